"""The prompt cache that keeps conversations: slot choice by common prefix, the
host-RAM cache (--cache-ram) and what it restores, on SmolLM2 through the engine
and the HTTP server."""
from __future__ import annotations

import httpx
import numpy as np
import pytest

from engine_helpers import GREEDY, generate, tokens
from ggserve.server.app import ServerConfig, create_app
from ggserve.server.engine.engine import EngineConfig, Engine, Request
from ggserve.server.engine.memory.host_cache import HostCache
from ggserve.server.engine.memory.snapshot import Snapshot
from server_harness import RunningServer

SYSTEM = ("You are a helpful assistant who answers questions about colours, animals and "
          "cities in one short sentence, politely and without lists.")


@pytest.fixture(scope="module")
def engine_1slot(smollm2_path):
    e = Engine(EngineConfig(smollm2_path, n_ctx=2048, n_parallel=1, n_threads=1, cache_ram_mb=64))
    yield e
    e.close()


def _turn(engine, rid, prompt, n=8):
    events = generate(engine, {rid: prompt}, n)[rid]
    return tokens(events), [e.logprob for e in events], events[-1].n_cached


# -- slot choice ---------------------------------------------------------------------

def test_a_user_sharing_only_the_system_prompt_takes_another_slot(smollm2_path):
    e = Engine(EngineConfig(smollm2_path, n_ctx=2048, n_parallel=4, n_threads=1, cache_ram_mb=0))
    try:
        sys_ids = e.tokenizer.encode(SYSTEM)
        a = sys_ids + e.tokenizer.encode(" Alice asks: what colour is the sky?")
        b = sys_ids + e.tokenizer.encode(" Bob asks: which animal barks?")
        a_out, _, _ = _turn(e, "a1", a)
        _, _, b_cached = _turn(e, "b1", b)
        assert b_cached == len(sys_ids)                  # copied from Alice's slot
        held = [e.slots.slot_tokens(s) for s in range(4)]
        assert held[0] == (a + a_out)[:len(held[0])] and len(held[0]) == len(a) + len(a_out) - 1
        assert held[1][:len(b)] == b                     # Bob in the next slot, Alice's kept
        a2 = a + a_out + e.tokenizer.encode(" And at night?")
        _, _, a2_cached = _turn(e, "a2", a2)
        assert a2_cached == len(a) + len(a_out) - 1      # all of Alice's conversation
    finally:
        e.close()


def test_similarity_zero_takes_the_least_recently_used_slot(smollm2_path):
    e = Engine(EngineConfig(smollm2_path, n_ctx=2048, n_parallel=2, n_threads=1, cache_ram_mb=0,
               slot_prompt_similarity=0.0))
    try:
        a = e.tokenizer.encode(SYSTEM + " One.")
        _turn(e, "a", a, 2)
        _turn(e, "b", e.tokenizer.encode("Something else entirely."), 2)
        _, _, cached = _turn(e, "a2", a, 2)      # slot 0 (Alice's) is the least recently used
        assert cached == len(a) - 1 and e.slots.last[0].id == "a2"
    finally:
        e.close()


# -- host RAM ------------------------------------------------------------------------

def test_a_prefix_evicted_to_host_ram_and_restored_gives_the_same_greedy_tokens(engine_1slot):
    e = engine_1slot
    e.clear_cache()
    a1 = e.tokenizer.encode(SYSTEM + " Alice asks: what colour is grass?")
    out1, _, _ = _turn(e, "a1", a1)
    a2 = a1 + out1 + e.tokenizer.encode(" And snow?")
    kept_out, kept_lp, kept_cached = _turn(e, "a2-kept", a2)       # never left the slot
    assert kept_cached == len(a1) + len(out1) - 1
    _turn(e, "b", e.tokenizer.encode("Bob asks: which city is the capital of Italy?"))
    assert e.slots.host.stored >= 1                                 # Alice went to host RAM
    back_out, back_lp, back_cached = _turn(e, "a2-back", a2)
    assert back_cached == len(a2) - 1                               # all of it, from host RAM
    assert back_out == kept_out and back_lp == kept_lp              # bit for bit


