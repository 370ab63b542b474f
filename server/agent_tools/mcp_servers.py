"""The MCP servers of `--mcp-servers-config` / `--mcp-servers-json`, as llama-server 11434 runs them.

At start each server is spawned once to list its tools (at most WARMUP_SECONDS each, all at
once), then stopped; a tool call spawns it again and keeps it running for the next calls; one
that died (a crash, its stdout closed) is spawned again on the next call, and one that could not
be spawned is not tried again for COOLDOWN_SECONDS. Calls to one server may overlap (the SDK
matches replies by id). Whatever goes wrong in a call is its result, `{"error": ...}`.
"""
from __future__ import annotations

import asyncio
import logging
import time

from mcp.shared.exceptions import MCPError
from mcp_types import REQUEST_TIMEOUT

from ggserve.server.agent_tools.mcp_client import McpConnection, result_to_response
from ggserve.server.agent_tools.mcp_config import McpServerConfig

log = logging.getLogger("ggserve.server")
WARMUP_SECONDS = 10
COOLDOWN_SECONDS = 5


class McpServers:
    def __init__(self, configs: list[McpServerConfig]):
        self.configs = {c.name: c for c in configs}
        self.tools: list[tuple[str, dict]] = []          # (server name, MCP tool as JSON)
        self._live: dict[str, McpConnection] = {}
        self._locks = {name: asyncio.Lock() for name in self.configs}
        self._dead_until: dict[str, float] = {}
        self._stopping = False

    async def warm_up(self) -> None:
        """List every server's tools; a server that fails adds none (and is said in the log)."""
        found = await asyncio.gather(*(self._list(cfg) for cfg in self.configs.values()))
        self.tools = [(name, tool) for name, tools in zip(self.configs, found) for tool in tools]

    async def _list(self, cfg: McpServerConfig) -> list[dict]:
        conn = McpConnection(cfg)
        try:
            await conn.open(WARMUP_SECONDS)
            listed = await asyncio.wait_for(conn.session.list_tools(), WARMUP_SECONDS)
            tools = [t.model_dump(by_alias=True, exclude_none=True) for t in listed.tools]
            log.info("MCP warmup: '%s' discovered %d tools", cfg.name, len(tools))
            return tools
        except Exception as e:
            log.warning("MCP warmup: '%s' failed: %s %s", cfg.name, type(e).__name__, e)
            return []
        finally:
            await conn.close()

    async def call(self, server: str, tool: str, arguments: dict) -> dict:
        conn = await self._connection(server)
        if conn is None:
            return {"error": f"MCP server unavailable: {server}"}
        try:
            result = await conn.session.call_tool(tool, arguments,
                                                  read_timeout_seconds=self.configs[server].timeout_ms / 1000)
        except MCPError as e:          # worded as llama-server words its own timeout and a lost server
            if e.error.code == REQUEST_TIMEOUT:
                return {"error": "request timed out"}
            if not conn.alive():
                return {"error": "transport closed"}
            return {"error": e.error.message}
        except Exception as e:                        # the connection went away mid-call, a bad reply
            return {"error": f"MCP call failed: {type(e).__name__}: {e}"}
        return result_to_response(result)

    async def _connection(self, name: str) -> McpConnection | None:
        async with self._locks[name]:
            if self._stopping or time.monotonic() < self._dead_until.get(name, 0):
                return None
            conn = self._live.get(name)
            if conn is not None and conn.alive():
                return conn
            if conn is not None:
                log.warning("MCP '%s' is no longer alive (stderr: %s), respawning", name, conn.stderr_tail[-200:])
                await conn.close()
            conn = McpConnection(self.configs[name])
            try:
                await conn.open(WARMUP_SECONDS)          # a start, not a call: the call has its own timeout
            except Exception as e:
                log.warning("MCP '%s': failed to start: %s %s", name, type(e).__name__, e)
                self._live.pop(name, None)
                self._dead_until[name] = time.monotonic() + COOLDOWN_SECONDS
                return None
            self._live[name] = conn
            return conn

    async def close(self) -> None:
        """Stop every running server; calls after this answer that the server is unavailable."""
        self._stopping = True
        live, self._live = list(self._live.values()), {}
        await asyncio.gather(*(conn.close() for conn in live))
