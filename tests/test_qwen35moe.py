"""Qwen3.5-MoE (qwen35's gated-delta-net and gated-attention layers, a MoE FFN with
a sigmoid-gated shared expert) against llama.cpp 11434 on a tiny random-weight
model that tests/data/qwen35moe/make_model.py writes at test time (the golden.json
beside it: llama-server's greedy answers on that very file, by sha256)."""
import hashlib
import json
import pathlib

import data_scripts
import httpx
import pytest
from engine_helpers import generate, max_logprob_deviation, tokens
from server_harness import RunningServer

from ggserve.models.registry import ModelError, model_class
from ggserve.models.tokenizer.tokenizer import Tokenizer
from ggserve.native.gguf_file import GGUFFile
from ggserve.server.app import ServerConfig, create_app
from ggserve.server.engine.engine import Engine, EngineConfig

DATA = pathlib.Path(__file__).resolve().parent / "data" / "qwen35moe"
GOLDEN = json.loads((DATA / "golden.json").read_text(encoding="utf-8"))
CASES = {c["key"]: c for c in GOLDEN["cases"]}
NEAR_TIE = 0.02       # accepted divergence: llama.cpp's own top-2 gap below this
LOGPROB_TOL = 0.01


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> str:
    make_model = data_scripts.make_model(DATA)
    path = str(tmp_path_factory.mktemp("qwen35moe") / "synth-qwen35moe-q8_0.gguf")
    make_model.build(path)
    with open(path, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == GOLDEN["model_sha256"], \
            "make_model.py no longer writes the file golden.json was made on: rerun make_golden.py"
    return path


@pytest.fixture(scope="module")
def engine(model_file):
    e = Engine(EngineConfig(model_file, n_ctx=4096, n_batch=512, n_parallel=4, n_threads=2))
    yield e
    e.close()


def _steps(golden: dict) -> list[dict]:
    return [{"id": s["id"], "probs_available": s["probs_available"],
             "top_logprobs": [(t["id"], t["logprob"]) for t in s.get("top_logprobs", [])]} for s in golden["steps"]]


def _gap(step: dict) -> float:
    top = sorted((t["logprob"] for t in step["top_logprobs"]), reverse=True)
    return top[0] - top[1]


_SOLO = {}


def solo(engine, prompt: list[int], n: int):
    key = (tuple(prompt), n)
    if key not in _SOLO:
        engine.clear_cache()
        _SOLO[key] = generate(engine, {"r": prompt}, n)["r"]
    return _SOLO[key]


@pytest.mark.parametrize("key", list(CASES))
def test_completion_equals_llama_cpp(engine, key):
    golden = CASES[key]
    events = solo(engine, golden["prompt_ids"], len(golden["generated_ids"]))
    ours, gold = tokens(events), golden["generated_ids"]
    i = next((i for i, (a, b) in enumerate(zip(ours, gold)) if a != b), None)
    if i is not None:
        step = golden["steps"][i]
        assert step["probs_available"] and _gap(step) < NEAR_TIE, f"diverged at step {i}: {ours[i]} vs {gold[i]}"
    else:
        assert ours == gold
    worst = max_logprob_deviation(events, _steps(golden))
    print(f"max |logprob difference| {worst:.5f}")
    assert worst <= LOGPROB_TOL


def test_four_prompts_batched_equal_each_alone(engine):
    keys = ["capital", "story", "cjk", "long_prose"]          # 5, 13, 3 and 610 tokens
    engine.clear_cache()
    together = generate(engine, {k: CASES[k]["prompt_ids"] for k in keys}, 48)
    for k in keys:
        alone = solo(engine, CASES[k]["prompt_ids"], 48)
        assert tokens(together[k]) == tokens(alone)
        assert [e.top_logprobs for e in together[k]] == [e.top_logprobs for e in alone]


def _assert_same_as_llama_cpp(events, golden: dict) -> None:
    ours, gold = tokens(events), golden["generated_ids"][:len(events)]
    i = next((i for i, (a, b) in enumerate(zip(ours, gold)) if a != b), None)
    if i is not None:
        step = golden["steps"][i]
        assert step["probs_available"] and _gap(step) < NEAR_TIE, f"diverged at step {i}: {ours[i]} vs {gold[i]}"
        return
    assert max_logprob_deviation(events, _steps(golden)[:len(events)]) <= LOGPROB_TOL


def test_prompt_fed_in_chunks_equals_llama_cpp(model_file):
    prose = CASES["long_prose"]                                # 610 tokens in chunks of 64: the delta
    chunked = Engine(EngineConfig(model_file, n_ctx=4096, n_batch=64, n_parallel=1, n_threads=2))   # net's state
    try:                                                       # carries across chunks
        events = generate(chunked, {"r": prose["prompt_ids"]}, 24)["r"]
    finally:
        chunked.close()
    _assert_same_as_llama_cpp(events, prose)


def test_a_conversation_continued_from_its_saved_state_equals_a_fresh_prompt(engine):
    first = CASES["story"]["prompt_ids"]
    engine.clear_cache()
    answer = tokens(generate(engine, {"a": first}, 8)["a"])
    # the state holds the prompt and the first 7 answer tokens (the 8th was sampled, not computed)
    follow_up = first + answer[:7] + CASES["code_fib"]["prompt_ids"]
    reused = generate(engine, {"b": follow_up}, 16)["b"]
    assert reused[0].n_cached == len(first) + 7
    fresh = solo(engine, follow_up, 16)
    assert tokens(reused) == tokens(fresh)
    assert [e.top_logprobs for e in reused] == [e.top_logprobs for e in fresh]


def test_served_completion_equals_llama_server(model_file):
    golden = CASES["long_code"]
    cfg = ServerConfig(model=model_file, n_ctx=4096, n_parallel=2, n_batch=512, n_threads=2)
    body = {"prompt": golden["prompt_ids"], "max_tokens": 24, "temperature": 0, "logprobs": 5}
    with RunningServer(create_app(cfg)) as srv:
        r = httpx.post(srv.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["usage"]["prompt_tokens"] == len(golden["prompt_ids"])
    vocab = Tokenizer.from_gguf(model_file)             # golden ids -> their text in the GGUF's vocabulary
    text = lambda *ids: b"".join(vocab.token_bytes(i) for i in ids).decode("utf-8", "replace")
    assert out["choices"][0]["text"] == text(*golden["generated_ids"][:24])
    for mine, step in zip(out["choices"][0]["logprobs"]["top_logprobs"], golden["steps"][:24]):
        theirs = {text(t["id"]): t["logprob"] for t in step["top_logprobs"]}
        shared = set(mine) & set(theirs)
        assert len(shared) >= 4
        assert max(abs(mine[t] - theirs[t]) for t in shared) <= LOGPROB_TOL


def _build(path: str, meta_changes=None, drop=()):
    f = GGUFFile(path)
    meta = {**f.metadata, **(meta_changes or {})}
    tensors = {name: t for name, t in f.tensors.items() if name not in drop}
    return model_class("qwen35moe", path)(meta, tensors, path)


def test_the_model_has_experts_and_a_gated_shared_expert_in_every_layer(model_file):
    m = _build(model_file)
    assert (m.routing.n_expert, m.routing.n_used, m.n_ff_exp, m.n_ff_shexp) == (8, 2, 64, 64)
    assert m.is_recurrent == [True, True, True, False]
    assert all(L.shexp_gate is not None and L.ffn_up is not None for L in m.layers)


@pytest.mark.parametrize("n_expert", [6, 16])
def test_a_wrong_expert_count_is_a_clear_error(model_file, n_expert):
    with pytest.raises(ModelError, match=rf"synth-qwen35moe-.*\.gguf: tensor 'blk.0.ffn_gate_inp.weight' holds 8 "
                                         rf"experts, the metadata says expert_count = {n_expert}"):
        _build(model_file, {"qwen35moe.expert_count": n_expert})


def test_no_expert_count_is_a_clear_error(model_file):
    with pytest.raises(ModelError, match=r"qwen35moe needs qwen35moe.expert_count"):
        _build(model_file, {"qwen35moe.expert_count": 0})


def test_a_shared_expert_without_its_gate_names_the_tensor(model_file):
    with pytest.raises(ModelError, match=r"missing tensor 'blk.2.ffn_gate_inp_shexp.weight'"):
        _build(model_file, drop=("blk.2.ffn_gate_inp_shexp.weight",))
