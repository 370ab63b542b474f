"""--sleep-idle-seconds N: after N seconds with nothing to do, the model, its KV cache
and its compute buffers are freed; the next request that needs the model loads it
again and then runs (llama-server 11434's sleeping state).

What a client polls (server/api/common.py is_poll) never wakes the server, and answers while it sleeps: /health,
/v1/models, /metrics (its series keep their values: nothing runs), GET /props (the
answer taken as the server fell asleep, with `is_sleeping: true`), /openapi.json
and the chat page's files. Every other endpoint wakes it first, /tokenize and the
token-counting ones included.

"Idle" means: no endpoint running, no generation streaming, for N seconds.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

log = logging.getLogger("ggserve.server")


class Sleeper:
    def __init__(self, service, idle_seconds: float, snapshot: Callable[[], Any]):
        """snapshot(): the GET /props answer, taken just before the model is freed."""
        self.service = service
        self.idle_seconds = idle_seconds
        self._snapshot = snapshot
        self.sleeping = False
        self.props: Any = None        # snapshot() while sleeping
        self._active = 0              # endpoints running that need the model
        self._last = time.monotonic()
        self._lock = asyncio.Lock()   # one sleep or wake at a time
        self._task: asyncio.Task | None = None

    async def enter(self) -> None:
        """An endpoint that needs the model starts: wake the server if it sleeps."""
        self._active += 1
        if self.sleeping:
            async with self._lock:
                if self.sleeping:
                    log.info("waking up: loading the model again")
                    await self.service.reload()
                    self.sleeping, self.props = False, None
                    self.service.metrics.freeze(False)

    def leave(self) -> None:
        self._active -= 1
        self._last = time.monotonic()

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch(), name="ggserve-sleep")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _watch(self) -> None:
        tick = min(0.25, self.idle_seconds / 4)
        while True:
            await asyncio.sleep(tick)
            if self._idle():
                async with self._lock:
                    if self._idle():
                        await self._sleep()

    def _idle(self) -> bool:
        s = self.service
        return (not self.sleeping and s.ready and not s.busy and self._active == 0
                and time.monotonic() - self._last >= self.idle_seconds)

    async def _sleep(self) -> None:
        try:
            props = self._snapshot()
        except Exception:
            log.exception("GET /props could not be kept for the sleeping state")
            props = {}
        log.info("idle for %g s: sleeping (the model is freed until the next request)", self.idle_seconds)
        self.props, self.sleeping = {**props, "is_sleeping": True}, True
        self.service.metrics.freeze(True)
        await self.service.unload()
