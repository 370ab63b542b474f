"""A model's memory: KV cells, recurrent states, slots and their prefixes, host-RAM and file snapshots."""
