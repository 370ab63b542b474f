"""llama-server 11434's context semantics: context sizes (-c 0, -np auto, a unified
KV cache), context shift, and quantized KV caches, against its recorded answers
(tests/data/kv_cache: make_reference.py and README say how they were made)."""
import json
import pathlib

import httpx
import pytest

from engine_helpers import GREEDY, generate_requests, tokens
from ggserve.server.cli.main import config_from_args, serve_parser
from ggserve.server.engine.engine import EngineConfig, Engine, Request
from ggserve.server.engine.memory.model_memory import context_sizes

DATA = pathlib.Path(__file__).parent / "data" / "kv_cache"


def _first_difference(ours, gold):
    return next((k for k, (a, b) in enumerate(zip(ours, gold)) if a != b), None)


def test_context_sizes_as_llama_cpp():
    # (KV cells, context per slot): -c 0 is the training context; sizes pad to 256;
    # without a unified cache each slot gets its padded share, capped by the training context
    assert context_sizes(0, 4, True, 8192) == (8192, 8192)
    assert context_sizes(3000, 4, True, 8192) == (3072, 3072)
    assert context_sizes(4096, 4, False, 8192) == (4096, 1024)
    assert context_sizes(4096, 3, False, 8192) == (4608, 1536)
    assert context_sizes(32768, 1, True, 8192) == (32768, 8192)
    with pytest.raises(ValueError, match="-c 0"):
        context_sizes(0, 4, True, 0)


def test_default_flags_are_llama_servers():
    cfg = config_from_args(serve_parser().parse_args([]))
    assert (cfg.n_ctx, cfg.n_parallel, cfg.kv_unified, cfg.context_shift) == (0, 4, True, False)
    cfg = config_from_args(serve_parser().parse_args(["-np", "2"]))
    assert (cfg.n_parallel, cfg.kv_unified) == (2, False)
    cfg = config_from_args(serve_parser().parse_args(["-np", "2", "-kvu", "-ctk", "q8_0", "-ctv", "q4_0"]))
    assert (cfg.kv_unified, cfg.cache_type_k, cfg.cache_type_v) == (True, "q8_0", "q4_0")


@pytest.mark.parametrize("kv_type", ["q8_0", "q4_0"])
def test_a_quantized_kv_cache_answers_as_llama_server(smollm2_path, kv_type):
    """-ctk/-ctv q8_0 or q4_0: K and V Hadamard-rotated before they are quantized, as
    llama.cpp 11434 does; greedy tokens equal llama-server's on the golden prompts."""
    ref = json.loads((DATA / f"{kv_type}.json").read_text())
    e = Engine(EngineConfig(smollm2_path, n_ctx=4096, n_parallel=1, n_threads=2, cache_type_k=kv_type, cache_type_v=kv_type))
    try:
        for case in ref["cases"][:4]:
            gold = case["generated_ids"]
            events = generate_requests(e, [Request(case["key"], case["prompt_ids"], GREEDY, max_tokens=len(gold),
                                                   ignore_eos=True)])[case["key"]]
            i = _first_difference(tokens(events), gold)
            if i is not None:       # the near-tie rule: llama.cpp's own top two were within 0.02
                top = case["top2"][i]
                assert top[0][1] - top[1][1] < 0.02, (case["key"], i)
            for ev, step in zip(events[:i], case["top2"]):        # (greedy: the token is the top one)
                assert abs(ev.logprob - step[0][1]) < 0.01
    finally:
        e.close()


def test_context_shift_goes_past_the_context_as_llama_server(smollm2_path):
    """-c 256 --context-shift, 400 tokens from a 26-token prompt: llama-server drops the
    oldest half of what follows n_keep each time the context is full; the tokens equal."""
    ref = json.loads((DATA / "context_shift.json").read_text())
    e = Engine(EngineConfig(smollm2_path, n_ctx=256, n_parallel=1, n_threads=2, context_shift=True))
    try:
        events = generate_requests(e, [Request("s", ref["prompt_ids"], GREEDY, max_tokens=ref["n_predict"],
                                               ignore_eos=True)])["s"]
        assert tokens(events) == ref["generated_ids"]
        assert events[-1].finish_reason == "length"
        assert e.kv.n_free == e.kv.size          # the shifted sequence left no cells behind
    finally:
        e.close()


