"""Isolation between clients (issue 36): the prompt cache shared only within one cache salt
(a request's `cache_salt`, and its API key with --cache-isolation key) — in slots, among
running prompts, in the host-RAM cache and in slot files — and stored responses and
resumable streams that answer only to the API key that created them."""
from __future__ import annotations

import httpx
import pytest

from engine_helpers import GREEDY, generate_requests, tokens
from ggserve.server.app import ServerConfig, create_app
from ggserve.server.engine.engine import Engine, EngineConfig, Request
from server_harness import RunningServer

KEY_A, KEY_B = "key-a-0123456789", "key-b-9876543210"
A = {"Authorization": f"Bearer {KEY_A}"}
B = {"x-api-key": KEY_B}
SYSTEM = ("You are a helpful assistant who answers questions about colours, animals and "
          "cities in one short sentence, politely and without lists. The secret is 4711.")


def chat_body(question: str, **kw) -> dict:
    return {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
            "max_tokens": 8, "temperature": 0, **kw}


def ask(srv, headers: dict, question: str, **kw) -> tuple[str, int, int]:
    """(answer, prompt tokens, cached tokens) of a greedy chat completion."""
    r = httpx.post(srv.url + "/v1/chat/completions", json=chat_body(question, **kw), headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    return (r.json()["choices"][0]["message"]["content"], usage["prompt_tokens"],
            usage["prompt_tokens_details"]["cached_tokens"])


@pytest.fixture(scope="module")
def keyed(smollm2_path):
    """Two API keys, a prompt cache per key; one slot, so every turn after the first
    finds the other's prefix in the slot or in the host-RAM cache."""
    cfg = ServerConfig(model=smollm2_path, n_ctx=2048, n_parallel=1, n_threads=1, n_batch=256,
                       api_keys=[KEY_A, KEY_B], cache_isolation="key", cache_ram_mb=64)
    with RunningServer(create_app(cfg)) as s:
        yield s


@pytest.fixture(scope="module")
def open_srv(smollm2_path):
    """No keys, today's shared cache: only cache_salt splits it. Two slots."""
    cfg = ServerConfig(model=smollm2_path, n_ctx=2048, n_parallel=2, n_threads=1, n_batch=256)
    with RunningServer(create_app(cfg)) as s:
        yield s


# -- the prompt cache, per API key -----------------------------------------------------

def test_a_second_key_gets_no_cached_tokens_for_the_first_keys_exact_prompt(keyed):
    q = "Which animal barks?"
    text_a, n, cached = ask(keyed, A, q)
    assert cached == 0
    again_a = ask(keyed, A, q)
    assert again_a == (text_a, n, n - 1)               # the same key: the whole prefix (the last token runs)
    got_b = ask(keyed, B, q)                           # in A's slot, then in the host-RAM cache: not B's
    assert got_b == (text_a, n, 0)
    assert ask(keyed, A, q) == (text_a, n, n - 1)      # A's back from host RAM (B's slot left for it)
    assert ask(keyed, B, q) == (text_a, n, n - 1)      # and B's own cache works for B


def test_a_cache_salt_splits_one_keys_cache_further(keyed):
    q = "What colour is the sky?"
    text, n, _ = ask(keyed, A, q)
    assert ask(keyed, A, q, cache_salt="tenant-1") == (text, n, 0)
    assert ask(keyed, A, q, cache_salt="tenant-1") == (text, n, n - 1)
    assert ask(keyed, B, q, cache_salt="tenant-1") == (text, n, 0)        # the same salt, another key


def test_without_isolation_keys_share_as_llama_server_does(smollm2_path):
    cfg = ServerConfig(model=smollm2_path, n_ctx=1024, n_parallel=1, n_threads=1, n_batch=256,
                       api_keys=[KEY_A, KEY_B])               # --cache-isolation none, the default
    with RunningServer(create_app(cfg)) as srv:
        text, n, _ = ask(srv, A, "Which city is in France?")
        assert ask(srv, B, "Which city is in France?") == (text, n, n - 1)


# -- cache_salt on every generation endpoint -----------------------------------------

def _chat(srv, salt):
    body = chat_body("Name a red fruit.", **({"cache_salt": salt} if salt else {}))
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60).json()
    return r["choices"][0]["message"]["content"], r["usage"]["prompt_tokens_details"]["cached_tokens"]


def _completions(srv, salt):
    body = {"prompt": SYSTEM + " Name a green fruit.", "max_tokens": 8, "temperature": 0,
            **({"cache_salt": salt} if salt else {})}
    r = httpx.post(srv.url + "/v1/completions", json=body, timeout=60).json()
    return r["choices"][0]["text"], r["usage"]["prompt_tokens_details"]["cached_tokens"]


