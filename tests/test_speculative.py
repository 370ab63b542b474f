"""Speculative decoding (server/engine/speculative/speculator.py, server/engine/speculative/draft_model.py): drafted tokens
are verified in one step and the answers are llama.cpp's non-speculative ones,
token for token; rejected rows leave nothing in the KV cache; sampling keeps its
distribution (and, seeded, its very tokens).

llama.cpp's golden continuations (tests/data/completions.json, shared/golden/synth)
are the non-speculative answers: llama-server ran each prompt alone, one token per
step, and the plain engine reproduces them (test_engine_golden, test_engine_synth_*).
Where llama.cpp sits at a near-tie the plain engine's own answer is the reference
(the slow tests compare every golden prompt both ways)."""
import json
import math
import pathlib

import httpx
import numpy as np
import pytest

from engine_helpers import generate, generate_requests, tokens
from ggserve.server.engine.engine import EngineConfig, Engine, Request
from ggserve.server.engine.sampling.sampler import SamplingParams
from ggserve.server.engine.sequence import Sequence
from ggserve.server.engine.speculative.speculator import SpecConfig, draft_length, lookup, simple_draft
from synth_golden import case, completions, model_path

GOLDEN = {c["key"]: c for c in json.loads(
    (pathlib.Path(__file__).parent / "data" / "completions.json").read_text())["models"]["smollm2"]}
# prompts whose plain answers are llama.cpp's exactly (no near-tie); long_prose decodes
# over 768 cells: its rows take ggml's thread-split attention kernel, each over its own view
FOUR = ("capital", "code_fib", "counting", "long_prose")
# drafts whatever the step cost: these tests are about verification (draft_length has its own)
NGRAM = SpecConfig(type="ngram", adaptive=False)


def _engine(path, spec=None, **kw):
    kw.setdefault("n_parallel", 4)
    return Engine(EngineConfig(path, n_ctx=4096, n_batch=512, n_threads=2, spec=spec, **kw))


# -- drafting ------------------------------------------------------------------------

def test_lookup_drafts_what_followed_the_latest_match_of_the_longest_suffix():
    toks = np.array([5, 6, 7, 8, 9, 1, 6, 7, 3, 4, 9, 6, 7])
    # "6 7" occurs at 1 and 6 ("7 8 ..." and "7 3 ..."): the latest one wins
    assert lookup(toks, 2, 4, 3) == [3, 4, 9]
    assert lookup(toks, 3, 4, 3) == []          # no earlier "9 6 7" / "4 9 6 7"
    assert lookup(np.array([1, 2, 3, 1, 2]), 2, 2, 5) == [3, 1, 2]


def test_simple_draft_is_llama_cpp_ngram_simple():
    # size_n 2, size_m 3: pattern = last 2 tokens; search from cur - n - 1 down to 1
    toks = np.array([0, 4, 5, 6, 7, 8, 9, 4, 5])
    assert simple_draft(toks, 2, 3) == [6, 7, 8]
    assert simple_draft(np.array([4, 5, 6, 7, 8, 9, 1, 4, 5]), 2, 3) == []   # a match at index 0 is ignored
    assert simple_draft(toks[:6], 2, 3) == []   # too short: needs more than n + m + 1 tokens


def test_spec_config_checks_its_fields():
    with pytest.raises(ValueError, match="spec type"):
        SpecConfig(type="medusa")
    with pytest.raises(ValueError, match="draft model"):
        SpecConfig(type="draft-simple")
    assert SpecConfig(type="draft-simple", model_draft="d.gguf").n_max == 3     # llama.cpp's default
    assert SpecConfig(type="ngram-simple").n_max == 48


# -- greedy: llama.cpp's answers -------------------------------------------------------

def _accepted(e):
    s = e.stats()
    return s["spec_accepted_tokens"], s["spec_draft_tokens"]


def test_ngram_four_streams_equal_llama_cpp(smollm2_path):
    e = _engine(smollm2_path, NGRAM)
    out = generate(e, {k: GOLDEN[k]["prompt_ids"] for k in FOUR}, 48)
    accepted, drafted = _accepted(e)
    e.close()
    assert {k: tokens(v) for k, v in out.items()} == {k: GOLDEN[k]["generated_ids"] for k in FOUR}
    assert 0 < accepted < drafted           # drafts were verified, some rejected


