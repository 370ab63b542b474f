"""One model's `ggserve serve` child process: started on a free loopback port, ready when its
/health answers 200, stopped with SIGTERM (then SIGKILL after the model's stop-timeout).

A process per model, as llama-server does, because unloading must give the memory back
and a crash must stay with its model (docs/architecture.md, Router mode, has the figures)."""
from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import signal
import socket
import sys

import httpx

log = logging.getLogger("ggserve.router")

READY_POLL_SECONDS = 0.02


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LoadFailed(Exception):
    """The child ended before it was ready; the message is its own last words."""


class Child:
    def __init__(self, model_id: str, argv: list[str]):
        self.model_id = model_id
        self.argv = argv                     # flags after `ggserve serve`, host and port excluded
        self.port = 0
        self.proc: asyncio.subprocess.Process | None = None
        self.tail: collections.deque[str] = collections.deque(maxlen=40)   # its last lines of output
        self._reader: asyncio.Task | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        """Start the process and return once it serves; LoadFailed if it ends first."""
        self.port = free_port()
        cmd = [sys.executable, "-m", "ggserve.server.cli.main", "serve", *self.argv,
               "--host", "127.0.0.1", "--port", str(self.port), "--alias", self.model_id]
        log.info("model %s: starting `ggserve serve %s`", self.model_id, " ".join(cmd[4:]))
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_MODELS_")}
        self.proc = await asyncio.create_subprocess_exec(
            *cmd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, env=env, start_new_session=True)
        self._reader = asyncio.create_task(self._read_output())
        async with httpx.AsyncClient(timeout=2.0) as client:
            while True:
                if self.proc.returncode is not None:
                    await asyncio.wait_for(asyncio.shield(self._reader), 2.0)
                    raise LoadFailed(self.reason())
                try:
                    if (await client.get(self.url + "/health")).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(READY_POLL_SECONDS)

    async def _read_output(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            self.tail.append(line)
            log.debug("[%s] %s", self.model_id, line)

    def reason(self) -> str:
        """Why the child ended: its `ggserve serve: ...` message, else its last line, with the exit status."""
        said = [ln for ln in self.tail if ln.startswith("ggserve serve:") or "error:" in ln]
        last = said[-1] if said else (self.tail[-1] if self.tail else "")
        code = self.proc.returncode if self.proc else None
        return f"{last} (exit status {code})" if last else f"exit status {code}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def wait(self) -> int:
        assert self.proc is not None
        return await self.proc.wait()

    async def stop(self, timeout: float) -> None:
        """SIGTERM (the child drains its requests), SIGKILL after `timeout` seconds."""
        if self.alive:
            assert self.proc is not None
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), timeout)
            except asyncio.TimeoutError:
                log.warning("model %s: no exit %g s after SIGTERM, killing it", self.model_id, timeout)
                self.proc.kill()
                await self.proc.wait()
        self._end_group()
        if self._reader is not None:       # a grandchild holding the pipe must not keep the reader
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)

    def _end_group(self) -> None:
        """What the child started (its grammar workers) goes with it: its own session's processes."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