def _native(srv, salt):
    body = {"prompt": SYSTEM + " Name a blue fruit.", "n_predict": 8, "temperature": 0,
            **({"cache_salt": salt} if salt else {})}
    r = httpx.post(srv.url + "/completion", json=body, timeout=60).json()
    return r["content"], r["timings"]["cache_n"]


def _responses(srv, salt):
    body = {"instructions": SYSTEM, "input": "Name a yellow fruit.", "max_output_tokens": 8, "temperature": 0,
            "store": False, **({"cache_salt": salt} if salt else {})}
    r = httpx.post(srv.url + "/v1/responses", json=body, timeout=60).json()
    return r["output"][0]["content"][0]["text"], r["usage"]["input_tokens_details"]["cached_tokens"]


def _messages(srv, salt):
    body = {"system": SYSTEM, "messages": [{"role": "user", "content": "Name a purple fruit."}],
            "max_tokens": 8, "temperature": 0, **({"cache_salt": salt} if salt else {})}
    r = httpx.post(srv.url + "/v1/messages", json=body, timeout=60).json()
    return r["content"][0]["text"], r["usage"]["cache_read_input_tokens"]


@pytest.mark.parametrize("call", [_chat, _completions, _native, _responses, _messages],
                         ids=["chat", "completions", "completion", "responses", "messages"])
def test_different_salts_never_share_and_the_same_salt_does(open_srv, call):
    one, two = f"{call.__name__}-1", f"{call.__name__}-2"    # (the chat endpoints share SYSTEM)
    text, _ = call(open_srv, None)
    again = call(open_srv, None)
    assert again[0] == text and again[1] > 0
    assert call(open_srv, one) == (text, 0)               # unsalted prefixes are not the salt's
    assert call(open_srv, one) == again                   # the same salt: the whole prefix
    assert call(open_srv, two) == (text, 0)
    assert call(open_srv, one) == again                   # one's slot (or host-RAM entry) is still its own


def test_an_empty_or_non_string_cache_salt_is_refused(open_srv):
    for salt in ("", 7, ["a"]):
        r = httpx.post(open_srv.url + "/v1/chat/completions", json=chat_body("Hi", cache_salt=salt))
        assert r.status_code == 400, r.text
        assert "cache_salt" in r.text


# -- the engine: running prompts, host RAM, slot files ----------------------------------

@pytest.fixture(scope="module")
def engine(smollm2_path):
    e = Engine(EngineConfig(smollm2_path, n_ctx=2048, n_parallel=2, n_threads=1, cache_ram_mb=64))
    yield e
    e.close()


def _run(engine, prompt, salts: dict[str, str], n=4) -> dict[str, tuple[list[int], int]]:
    """Run requests of these ids and salts together: id -> (tokens, n_cached)."""
    events = generate_requests(engine, [Request(rid, list(prompt), GREEDY, max_tokens=n, ignore_eos=True,
                                                cache_salt=salt) for rid, salt in salts.items()])
    return {rid: (tokens(evs), evs[-1].n_cached) for rid, evs in events.items()}


def test_running_prompts_share_a_prefix_only_within_their_salt(engine):
    prompt = engine.tokenizer.encode(SYSTEM * 3 + " Running together.")
    engine.slots.clear()
    got = _run(engine, prompt, {"x1": "x", "y1": "y"})
    assert got["x1"][1] == got["y1"][1] == 0 and got["x1"][0] == got["y1"][0]
    engine.slots.clear()
    got = _run(engine, prompt, {"x2": "x", "x3": "x"})              # PrefixCache.share: one computes it
    assert sorted(c for _, c in got.values())[1] >= 32 and got["x2"][0] == got["x3"][0]


def test_the_host_ram_cache_gives_a_prefix_back_only_to_its_salt(engine):
    prompt = engine.tokenizer.encode(SYSTEM + " Host RAM.")
    other = engine.tokenizer.encode("Something else entirely, to push the first prompt out.")
    engine.slots.clear()
    first = _run(engine, prompt, {"h1": "s"})["h1"]
    for i in range(2):                                              # both slots taken by other prompts:
        _run(engine, other + [i], {f"o{i}": "s"})                   # the first one goes to host RAM
    assert all(engine.slots.slot_tokens(s)[:len(prompt)] != prompt for s in range(2))
    assert engine.slots.host is not None and len(engine.slots.host) > 0
    assert _run(engine, prompt, {"h2": "t"})["h2"] == (first[0], 0)           # another salt: nothing
    assert _run(engine, prompt, {"h3": "s"})["h3"] == (first[0], len(prompt) - 1)


