"""Baidu ERNIE 4.5, dense (ernie4_5) and MoE (ernie4_5-moe: a dense first layer, then
softmax top-2 experts chosen with the exp_probs_b selection bias, plus a shared
expert), against llama.cpp 11434 on two tiny random-weight models that
tests/data/ernie4_5/make_model.py writes at test time (golden.json and
golden_moe.json beside it: llama-server's answers on those very files, by sha256,
made with the shared make_synth_golden.py; README.md there says how)."""
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

from ggserve.models.registry import ModelError, model_class
from ggserve.models.tokenizer import Tokenizer
from ggserve.native.gguf_file import GGUFFile
from ggserve.server.app import ServerConfig, create_app
from ggserve.server.chat.prompts import PromptBuilder
from ggserve.server.engine.engine import Engine, EngineConfig, Request

DATA = pathlib.Path(__file__).resolve().parent / "data" / "ernie4_5"
GOLDEN = {arch: json.loads((DATA / name).read_text(encoding="utf-8"))
          for arch, name in (("ernie4_5", "golden.json"), ("ernie4_5-moe", "golden_moe.json"))}
ARCHS = list(GOLDEN)
TOKENIZE_VARIANTS = {"nobos_special": (False, True), "bos_special": (True, True), "nobos_nospecial": (False, False)}


def _cases(field: str) -> list:
    return [pytest.param(arch, c, id=f"{arch}-{c['key']}") for arch in ARCHS for c in GOLDEN[arch][field]]


