"""server/service/burst.py: an idle engine waits while prompts sent together are still
being built, and a few milliseconds after the latest began, so they start in one step;
a lone request waits no more than that."""
import asyncio
import time

from ggserve.server.service import burst


async def test_with_no_prompt_built_lately_the_engine_does_not_wait():
    arrivals = burst.Arrivals()
    t = time.perf_counter()
    await arrivals.settle()
    assert time.perf_counter() - t < 0.004          # the wait, were there one, is 50 ms


async def test_a_lone_request_waits_only_the_quiet_period_after_its_prompt_began():
    arrivals = burst.Arrivals()
    with arrivals.building_one():
        pass                                        # its prompt, built at once
    t = time.perf_counter()
    await arrivals.settle()
    assert burst.QUIET_SECONDS * 0.8 < time.perf_counter() - t < burst.MAX_WAIT_SECONDS


async def test_a_prompt_that_begins_just_after_the_first_one_ended_is_waited_for():
    # the race seen at 4 streams: the first prompt built in 0.9 ms, the next request's body
    # still being read; it reached the prompt thread 1.3 ms later
    arrivals = burst.Arrivals()

    async def build(after, seconds):
        await asyncio.sleep(after)
        with arrivals.building_one():
            await asyncio.sleep(seconds)

    with arrivals.building_one():
        pass
    second = asyncio.create_task(build(0.0015, 0.01))
    await arrivals.settle()
    assert second.done()


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
