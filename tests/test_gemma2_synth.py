"""Gemma 2 (gemma2: sliding-window attention on layers 0 and 2, global on 1 and 3,
softcapped attention and output logits, pre and post norms, GeGLU) against llama.cpp
11434 on a tiny random-weight model that tests/data/gemma2/make_model.py writes at
test time (golden.json beside it: llama-server's answers on that very file, by
sha256, made with the shared make_synth_golden.py; README.md there says how)."""
import hashlib
import json
import pathlib

import data_scripts
import httpx
import pytest
from engine_helpers import GREEDY, generate, generate_requests, tokens
from server_harness import RunningServer
from synth_golden import LOGPROB_TOL, assert_kv_caches_as_llama_cpp, assert_same_as_llama_cpp, kv_caches_in_log

from ggserve.models.registry import ModelError, model_class
from ggserve.models.tokenizer import Tokenizer
from ggserve.native.gguf_file import GGUFFile
from ggserve.server.app import ServerConfig, create_app
from ggserve.server.chat.prompts import PromptBuilder
from ggserve.server.engine.engine import Engine, EngineConfig, Request

DATA = pathlib.Path(__file__).resolve().parent / "data" / "gemma2"
GOLDEN = json.loads((DATA / "golden.json").read_text(encoding="utf-8"))
COMPLETIONS = {c["key"]: c for c in GOLDEN["completions"]}
TOKENIZE_VARIANTS = {"nobos_special": (False, True), "bos_special": (True, True), "nobos_nospecial": (False, False)}


