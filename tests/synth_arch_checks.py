"""The checks every tiny random-weight architecture test (tests/test_*_synth.py) makes
against llama.cpp 11434's answers in its golden.json: the model file written as the
golden was made on, tokenization, greedy completions with logprobs, chat rendering and
answers, concurrent streams, chunked prompts and the served chat. Each test file keeps
its own test functions (one behaviour each) and calls these with its golden dict."""
from __future__ import annotations

import hashlib
import pathlib
import re

import data_scripts
import httpx
from engine_helpers import GREEDY, generate, generate_requests, tokens
from server_harness import RunningServer
from synth_golden import LOGPROB_TOL, assert_same_as_llama_cpp

from ggserve.server.app import ServerConfig, create_app
from ggserve.server.chat.prompts import PromptBuilder
from ggserve.server.engine.engine import Engine, EngineConfig, Request

TOKENIZE_VARIANTS = {"nobos_special": (False, True), "bos_special": (True, True), "nobos_nospecial": (False, False)}
STREAM_KEYS = ("capital", "code_fib", "cjk", "long_prose")   # short ones decode while the long one fills


def write_model(tmp_path_factory, data: pathlib.Path, golden: dict, tmp_name: str, **build_kw) -> str:
    """data/make_model.py's file, checked by sha256 to be the one the golden was made on."""
    make_model = data_scripts.make_model(data)
    path = str(tmp_path_factory.mktemp(tmp_name) / golden["model_file"])
    make_model.build(path, **build_kw)
    with open(path, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == golden["model_sha256"], \
            "make_model.py no longer writes the file the golden was made on: remake the golden (README.md)"
    return path


def make_engine(path: str, **kw) -> Engine:
    """Set up as llama-server ran it: prompts over 512 tokens cut into 512-row ubatches, 2 threads."""
    kw.setdefault("n_ctx", 8192)
    kw.setdefault("n_batch", 512)
    kw.setdefault("n_parallel", 4)
    return Engine(EngineConfig(path, n_threads=2, **kw))


_SOLO = {}


def solo(engine, prompt: list[int], n: int):
    """prompt run alone on an empty cache, n greedy tokens (cached per engine and prompt)."""
    key = (id(engine), tuple(prompt), n)
    if key not in _SOLO:
        engine.clear_cache()
        _SOLO[key] = generate(engine, {"r": prompt}, n)["r"]
    return _SOLO[key]


def same_events(a, b) -> None:
    """Token for token and logprob for logprob the same (bit for bit)."""
    assert tokens(a) == tokens(b)
    assert [e.top_logprobs for e in a] == [e.top_logprobs for e in b]


def completion(golden: dict, key: str) -> dict:
    return next(c for c in golden["completions"] if c["key"] == key)


def check_kv_cache(path: str, golden: dict) -> None:
    """One cache as llama-server's log line reports it, e.g. "llama_kv_cache: size = 2.00 MiB
    (4096 cells, 4 layers, 1/1 seqs), K (f16): 1.00 MiB, V (f16): 1.00 MiB"."""
    line = next(line for line in golden["kv_cache_log"] if "llama_kv_cache: size =" in line)
    m = re.search(r"size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers.*K \(f16\): +([\d.]+) MiB, V \(f16\): +([\d.]+) MiB",
                  line)
    mib, cells, n_layers, k_mib, v_mib = float(m[1]), int(m[2]), int(m[3]), float(m[4]), float(m[5])
    e = make_engine(path, n_ctx=4096, n_parallel=1)                  # as llama-server ran it
    try:
        kv = e.memory.kv
        assert (kv.size, sum(t is not None for t in kv.k), sum(t is not None for t in kv.v)) == (cells, n_layers, n_layers)
        k = sum(t.nbytes for t in kv.k if t is not None) / 2**20
        v = sum(t.nbytes for t in kv.v if t is not None) / 2**20
        assert (round(k, 2), round(v, 2), round(k + v, 2)) == (k_mib, v_mib, mib)
    finally:
        e.close()


def check_tokenization(tokenizer, entry: dict) -> None:
    for name, expected in entry["variants"].items():
        add_special, parse_special = TOKENIZE_VARIANTS[name]
        assert tokenizer.encode(entry["text"], add_special=add_special, parse_special=parse_special) == expected["ids"], name


def check_completion(engine, case: dict) -> None:
    assert_same_as_llama_cpp(solo(engine, case["prompt_ids"], len(case["generated_ids"])), case)


def check_chat(engine, conv: dict, render_template: bool = False) -> None:
    """The chat's prompt text and tokens, then its greedy answer, as llama-server's.
    render_template: also render the file's own template directly (not the ChatML fallback)."""
    golden = conv["chat_completion"]
    messages, tools = golden["request"]["messages"], golden["request"].get("tools")
    prefill = messages[-1]["role"] == "assistant"             # llama-server continues a final assistant message
    if render_template:
        text = engine.chat_template.render(messages, add_generation_prompt=True, tools=tools,
                                           continue_final_message=prefill)
        assert text == conv["prompt"]
    prompt = PromptBuilder.for_engine(engine).chat(messages, tools=tools, continue_final=prefill)
    assert prompt.text == conv["prompt"]
    assert prompt.tokens == conv["prompt_ids_add_special_parse_special"]
    assert golden["prompt_tokens"] == len(prompt.tokens)
    engine.clear_cache()
    r = Request("r", prompt.tokens, GREEDY, max_tokens=len(golden["generated_ids"]), ignore_eos=True,
                turn_starts=prompt.turn_starts)
    assert_same_as_llama_cpp(generate_requests(engine, [r])["r"], golden)


def check_concurrent_streams(engine, golden: dict) -> None:
    """Four prompts decoded together give what each gives alone."""
    prompts = {k: completion(golden, k)["prompt_ids"] for k in STREAM_KEYS}
    engine.clear_cache()
    together = generate(engine, prompts, 48)
    for k, prompt in prompts.items():
        same_events(together[k], solo(engine, prompt, 48))


def check_long_prompt(path: str, case: dict, whole_batch: int) -> None:
    """case's prompt in 64-row chunks equals it in one batch of whole_batch rows, and llama.cpp."""
    runs = []
    for n_batch in (64, whole_batch):                           # chunked, then one batch
        e = make_engine(path, n_batch=n_batch, n_parallel=1, n_ctx=4096)
        try:
            runs.append(generate(e, {"r": case["prompt_ids"]}, 48)["r"])
        finally:
            e.close()
    same_events(*runs)
    assert_same_as_llama_cpp(runs[0], case)


def check_served_chat(path: str, golden_file: dict, key: str) -> None:
    """/v1/chat/completions on the chat `key`: message, usage and logprobs as llama-server's."""
    golden = next(c for c in golden_file["chats"] if c["key"] == key)["chat_completion"]
    body = {"messages": golden["request"]["messages"], "max_tokens": len(golden["generated_ids"]),
            "temperature": 0, "logprobs": True, "top_logprobs": 5}
    cfg = ServerConfig(model=path, n_ctx=4096, n_parallel=2, n_batch=512, n_threads=2)
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
