"""Resumable streams (X-Conversation-Id, GET/DELETE /v1/stream, POST /v1/streams/lookup), as
llama-server 11434 serves them (server/api/stream_resume.py)."""
from __future__ import annotations

import json
import time
from urllib.parse import quote

import httpx
import pytest

from ggserve.server.app import ServerConfig, create_app
from server_harness import RunningServer

CONV = "conv-7::ggml-org/tinygemma3-GGUF:Q8_0"      # a model name with slashes travels in the query
QS = "conv_id=" + quote(CONV, safe="")


def chat(max_tokens: int, **kw) -> dict:
    return {"messages": [{"role": "user", "content": "Count to a hundred."}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, **kw}


@pytest.fixture(scope="module")
def srv(smollm2_path):
    with RunningServer(create_app(ServerConfig(model=smollm2_path, n_ctx=2048, n_parallel=2,
                                               n_threads=2))) as s:
        yield s


def lookup(srv, *ids) -> list:
    return httpx.post(srv.url + "/v1/streams/lookup", json={"conversation_ids": list(ids)}).json()


def wait_done(srv, conv_id: str = CONV) -> dict:
    for _ in range(600):
        found = [s for s in lookup(srv, conv_id) if s["conversation_id"] == conv_id]
        if found and found[0]["is_done"]:
            return found[0]
        time.sleep(0.05)
    raise TimeoutError


def contents(sse_text: str) -> list[str]:
    out = []
    for block in sse_text.split("\n\n"):
        if block.startswith("data: {"):
            choices = json.loads(block[6:])["choices"]
            if choices and choices[0]["delta"].get("content"):
                out.append(choices[0]["delta"]["content"])
    return out


def test_a_finished_stream_replays_byte_for_byte(srv):
    sent = httpx.post(srv.url + "/v1/chat/completions", json=chat(12), headers={"X-Conversation-Id": CONV},
                      timeout=120).text
    assert httpx.get(f"{srv.url}/v1/stream?{QS}&from=0").text == sent
    assert httpx.get(f"{srv.url}/v1/stream?{QS}&from=100").text == sent[100:]
    info = wait_done(srv)
    assert info["total_bytes"] == len(sent.encode()) and info["completed_at"] >= info["started_at"] > 0


def test_generation_goes_on_when_the_client_leaves(srv):
    alone = contents(httpx.post(srv.url + "/v1/chat/completions", json=chat(60, ignore_eos=True),
                                timeout=120).text)
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=chat(60, ignore_eos=True),
                      headers={"X-Conversation-Id": CONV}, timeout=120) as r:
        next(r.iter_lines())                   # the first frame, then the client is gone
    wait_done(srv)
    replay = httpx.get(f"{srv.url}/v1/stream?{QS}").text
    assert contents(replay) == alone            # the whole answer, as if the client had stayed
    assert replay.endswith("data: [DONE]\n\n")


def test_a_reader_follows_a_live_stream_to_its_end(srv):
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=chat(80, ignore_eos=True),
                      headers={"X-Conversation-Id": CONV}, timeout=120) as r:
        lines = r.iter_lines()
        next(lines)
        follower = httpx.get(f"{srv.url}/v1/stream?{QS}&from=0", timeout=120).text   # while it generates
        sent = "\n".join(lines)
    assert follower.endswith("data: [DONE]\n\n")
    assert len(contents(follower)) == 80 and sent.rstrip().endswith("data: [DONE]")


def test_stop_ends_the_generation_and_the_session(srv):
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=chat(1500, ignore_eos=True),
                      headers={"X-Conversation-Id": CONV}, timeout=120) as r:
        lines = r.iter_lines()
        next(lines)
        t0 = time.monotonic()
        assert httpx.delete(f"{srv.url}/v1/stream?{QS}").status_code == 204
        rest = list(lines)                      # the stream ends, cleanly, at once
    assert time.monotonic() - t0 < 5 and len(contents("\n\n".join(rest))) < 1500
    assert httpx.get(f"{srv.url}/v1/stream?{QS}").status_code == 404
    time.sleep(0.2)
    assert not any(s["is_processing"] for s in httpx.get(srv.url + "/slots").json())     # nothing left running
    assert httpx.delete(f"{srv.url}/v1/stream?{QS}").status_code == 204                 # idempotent


def test_a_new_stream_under_the_same_id_replaces_the_old(srv):
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=chat(1500, ignore_eos=True),
                      headers={"X-Conversation-Id": CONV}, timeout=120) as old:
        lines = old.iter_lines()
        next(lines)
        new = httpx.post(srv.url + "/v1/chat/completions", json=chat(8), headers={"X-Conversation-Id": CONV},
                         timeout=120).text
        assert len(contents("\n\n".join(lines))) < 1500          # the old one was stopped
    assert httpx.get(f"{srv.url}/v1/stream?{QS}").text == new


def test_lookup_answers_only_the_ids_asked(srv):
    httpx.post(srv.url + "/v1/chat/completions", json=chat(2), headers={"X-Conversation-Id": "other::m"},
               timeout=120)
    assert [s["conversation_id"] for s in lookup(srv, "other")] == ["other::m"]     # id::model matches id
    assert lookup(srv) == [] and lookup(srv, "nobody") == []


def test_only_streamed_answers_are_kept(srv):
    r = httpx.post(srv.url + "/v1/chat/completions", json={**chat(2), "stream": False},
                   headers={"X-Conversation-Id": "plain"}, timeout=120)
    assert r.status_code == 200 and lookup(srv, "plain") == []


@pytest.mark.parametrize("query,status", [("", 400), ("conv_id=unknown", 404), (f"{QS}&from=x", 400)])
def test_bad_replays(srv, query, status):
    httpx.post(srv.url + "/v1/chat/completions", json=chat(2), headers={"X-Conversation-Id": CONV}, timeout=120)
    r = httpx.get(f"{srv.url}/v1/stream?{query}")
    assert r.status_code == status and "error" in r.json()
