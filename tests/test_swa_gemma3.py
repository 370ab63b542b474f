"""Gemma 3 270M's 15 sliding-window layers (window 512) in llama.cpp's iSWA ring, its 3
global layers over the whole context: the KV cache as llama-server 11434 reports it at
its defaults and at the golden's settings; context shift off with a ring, as llama-server
turns it off, and with --swa-full llama-server's tokens (tests/data/swa_memory:
make_reference.py and README.md say how they were recorded). The golden prompts longer
than the window (long_prose, long_code: 611 and 982 tokens, the latter wrapping the
1,024-cell ring) are in test_engine_golden.py."""
import dataclasses
import json
import math
import pathlib

import pytest
from engine_helpers import GREEDY, generate_requests, tokens
from synth_golden import NEAR_TIE, assert_kv_caches_as_llama_cpp, kv_caches_in_log

from ggserve.server.engine.engine import Engine, EngineConfig, Request

DATA = pathlib.Path(__file__).parent / "data" / "swa_memory"
LOGS = json.loads((DATA / "gemma3_load_logs.json").read_text())
LAYERS = {"non-SWA": [5, 11, 17], "SWA": [il for il in range(18) if il % 6 != 5]}


@pytest.mark.parametrize("name,kw", [
    ("defaults", dict(n_ctx=0, n_parallel=4, kv_unified=True)),      # 32,768 cells; one 2,560-cell ring
    ("c4096_np1", dict(n_ctx=4096, n_parallel=1)),                   # 4,096 cells; a 1,024-cell ring
])
def test_kv_cache_holds_what_llama_server_reports(gemma3_path, name, kw):
    e = Engine(EngineConfig(gemma3_path, n_threads=2, **kw))
    try:
        assert_kv_caches_as_llama_cpp(e.memory, kv_caches_in_log(LOGS[name]["log"]), LAYERS)
    finally:
        e.close()


def _long_code_in_1280(gemma3_path, ref_name: str, **kw):
    """(engine, reference, events): the golden's 982-token long_code prompt, -c 1280
    --context-shift -t 1, EOG tokens banned as llama-server's ignore_eos bans them."""
    ref = json.loads((DATA / ref_name).read_text())
    e = Engine(EngineConfig(gemma3_path, n_ctx=1280, n_parallel=1, n_threads=1, context_shift=True, **kw))
    no_eog = dataclasses.replace(GREEDY, logit_bias={t: -math.inf for t in e.tokenizer.eog_ids})
    events = generate_requests(e, [Request("s", ref["prompt_ids"], no_eog, max_tokens=ref["n_predict"],
                                           ignore_eos=True)])["s"]
    return e, ref, events


def _assert_same_up_to_a_near_tie(ours: list[int], ref: dict) -> None:
    """llama-server's tokens, up to a step where its own top two are within NEAR_TIE."""
    i = next((i for i, (a, b) in enumerate(zip(ours, ref["generated_ids"])) if a != b), None)
    if i is None:
        assert ours == ref["generated_ids"]
    else:
        (_, first), (_, second) = ref["top2"][i][:2]
        assert first - second < NEAR_TIE, f"step {i}: {ours[i]} vs llama-server's {ref['generated_ids'][i]}"


def test_a_ring_turns_context_shift_off_as_llama_server(gemma3_path):
    """A 1,024-cell ring (window 512 + ubatch 512) beside 1,280 cells cannot shift (llama.cpp's
    iSWA cache shifts only when both have one size; llama-server turns --context-shift
    off): generation wraps the ring and stops at the context, after llama-server's 298 tokens."""
    e, ref, events = _long_code_in_1280(gemma3_path, "gemma3_context_shift.json")
    try:
        assert (e.memory.swa.size, e.kv.size, e.context_shift) == (1024, 1280, False)
        assert len(tokens(events)) == len(ref["generated_ids"]) == 298
        assert events[-1].finish_reason == "length"
        _assert_same_up_to_a_near_tie(tokens(events), ref)
    finally:
        e.close()


def test_context_shift_with_swa_full_as_llama_server(gemma3_path):
    """--swa-full: every layer over the 1,280 cells, so the context shifts (keys re-rotated
    with each layer's rope) and generation goes on past it: 320 tokens, as llama-server's."""
    e, ref, events = _long_code_in_1280(gemma3_path, "gemma3_context_shift_swa_full.json", swa_full=True)
    try:
        assert (e.memory.swa, e.context_shift, ref["truncated"]) == (None, True, True)
        assert len(tokens(events)) == len(ref["generated_ids"]) == 320
        _assert_same_up_to_a_near_tie(tokens(events), ref)
    finally:
        e.close()