def test_without_context_shift_a_generation_stops_at_the_context(smollm2_path):
    # a 250-token prompt in a 256-token context: 6 tokens, then "length" (llama-server's
    # n_past + 1 >= n_ctx stop), however many were asked for
    prompt = (json.loads((DATA / "context_shift.json").read_text())["prompt_ids"] * 10)[:250]
    e = Engine(EngineConfig(smollm2_path, n_ctx=256, n_parallel=1, n_threads=2))
    try:
        events = generate_requests(e, [Request("s", prompt, GREEDY, max_tokens=400, ignore_eos=True)])["s"]
        assert len(tokens(events)) == 6
        assert events[-1].finish_reason == "length"
    finally:
        e.close()


def test_a_long_conversation_with_default_flags(smollm2_path):
    """The default model with no flags (-c 0: its 8,192-token training context, four
    slots sharing it) answers a 3,000-token conversation; /v1/models reports the limit."""
    from ggserve.server.app import create_app
    from server_harness import RunningServer

    cfg = config_from_args(serve_parser().parse_args(["-t", "2"]))
    paragraph = ("The river runs past the old mill, where the miller keeps a ledger of every sack of "
                 "grain that comes in from the farms on the hills. ") * 12
    messages = []
    for turn in range(9):
        messages += [{"role": "user", "content": f"Part {turn}: {paragraph}"},
                     {"role": "assistant", "content": "Noted."}]
    messages.append({"role": "user", "content": "Which building is by the river?"})
    with RunningServer(create_app(cfg)) as srv:
        meta = httpx.get(srv.url + "/v1/models").json()["data"][0]["meta"]
        props = httpx.get(srv.url + "/props").json()
        r = httpx.post(srv.url + "/v1/chat/completions", timeout=600,
                       json={"messages": messages, "max_tokens": 4, "temperature": 0})
    assert (meta["n_ctx"], meta["n_ctx_train"], meta["kv_size"]) == (8192, 8192, 8192)
    assert (props["default_generation_settings"]["n_ctx"], props["total_slots"]) == (8192, 4)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] > 3000


KEEP = json.loads((DATA / "context_shift_keep.json").read_text())


@pytest.mark.parametrize("case,n_keep", [("flag", 8), ("request_n_keep_100", 100)])
def test_context_shift_keeps_n_keep_tokens_as_llama_server(smollm2_path, case, n_keep):
    """--keep / n_keep: the first n_keep tokens stay through every shift (llama-server's --keep 8,
    and a request's n_keep 100); the tokens equal its recorded answers."""
    e = Engine(EngineConfig(smollm2_path, n_ctx=256, n_parallel=1, n_threads=2, context_shift=True))
    try:
        events = generate_requests(e, [Request("s", KEEP["prompt_ids"], GREEDY, max_tokens=KEEP["n_predict"],
                                               ignore_eos=True, n_keep=n_keep)])["s"]
        assert tokens(events) == KEEP["cases"][case]["generated_ids"]
    finally:
        e.close()


def test_keep_flag_is_the_n_keep_of_requests_that_give_none(smollm2_path):
    from ggserve.server.app import create_app
    from server_harness import RunningServer

    args = serve_parser().parse_args(["-m", smollm2_path, *KEEP["llama_server_args"]])
    with RunningServer(create_app(config_from_args(args))) as s:
        r = httpx.post(s.url + "/completion", timeout=300, json={
            "prompt": KEEP["prompt_ids"], "n_predict": KEEP["n_predict"], "temperature": 0, "ignore_eos": True,
            "return_tokens": True, "cache_prompt": False}).json()
    assert r["generation_settings"]["n_keep"] == KEEP["cases"]["flag"]["n_keep"] == 8
    assert r["tokens"] == KEEP["cases"]["flag"]["generated_ids"]


def test_a_chat_requests_n_keep_is_read_and_keep_is_the_default(smollm2_path):
    from ggserve.server.app import ServerConfig, create_app
    from server_harness import RunningServer

    with RunningServer(create_app(ServerConfig(model=smollm2_path, n_ctx=512, n_parallel=1, n_keep=4))) as s:
        bad = httpx.post(s.url + "/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "n_keep": -2})
        assert bad.status_code == 400 and "n_keep" in bad.text
        got = httpx.post(s.url + "/completion", timeout=60, json={"prompt": "Hi", "n_predict": 1}).json()
        assert got["generation_settings"]["n_keep"] == 4
