"""A long prompt arriving while a stream decodes, on the real engine: with a stall
budget (by default, EngineConfig.max_stall_ms < 0: twice a decode step or a quarter
second) the prompt is computed in steps beside the stream's, their prompt rows sized
from the measured step cost, and the stream gets a token every step; with the budget
off (0, llama-server's way) the prompt's steps hold it back for a whole -b batch."""
import statistics

import pytest
from engine_helpers import GREEDY

from ggserve.server.engine.engine import Engine, EngineConfig, Request

PROMPT = [(i * 7919) % 40000 + 100 for i in range(1100)]


def _stream_beside_a_long_prompt(path: str, max_stall_ms: float) -> list[tuple[float, float | None, bool]]:
    """(step seconds, budget planned for it, did the stream get a token) for every
    step that computed part of the long prompt beside the decoding stream."""
    # one thread: on a loaded machine two threads' barriers stretch steps far more than the plan
    engine = Engine(EngineConfig(path, n_threads=1, n_ctx=4096, n_parallel=2, max_stall_ms=max_stall_ms))
    try:
        engine.add(Request("stream", PROMPT[:100], GREEDY, max_tokens=400, ignore_eos=True))
        for _ in range(12):                  # its prompt step and decode steps: the cost is fitted
            engine.step()
        engine.add(Request("long", PROMPT, GREEDY, max_tokens=1, ignore_eos=True))
        steps = []
        while engine.scheduler.waiting or any(s.id == "long" for s in engine.scheduler.running):
            budget = engine.scheduler.stall_budget()
            events = engine.step()
            steps.append((engine.last_step_seconds, budget,
                          any(e.request_id == "stream" and e.token is not None for e in events)))
        return steps
    finally:
        engine.close()


@pytest.fixture(scope="module")
def default_steps(smollm2_path):
    return _stream_beside_a_long_prompt(smollm2_path, -1.0)


@pytest.fixture(scope="module")
def off_steps(smollm2_path):
    return _stream_beside_a_long_prompt(smollm2_path, 0.0)


def test_by_default_a_decoding_stream_gets_a_token_every_step_while_a_long_prompt_is_computed(default_steps):
    assert len(default_steps) > 3 and all(got for _, _, got in default_steps)


def test_by_default_the_steps_beside_a_long_prompt_are_far_shorter_than_a_whole_batch(default_steps, off_steps):
    # the median: a step on a loaded machine is stretched now and then, whatever its plan
    assert statistics.median(t for t, _, _ in default_steps) < 0.5 * max(t for t, _, _ in off_steps)


def test_with_the_budget_off_the_prompt_holds_the_stream_for_a_whole_batch(off_steps):
    # its first 100 tokens are the stream's prompt (copied): 511 + 489 rows beside the stream's
    assert len(off_steps) == 2
