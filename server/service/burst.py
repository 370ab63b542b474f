"""Requests that arrive together start together.

Clients that send several requests at once (a batch job, an agent's parallel calls,
a benchmark's concurrent streams) reach the engine a few milliseconds apart: each
prompt is rendered and tokenized in turn on the prompt thread. An idle engine that
started on the first alone would decode it while the next prompts' rows are computed
beside it, in steps the stall budget caps: every stream of the burst then waits on
the others' prompts, step after step. llama-server's loop takes what its HTTP threads
queued in one batch; here an idle engine waits while prompts are still being built
(a few milliseconds, nothing beside a prompt step), so the burst's prompts go into one
step. A request whose HTTP body is still being read when the prompt before it is done
is not being built yet: the engine also waits until no prompt began for QUIET_SECONDS
(what a lone request waits, less the time its own prompt took).
"""
from __future__ import annotations

import asyncio
import contextlib
import time

POLL_SECONDS = 0.001
MAX_WAIT_SECONDS = 0.05     # never hold the first request longer
# a burst's requests reach the prompt thread a few ms apart (4 streams from one client
# on 2 cores: up to ~3 ms); a prompt that began this recently may have company coming
QUIET_SECONDS = 0.005


class Arrivals:
    """Counts the prompts being built off the event loop (each becomes a request),
    and when the latest began."""

    def __init__(self) -> None:
        self.building = 0
        self.last_began = -float("inf")      # time.monotonic()

    @contextlib.contextmanager
    def building_one(self):
        self.building += 1
        self.last_began = time.monotonic()
        try:
            yield
        finally:
            self.building -= 1

    async def settle(self) -> None:
        """Return once no prompt is being built and none began for QUIET_SECONDS, or
        after MAX_WAIT_SECONDS."""
        deadline = time.monotonic() + MAX_WAIT_SECONDS
        while time.monotonic() < deadline and (self.building or time.monotonic() - self.last_began < QUIET_SECONDS):
            await asyncio.sleep(POLL_SECONDS)