def _write_model(tmp_path_factory, golden: dict) -> str:
    make_model = data_scripts.make_model(DATA)
    path = str(tmp_path_factory.mktemp("gemma2") / golden["model_file"])
    make_model.build(path)
    with open(path, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == golden["model_sha256"], \
            "make_model.py no longer writes the file the golden was made on: remake the golden (README.md)"
    return path


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> str:
    return _write_model(tmp_path_factory, GOLDEN)


@pytest.fixture(scope="module")
def tokenizer(model_file) -> Tokenizer:
    return Tokenizer.from_gguf(model_file)


def _engine(path: str, **kw) -> Engine:
    """Set up as llama-server ran it: prompts over 512 tokens cut into 512-row ubatches, 2 threads."""
    kw.setdefault("n_ctx", 8192)
    kw.setdefault("n_batch", 512)
    kw.setdefault("n_parallel", 4)
    return Engine(EngineConfig(path, n_threads=2, **kw))


@pytest.fixture(scope="module")
def engine(model_file):
    e = _engine(model_file)
    yield e
    e.close()


_SOLO = {}


def _solo(engine, prompt: list[int], n: int):
    """prompt run alone on an empty cache, n greedy tokens (cached per prompt)."""
    key = (tuple(prompt), n)
    if key not in _SOLO:
        engine.clear_cache()
        _SOLO[key] = generate(engine, {"r": prompt}, n)["r"]
    return _SOLO[key]


def _same_events(a, b) -> None:
    """Token for token and logprob for logprob the same (bit for bit)."""
    assert tokens(a) == tokens(b)
    assert [e.top_logprobs for e in a] == [e.top_logprobs for e in b]


def test_the_model_loads_as_gemma2_with_its_windows_softcaps_and_scales(model_file):
    meta = GGUFFile(model_file).metadata
    assert meta["general.architecture"] == "gemma2"
    m = model_class("gemma2")(meta, GGUFFile(model_file).tensors, model_file)
    assert (m.n_layer, m.n_head, m.n_head_kv, m.head_dim, m.n_ff) == (4, 4, 2, 16, 128)
    assert (m.swa_layers, m.window) == ([True, False, True, False], 32)      # pattern 2: llama.cpp's default
    assert (m.attn_softcap, m.final_softcap, m.q_scale, m.kq_scale, m.embd_scale) == (50.0, 30.0, 0.25, 1.0, 8.0)
    assert m.output is m.tok_embd and all(L.attn_post_norm is not None and L.ffn_post_norm is not None for L in m.layers)


def test_a_missing_post_norm_names_the_file_and_the_tensor(model_file):
    f = GGUFFile(model_file)
    tensors = {k: v for k, v in f.tensors.items() if k != "blk.1.post_ffw_norm.weight"}
    with pytest.raises(ModelError, match=r"gemma2.*blk\.1\.post_ffw_norm\.weight"):
        model_class("gemma2")(f.metadata, tensors, model_file)


def test_kv_caches_hold_what_llama_cpp_reports(model_file):
    # llama-server's two caches: global layers 1, 3 (4096 cells); sliding layers 0, 2 (a 32-token window + a
    # 512-row ubatch, padded: 768 cells)
    e = _engine(model_file, n_ctx=4096, n_parallel=1)                # as llama-server ran it
    try:
        assert_kv_caches_as_llama_cpp(e.memory, kv_caches_in_log(GOLDEN["kv_cache_log"]),
                                      {"non-SWA": [1, 3], "SWA": [0, 2]})
    finally:
        e.close()


@pytest.mark.parametrize("entry", GOLDEN["tokenize"], ids=lambda e: e["key"])
def test_tokenization_equals_llama_servers(tokenizer, entry):
    for name, expected in entry["variants"].items():
        add_special, parse_special = TOKENIZE_VARIANTS[name]
        assert tokenizer.encode(entry["text"], add_special=add_special, parse_special=parse_special) == expected["ids"], name


@pytest.mark.parametrize("case", GOLDEN["completions"], ids=lambda c: c["key"])
def test_completion_equals_llama_cpp(engine, case):
    assert_same_as_llama_cpp(_solo(engine, case["prompt_ids"], len(case["generated_ids"])), case)


@pytest.mark.parametrize("conv", GOLDEN["chats"], ids=lambda c: c["key"])
def test_chat_renders_tokenizes_and_answers_as_llama_server(engine, conv):
    golden = conv["chat_completion"]
    messages = golden["request"]["messages"]
    prefill = messages[-1]["role"] == "assistant"             # llama-server continues a final assistant message
    prompt = PromptBuilder.for_engine(engine).chat(messages, continue_final=prefill)
    assert prompt.text == conv["prompt"]
    assert prompt.tokens == conv["prompt_ids_add_special_parse_special"]
    assert golden["prompt_tokens"] == len(prompt.tokens)
    engine.clear_cache()
    r = Request("r", prompt.tokens, GREEDY, max_tokens=len(golden["generated_ids"]), ignore_eos=True,
                turn_starts=prompt.turn_starts)
    assert_same_as_llama_cpp(generate_requests(engine, [r])["r"], golden)


def test_four_concurrent_streams_equal_each_alone(engine):
    keys = ["capital", "code_fib", "cjk", "long_prose"]        # short ones decode while the long one fills
    prompts = {k: COMPLETIONS[k]["prompt_ids"] for k in keys}
    engine.clear_cache()
    together = generate(engine, prompts, 48)
    for k in keys:
        _same_events(together[k], _solo(engine, prompts[k], 48))


def test_a_prompt_longer_than_a_batch_equals_it_unbatched(model_file):
    # 675 tokens: 11 chunks of 64, each past the 32-token window, wrapping the 256-cell ring
    case = COMPLETIONS["long_prose"]
    runs = []
    for n_batch in (64, 1024):                                  # chunked, then one batch
        e = _engine(model_file, n_batch=n_batch, n_parallel=1, n_ctx=4096)
        try:
            runs.append(generate(e, {"r": case["prompt_ids"]}, 48)["r"])
        finally:
            e.close()
    _same_events(*runs)
    assert_same_as_llama_cpp(runs[0], case)


def test_served_chat_equals_llama_servers_message(model_file):
    conv = next(c for c in GOLDEN["chats"] if c["key"] == "multi_turn")
    golden = conv["chat_completion"]
    body = {"messages": golden["request"]["messages"], "max_tokens": len(golden["generated_ids"]),
            "temperature": 0, "logprobs": True, "top_logprobs": 5}
    cfg = ServerConfig(model=model_file, n_ctx=4096, n_parallel=2, n_batch=512, n_threads=2)
    with RunningServer(create_app(cfg)) as srv:
        r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert r.json()["usage"]["prompt_tokens"] == golden["prompt_tokens"]
    assert choice["finish_reason"] == golden["finish_reason"]
    assert {k: choice["message"].get(k) for k in golden["message"]} == golden["message"]
    ours = choice["logprobs"]["content"]
    assert b"".join(bytes(t["bytes"]) for t in ours) == b"".join(bytes(s.get("bytes", b"")) for s in golden["steps"])
    pairs = [(t, s) for t, s in zip(ours, golden["steps"]) if s["probs_available"]]
    assert max(abs(t["logprob"] - s["logprob"]) for t, s in pairs) <= LOGPROB_TOL
