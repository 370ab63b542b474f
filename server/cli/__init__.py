"""The command line: flags (llama-server's among them) and subcommands."""
