"""Requests that arrive together start together.

Clients that send several requests at once (a batch job, an agent's parallel calls,
a benchmark's concurrent streams) reach the engine a few milliseconds apart: each
prompt is rendered and tokenized in turn on the prompt thread. An idle engine that
started on the first alone would decode it while the next prompts' rows are computed
beside it, in steps the stall budget caps: every stream of the burst then waits on
the others' prompts, step after step. llama-server's loop takes what its HTTP threads
queued in one batch; here an idle engine waits while prompts are still being built
(a few milliseconds, nothing beside a prompt step), so the burst's prompts go into one
step. A lone request finds nothing being built and starts at once.
"""
from __future__ import annotations

import asyncio
import contextlib

POLL_SECONDS = 0.001
MAX_WAIT_SECONDS = 0.05     # never hold the first request longer


class Arrivals:
    """Counts the prompts being built off the event loop (each becomes a request)."""

    def __init__(self) -> None:
        self.building = 0

    @contextlib.contextmanager
    def building_one(self):
        self.building += 1
        try:
            yield
        finally:
            self.building -= 1

    async def settle(self) -> None:
        """Return once no prompt is being built, or after MAX_WAIT_SECONDS."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + MAX_WAIT_SECONDS
        while self.building and loop.time() < deadline:
            await asyncio.sleep(POLL_SECONDS)