@pytest.fixture(scope="module")
def model_files(tmp_path_factory) -> dict[str, str]:
    make_model = data_scripts.make_model(DATA)
    folder = tmp_path_factory.mktemp("ernie4_5")
    paths = {}
    for arch, golden in GOLDEN.items():
        paths[arch] = str(folder / golden["model_file"])
        make_model.build(paths[arch], moe=arch == "ernie4_5-moe")
        with open(paths[arch], "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == golden["model_sha256"], \
                f"make_model.py no longer writes the {arch} file the golden was made on: remake it (README.md)"
    return paths


def _engine(path: str, **kw) -> Engine:
    """Set up as llama-server ran it: prompts over 512 tokens cut into 512-row ubatches, 2 threads."""
    kw.setdefault("n_ctx", 8192)
    kw.setdefault("n_batch", 512)
    kw.setdefault("n_parallel", 4)
    return Engine(EngineConfig(path, n_threads=2, **kw))


@pytest.fixture(scope="module")
def engines(model_files):
    es = {arch: _engine(path) for arch, path in model_files.items()}
    yield es
    for e in es.values():
        e.close()


_SOLO = {}


def _solo(engine, prompt: list[int], n: int):
    """prompt run alone on an empty cache, n greedy tokens (cached per engine and prompt)."""
    key = (id(engine), tuple(prompt), n)
    if key not in _SOLO:
        engine.clear_cache()
        _SOLO[key] = generate(engine, {"r": prompt}, n)["r"]
    return _SOLO[key]


def _same_events(a, b) -> None:
    """Token for token and logprob for logprob the same (bit for bit)."""
    assert tokens(a) == tokens(b)
    assert [e.top_logprobs for e in a] == [e.top_logprobs for e in b]


def _load(path: str, tensors=None):
    f = GGUFFile(path)
    return model_class(f.metadata["general.architecture"])(f.metadata, f.tensors if tensors is None else tensors, path)


def test_the_dense_model_loads_as_ernie4_5(model_files):
    m = _load(model_files["ernie4_5"])
    assert (m.arch, m.n_layer, m.n_head, m.n_head_kv, m.head_dim, m.n_rot, m.n_ff) == ("ernie4_5", 4, 4, 2, 16, 16, 128)
    assert m.routing is None and all(L.experts is None for L in m.layers)
    assert m.rope_scaling.freq_base == 500000.0


def test_the_moe_model_loads_with_a_dense_lead_experts_selection_bias_and_shared_expert(model_files):
    m = _load(model_files["ernie4_5-moe"])
    assert (m.routing.n_expert, m.routing.n_used, m.routing.norm_weights, m.n_ff_exp, m.n_ff_shexp) == (8, 2, True, 64, 64)
    assert [L.experts is not None for L in m.layers] == [False, True, True, True]       # leading_dense_block_count 1
    assert all(L.experts.probs_b is not None and L.shexp is not None for L in m.layers[1:])


def test_a_missing_expert_tensor_names_the_file_and_the_tensor(model_files):
    path = model_files["ernie4_5-moe"]
    tensors = {k: v for k, v in GGUFFile(path).tensors.items() if k != "blk.2.ffn_down_exps.weight"}
    with pytest.raises(ModelError, match=r"ernie4_5-moe.*blk\.2\.ffn_down_exps\.weight"):
        _load(path, tensors)


@pytest.mark.parametrize("arch", ARCHS)
def test_kv_cache_holds_what_llama_cpp_reports(model_files, arch):
    # "llama_kv_cache: size = 2.00 MiB (4096 cells, 4 layers, 1/1 seqs), K (f16): 1.00 MiB, V (f16): 1.00 MiB"
    m = re.search(r"size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers.*K \(f16\): +([\d.]+) MiB, V \(f16\): +([\d.]+) MiB",
                  GOLDEN[arch]["kv_cache_log"][0])
    mib, cells, n_layers, k_mib, v_mib = float(m[1]), int(m[2]), int(m[3]), float(m[4]), float(m[5])
    e = _engine(model_files[arch], n_ctx=4096, n_parallel=1)          # as llama-server ran it
    try:
        kv = e.memory.kv
        assert (kv.size, sum(t is not None for t in kv.k), sum(t is not None for t in kv.v)) == (cells, n_layers, n_layers)
        k = sum(t.nbytes for t in kv.k if t is not None) / 2**20
        v = sum(t.nbytes for t in kv.v if t is not None) / 2**20
        assert (round(k, 2), round(v, 2), round(k + v, 2)) == (k_mib, v_mib, mib)
    finally:
        e.close()


@pytest.mark.parametrize("entry", GOLDEN["ernie4_5"]["tokenize"], ids=lambda e: e["key"])
def test_tokenization_equals_llama_servers(model_files, entry):
    tokenizer = Tokenizer.from_gguf(model_files["ernie4_5"])
    for name, expected in entry["variants"].items():
        add_special, parse_special = TOKENIZE_VARIANTS[name]
        assert tokenizer.encode(entry["text"], add_special=add_special, parse_special=parse_special) == expected["ids"], name


@pytest.mark.parametrize("arch,case", _cases("completions"))
def test_completion_equals_llama_cpp(engines, arch, case):
    assert_same_as_llama_cpp(_solo(engines[arch], case["prompt_ids"], len(case["generated_ids"])), case)


@pytest.mark.parametrize("arch,conv", _cases("chats"))
def test_chat_renders_tokenizes_and_answers_as_llama_server(engines, arch, conv):
    engine, golden = engines[arch], conv["chat_completion"]
    messages = golden["request"]["messages"]
    prefill = messages[-1]["role"] == "assistant"             # llama-server continues a final assistant message
    text = engine.chat_template.render(messages, add_generation_prompt=True, continue_final_message=prefill)
    assert text == conv["prompt"]
    prompt = PromptBuilder.for_engine(engine).chat(messages, continue_final=prefill)
    assert prompt.tokens == conv["prompt_ids_add_special_parse_special"]
    assert golden["prompt_tokens"] == len(prompt.tokens)
    engine.clear_cache()
    r = Request("r", prompt.tokens, GREEDY, max_tokens=len(golden["generated_ids"]), ignore_eos=True,
                turn_starts=prompt.turn_starts)
    assert_same_as_llama_cpp(generate_requests(engine, [r])["r"], golden)


@pytest.mark.parametrize("arch", ARCHS)
def test_four_concurrent_streams_equal_each_alone(engines, arch):
    engine = engines[arch]
    cases = {c["key"]: c["prompt_ids"] for c in GOLDEN[arch]["completions"]}
    prompts = {k: cases[k] for k in ("capital", "code_fib", "cjk", "long_prose")}   # short ones decode while the long fills
    engine.clear_cache()
    together = generate(engine, prompts, 48)
    for k, prompt in prompts.items():
        _same_events(together[k], _solo(engine, prompt, 48))


@pytest.mark.parametrize("arch", ARCHS)
def test_a_prompt_longer_than_a_batch_equals_it_unbatched(model_files, arch):
    case = next(c for c in GOLDEN[arch]["completions"] if c["key"] == "long_code")    # 1042 tokens: 17 chunks of 64
    runs = []
    for n_batch in (64, 2048):                                  # chunked, then one batch
        e = _engine(model_files[arch], n_batch=n_batch, n_parallel=1, n_ctx=4096)
        try:
            runs.append(generate(e, {"r": case["prompt_ids"]}, 48)["r"])
        finally:
            e.close()
    _same_events(*runs)
    assert_same_as_llama_cpp(runs[0], case)


@pytest.mark.parametrize("arch", ARCHS)
def test_served_chat_equals_llama_servers_message(model_files, arch):
    conv = next(c for c in GOLDEN[arch]["chats"] if c["key"] == "system_user")
    golden = conv["chat_completion"]
    body = {"messages": golden["request"]["messages"], "max_tokens": len(golden["generated_ids"]),
            "temperature": 0, "logprobs": True, "top_logprobs": 5}
    cfg = ServerConfig(model=model_files[arch], n_ctx=4096, n_parallel=2, n_batch=512, n_threads=2)
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
