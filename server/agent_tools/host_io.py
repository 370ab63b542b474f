"""The tools' reach on the host: files under the rules of paths.py, listings, commands.

A runtime (`runtimes.py`) has the same methods, run as commands inside a container or over ssh.
Listings skip what can be enormous, as llama-server's do: junk directories are listed but never
walked, symlinked directories never followed (a link can loop), and a walk stops after
LIST_SECONDS (the result says it was cut).
"""
from __future__ import annotations

import asyncio
import codecs
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Callable

from ggserve.server.agent_tools.paths import resolve, resolve_cwd

# llama-server's SERVER_TOOL_JUNK_DIR_NAMES
JUNK_DIRS = frozenset({".git", ".svn", ".hg", "node_modules", "__pycache__", ".venv", "venv", "dist",
                       "build", "target", ".cache", ".idea", ".vscode"})
LIST_SECONDS = 15
GIT_LS_MAX_OUTPUT = 8 * 2**20


@dataclass
class ExecResult:
    output: str
    exit_code: int
    timed_out: bool = False


@dataclass
class Listing:
    entries: list[tuple[str, bool]] = field(default_factory=list)   # ('/'-separated relative path, is_dir)
    truncated: bool = False                                          # the walk could not see everything


def depth(rel: str) -> int:
    return rel.count("/") + 1


async def run_command(argv: list[str], max_output: int, timeout: float, cwd: str | None = None,
                      on_chunk: Callable[[str], bool] | None = None, stdin: bytes | None = None,
                      join_stderr: bool = True) -> ExecResult:
    """Run argv (stderr joined to stdout unless join_stderr is False: then it is dropped), at most
    timeout seconds and max_output bytes kept.
    on_chunk gets the output as it comes; when it returns False (the client left) the command
    is killed. The command runs in its own process group, killed whole."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT if join_stderr else asyncio.subprocess.DEVNULL,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            start_new_session=True)
    except OSError as e:
        return ExecResult(f"failed to spawn process: {e.strerror}", -1)
    if stdin is not None:
        proc.stdin.write(stdin)
        await proc.stdin.drain()
        proc.stdin.close()
    decoder, kept, out, timed_out = codecs.getincrementaldecoder("utf-8")("replace"), 0, [], False
    deadline = time.monotonic() + timeout
    finished = False
    try:
        while True:
            left = deadline - time.monotonic()
            try:
                data = await asyncio.wait_for(proc.stdout.read(4096), max(left, 0))
            except asyncio.TimeoutError:
                timed_out = True
                break
            if not data:          # EOF: the command ends (a child it left may hold the pipe: bounded)
                try:
                    await asyncio.wait_for(proc.wait(), max(deadline - time.monotonic(), 0.1))
                    finished = True
                except asyncio.TimeoutError:
                    timed_out = True
                break
            if kept < max_output:                 # past the cap: drained, not kept
                data = data[:max_output - kept]
                kept += len(data)
                text = decoder.decode(data)
                out.append(text)
                if on_chunk is not None and text and not on_chunk(text):
                    break
    finally:
        if not finished:                          # timed out, the client left, or cancelled
            _kill_group(proc.pid)
        code = await proc.wait()
    output = "".join(out) + decoder.decode(b"", final=True)
    if kept >= max_output:
        output += "\n[output truncated]"
    return ExecResult(output, code, timed_out)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class HostIO:
    """Files and commands on this machine, paths checked by paths.resolve."""

    def __init__(self, cwd: str | None, root: str | None):
        self.root = root
        self.cwd = resolve_cwd(cwd, root)
        self.cwd_given = bool(cwd)

    def path(self, path: str) -> str:
        return resolve(path, self.cwd, self.root)

    async def kind(self, path: str) -> str | None:
        full = self.path(path)
        return "dir" if os.path.isdir(full) else "file" if os.path.isfile(full) else None

    async def size(self, path: str) -> int | None:
        try:
            return os.path.getsize(self.path(path))
        except OSError:
            return None

    async def read(self, path: str) -> bytes | None:
        try:
            return await asyncio.to_thread(_read_bytes, self.path(path))
        except OSError:
            return None

    async def write(self, path: str, data: bytes) -> bool:
        try:
            await asyncio.to_thread(_write_bytes, self.path(path), data)
            return True
        except OSError:
            return False

    async def run(self, argv: list[str], max_output: int, timeout: float,
                  on_chunk: Callable[[str], bool] | None = None) -> ExecResult:
        return await run_command(argv, max_output, timeout, self.cwd, on_chunk)

    async def list_entries(self, base: str, max_depth: int, kind: str) -> Listing | None:
        """Entries under base (already resolved); None when base is not a directory.
        max_depth 0: no limit, 1: base's own entries. kind: file, dir or all."""
        if not os.path.isdir(base):
            return None
        if kind == "file":              # git's view first: it honours .gitignore
            git = await run_command(["git", "-C", base, "ls-files", "--cached", "--others", "--exclude-standard"],
                                    GIT_LS_MAX_OUTPUT, LIST_SECONDS)
            if git.exit_code == 0 and not git.timed_out:
                rels = [r for r in git.output.splitlines() if r and (max_depth == 0 or depth(r) <= max_depth)]
                return Listing([(r, False) for r in rels if os.path.isfile(os.path.join(base, r))])
        return await asyncio.to_thread(walk, base, max_depth, kind)


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _write_bytes(path: str, data: bytes) -> None:
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def walk(base: str, max_depth: int, kind: str) -> Listing:
    out, stack = Listing(), [(base, "", 0)]
    deadline = time.monotonic() + LIST_SECONDS
    while stack:
        folder, rel_folder, level = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            out.truncated = True
            continue
        for entry in entries:
            if time.monotonic() > deadline:
                out.truncated = True
                return out
            rel = f"{rel_folder}{entry.name}"
            try:
                is_dir = entry.is_dir()
                is_file = not is_dir and entry.is_file()
            except OSError:
                continue
            if is_dir:
                if kind in ("dir", "all"):
                    out.entries.append((rel, True))
                if entry.name not in JUNK_DIRS and not entry.is_symlink() and (max_depth == 0 or level + 1 < max_depth):
                    stack.append((entry.path, rel + "/", level + 1))
            elif is_file and kind in ("file", "all"):
                out.entries.append((rel, False))
    return out
