"""What the agent-tool flags ask for (server/cli/agent_flags.py), and the ToolBox they make."""
from __future__ import annotations

from dataclasses import dataclass

from ggserve.server.agent_tools import builtin
from ggserve.server.agent_tools.mcp_config import McpServerConfig


@dataclass(frozen=True)
class AgentToolsConfig:
    tools: tuple[str, ...] = ()                    # --tools: "all" or names
    runtime: str | None = None                     # --tools-runtime
    root: str | None = None                        # --tools-root: every path under it
    mcp_servers: tuple[McpServerConfig, ...] = ()  # --mcp-servers-config / --mcp-servers-json
    cors_proxy: bool = False                       # --ui-mcp-proxy: GET/POST /cors-proxy

    @property
    def serves_tools(self) -> bool:
        """/tools answers (else 403), and CORS defaults to localhost."""
        return bool(self.tools or self.mcp_servers)

    def toolbox(self):
        """The ToolBox these flags make, or None when /tools is off. ValueError for a bad flag."""
        if not self.serves_tools:
            return None
        from ggserve.server.agent_tools.mcp_servers import McpServers
        from ggserve.server.agent_tools.toolbox import ToolBox

        return ToolBox(builtin.enabled(list(self.tools)) if self.tools else [],
                       McpServers(list(self.mcp_servers)) if self.mcp_servers else None,
                       self.runtime, self.root)