def test_draft_model_for_itself_synth_qwen3_four_streams_equal_llama_cpp():
    keys = ("capital", "story", "code_fib", "long_prose")
    path = model_path("qwen3")
    e = _engine(path, SpecConfig(type="draft-simple", model_draft=path, n_max=4, adaptive=False))
    out = generate(e, {k: case("qwen3", k)["prompt_ids"] for k in keys}, 48)
    accepted, drafted = _accepted(e)
    e.close()
    assert {k: tokens(v) for k, v in out.items()} == {k: case("qwen3", k)["generated_ids"] for k in keys}
    assert accepted > 0.5 * drafted     # the same weights mostly agree (the draft has no kernel parity)


def test_rejected_drafts_leave_no_cells(smollm2_path):
    """After every step each running sequence holds exactly its computed tokens,
    one cell per position."""
    e = _engine(smollm2_path, NGRAM, n_parallel=2)
    for k in ("code_fib", "counting"):
        e.add(Request(k, GOLDEN[k]["prompt_ids"], SamplingParams(temperature=0.0), max_tokens=40, ignore_eos=True))
    while e.has_work():
        e.step()
        for s in e.scheduler.running:
            mine = (e.kv.seqs & (np.uint64(1) << np.uint64(s.slot))) != 0
            assert sorted(e.kv.pos[mine].tolist()) == list(range(s.n_computed))
    accepted, drafted = _accepted(e)
    assert e.memory.n_used == len(e.slots.slot_tokens(0)) + len(e.slots.slot_tokens(1))   # all that is left
    e.close()
    assert drafted > accepted > 0


def test_hybrid_models_refuse_a_draft_model_and_run_without_ngram_drafts():
    path = model_path("qwen35")
    with pytest.raises(ValueError, match="recurrent"):
        Engine(EngineConfig(path, n_ctx=512, n_parallel=1, n_threads=2, spec=SpecConfig(type="draft-simple", model_draft=path, adaptive=False)))
    e = Engine(EngineConfig(path, n_ctx=512, n_parallel=1, n_threads=2, spec=NGRAM))
    assert not e.spec.on
    e.close()


# -- sampling ------------------------------------------------------------------------

SAMPLED = dict(temperature=1.5, top_k=6)
DAYS = "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday. " * 2 + "Monday, Tuesday, Wednesday"


def _sampled(e, prompt, seeds, n):
    """Seeded sampled answers, four streams at a time."""
    out = {}
    for b in range(0, len(seeds), 4):
        out.update(generate_requests(e, [Request(f"s{s}", prompt, SamplingParams(seed=s, **SAMPLED), max_tokens=n,
                                                 ignore_eos=True) for s in seeds[b:b + 4]]))
    return [tuple(tokens(out[f"s{s}"])) for s in seeds]


def test_seeded_sampling_gives_the_same_tokens(smollm2_path):
    """Every output token is drawn from the model's own row with the draw it gets
    without drafts: same seed, same tokens."""
    spec, plain = _engine(smollm2_path, NGRAM), _engine(smollm2_path)
    prompt = spec.tokenizer.encode(DAYS, add_special=False)    # drafts from the second token on
    assert _sampled(spec, prompt, range(4), 12) == _sampled(plain, prompt, range(4), 12)
    accepted, drafted = _accepted(spec)
    spec.close()
    plain.close()
    assert 0 < accepted < drafted


@pytest.mark.slow
def test_sampled_answers_follow_the_plain_distribution(smollm2_path):
    """Across seeds, the answers follow the plain distribution: two-sample
    chi-square against other seeds without drafts."""
    spec, plain = _engine(smollm2_path, NGRAM), _engine(smollm2_path)
    prompt = spec.tokenizer.encode(DAYS, add_special=False)
    n = 160
    a = _sampled(spec, prompt, list(range(100, 100 + n)), 4)
    b = _sampled(plain, prompt, list(range(1000, 1000 + n)), 4)
    accepted, drafted = _accepted(spec)
    drafts = spec.stats()["spec_drafts"]
    spec.close()
    plain.close()
    # verified rows for most seeds (a draft of 8 verifies a 4-token answer at once), some rejected
    assert drafts >= n // 2 and 0 < accepted < drafted
    stat, df = _chi_square(a, b)
    assert df >= 3 and stat < _CHI2_999[df], (stat, df)


_CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46}   # 0.999 quantiles


