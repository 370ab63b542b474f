"""A small stdio MCP server for the tests, written with the official SDK (mcp 2.x).

Tools: `echo` (message -> "echo: message"), `add` (a + b), `fail` (an MCP tool error),
`sleep` (seconds), `crash` (the process exits at once), `pid` (this process's id, to tell a
respawned server from the first), `chatty` (a log notification before its answer, and a line
that is not JSON-RPC written straight to stdout). A file named by $NOTES_SPAWN_LOG gets one line per start.
"""
import os
import sys
import time

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("notes")

if os.environ.get("NOTES_SPAWN_LOG"):
    with open(os.environ["NOTES_SPAWN_LOG"], "a") as f:
        f.write(f"{os.getpid()}\n")


@server.tool(description="Echo back the input message")
def echo(message: str) -> str:
    return f"echo: {message}"


@server.tool(description="Add two numbers")
def add(a: float, b: float) -> str:
    return str(a + b)


@server.tool(description="Always fails")
def fail() -> str:
    raise ValueError("this tool always fails")


@server.tool(description="Sleep for a while")
def sleep(seconds: float) -> str:
    time.sleep(seconds)
    return f"slept {seconds}s"


@server.tool(description="Exit the server process")
def crash() -> str:
    sys.stdout.flush()
    os._exit(3)


@server.tool(description="This process's id")
def pid() -> str:
    return str(os.getpid())


@server.tool(description="Talks before it answers")
async def chatty(ctx: Context) -> str:
    await ctx.info("about to answer")
    os.write(1, b"this line is not JSON-RPC\n")
    return "answered"


if __name__ == "__main__":
    server.run("stdio")
