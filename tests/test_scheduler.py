"""The step scheduler: who runs in a step and how many tokens each."""
import dataclasses
from types import SimpleNamespace

import pytest

from ggserve.server.engine.scheduler import MAX_SKIPS, MIN_PROMPT_ROWS, STALL_DECODE_STEPS, STALL_FLOOR_S, Scheduler
from ggserve.server.engine.sequence import Request, Sequence


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


def _measured(sched: Scheduler, fixed: float, per_row: float) -> Scheduler:
    """Steps of 1 to 300 rows that took fixed + per_row * rows."""
    for rows in (1, 4, 60, 300, 2, 120):
        sched.observe(rows, per_row * rows, fixed + per_row * rows)
    return sched


def test_step_cost_is_fitted_from_measured_steps():
    fixed, per_row = _measured(_scheduler(), 0.004, 0.002).cost.fit()
    assert fixed == pytest.approx(0.004) and per_row == pytest.approx(0.002)


def test_one_streams_decode_steps_and_a_rare_draft_are_enough_to_fit_a_drafted_rows_cost():
    sched = _scheduler()
    for rows in (1,) * 9 + (9,):          # decode steps; one of them verifies 8 drafted tokens
        sched.observe(rows, 0.00225 * rows, 0.00575 + 0.00225 * rows)
    fixed, per_row = sched.decode_cost.fit()
    assert fixed == pytest.approx(0.00575) and per_row == pytest.approx(0.00225)


def test_a_one_token_probe_after_many_decode_steps_is_enough_to_fit_a_drafted_rows_cost():
    # the 1B Q4_K_M file on 2 cores: a decode step 19 ms, a drafted (solo) row 13 ms more
    sched = _scheduler()
    for rows in (1,) * 60 + (2,):         # a long stream's decode steps, then its first draft's verify
        sched.observe(rows, 0.013 * rows, 0.006 + 0.013 * rows)
    fixed, per_row = sched.decode_cost.fit()
    assert fixed == pytest.approx(0.006) and per_row == pytest.approx(0.013)


def test_where_rows_cost_most_prompts_arriving_together_go_one_by_one_shortest_first():
    # a CPU: the shortest prompt is answered after its own 40 rows, not after all 200
    sched = _measured(_scheduler(Sequence(Request("a", list(range(100)))), Sequence(Request("b", list(range(40)))),
                                 Sequence(Request("c", list(range(60)))), _decoding(0)), 0.002, 0.003)
    assert _rows(sched.schedule()) == [("d0", 1), ("b", 40)]


def test_where_a_step_costs_most_prompts_share_it():
    # a GPU: rows are nearly free, every prompt waiting goes in one step
    sched = _measured(_scheduler(Sequence(Request("a", list(range(100)))), Sequence(Request("b", list(range(40)))),
                                 _decoding(0)), 0.010, 0.00001)
    assert sorted(_rows(sched.schedule())) == [("a", 100), ("b", 40), ("d0", 1)]


def test_a_long_prompt_passed_over_too_often_goes_first():
    long = Sequence(Request("long", list(range(300))))
    sched = _measured(_scheduler(long, _decoding(0)), 0.002, 0.003)     # prompts arriving mid-stream
    for i in range(MAX_SKIPS):
        short = Sequence(Request(f"s{i}", list(range(20))))
        sched.add(short)
        sched.admit()
        assert _rows(sched.schedule()) == [("d0", 1), (f"s{i}", 20)]    # the new short one first ...
        short.n_computed = 20
        sched.remove(short.id)
    sched.add(Sequence(Request("late", list(range(20)))))
    sched.admit()
    assert _rows(sched.schedule())[1] == ("long", 300)         # ... until the long one waited enough


def test_drafts_wait_while_a_prompt_does():
    stream = _decoding(0)
    stream.draft = (7, 8, 9)
    sched = _scheduler(Sequence(Request("p", list(range(50)))), stream)
    assert _rows(sched.schedule()) == [("d0", 1), ("p", 50)]        # no draft rows before p's first token
    sched.running[0].n_computed = 50
    assert _rows(sched.schedule()) == [("d0", 4)]                   # then the draft is verified again


# -- the default stall budget: prompt chunks sized by time ------------------------

def _measured_with_decodes(sched: Scheduler, fixed: float, per_row: float, decode_rows: int) -> Scheduler:
    """_measured, then steps of decode_rows decoding rows alone."""
    _measured(sched, fixed, per_row)
    for _ in range(40):
        sched.observe(decode_rows, per_row * decode_rows, fixed + per_row * decode_rows)
    return sched


