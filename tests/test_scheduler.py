"""The step scheduler: who runs in a step and how many tokens each."""
import dataclasses
from types import SimpleNamespace

import pytest

from ggserve.server.scheduler import MIN_PROMPT_ROWS, Scheduler
from ggserve.server.sequence import Request, Sequence


def _decoding(i: int) -> Sequence:
    s = Sequence(Request(f"d{i}", [1, 2, 3]))
    s.n_computed = 3
    s.tokens.append(4)          # sampled, not yet in the cache
    return s


def _scheduler(*seqs, n_batch=512) -> Scheduler:
    sched = Scheduler(16, n_batch)
    for s in seqs:
        sched.add(s)
    sched.admit()
    return sched


def _rows(chunks) -> list[tuple[str, int]]:
    return [(c.seq.id, c.n) for c in chunks]


def test_decodes_come_first_and_prompts_fill_the_batch():
    sched = _scheduler(Sequence(Request("p", list(range(900)))), _decoding(0))
    assert _rows(sched.schedule()) == [("d0", 1), ("p", 511)]


def test_a_row_cap_shortens_prompt_chunks_while_streams_decode():
    sched = _scheduler(Sequence(Request("p", list(range(900)))), _decoding(0), _decoding(1))
    assert _rows(sched.schedule(max_rows=130)) == [("d0", 1), ("d1", 1), ("p", 128)]


def test_a_row_cap_leaves_prompt_chunks_at_least_the_minimum():
    sched = _scheduler(Sequence(Request("p", list(range(900)))), _decoding(0))
    assert _rows(sched.schedule(max_rows=0)) == [("d0", 1), ("p", MIN_PROMPT_ROWS)]


def test_a_row_cap_does_not_apply_without_decodes():
    sched = _scheduler(Sequence(Request("p", list(range(900)))))
    assert _rows(sched.schedule(max_rows=100)) == [("p", 512)]


def test_an_image_that_must_share_a_batch_may_exceed_the_row_cap():
    image = SimpleNamespace(start=10, end=266, bidirectional=True)
    prompt = Sequence(Request("p", list(range(300)), images=[image]))
    sched = _scheduler(prompt, _decoding(0))
    prompt.n_computed = 10                   # the text before the image is in the cache
    assert _rows(sched.schedule(max_rows=100)) == [("d0", 1), ("p", 256)]


def test_a_plan_is_frozen():
    sched = _scheduler(Sequence(Request("p", list(range(900)))), _decoding(0))
    plan = sched.plan(frozenset(), tile_ready=lambda key: True, encoder_free=True)
    assert _rows(plan.chunks) == [("d0", 1), ("p", 511)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.chunks = ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.chunks[1].n = 10
    assert isinstance(plan.chunks, tuple)


def test_a_chunk_stops_before_a_tile_not_encoded_and_the_encoder_gets_it():
    image = SimpleNamespace(start=10, end=266, bidirectional=True, key="img:0")
    sched = _scheduler(Sequence(Request("p", list(range(300)), images=[image])))
    plan = sched.plan(frozenset(), tile_ready=lambda key: False, encoder_free=True)
    assert _rows(plan.chunks) == [("p", 10)] and plan.encode is image and plan.encode_first is None
    assert not plan.chunks[0].wants_logits


def test_a_step_with_nothing_to_run_but_a_tile_encodes_it_first():
    image = SimpleNamespace(start=0, end=256, bidirectional=True, key="img:0")
    sched = _scheduler(Sequence(Request("p", list(range(300)), images=[image])))
    plan = sched.plan(frozenset(), tile_ready=lambda key: False, encoder_free=False)
    assert plan.chunks == () and plan.encode_first is image


def test_held_prompts_wait():
    sched = _scheduler(Sequence(Request("p", list(range(900)))), Sequence(Request("q", list(range(50)))))
    plan = sched.plan(frozenset({"p"}), tile_ready=lambda key: True, encoder_free=True)
    assert _rows(plan.chunks) == [("q", 50)] and plan.held == {"p"}
