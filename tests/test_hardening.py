"""Hostile input, a busy event loop, stalled clients, shutdown and load failure
(issue 21): each finding of the probes, reproduced and now answered correctly."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from ggserve.server.app import ServerConfig, create_app
from ggserve.server.limits import MAX_DEPTH, key_matches
from server_harness import RunningServer

MAX_BODY = 16 * 2**20


@pytest.fixture(scope="module")
def server(smollm2_path):
    cfg = ServerConfig(model=smollm2_path, n_ctx=1024, n_parallel=4, n_batch=256, n_threads=1,
                       metrics=True, max_body_bytes=MAX_BODY, timeout=1.0)
    srv = RunningServer(create_app(cfg))
    # accepted sockets inherit this: a fixed small send buffer (loopback's autotuned one
    # holds megabytes), so a client that stops reading stalls the server's writes quickly
    srv._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
    with srv:
        yield srv


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def assert_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


def chat_body(**kw) -> dict:
    return {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0, **kw}


# -- JSON nesting -------------------------------------------------------------------

@pytest.mark.parametrize("depth", [2_000, 100_000])
@pytest.mark.parametrize("open_, close", [("[", "]"), ('{"a":', "}")])
def test_deep_nesting_is_400_and_the_connection_survives(client, depth, open_, close):
    raw = '{"messages":' + open_ * depth + "1" + close * depth + "}"
    err = assert_error(client.post("/v1/chat/completions", content=raw,
                                   headers={"content-type": "application/json"}), 400)
    assert "nesting" in err["message"]
    assert client.get("/health").status_code == 200      # same keep-alive connection


def test_nesting_at_the_limit_reaches_validation(client):
    deep = "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)
    err = assert_error(client.post("/tokenize", content='{"content":' + deep + "}"), 400)
    assert err["param"] == "content"         # parsed; refused by the schema, not by the depth limit


# -- lone surrogates ------------------------------------------------------------------

def test_lone_surrogate_in_model_is_400_and_the_connection_survives(client, server):
    raw = '{"model": "\\ud800", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}'
    err = assert_error(client.post("/v1/chat/completions", content=raw), 400)
    assert "surrogate" in err["message"]
    assert client.get("/health").status_code == 200
    text = client.get("/metrics").text
    assert 'ggserve_requests_total{endpoint="chat",status="400"}' in text    # counted


def test_lone_surrogate_in_streamed_echo_prompt_is_400(client):
    raw = '{"prompt": "Hello \\udc00", "echo": true, "stream": true, "max_tokens": 4}'
    err = assert_error(client.post("/v1/completions", content=raw), 400)
    assert "surrogate" in err["message"]
    assert "ggserve_requests_running 0.0" in client.get("/metrics").text   # nothing left generating


def test_utf8_encoded_surrogate_bytes_are_400(client):
    raw = b'{"content": "\xed\xa0\x80"}'
    err = assert_error(client.post("/tokenize", content=raw), 400)
    assert "UTF-8" in err["message"]


def test_surrogate_pair_is_text(client):
    r = client.post("/tokenize", content='{"content": "\\ud83d\\ude00"}')
    assert r.status_code == 200 and r.json()["tokens"]


# -- body size ------------------------------------------------------------------------

def test_body_over_the_limit_is_413(client):
    err = assert_error(client.post("/tokenize", json={"content": "a" * MAX_BODY}), 413)
    assert err["type"] == "invalid_request_error" and "--max-body-mb" in err["message"]


def test_chunked_body_over_the_limit_is_413(client):
    def chunks():
        yield b'{"content": "'
        for _ in range(MAX_BODY // 2**20 + 1):
            yield b"a" * 2**20
        yield b'"}'
    assert_error(client.post("/tokenize", content=chunks()), 413)
    assert client.get("/health").status_code == 200


# -- logit_bias, media marker, API key ------------------------------------------------------

@pytest.mark.parametrize("key", ["１", "٣", " 1", "1_0", "+1"])
def test_logit_bias_keys_must_be_ascii_digits(client, key):
    err = assert_error(client.post("/v1/chat/completions", json=chat_body(logit_bias={key: 5})), 400)
    assert err["param"] == "logit_bias"


def test_typed_media_marker_is_plain_text(client):
    body = chat_body(messages=[{"role": "user", "content": "What is <__media__>?"}])
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    prompt = client.post("/apply-template", json=body).json()["prompt"]
    ids = client.post("/tokenize", json={"content": prompt, "add_special": True,
                                          "parse_special": True}).json()["tokens"]
    assert r.json()["usage"]["prompt_tokens"] == len(ids)     # the marker's text was tokenized


def test_api_key_matches_any_configured_key():
    assert key_matches("k2", ["k1", "k2", "k3"])
    assert not key_matches("k", ["k1", "k2"])
    assert not key_matches("\ud800", ["k1"])                    # no exception on odd input


# -- a client that stops reading (--timeout) --------------------------------------------

def metric(server, name: str) -> float:
    return server.metric(name)


def test_stalled_stream_client_is_dropped_and_its_sequence_freed(server):
    body = json.dumps({"prompt": "Once upon a time", "stream": True, "max_tokens": 1000,
                       "ignore_eos": True, "temperature": 0, "logprobs": 20, "n": 4}).encode()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)     # a small window fills fast
    s.connect(("127.0.0.1", server.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    try:
        deadline = time.monotonic() + 3
        while metric(server, "ggserve_requests_running") == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert metric(server, "ggserve_requests_running") == 4
        t0 = time.monotonic()
        while metric(server, "ggserve_requests_running") > 0 and time.monotonic() - t0 < 15:
            time.sleep(0.1)
        # ended by the 1 s write timeout long before its 1,000 tokens
        assert metric(server, "ggserve_requests_running") == 0
        generated = metric(server, "ggserve_generated_tokens_total")
        time.sleep(0.5)
        assert metric(server, "ggserve_generated_tokens_total") == generated     # nothing generates
    finally:
        s.close()