def test_three_users_taking_turns_on_one_slot_keep_their_conversations(engine_1slot):
    e = engine_1slot
    e.clear_cache()
    convs = {u: e.tokenizer.encode(SYSTEM) for u in ("Ann", "Ben", "Cy")}
    for turn in range(4):
        for user, conv in convs.items():
            before = len(conv)
            conv += e.tokenizer.encode(f" {user}: question {turn}?")
            out, _, cached = _turn(e, f"{user}{turn}", conv, 4)
            if turn:
                assert cached >= before - 1, (user, turn, cached, before)
            conv += out


# -- host cache bookkeeping ------------------------------------------------------------

def _snap(toks, row=10):
    n = len(toks)
    return Snapshot(tuple(toks), np.arange(n, dtype=np.int32)[None], np.zeros(n, dtype=np.int64),
                    [b"k" * row * n], [b"v" * row * n])


def test_host_cache_finds_the_longest_prefix_and_gives_it_back_once():
    h = HostCache(10_000)
    h.put(_snap([1, 2, 3, 4]))
    h.put(_snap([1, 2, 9]))
    key, n = h.best([1, 2, 3, 4, 5], limit=4)
    assert n == 4 and h.take(key).tokens == (1, 2, 3, 4)
    assert h.best([1, 2, 3, 4, 5], limit=4)[1] == 2 and len(h) == 1


def test_host_cache_stores_a_prefix_once_and_drops_what_an_entry_extends():
    h = HostCache(10_000)
    assert h.put(_snap([1, 2, 3]))
    assert not h.put(_snap([1, 2]))            # already held as the start of [1, 2, 3]
    assert h.put(_snap([1, 2, 3, 4]))          # extends [1, 2, 3], which goes
    assert len(h) == 1 and h.nbytes == _snap([1, 2, 3, 4]).nbytes


def test_host_cache_drops_the_least_recently_stored_entry_when_full():
    one = _snap([1, 2]).nbytes
    h = HostCache(2 * one)
    h.put(_snap([1, 2]))
    h.put(_snap([3, 4]))
    h.put(_snap([5, 6]))
    assert len(h) == 2 and h.best([1, 2], 2) == (None, 0) and h.nbytes <= h.limit
    assert not h.put(_snap(list(range(10))))   # larger than the whole cache


# -- through the server: 3 users x 10 turns ------------------------------------------

