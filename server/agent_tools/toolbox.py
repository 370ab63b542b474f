"""ToolBox: the tools `/tools` lists and runs, built-in and MCP, by name.

Built-in tools run on the host (`host_io.HostIO`) or in a runtime (`runtimes.IsolateIO`): the
call's `x-tool-runtime`, else `--tools-runtime`. MCP tools are named `<server>_<tool>`; one whose
name another tool already has is skipped, as llama-server skips it.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ggserve.server.agent_tools import runtimes
from ggserve.server.agent_tools.builtin import BuiltinTool
from ggserve.server.agent_tools.errors import ToolError, ToolRequestError
from ggserve.server.agent_tools.host_io import HostIO

if TYPE_CHECKING:       # the MCP SDK (~40 MiB imported) only where MCP servers are configured (config.py)
    from ggserve.server.agent_tools.mcp_servers import McpServers

log = logging.getLogger("ggserve.server")


@dataclass(frozen=True)
class CallPlace:
    """Where a call runs, from the request's headers (the model's own `cwd` never counts)."""
    cwd: str | None = None           # x-tool-cwd
    runtime: str | None = None       # x-tool-runtime
    resp_type: str | None = None     # x-resp-type: read_file's "base64"


class ToolBox:
    def __init__(self, builtin: list[BuiltinTool], mcp: McpServers | None = None,
                 runtime: str | None = None, root: str | None = None):
        self.builtin = {t.name: t for t in builtin}
        self.mcp = mcp
        self.root = root
        self.runtime, self.owned = runtime, None
        if runtime:
            kind, engine, image = runtimes.parse(runtime)      # a bad spec fails at start
            if kind == "spawn":
                self.owned = runtimes.OwnedContainer(engine, image)
        self.mcp_tools: dict[str, tuple[str, dict]] = {}

    async def start(self) -> None:
        if self.mcp is not None:
            await self.mcp.warm_up()
            for server, tool in self.mcp.tools:
                name = f"{server}_{tool.get('name', '')}"
                if name in self.builtin or name in self.mcp_tools:
                    log.warning('MCP tool "%s" from server "%s" collides with an existing tool, skipping', name, server)
                    continue
                self.mcp_tools[name] = (server, tool)
        if self.owned is not None:
            await self.owned.spec()

    async def close(self) -> None:
        if self.mcp is not None:
            await self.mcp.close()
        if self.owned is not None:
            await self.owned.close()

    def listing(self) -> list[dict]:
        """GET /tools: every tool with its definition, built-in ones first."""
        out = [t.listing() for t in self.builtin.values()]
        for name, (_, tool) in self.mcp_tools.items():
            schema = tool.get("inputSchema")
            out.append({"display_name": name, "tool": name, "type": "mcp", "permissions": {"write": False},
                        "uses_cwd": False, "definition": {"type": "function", "function": {
                            "name": name, "description": tool.get("description", ""),
                            "parameters": schema if isinstance(schema, dict) else {}}}})
        return out

    def check(self, name: str, stream: bool) -> None:
        """ToolRequestError 404 for a tool not served, or one that cannot stream when asked to."""
        if name not in self.builtin and name not in self.mcp_tools:
            raise ToolRequestError(404, f'unknown tool "{name}"')
        if stream and not (name in self.builtin and self.builtin[name].stream):
            raise ToolRequestError(404, f'tool "{name}" does not support stream = true')

    async def invoke(self, name: str, params: dict, place: CallPlace,
                     push: Callable[[str], bool] | None = None) -> dict | None:
        """The tool's result (`{"error": ...}` when it failed); None for a streamed call (its
        output went to push). ToolRequestError when no tool could run."""
        self.check(name, push is not None)
        if name in self.mcp_tools:
            server, tool = self.mcp_tools[name]
            return await self.mcp.call(server, tool["name"], params)
        args = {k: v for k, v in params.items() if k not in ("cwd", "runtime", "resp_type")}
        if name == "read_file" and place.resp_type:
            args["resp_type"] = place.resp_type
        tool = self.builtin[name]
        try:
            io = await self._io(place)
            return await (tool.run(io, args, push) if tool.stream else tool.run(io, args))
        except ToolError as e:
            return {"error": str(e)}
        except KeyError as e:
            return {"error": f"missing parameter: {e.args[0]}"}
        except (TypeError, ValueError) as e:
            return {"error": f"invalid parameters: {e}"}

    async def _io(self, place: CallPlace):
        runtime = place.runtime or (await self.owned.spec() if self.owned else self.runtime)
        if runtime:
            return runtimes.IsolateIO(runtime, place.cwd, self.root)
        return HostIO(place.cwd, self.root)
