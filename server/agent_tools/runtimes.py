"""Where tools run when not on the host: `--tools-runtime` and the `x-tool-runtime` header.

`docker:IMAGE` / `podman:IMAGE`: a container this server starts and removes on exit (`OwnedContainer`);
`docker-container:ID` / `podman-container:ID`: a running container, through `<engine> exec`;
`ssh:TARGET`: a remote POSIX host. Every operation is a command run there (`IsolateIO`), so the
far side needs sh, cat, wc, mkdir, dirname, find and timeout.

A runtime may come from a client's header and lands on a command line: a container id or ssh
target that could read as an option (`--privileged`, `-oProxyCommand=...`) is refused, and an
unknown scheme is refused rather than run on the host.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import re
import shlex
import tempfile

from ggserve.server.agent_tools.errors import ToolError, ToolRequestError
from ggserve.server.agent_tools.host_io import (
    GIT_LS_MAX_OUTPUT,
    JUNK_DIRS,
    LIST_SECONDS,
    ExecResult,
    Listing,
    depth,
    run_command,
)

ENGINES = ("docker", "podman")
AUX_TIMEOUT = 15
READ_MAX = 64 * 2**20
_CONTAINER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SSH_TARGET = re.compile(r"[A-Za-z0-9._@][A-Za-z0-9._@-]*")
SSH = ["ssh", "-o", "BatchMode=yes", "-o", "PasswordAuthentication=no", "-o", "KbdInteractiveAuthentication=no",
       "-o", "StrictHostKeyChecking=yes"]


def parse(spec: str) -> tuple[str, str, str]:
    """spec -> (kind, program, argument): kind is "spawn" (engine, image), "container" (engine, id)
    or "ssh" ("ssh", target). ToolRequestError (500, as llama-server) for what must not run."""
    for engine in ENGINES:
        if spec.startswith(f"{engine}-container:"):
            cid = spec[len(engine) + 11:]
            if not _CONTAINER_ID.fullmatch(cid):
                raise ToolRequestError(500, f"invalid container id: {cid}")
            return "container", engine, cid
        if spec.startswith(f"{engine}:"):
            return "spawn", engine, spec[len(engine) + 1:]
    if spec.startswith("ssh:"):
        target = spec[4:]
        if not _SSH_TARGET.fullmatch(target):
            raise ToolRequestError(500, f"invalid ssh target: {target}")
        return "ssh", "ssh", target
    raise ToolRequestError(500, f"unknown tool runtime: {spec}")


class IsolateIO:
    """HostIO's methods as commands run in a container or over ssh (POSIX paths there)."""

    def __init__(self, spec: str, cwd: str | None, root: str | None):
        kind, self.program, self.target = parse(spec)
        if kind == "spawn":
            raise ToolRequestError(500, f"tool runtime must name a running container: {spec}")
        self.ssh = kind == "ssh"
        self.root, self.cwd, self.cwd_given = root, posixpath.normpath(cwd) if cwd else "", bool(cwd)
        if root and self.cwd and not _under(self.cwd, root):
            raise ToolError(f"working directory is outside --tools-root: {cwd}")

    def path(self, path: str) -> str:
        full = path if path.startswith("/") or not self.cwd else f"{self.cwd}/{path}"
        full = posixpath.normpath(full)
        if not path.startswith("/") and self.cwd and not _under(full, self.cwd):
            raise ToolError(f"path escapes the working directory: {path}")
        if self.root and not _under(full, self.root):
            raise ToolError(f"path is outside --tools-root: {path}")
        return full

    def argv(self, inner: list[str], stdin: bool) -> list[str]:
        if self.ssh:            # the remote shell parses the line again: one quoted word
            return [*SSH, *([] if stdin else ["-n"]), self.target, shlex.join(inner)]
        return [self.program, "exec", *(["-i"] if stdin else []), self.target, *inner]

    async def _exec(self, inner: list[str], max_output: int = 4096, join_stderr: bool = True,
                    stdin: bytes | None = None) -> ExecResult:
        return await run_command(self.argv(inner, stdin is not None), max_output, AUX_TIMEOUT,
                                 stdin=stdin, join_stderr=join_stderr)

    async def _test(self, flag: str, path: str) -> bool:
        res = await self._exec(["sh", "-c", f'[ {flag} "$1" ]', "_", self.path(path)])
        return res.exit_code == 0

    async def kind(self, path: str) -> str | None:
        return "dir" if await self._test("-d", path) else "file" if await self._test("-f", path) else None

    async def size(self, path: str) -> int | None:
        res = await self._exec(["sh", "-c", 'wc -c < "$1"', "_", self.path(path)])
        return int(res.output.strip()) if res.exit_code == 0 and res.output.strip().isdigit() else None

    async def read(self, path: str) -> bytes | None:
        res = await self._exec(["cat", "--", self.path(path)], READ_MAX, join_stderr=False)
        return res.output.encode() if res.exit_code == 0 and not res.timed_out else None

    async def write(self, path: str, data: bytes) -> bool:
        res = await self._exec(["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "_", self.path(path)],
                               stdin=data)
        return res.exit_code == 0 and not res.timed_out

    async def run(self, argv: list[str], max_output: int, timeout: float, on_chunk=None) -> ExecResult:
        # `timeout` inside: killing the local client does not stop what runs over there
        inner = ["timeout", f"{int(timeout)}s", *argv]
        if self.cwd:
            inner = ["sh", "-c", 'cd "$1" || exit 127; shift; exec "$@"', "_", self.cwd, *inner]
        return await run_command(self.argv(inner, True), max_output, timeout + 5, on_chunk=on_chunk, stdin=b"")

    async def list_entries(self, base: str, max_depth: int, kind: str) -> Listing | None:
        if await self.kind(base) != "dir":
            return None
        if kind == "file":
            git = await self._exec(["sh", "-c", 'cd "$1" && git ls-files --cached --others --exclude-standard',
                                    "_", base], GIT_LS_MAX_OUTPUT)
            if git.exit_code == 0 and not git.timed_out:
                return Listing([(r, False) for r in git.output.splitlines()
                                if r and (max_depth == 0 or depth(r) <= max_depth)])
        out = Listing()
        for want_dirs in ([True] if kind == "dir" else [False] if kind == "file" else [True, False]):
            prune = " -o ".join(f"-name {n}" for n in sorted(JUNK_DIRS))
            cmd = 'cd "$1" && find . -mindepth 1' + (f" -maxdepth {max_depth}" if max_depth else "")
            cmd += f" \\( {prune} \\) -prune" + (" -print -o -type d -print" if want_dirs else " -o -type f -print")
            res = await run_command(self.argv(["sh", "-c", cmd, "_", base], False), GIT_LS_MAX_OUTPUT, LIST_SECONDS)
            out.truncated |= res.timed_out
            out.entries += [(r[2:] if r.startswith("./") else r, want_dirs) for r in res.output.splitlines() if r]
        return out


def _under(path: str, base: str) -> bool:
    return path == base or path.startswith(base.rstrip("/") + "/")


class OwnedContainer:
    """`--tools-runtime docker:IMAGE`: `<engine> run --rm -i IMAGE sh` kept alive by its open stdin,
    started again if it dies; closing stdin at shutdown ends it, and --rm removes it."""

    def __init__(self, engine: str, image: str):
        if not image:
            raise ValueError(f"--tools-runtime {engine}:<image> requires an image name")
        self.engine, self.image = engine, image
        self.proc: asyncio.subprocess.Process | None = None
        self.cid = ""
        self.lock = asyncio.Lock()

    async def spec(self) -> str:
        async with self.lock:
            if self.proc is None or self.proc.returncode is not None:
                await self._spawn()
            return f"{self.engine}-container:{self.cid}"

    async def _spawn(self) -> None:
        cidfile = os.path.join(tempfile.mkdtemp(prefix="ggserve-tools-"), "cid")
        try:
            self.proc = await asyncio.create_subprocess_exec(
                self.engine, "run", "--rm", "-i", "--cidfile", cidfile, self.image, "sh",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        except OSError as e:
            raise ToolRequestError(500, f"failed to spawn {self.engine} container for tools runtime: {e.strerror}")
        for _ in range(100):
            with contextlib.suppress(OSError):
                self.cid = open(cidfile).read().strip()
            if self.cid or self.proc.returncode is not None:      # started, or failed to
                break
            await asyncio.sleep(0.1)
        with contextlib.suppress(OSError):
            os.remove(cidfile)
            os.rmdir(os.path.dirname(cidfile))
        if not self.cid:
            if self.proc.returncode is None:
                self.proc.kill()
            raise ToolRequestError(500, f"{self.engine} container for the tools did not start (image: {self.image})")

    async def close(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except asyncio.TimeoutError:
                self.proc.kill()
