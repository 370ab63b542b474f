"""Tools the server runs for the chat page (llama-server's `--tools`, `--mcp-servers-config`).

`toolbox.ToolBox` is the one door: the built-in tools (`builtin.py`: files, search, shell) and
the tools of MCP servers (`mcp_servers.py`), listed and invoked by name. A tool's failure is a
tool result (`{"error": ...}`), never an exception out of `ToolBox.invoke`; what the caller got
wrong before any tool ran (an unknown tool, a bad runtime) raises `ToolRequestError`.
Nothing here imports the rest of the server: the API layer (`api/llama/tools.py`) serves it.
"""