def _chat(url, messages):
    r = httpx.post(url + "/v1/chat/completions", timeout=120, json={
        "messages": messages, "max_tokens": 6, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("n_parallel", [4, 1])
def test_three_users_ten_turns_interleaved_reuse_their_whole_conversation(smollm2_path, n_parallel):
    cfg = ServerConfig(model=smollm2_path, n_ctx=4096, n_parallel=n_parallel, n_threads=1, n_batch=256)
    with RunningServer(create_app(cfg)) as srv:
        convs = {u: [{"role": "system", "content": SYSTEM}] for u in ("Ann", "Ben", "Cy")}
        so_far = {u: 0 for u in convs}
        for turn in range(10):
            for user, msgs in convs.items():
                msgs.append({"role": "user", "content": f"{user} here, question {turn}: name a colour."})
                out = _chat(srv.url, msgs)
                usage = out["usage"]
                cached = usage["prompt_tokens_details"]["cached_tokens"]
                if turn:
                    assert cached >= 0.95 * so_far[user], (user, turn, cached, so_far[user])
                so_far[user] = usage["prompt_tokens"] + usage["completion_tokens"]
                msgs.append({"role": "assistant", "content": out["choices"][0]["message"]["content"]})


def test_an_image_prompt_evicted_to_host_ram_comes_back_without_recomputing_the_image(mmproj_dir, smollm2_path):
    import hashlib
    import pathlib

    from PIL import Image

    from engine_helpers import build_prompt, generate_requests

    e = Engine(EngineConfig(smollm2_path, n_ctx=2048, n_parallel=1, n_threads=1, cache_ram_mb=64,
               mmproj=str(mmproj_dir / "mmproj-synth-mlp-f16.gguf")))
    try:
        path = pathlib.Path(__file__).parent / "data" / "vision" / "grad_64x64.png"
        image = (hashlib.sha256(path.read_bytes()).hexdigest(), Image.open(path))
        text = ("<|im_start|>user\n<__media__>Describe this image.<|im_end|>\n"
                "<|im_start|>assistant\n")
        prompt, spans = build_prompt(e, text, [image])

        def run(rid):
            ev = generate_requests(e, [Request(rid, list(prompt), GREEDY, max_tokens=6, ignore_eos=True,
                                               images=build_prompt(e, text, [image])[1])])[rid]
            return tokens(ev), [x.logprob for x in ev], ev[-1].n_cached

        first = run("img1")
        kept = run("img-kept")                      # the slot still holds it
        _turn(e, "other", e.tokenizer.encode("A text prompt that evicts the image."), 2)
        back = run("img-back")                      # from host RAM
        assert len(spans) == 1 and kept[2] == back[2] == len(prompt) - 1
        assert back[:2] == kept[:2] and first[0] == kept[0]
    finally:
        e.close()


def test_a_hybrid_models_conversation_comes_back_from_host_ram_with_its_recurrent_state():
    from ggserve.server.chat.prompts import PromptBuilder
    from engine_helpers import generate_requests
    from synth_golden import model_path

    e = Engine(EngineConfig(model_path("qwen35"), n_ctx=2048, n_parallel=1, n_threads=1, cache_ram_mb=64))
    try:
        def ask(rid, messages, n):
            p = PromptBuilder.for_engine(e).chat(messages)
            ev = generate_requests(e, [Request(rid, p.tokens, GREEDY, max_tokens=n, ignore_eos=True,
                                               turn_starts=p.turn_starts)])[rid]
            return len(p.tokens), tokens(ev), [x.logprob for x in ev], ev[0].n_cached

        turn1 = [{"role": "system", "content": "You are a terse assistant."},
                 {"role": "user", "content": "What is 2 + 2?"}]
        turn2 = turn1 + [{"role": "assistant", "content": "4."}, {"role": "user", "content": "And 3 * 5?"}]
        n1 = ask("t1", turn1, 6)[0]
        kept = ask("t2-kept", turn2, 8)                                   # never left the slot
        assert kept[3] == n1 - 4       # the state saved before the first prompt's tail (tests/test_qwen35.py)
        e.clear_cache()
        ask("t1-again", turn1, 6)
        ask("other", [{"role": "user", "content": "Name a colour."}], 4)  # evicts to host RAM
        assert len(e.slots.host) == 1
        back = ask("t2-back", turn2, 8)
        assert back[1:] == kept[1:]                                       # same tokens, logprobs, cached
    finally:
        e.close()


def test_cache_reuse_is_refused_with_its_reason_and_cache_ram_below_minus_one_too():
    from ggserve.server.cli.main import config_from_args, serve_parser

    with pytest.raises(SystemExit, match="--cache-reuse is not supported"):
        config_from_args(serve_parser().parse_args(["--cache-reuse", "256"]))
    with pytest.raises(SystemExit, match="--cache-ram must be"):
        config_from_args(serve_parser().parse_args(["--cache-ram", "-2"]))
    with pytest.raises(SystemExit, match="--slot-prompt-similarity"):
        config_from_args(serve_parser().parse_args(["-sps", "1.5"]))


def test_evicting_an_idle_slot_frees_its_cells_and_keeps_its_prefix_in_host_ram(engine_1slot):
    e = engine_1slot
    e.clear_cache()
    a = e.tokenizer.encode(SYSTEM + " Alice asks: what colour is grass?")
    out, lp, _ = _turn(e, "a", a)
    used = e.memory.n_used
    assert used == len(a) + len(out) - 1 and e.slots.evict_idle()
    assert e.memory.n_used == 0 and not e.slots.evict_idle()           # nothing idle holds cells now
    again = a + out + e.tokenizer.encode(" And snow?")
    _, _, cached = _turn(e, "a2", again)
    assert cached == used
