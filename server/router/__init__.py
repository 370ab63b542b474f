"""Router mode (llama-server 11434's): many models behind one server, each served by its own
`ggserve serve` child process, loaded on first use and evicted least-recently-used."""
