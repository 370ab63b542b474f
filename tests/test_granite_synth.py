"""IBM Granite dense (granite: RoPE attention with rope_freqs factors, SwiGLU FFN,
Granite's embedding/attention/residual/logit scales) against llama.cpp 11434 on a
tiny random-weight model that tests/data/granite/make_model.py writes at
test time (golden.json beside it: llama-server's answers on that very file, by
sha256, made with the shared make_synth_golden.py; README.md there says how)."""
import datetime
import hashlib
import json
import pathlib
import re

import data_scripts
import httpx
import pytest
from engine_helpers import GREEDY, generate, generate_requests, tokens
from server_harness import RunningServer
from synth_golden import LOGPROB_TOL, assert_same_as_llama_cpp

import ggserve.models.chat_template as ct
from ggserve.models.registry import ModelError, model_class
from ggserve.models.tokenizer import Tokenizer
from ggserve.native.gguf_file import GGUFFile
from ggserve.server.app import ServerConfig, create_app
from ggserve.server.chat.prompts import PromptBuilder
from ggserve.server.engine.engine import Engine, EngineConfig, Request

DATA = pathlib.Path(__file__).resolve().parent / "data" / "granite"
GOLDEN = json.loads((DATA / "golden.json").read_text(encoding="utf-8"))
COMPLETIONS = {c["key"]: c for c in GOLDEN["completions"]}
# the same weights with rope.scaling.finetuned false: llama.cpp's answers without RoPE
GOLDEN_NO_ROPE = json.loads((DATA / "golden_no_rope.json").read_text(encoding="utf-8"))
TOKENIZE_VARIANTS = {"nobos_special": (False, True), "bos_special": (True, True), "nobos_nospecial": (False, False)}
# Granite 3.3's template prints today's date: render as on the day llama-server did
DAY = datetime.datetime.fromisoformat(GOLDEN["date"]).replace(hour=12)


def _write_model(tmp_path_factory, golden: dict, rope: bool) -> str:
    make_model = data_scripts.make_model(DATA)
    path = str(tmp_path_factory.mktemp("granite") / golden["model_file"])
    make_model.build(path, rope=rope)
    with open(path, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == golden["model_sha256"], \
            "make_model.py no longer writes the file the golden was made on: remake the golden (README.md)"
    return path


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> str:
    return _write_model(tmp_path_factory, GOLDEN, rope=True)


@pytest.fixture(scope="module")
def no_rope_engine(tmp_path_factory):
    e = _engine(_write_model(tmp_path_factory, GOLDEN_NO_ROPE, rope=False), n_parallel=1)
    yield e
    e.close()


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


def test_the_model_loads_as_dense_granite_with_rope_factors_and_scales(model_file):
    meta = GGUFFile(model_file).metadata
    assert meta["general.architecture"] == "granite"
    m = model_class("granite")(meta, GGUFFile(model_file).tensors, model_file)
    assert (m.n_layer, m.n_head, m.n_head_kv, m.head_dim, m.n_rot, m.n_ff) == (4, 4, 2, 16, 16, 128)
    assert m.routing is None and all(L.experts is None and L.ffn_gate is not None for L in m.layers)
    assert m.use_rope and m.rope_freqs is not None                 # rope.scaling.finetuned absent: RoPE on
    assert (m.embd_scale, m.kq_scale, m.logit_scale) == (12.0, 0.0078125, 8.0)
    assert m.residual_scale == pytest.approx(0.22)


def test_a_missing_ffn_tensor_names_the_file_and_the_tensor(model_file):
    f = GGUFFile(model_file)
    tensors = {k: v for k, v in f.tensors.items() if k != "blk.2.ffn_up.weight"}
    with pytest.raises(ModelError, match=r"granite.*blk\.2\.ffn_up\.weight"):
        model_class("granite")(f.metadata, tensors, model_file)


def test_kv_cache_holds_what_llama_cpp_reports(model_file):
    # "llama_kv_cache: size = 2.00 MiB (4096 cells, 4 layers, 1/1 seqs), K (f16): 1.00 MiB, V (f16): 1.00 MiB"
    m = re.search(r"size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers.*K \(f16\): +([\d.]+) MiB, V \(f16\): +([\d.]+) MiB",
                  GOLDEN["kv_cache_log"][0])
    mib, cells, n_layers, k_mib, v_mib = float(m[1]), int(m[2]), int(m[3]), float(m[4]), float(m[5])
    e = _engine(model_file, n_ctx=4096, n_parallel=1)                # as llama-server ran it
    try:
        kv = e.memory.kv
        assert (kv.size, sum(t is not None for t in kv.k), sum(t is not None for t in kv.v)) == (cells, n_layers, n_layers)
        k = sum(t.nbytes for t in kv.k if t is not None) / 2**20
        v = sum(t.nbytes for t in kv.v if t is not None) / 2**20
        assert (round(k, 2), round(v, 2), round(k + v, 2)) == (k_mib, v_mib, mib)
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


@pytest.mark.parametrize("case", GOLDEN_NO_ROPE["completions"], ids=lambda c: c["key"])
def test_rope_scaling_finetuned_false_runs_without_rope_as_llama_cpp(no_rope_engine, case):
    assert not no_rope_engine.model.use_rope
    no_rope_engine.clear_cache()
    assert_same_as_llama_cpp(generate(no_rope_engine, {"r": case["prompt_ids"]}, len(case["generated_ids"]))["r"], case)


@pytest.mark.parametrize("conv", GOLDEN["chats"], ids=lambda c: c["key"])
def test_chat_renders_tokenizes_and_answers_as_llama_server(engine, conv, monkeypatch):
    monkeypatch.setattr(ct, "now", lambda: DAY)
    golden = conv["chat_completion"]
    req = golden["request"]
    text = engine.chat_template.render(req["messages"], add_generation_prompt=True, tools=req.get("tools"))
    assert text == conv["prompt"]
    prompt = PromptBuilder.for_engine(engine).chat(req["messages"], tools=req.get("tools"))
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
    case = COMPLETIONS["long_code"]                             # 928 tokens: 15 chunks of 64
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
    conv = next(c for c in GOLDEN["chats"] if c["key"] == "system_user")
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
