"""Where a tool's path points, and whether it may go there.

Relative paths resolve against the working directory (the `x-tool-cwd` header, else the
server's own), `~` to the home directory, as llama-server resolves them. Two rules keep a path
where it belongs (the real path counts: `..` and symlinks resolved):

- a relative path stays under the working directory: `../../etc/passwd` and a symlink out of
  it are refused (llama-server lets them through);
- with `--tools-root DIR`, every path, absolute ones and the working directory itself, stays
  under DIR.
"""
from __future__ import annotations

import os

from ggserve.server.agent_tools.errors import ToolError


def _under(path: str, base: str) -> bool:
    return path == base or path.startswith(base.rstrip("/") + "/")


def resolve_cwd(cwd: str | None, root: str | None) -> str:
    """The working directory a call runs in: the header's, else the server's; under root."""
    work = os.path.normpath(os.path.expanduser(cwd)) if cwd else os.getcwd()
    if not os.path.isabs(work):
        work = os.path.join(os.getcwd(), work)
    if root and not _under(os.path.realpath(work), os.path.realpath(root)):
        raise ToolError(f"working directory is outside --tools-root: {cwd}")
    return work


def resolve(path: str, cwd: str, root: str | None) -> str:
    """path as an absolute, normalized path, or ToolError when it leaves where it may go."""
    expanded = os.path.expanduser(path)
    full = os.path.normpath(os.path.join(cwd, expanded))
    real = os.path.realpath(full)
    if not os.path.isabs(expanded) and not _under(real, os.path.realpath(cwd)):
        raise ToolError(f"path escapes the working directory: {path}")
    if root and not _under(real, os.path.realpath(root)):
        raise ToolError(f"path is outside --tools-root: {path}")
    return full
