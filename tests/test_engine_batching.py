"""Batching must not change results: prompts decoded together equal prompts alone,
a prompt fed in chunks equals it fed whole; sampling is reproducible."""
import json
import pathlib

import numpy as np
import pytest

from ggserve.server.engine.engine import EngineConfig, ContextLengthExceeded, Engine, Request
from ggserve.server.engine.sampling.sampler import SamplingParams
from engine_helpers import GREEDY, generate, tokens

CASES = json.loads((pathlib.Path(__file__).parent / "data" / "completions.json").read_text())["models"]["smollm2"]
FOUR = {c["key"]: c["prompt_ids"] for c in CASES[:4]}


def _engine(path, **kw):
    kw.setdefault("n_ctx", 2048)
    kw.setdefault("n_parallel", 4)
    return Engine(EngineConfig(path, n_threads=2, **kw))


@pytest.fixture(scope="module")
def solo_tokens(smollm2_path):
    out = {}
    for key, ids in FOUR.items():
        e = _engine(smollm2_path)
        out[key] = tokens(generate(e, {key: ids}, 32)[key])
        e.close()
    return out


def test_four_prompts_in_one_batch_equal_each_alone(smollm2_path, solo_tokens):
    e = _engine(smollm2_path)
    together = generate(e, FOUR, 32)
    e.close()
    assert {k: tokens(v) for k, v in together.items()} == solo_tokens


def test_prompt_in_chunks_of_7_equals_whole(smollm2_path, solo_tokens):
    e = _engine(smollm2_path, n_batch=7)
    chunked = generate(e, {"code_fib": FOUR["code_fib"]}, 32)
    e.close()
    assert tokens(chunked["code_fib"]) == solo_tokens["code_fib"]


def test_seeded_sampling_is_reproducible(smollm2_path):
    params = SamplingParams(temperature=0.9, seed=42)
    runs = []
    for _ in range(2):
        e = _engine(smollm2_path)
        runs.append(tokens(generate(e, {"s": FOUR["story"]}, 24, params)["s"]))
        e.close()
    assert runs[0] == runs[1]


def test_a_long_sequence_decoded_alone_equals_decoded_with_others(smollm2_path):
    # > 512 cells in use: ggml would switch a lone decode row to another kernel path
    long_prompt = CASES[9]["prompt_ids"][:600]
    e = _engine(smollm2_path, n_ctx=4096)
    alone = tokens(generate(e, {"long": long_prompt}, 16)["long"])
    e.close()
    e = _engine(smollm2_path, n_ctx=4096)
    together = generate(e, {"long": long_prompt, "short": FOUR["capital"]}, 16)
    e.close()
    assert tokens(together["long"]) == alone


def test_reusing_a_cached_prefix_gives_the_same_tokens(smollm2_path):
    prefix = CASES[8]["prompt_ids"][:200]                 # 200 tokens of long_prose
    question = FOUR["capital"]
    e = _engine(smollm2_path)
    fresh = tokens(generate(e, {"q": prefix + question}, 24)["q"])
    e.close()
    e = _engine(smollm2_path, n_parallel=2)
    generate(e, {"low": FOUR["counting"]}, 30)            # slot 0: the low cells
    generate(e, {"warm": prefix + FOUR["story"]}, 4)      # slot 1: the prefix, above them
    generate(e, {"other": FOUR["code_fib"]}, 2)           # slot 0 again: frees most low cells
    events = generate(e, {"q": prefix + question}, 24)["q"]   # reuses slot 1's prefix
    e.close()
    assert events[0].n_cached >= 190
    assert tokens(events) == fresh


