"""A client that stops reading its stream (issue 36): after -to/--timeout seconds of writes
that cannot go out, the stream is ended, its connection closed and its slot freed
(server/api/limits.py TimedStreamingResponse).

Loopback's socket buffers autotune to megabytes, more than a small model writes before a
test gives up; so the server's send buffer is fixed small (accepted sockets inherit it
from the listening one), the client's receive buffer too, and each frame is large (20 top
logprobs a token): a few dozen tokens fill both."""
from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from ggserve.server.app import ServerConfig, create_app
from server_harness import RunningServer

TIMEOUT = 1.0
MAX_TOKENS = 3000          # far more than is generated before the cut


@pytest.fixture(scope="module")
def server(smollm2_path):
    cfg = ServerConfig(model=smollm2_path, n_ctx=4096, n_parallel=1, n_batch=256, n_threads=1,
                       metrics=True, timeout=TIMEOUT)
    srv = RunningServer(create_app(cfg))
    srv._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    with srv:
        yield srv


def busy(srv) -> bool:
    return any(s["is_processing"] for s in httpx.get(srv.url + "/slots").json())


def stalled_stream(srv, path: str, body: dict) -> socket.socket:
    """A streamed request whose client reads the response head and then nothing more."""
    raw = json.dumps(body).encode()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)        # before connect: the window is small
    s.connect(("127.0.0.1", srv.port))
    s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
              % (path.encode(), len(raw)) + raw)
    head = s.recv(256)
    assert head.startswith(b"HTTP/1.1 200"), head
    return s


def drain(s: socket.socket, seconds: float) -> bytes:
    """Everything the server still sends, until it closes the connection."""
    s.settimeout(seconds)
    out = bytearray()
    while chunk := s.recv(65536):
        out += chunk
    return bytes(out)


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Tell me a long story."}],
                              "logprobs": True, "top_logprobs": 20}),
    ("/completion", {"prompt": "Once upon a time", "n_probs": 20}),
], ids=["chat", "completion"])
def test_a_reader_who_stops_reading_is_cut_after_the_timeout_and_its_slot_freed(server, path, body):
    generated0 = server.metric("ggserve_generated_tokens_total")
    s = stalled_stream(server, path, {**body, "stream": True, "max_tokens": MAX_TOKENS, "ignore_eos": True,
                                      "temperature": 0})
    try:
        t0 = time.monotonic()
        while busy(server) and time.monotonic() - t0 < 60:
            time.sleep(0.1)
        assert not busy(server), "the stalled stream still holds its slot"
        generated = server.metric("ggserve_generated_tokens_total") - generated0
        assert 0 < generated < MAX_TOKENS / 2                    # cut mid-generation, not finished
        rest = drain(s, 10)                                      # the server closed the connection
        assert b"[DONE]" not in rest and b'"stop":true' not in rest
        time.sleep(0.3)
        assert server.metric("ggserve_generated_tokens_total") - generated0 == generated   # nothing runs on
    finally:
        s.close()
    # the slot serves the next request
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                   json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4

