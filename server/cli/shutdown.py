"""Running the app under uvicorn as a process supervisor expects:

- a model (or mmproj) that fails to load ends the process with a non-zero status
  and the reason (/health answers 503 while loading, as before);
- SIGTERM/SIGINT drain: new requests get 503 with Retry-After, running requests
  may finish for up to --shutdown-timeout seconds, then each remaining one is
  ended with an error event and its stream's end ([DONE]); the process exits 0.
  A second signal exits at once.
"""
from __future__ import annotations

import asyncio
import logging
import sys
import time

import uvicorn

from ggserve.server.service.errors import Unavailable

log = logging.getLogger("ggserve.server")

# after ending the remaining streams: time for their last events to be written
FLUSH_SECONDS = 5.0


class Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, service, shutdown_timeout: float):
        super().__init__(config)
        self.service = service
        self.shutdown_timeout = shutdown_timeout
        self.load_error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task] = set()

    async def startup(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)
        self._spawn(self._watch_load())

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch_load(self) -> None:
        try:
            await self.service.wait_ready()
        except Exception as e:        # the reason was logged with its traceback by the service
            self.load_error = e
            self.should_exit = True

    def handle_exit(self, sig, frame) -> None:
        # (not uvicorn's: it re-raises the signal after shutting down, and the process
        # would end by SIGTERM instead of exiting 0)
        if self.service.draining or self._loop is None:
            self.should_exit = self.force_exit = True
            return
        self.service.draining = True
        self._loop.call_soon_threadsafe(self._spawn, self._drain())

    async def _drain(self) -> None:
        log.info("shutting down: draining running requests (up to %g s)", self.shutdown_timeout)
        deadline = time.monotonic() + self.shutdown_timeout
        while self.service.busy and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.service.busy:
            log.info("shutting down: ending the remaining requests")
            self.service.end_all(Unavailable("Server is shutting down", code="shutting_down"))
            deadline = time.monotonic() + FLUSH_SECONDS
            while self.service.busy and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        self.should_exit = True


def run(app, *, host: str, port: int, log_level: str, shutdown_timeout: float, **uvicorn_kw) -> bool:
    """Serve until shut down. False when the model (or mmproj) failed to load, said on stderr.
    uvicorn_kw: how uvicorn logs (server/cli/log_flags.py)."""
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=int(FLUSH_SECONDS), **uvicorn_kw)
    server = Server(config, app.state.service, shutdown_timeout)
    if "," in host:                       # llama-server's --host 127.0.0.1,::1: several addresses
        from ggserve.server.cli.llama_flags import bind_sockets
        server.run(sockets=bind_sockets(host, port))
    else:
        server.run()
    if server.load_error is None:
        return True
    cfg, e = app.state.config, server.load_error
    mmproj = f" (mmproj {cfg.mmproj})" if cfg.mmproj else ""
    print(f"ggserve serve: failed to load {cfg.model}{mmproj}: {type(e).__name__}: {e}", file=sys.stderr)
    return False