def test_a_prefix_held_by_a_running_sequence_is_copied_and_gives_the_same_tokens(smollm2_path):
    # 600 tokens of prefix: past 512 cells, where the copied cells' layout matters
    prefix = CASES[8]["prompt_ids"][:600]
    question = FOUR["capital"]
    e = _engine(smollm2_path, n_ctx=4096, n_parallel=2)
    fresh = tokens(generate(e, {"q": prefix + question}, 24)["q"])
    e.close()
    e = _engine(smollm2_path, n_ctx=4096, n_parallel=2)
    e.add(Request("warm", prefix + FOUR["story"], GREEDY, max_tokens=40, ignore_eos=True))
    e.step()
    while e.scheduler.running[0].n_computed < len(prefix):
        e.step()                                           # "warm" holds the prefix and keeps running
    e.add(Request("q", prefix + question, GREEDY, max_tokens=24, ignore_eos=True))
    got = [ev for ev in e.step() if ev.request_id == "q"]
    q = next(s for s in e.scheduler.running if s.request.id == "q")
    c0, c1 = e.kv.view_for(q.slot)           # its own copy: 605 cells in one 768-cell span
    while e.has_work():
        got += [ev for ev in e.step() if ev.request_id == "q"]
    e.close()
    assert c1 - c0 == 768
    assert got[0].n_cached >= 590
    assert tokens(got) == fresh


def test_prompts_arriving_together_with_one_prefix_compute_it_once(smollm2_path):
    prefix = CASES[8]["prompt_ids"][:600]
    questions = {"q1": FOUR["capital"], "q2": FOUR["story"]}
    alone = {}
    for key, q in questions.items():
        e = _engine(smollm2_path, n_ctx=4096, n_parallel=2)
        alone[key] = tokens(generate(e, {key: prefix + q}, 16)[key])
        e.close()
    e = _engine(smollm2_path, n_ctx=4096, n_parallel=2)
    together = generate(e, {k: prefix + q for k, q in questions.items()}, 16)
    e.close()
    assert together["q2"][0].n_cached >= 590        # q1 computed the prefix, q2 copied it
    assert {k: tokens(v) for k, v in together.items()} == alone


def test_decode_steps_reuse_the_graph_of_the_first_decode_step(smollm2_path):
    e = _engine(smollm2_path)
    generate(e, {"c": FOUR["capital"]}, 32)      # 1 prompt step, 31 decode steps within 256 cells
    e.close()
    assert e.graph_builds == 2


def test_temperature_zero_equals_greedy(smollm2_path, solo_tokens):
    e = _engine(smollm2_path)
    got = tokens(generate(e, {"c": FOUR["capital"]}, 32, SamplingParams(temperature=0.0, top_k=40))["c"])
    e.close()
    assert got == solo_tokens["capital"]


def test_prompt_longer_than_slot_context_is_rejected(smollm2_path):
    e = _engine(smollm2_path, n_ctx=1024, n_parallel=4)     # 256 tokens per slot (llama.cpp pads to 256)
    with pytest.raises(ContextLengthExceeded):
        e.add(Request("long", list(range(100, 356))))
    e.close()


def test_cancel_frees_the_sequence_cells(smollm2_path):
    e = _engine(smollm2_path)
    e.add(Request("a", FOUR["story"], SamplingParams(temperature=0), max_tokens=100))
    e.step()
    assert e.stats()["kv_used"] > 0
    e.cancel("a")
    stats = e.stats()
    assert (stats["kv_used"], stats["running"], stats["waiting"]) == (0, 0, 0)


def test_a_row_with_non_finite_logits_ends_only_its_request(smollm2_path, solo_tokens):
    # fault injection: the graph's logits for one request's row become NaN in one step
    e = _engine(smollm2_path)
    run = e.runner.run

    def poisoned(batch, cells, n_threads):
        logits = run(batch, cells, n_threads)
        for i, c in enumerate(batch.out_chunks):
            if c.seq.id == "bad" and c.seq.n_generated == 3:
                logits[i, 7] = np.nan
        return logits

    e.runner.run = poisoned
    events = generate(e, {"bad": FOUR["story"], "capital": FOUR["capital"]}, 32)
    stats = e.stats()
    e.close()
    assert [ev.finish_reason for ev in events["bad"]][-1] == "error" and len(tokens(events["bad"])) == 3
    assert tokens(events["capital"]) == solo_tokens["capital"]
    assert (stats["running"], stats["waiting"]) == (0, 0)
