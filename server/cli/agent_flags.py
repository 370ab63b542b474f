"""The flags of the tools the server runs for the chat page (server/agent_tools/), as llama-server
11434 names them: --tools, --tools-runtime, --mcp-servers-config, --mcp-servers-json,
--ui-mcp-proxy, -ag/--agent; and ggserve's --tools-root. All off by default; with tools or MCP
servers on, --cors-origins defaults to localhost (llama-server's common/arg.cpp)."""
from __future__ import annotations

import argparse

from ggserve.server.cli.serve_flags import _flag

_RISK = " - do not enable in untrusted environments"
_CORS = "; --cors-origins then defaults to localhost"


def add_agent_flags(p) -> None:
    _flag(p, "--tools", env="LLAMA_ARG_TOOLS", metavar="TOOL1,TOOL2,...",
          help="built-in tools for the chat page's agent, served at /tools" + _RISK + ": 'all' or names of "
               "read_file, file_glob_search, grep_search, exec_shell_command, write_file, edit_file, get_info" + _CORS)
    _flag(p, "--tools-runtime", env="LLAMA_ARG_TOOLS_RUNTIME", metavar="OPTION",
          help="run the tools elsewhere: 'docker:IMAGE' / 'podman:IMAGE' (a container started now, removed on "
               "exit), 'docker-container:ID' / 'podman-container:ID' (a running one), 'ssh:TARGET' (key-based)")
    _flag(p, "--tools-root", env="GGSERVE_TOOLS_ROOT", metavar="DIR",
          help="every path the tools touch, and their working directory, must be under DIR "
               "(symlinks resolved); a relative path always stays under the working directory")
    _flag(p, "--mcp-servers-config", env="LLAMA_ARG_MCP_SERVERS_CONFIG", metavar="PATH",
          help="JSON file of stdio MCP servers (Cursor's {\"mcpServers\": {...}}) whose tools /tools serves as "
               "<server>_<tool>" + _RISK + _CORS)
    _flag(p, "--mcp-servers-json", env="LLAMA_ARG_MCP_SERVERS_JSON", metavar="JSON",
          help="the same, inline" + _CORS)
    _flag(p, "--ui-mcp-proxy", "--webui-mcp-proxy", env="LLAMA_ARG_UI_MCP_PROXY", flag=True, dest="ui_mcp_proxy",
          help="serve /cors-proxy?url=..., through which the chat page reaches remote MCP servers" + _RISK)
    p.add_argument("--no-ui-mcp-proxy", "--no-webui-mcp-proxy", action="store_false", dest="ui_mcp_proxy",
                   help="no /cors-proxy (the default)")
    _flag(p, "-ag", "--agent", env="LLAMA_ARG_AGENT", flag=True, dest="agent",
          help="all built-in tools and the CORS proxy" + _RISK + _CORS)
    p.add_argument("-no-ag", "--no-agent", action="store_false", dest="agent", help="(the default)")


def agent_settings(args: argparse.Namespace):
    """The AgentToolsConfig the flags ask for; a bad one ends the program naming its flag."""
    from ggserve.server.agent_tools import builtin, mcp_config, runtimes
    from ggserve.server.agent_tools.config import AgentToolsConfig
    from ggserve.server.agent_tools.errors import ToolRequestError

    tools = tuple(t.strip() for t in (args.tools or "").split(",") if t.strip())
    if args.agent:
        tools = ("all",)
    try:
        builtin.enabled(list(tools))
    except ValueError as e:
        raise SystemExit(f"ggserve serve: --tools: {e}")
    if args.tools_runtime:
        try:
            kind, engine, arg = runtimes.parse(args.tools_runtime)
        except ToolRequestError as e:
            raise SystemExit(f"ggserve serve: --tools-runtime: {e}")
        if kind == "spawn" and not arg:
            raise SystemExit(f"ggserve serve: --tools-runtime {engine}:<image> requires an image name")
    try:
        servers = mcp_config.load(args.mcp_servers_config, args.mcp_servers_json)
    except ValueError as e:
        raise SystemExit(f"ggserve serve: {e}")
    return AgentToolsConfig(tools, args.tools_runtime, args.tools_root, tuple(servers),
                            bool(args.ui_mcp_proxy or args.agent))


def cors_origins(args: argparse.Namespace, agent) -> list[str]:
    """--cors-origins as given; when not given, localhost with tools or MCP servers on, else '*'."""
    given = args.cors_origins
    if given is None:
        given = "localhost" if agent.serves_tools else "*"
    return [o.strip() for o in given.split(",") if o.strip()]