def test_a_slot_file_keeps_its_salt(engine, tmp_path):
    prompt = engine.tokenizer.encode(SYSTEM + " Slot file.")
    engine.slots.clear()
    first = _run(engine, prompt, {"f1": "s"})["f1"]
    slot = next(s for s in range(2) if engine.slots.slot_tokens(s)[:len(prompt)] == prompt)
    path = str(tmp_path / "slot.bin")
    assert engine.save_slot(slot, path) is not None
    engine.slots.clear()
    engine.restore_slot(0, path)
    assert engine.slots.slot_salt(0) == "s"
    assert _run(engine, prompt, {"f2": "t"})["f2"] == (first[0], 0)
    assert _run(engine, prompt, {"f3": "s"})["f3"] == (first[0], len(prompt) - 1)


# -- stored responses and resumable streams: the creating key's alone ------------------

def assert_not_found(r: httpx.Response, code: str | None = None) -> None:
    assert r.status_code == 404, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and (code is None or err["code"] == code)


def test_another_key_cannot_read_continue_or_delete_a_stored_response(keyed):
    body = {"input": "Say hi.", "max_output_tokens": 4, "temperature": 0}
    r = httpx.post(keyed.url + "/v1/responses", json=body, headers=A, timeout=60)
    assert r.status_code == 200, r.text
    rid = r.json()["id"]
    unknown = "resp_" + "0" * 32
    for path in (f"/v1/responses/{rid}", f"/responses/{rid}"):
        assert_not_found(httpx.get(keyed.url + path, headers=B), "response_not_found")
        assert_not_found(httpx.delete(keyed.url + path, headers=B), "response_not_found")
    # the same answer as an id that never existed
    assert httpx.get(keyed.url + f"/v1/responses/{rid}", headers=B).json()["error"]["message"] == \
        httpx.get(keyed.url + f"/v1/responses/{unknown}", headers=B).json()["error"]["message"].replace(unknown, rid)
    assert_not_found(httpx.post(keyed.url + "/v1/responses", json={**body, "previous_response_id": rid},
                                headers=B, timeout=60), "previous_response_not_found")
    assert_not_found(httpx.post(keyed.url + "/v1/responses/input_tokens", json={**body, "previous_response_id": rid},
                                headers=B), "previous_response_not_found")
    assert httpx.get(keyed.url + f"/v1/responses/{rid}", headers=A).json()["id"] == rid    # still A's
    nxt = httpx.post(keyed.url + "/v1/responses", json={**body, "previous_response_id": rid}, headers=A, timeout=60)
    assert nxt.status_code == 200, nxt.text
    assert httpx.delete(keyed.url + f"/v1/responses/{rid}", headers=A).json()["deleted"] is True
    assert_not_found(httpx.get(keyed.url + f"/v1/responses/{rid}", headers=A), "response_not_found")


def test_another_key_cannot_resume_list_stop_or_replace_a_stream(keyed):
    conv = "conv-isolated"
    body = {"messages": [{"role": "user", "content": "Count to ten."}], "max_tokens": 16, "temperature": 0,
            "stream": True}
    r = httpx.post(keyed.url + "/v1/chat/completions", json=body, headers={**A, "X-Conversation-Id": conv},
                   timeout=60)
    assert r.status_code == 200 and "[DONE]" in r.text
    assert_not_found(httpx.get(keyed.url + "/v1/stream", params={"conv_id": conv}, headers=B))
    assert httpx.post(keyed.url + "/v1/streams/lookup", json={"conversation_ids": [conv]}, headers=B).json() == []
    assert httpx.delete(keyed.url + "/v1/stream", params={"conv_id": conv}, headers=B).status_code == 204
    # B's own stream under the same id is B's: A's is neither replaced nor stopped
    rb = httpx.post(keyed.url + "/v1/chat/completions", json={**body, "max_tokens": 2},
                    headers={**B, "X-Conversation-Id": conv}, timeout=60)
    assert rb.status_code == 200
    replay = httpx.get(keyed.url + "/v1/stream", params={"conv_id": conv}, headers=A, timeout=60)
    assert replay.status_code == 200 and replay.text == r.text          # A's stream, byte for byte
    assert httpx.get(keyed.url + "/v1/stream", params={"conv_id": conv}, headers=B, timeout=60).text == rb.text
    [mine] = httpx.post(keyed.url + "/v1/streams/lookup", json={"conversation_ids": [conv]}, headers=A).json()
    assert mine["total_bytes"] == len(r.content) and mine["is_done"]
    assert httpx.delete(keyed.url + "/v1/stream", params={"conv_id": conv}, headers=A).status_code == 204
    assert_not_found(httpx.get(keyed.url + "/v1/stream", params={"conv_id": conv}, headers=A))
    assert httpx.get(keyed.url + "/v1/stream", params={"conv_id": conv}, headers=B, timeout=60).status_code == 200