def _chi_square(a, b):
    """Two-sample chi-square over the answers seen at least 10 times in all (the rest pooled)."""
    seen = {t for t in set(a) | set(b) if a.count(t) + b.count(t) >= 10}
    bins = sorted(seen)
    ca = [a.count(t) for t in bins] + [sum(1 for t in a if t not in seen)]
    cb = [b.count(t) for t in bins] + [sum(1 for t in b if t not in seen)]
    rows = [(x, y) for x, y in zip(ca, cb) if x + y]
    na, nb = sum(ca), sum(cb)
    stat = sum((math.sqrt(nb / na) * x - math.sqrt(na / nb) * y) ** 2 / (x + y) for x, y in rows)
    return stat, min(len(rows) - 1, 6)


# -- every golden prompt (slow) ---------------------------------------------------------

def _both(path, spec, prompts, n):
    outs = []
    for s in (None, spec):
        e = _engine(path, s)
        outs.append({k: tokens(v) for k, v in generate(e, prompts, n).items()})
        e.close()
    return outs


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ngram", "ngram-simple", "draft-simple"])
def test_every_smollm2_golden_prompt_equals_plain_decoding(smollm2_path, kind):
    spec = SpecConfig(type=kind, model_draft=smollm2_path if kind == "draft-simple" else None,
                      simple_n=3, simple_m=8, adaptive=False)
    keys = list(GOLDEN)
    for group in (keys[:4], keys[4:8], keys[8:]):       # four streams at a time
        plain, fast = _both(smollm2_path, spec, {k: GOLDEN[k]["prompt_ids"] for k in group}, 48)
        assert fast == plain


@pytest.mark.slow
def test_every_synth_qwen3_golden_prompt_equals_llama_cpp_with_itself_as_draft():
    path = model_path("qwen3")
    cases = completions()["models"]["qwen3"]
    e = _engine(path, SpecConfig(type="draft-simple", model_draft=path, n_max=6, adaptive=False))
    for group in (cases[:4], cases[4:]):
        out = generate(e, {c["key"]: c["prompt_ids"] for c in group}, 48)
        assert {k: tokens(v) for k, v in out.items()} == {c["key"]: c["generated_ids"] for c in group}
    e.close()


# -- served ----------------------------------------------------------------------------

def test_served_answer_has_draft_timings_and_metrics_count_them(smollm2_path):
    from ggserve.models.tokenizer import Tokenizer
    from ggserve.server.app import ServerConfig, create_app
    from server_harness import RunningServer

    golden = GOLDEN["code_fib"]
    cfg = ServerConfig(model=smollm2_path, n_ctx=2048, n_parallel=1, n_threads=2, metrics=True, spec=NGRAM)
    with RunningServer(create_app(cfg)) as srv:
        r = httpx.post(srv.url + "/v1/completions", json={
            "prompt": golden["prompt_ids"], "max_tokens": 48, "temperature": 0, "ignore_eos": True}, timeout=120)
        body = r.json()
        drafted, accepted = srv.metric("ggserve_spec_decode_num_draft_tokens_total"), \
            srv.metric("ggserve_spec_decode_num_accepted_tokens_total")
    assert body["choices"][0]["text"] == Tokenizer.from_gguf(smollm2_path).decode(golden["generated_ids"])
    t = body["timings"]
    assert t["predicted_n"] == 48 and 0 < t["draft_n_accepted"] < t["draft_n"]
    assert (drafted, accepted) == (t["draft_n"], t["draft_n_accepted"])


def _stream(accepted: float, rejected: float):
    s = Sequence(Request("s", [1, 2, 3]))
    s.recent_accepted, s.recent_rejected = accepted, rejected
    return s


# one stream on this CPU: a step of SmolLM2 costs 7.5 ms plus 2.2 ms a row
CPU_1 = (0.0075, 0.0022)


@pytest.mark.parametrize("streams,step_cost,accepted,rejected,k", [
    (1, CPU_1, 0, 0, 1),              # nothing known yet (p = 1/2): one token, the best bet
    (1, CPU_1, 20, 0.2, 8),           # a stream copying its prompt: the longest draft
    (1, CPU_1, 0, 4, 0),              # a free story the lookup mispredicts: none
    (8, (0.010, 0.002), 2, 2, 0),     # eight streams, rows dominate: half accepted does not pay
    (8, (0.010, 0.002), 40, 0.2, 8),  # ... nearly always accepted does
    (8, (0.010, 0.00001), 2, 2, 6),   # a GPU: rows are nearly free
    (8, None, 0, 5, 1),               # before any step was measured: a one-token probe
])
def test_a_draft_is_as_long_as_pays_for_its_rows(streams, step_cost, accepted, rejected, k):
    assert draft_length(_stream(accepted, rejected), streams, step_cost, 8) == k