def _default_budget(*seqs, fixed: float, per_row: float) -> Scheduler:
    """`ggserve serve`'s default budget (max_stall_s < 0), after steps that took
    fixed + per_row * rows, the last ones the decodes of these sequences alone."""
    sched = Scheduler(16, 512, max_stall_s=-1.0)
    for s in seqs:
        sched.add(s)
    sched.admit()
    return _measured_with_decodes(sched, fixed, per_row, sum(not s.prefilling for s in seqs))


def test_by_default_a_step_beside_decodes_takes_the_prompt_rows_that_fit_two_decode_steps():
    # an 8B-like model on two cores: a decode step of two streams takes 0.46 s
    sched = _default_budget(Sequence(Request("p", list(range(900)))), _decoding(0), _decoding(1),
                            fixed=0.40, per_row=0.03)
    assert sched.stall_budget() == pytest.approx(STALL_DECODE_STEPS * 0.46, rel=1e-3)
    assert _rows(sched.schedule()) == [("d0", 1), ("d1", 1), ("p", 15)]
    assert sched.predicted_seconds(17) <= sched.stall_budget() < sched.predicted_seconds(18)


def test_where_decode_steps_are_short_the_budget_is_the_floor():
    # a 1B model on two cores: 50 ms + 4.5 ms a row
    sched = _default_budget(Sequence(Request("p", list(range(900)))), _decoding(0), _decoding(1),
                            fixed=0.050, per_row=0.0045)
    assert sched.stall_budget() == STALL_FLOOR_S
    assert _rows(sched.schedule()) == [("d0", 1), ("d1", 1), ("p", 42)]


def test_a_long_prompt_arriving_mid_stream_is_computed_in_steps_that_each_keep_the_budget():
    prompt = Sequence(Request("p", list(range(900))))
    sched = _default_budget(prompt, _decoding(0), fixed=0.050, per_row=0.0045)
    steps = 0
    while prompt.prefilling:
        chunks = sched.schedule()
        assert chunks[0].seq.id == "d0"                        # the stream decodes every step
        assert sched.predicted_seconds(sum(c.n for c in chunks)) <= sched.stall_budget()
        prompt.n_computed += chunks[1].n
        steps += 1
    assert steps == -(-900 // 43)                              # 43 prompt rows a step


def test_a_step_beside_decodes_that_took_longer_than_planned_shrinks_the_next_chunk():
    prompt = Sequence(Request("p", list(range(900))))
    sched = _default_budget(prompt, _decoding(0), fixed=0.050, per_row=0.0045)
    assert _rows(sched.schedule()) == [("d0", 1), ("p", 43)]
    prompt.n_computed += 43
    sched.observe(44, 0.40, 0.40)           # 43 prompt rows added 0.3455 s, not 0.19 s
    assert _rows(sched.schedule()) == [("d0", 1), ("p", 24)]      # (0.25 - 0.0545) / 0.00803


def test_before_a_decode_step_is_measured_the_default_budget_takes_the_smallest_chunks():
    sched = Scheduler(16, 512, max_stall_s=-1.0)
    for s in (Sequence(Request("p", list(range(900)))), _decoding(0)):
        sched.add(s)
    sched.admit()
    assert _rows(sched.schedule()) == [("d0", 1), ("p", MIN_PROMPT_ROWS)]


def test_with_the_budget_off_a_step_beside_decodes_takes_the_whole_batch():
    sched = _measured(_scheduler(Sequence(Request("p", list(range(900)))), _decoding(0)), 0.050, 0.0045)
    assert _rows(sched.schedule()) == [("d0", 1), ("p", 511)]


def test_prompts_arriving_together_get_their_first_tokens_in_one_step_as_in_llama_server():
    # the text workload's lengths: none of them starts decoding (to stall behind the
    # others' rows) before all are computed; the most rows pending go first
    prompts = [Sequence(Request(rid, list(range(n)))) for rid, n in (("a", 30), ("b", 210), ("c", 800), ("d", 30))]
    sched = _default_budget(*prompts, fixed=0.050, per_row=0.0045)
    plans = []
    while any(s.prefilling for s in prompts):
        chunks = sched.schedule()
        plans.append([(c.seq.id, c.n, c.wants_logits) for c in chunks])
        for c in chunks:
            c.seq.n_computed += c.n
    assert plans == [[("c", 512, False)],
                     [("c", 287, False), ("b", 209, False), ("a", 16, False)],
                     [("d", 30, True), ("a", 14, True), ("b", 1, True), ("c", 1, True)]]


def test_prompts_arriving_together_beyond_one_llama_server_batch_go_shortest_first():
    # llama-server answers the short one after its first 2048-row batch too, then
    # computes the rest while it decodes; here the rest goes in steps within the budget
    prompts = [Sequence(Request("short", list(range(30)))), Sequence(Request("long", list(range(3000))))]
    sched = _default_budget(*prompts, fixed=0.050, per_row=0.0045)
    assert _rows(sched.schedule()) == [("short", 30)]
