"""server/service/burst.py: an idle engine waits while prompts sent together are still
being built, so they start in one step; a lone request does not wait."""
import asyncio
import time

from ggserve.server.service import burst


async def test_a_lone_request_does_not_wait():
    arrivals = burst.Arrivals()
    t = time.perf_counter()
    await arrivals.settle()
    assert time.perf_counter() - t < 0.01          # the wait, were there one, is 50 ms


async def test_the_engine_waits_until_the_prompts_being_built_are_done(monkeypatch):
    monkeypatch.setattr(burst, "MAX_WAIT_SECONDS", 10.0)      # only the builds end the wait here
    arrivals = burst.Arrivals()

    async def build(seconds):
        with arrivals.building_one():
            await asyncio.sleep(seconds)

    builds = [asyncio.create_task(build(s)) for s in (0.002, 0.004, 0.006)]
    await asyncio.sleep(0)                      # all three started building
    assert arrivals.building == 3
    await arrivals.settle()
    assert arrivals.building == 0 and all(b.done() for b in builds)


async def test_a_slow_prompt_holds_the_others_no_longer_than_the_limit(monkeypatch):
    monkeypatch.setattr(burst, "MAX_WAIT_SECONDS", 0.02)
    arrivals = burst.Arrivals()

    async def build():
        with arrivals.building_one():
            await asyncio.sleep(10.0)

    slow = asyncio.create_task(build())
    await asyncio.sleep(0)
    t = time.perf_counter()
    await arrivals.settle()
    assert arrivals.building == 1 and time.perf_counter() - t < 5.0
    slow.cancel()
