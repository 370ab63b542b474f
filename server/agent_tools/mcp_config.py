"""`--mcp-servers-config FILE` / `--mcp-servers-json JSON`: Cursor's `{"mcpServers": {...}}` format,
read as llama-server 11434 reads it (entries without a command skipped, names unique across both)."""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

log = logging.getLogger("ggserve.server")


@dataclass(frozen=True)
class McpServerConfig:
    name: str
    command: str
    args: tuple[str, ...] = ()
    env: dict = field(default_factory=dict)      # merged over the server's own environment
    cwd: str | None = None
    timeout_ms: int = 30000                      # per tool call


def parse(text: str) -> list[McpServerConfig]:
    """One JSON document's servers; ValueError when it is not JSON or an entry is malformed."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"failed to parse MCP config JSON: {e}") from None
    servers = doc.get("mcpServers") if isinstance(doc, dict) else None
    if not isinstance(servers, dict):
        return []
    out = []
    for name, entry in servers.items():
        if not isinstance(entry, dict) or not entry.get("command"):
            log.warning("MCP server '%s' has no command, skipping", name)
            continue
        args, env = entry.get("args", []), entry.get("env", {})
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ValueError(f"MCP server '{name}': args must be an array of strings")
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise ValueError(f"MCP server '{name}': env must map names to strings")
        timeout = entry.get("timeout_ms", 30000)
        if not isinstance(timeout, int) or timeout <= 0:
            raise ValueError(f"MCP server '{name}': timeout_ms must be a positive integer")
        out.append(McpServerConfig(name, str(entry["command"]), tuple(args), dict(env), entry.get("cwd") or None,
                                   timeout))
    return out


def load(config_path: str | None, inline_json: str | None) -> list[McpServerConfig]:
    """Both sources, the file's first; ValueError for an unreadable file or bad JSON."""
    texts = []
    if config_path:
        try:
            with open(config_path, encoding="utf-8") as f:
                texts.append(f.read())
        except OSError as e:
            raise ValueError(f"failed to open MCP config file: {config_path}: {e.strerror}") from None
    if inline_json:
        texts.append(inline_json)
    servers: dict[str, McpServerConfig] = {}
    for text in texts:
        parsed = parse(text)
        if not parsed:
            log.warning("MCP config: no servers found in JSON")
        for cfg in parsed:
            if cfg.name in servers:
                log.warning("MCP config: duplicate server name '%s', skipping", cfg.name)
                continue
            servers[cfg.name] = cfg
    return list(servers.values())
