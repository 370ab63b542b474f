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
from ggserve.server.api.limits import MAX_DEPTH, key_matches
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


# -- the process: load failure, SIGTERM ---------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(*args: str, port: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ggserve.server.cli.main", "serve", "--port", str(port),
                             "-t", "1", "--no-webui", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_missing_model_file_exits_nonzero_naming_it(tmp_path):
    missing = str(tmp_path / "nonexistent.gguf")
    p = serve("-m", missing, port=free_port())
    _, err = p.communicate(timeout=60)
    assert p.returncode != 0 and missing in err


@pytest.mark.parametrize("which", ["-m", "--mmproj"])
def test_truncated_gguf_exits_nonzero_naming_it(tmp_path, smollm2_path, which):
    bad = str(tmp_path / "truncated.gguf")
    with open(smollm2_path, "rb") as f, open(bad, "wb") as g:
        g.write(f.read(1 << 20))
    args = ["-m", bad] if which == "-m" else ["-m", smollm2_path, "--mmproj", bad]
    p = serve(*args, port=free_port())
    _, err = p.communicate(timeout=120)
    assert p.returncode == 1, err[-2000:]
    assert "failed to load" in err and bad in err


def wait_healthy(url: str, p: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert p.poll() is None, p.communicate()[1][-2000:]
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise TimeoutError("server did not become ready")


def test_sigterm_ends_every_stream_with_done_and_exits_0():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    p = serve("-c", "4096", "-np", "4", "--shutdown-timeout", "6", port=port)
    try:
        wait_healthy(url, p)
        # two streams that can finish within the shutdown timeout, two that cannot
        limits = [8, 8, 3000, 3000]
        results: list[list] = [[] for _ in limits]
        started = [threading.Event() for _ in limits]

        def stream(i: int) -> None:
            body = {"messages": [{"role": "user", "content": f"Count to {i + 10}"}], "stream": True,
                    "max_tokens": limits[i], "ignore_eos": True, "temperature": 0}
            with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        data = line[6:]
                        results[i].append(data if data == "[DONE]" else json.loads(data))
                        if len(results[i]) >= 3:
                            started[i].set()

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(len(limits))]
        for t in threads:
            t.start()
        for e in started:
            assert e.wait(60)
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        r = httpx.post(url + "/v1/chat/completions", json=chat_body(), timeout=10)   # during the drain
        assert r.status_code == 503 and r.headers["retry-after"]
        assert r.json()["error"]["code"] == "shutting_down"
        p.wait(timeout=30)
        elapsed = time.monotonic() - t0
        for t in threads:
            t.join(timeout=10)
        assert p.returncode == 0
        assert elapsed < 6 + 5 + 3                 # shutdown timeout + flush + start-up slack
        for i, events in enumerate(results):
            assert events[-1] == "[DONE]", (i, events[-3:])
            last = events[-2]
            if limits[i] == 8:                     # its remaining tokens, then its end
                assert last["choices"][0]["finish_reason"] == "length"
                assert not any("error" in e for e in events[:-1])
            else:
                assert last["error"]["code"] == "shutting_down", last
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


# -- heavy requests run off the event loop ------------------------------------------------

def probe_during(url: str, work) -> tuple[list[float], object]:
    """/health every 100 ms while work() runs: each probe's seconds, and work's result."""
    times, done = [], threading.Event()

    def probe():
        with httpx.Client(timeout=30) as c:
            while not done.is_set():
                t = time.perf_counter()
                assert c.get(url + "/health").status_code == 200
                times.append(time.perf_counter() - t)
                time.sleep(0.1)

    t = threading.Thread(target=probe)
    t.start()
    time.sleep(0.3)
    try:
        result = work()
    finally:
        done.set()
        t.join()
    return times, result


@pytest.fixture(scope="module")
def process_server():
    """ggserve serve in its own process: the probes measure its event loop, not this
    process's (whose GIL the test's own JSON work would hold)."""
    port = free_port()
    p = serve("-c", "2048", "--max-body-mb", "32", port=port)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, p)
        # queued behind the vocabulary copy for grammars that loading starts (a start-up cost)
        httpx.post(url + "/tokenize", json={"content": "warm up"}, timeout=60)
        yield url
    finally:
        p.terminate()
        p.wait(timeout=30)


def test_health_stays_fast_during_a_10mb_tokenize(process_server):
    url = process_server
    text = "The quick brown fox jumps over the lazy dog. " * (10 * 2**20 // 45)
    times, r = probe_during(url, lambda: httpx.post(url + "/tokenize", json={"content": text}, timeout=300))
    assert r.status_code == 200 and len(r.json()["tokens"]) > 2_000_000
    assert len(times) >= 5 and max(times) < 0.25, max(times)


def test_health_stays_fast_during_a_100000_message_chat(process_server):
    url = process_server
    body = chat_body(messages=[{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"}
                               for i in range(100_000)])
    times, r = probe_during(url, lambda: httpx.post(url + "/v1/chat/completions", json=body, timeout=300))
    err = assert_error(r, 400)                       # far longer than the context
    assert "context" in err["message"]
    assert len(times) >= 3 and max(times) < 0.25, max(times)
