"""--sleep-idle-seconds: the model is freed after that long idle and loaded again by the next
request that needs it (llama-server 11434's sleeping state, server/service/sleep.py)."""
from __future__ import annotations

import time

import httpx
import pytest

from ggserve.server.app import ServerConfig, create_app
from ggserve.server.cli.main import config_from_args, serve_parser
from server_harness import RunningServer

COMPLETION = {"prompt": "The capital of France is", "n_predict": 8, "temperature": 0}


@pytest.fixture
def sleepy(smollm2_path):
    cfg = ServerConfig(model=smollm2_path, n_ctx=1024, n_parallel=2, n_threads=2, metrics=True,
                       sleep_idle_seconds=1)
    app = create_app(cfg)
    with RunningServer(app) as srv:
        srv.service = app.state.service
        yield srv


def is_sleeping(srv) -> bool:
    r = httpx.get(srv.url + "/props")
    assert r.status_code == 200
    return r.json()["is_sleeping"]


def wait_for_sleep(srv, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if is_sleeping(srv):
            return
        time.sleep(0.1)
    raise TimeoutError("the server did not fall asleep")


def test_idle_server_frees_the_model(sleepy):
    assert sleepy.service.engine is not None
    wait_for_sleep(sleepy)
    assert sleepy.service.engine is None
    assert httpx.get(sleepy.url + "/health").json() == {"status": "ok"}
    models = httpx.get(sleepy.url + "/v1/models").json()
    assert models["data"][0]["id"] == "Smollm2 135M 8k Lc100K Mix1 Ep2"       # the GGUF's name still


def test_a_request_wakes_it_with_the_same_answer(sleepy):
    before = httpx.post(sleepy.url + "/completion", json=COMPLETION, timeout=120).json()["content"]
    wait_for_sleep(sleepy)
    r = httpx.post(sleepy.url + "/completion", json=COMPLETION, timeout=120)
    assert r.status_code == 200
    assert r.json()["content"] == before
    assert not is_sleeping(sleepy)


def test_polling_does_not_wake_it_and_metrics_hold_still(sleepy):
    httpx.post(sleepy.url + "/completion", json=COMPLETION, timeout=120)
    httpx.get(sleepy.url + "/metrics")              # the throughput window is read once awake
    awake = httpx.get(sleepy.url + "/metrics").text
    wait_for_sleep(sleepy)
    for path in ("/health", "/v1/models", "/models", "/props"):
        assert httpx.get(sleepy.url + path).status_code == 200
    assert httpx.get(sleepy.url + "/metrics").text == awake
    assert httpx.get(sleepy.url + "/metrics").text == awake
    assert is_sleeping(sleepy) and sleepy.service.engine is None


@pytest.mark.parametrize("path,body", [
    ("/tokenize", {"content": "Hello world"}),
    ("/v1/chat/completions/input_tokens", {"messages": [{"role": "user", "content": "Hello world"}]}),
    ("/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "Hello world"}]}),
])
def test_token_counting_wakes_it(sleepy, path, body):
    wait_for_sleep(sleepy)
    r = httpx.post(sleepy.url + path, json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert not is_sleeping(sleepy)


def test_a_long_generation_keeps_it_awake(sleepy):
    """Idle means nothing running: a stream longer than the idle time is never cut."""
    body = {"prompt": "Once upon a time", "n_predict": 160, "ignore_eos": True, "stream": True,
            "temperature": 0}
    t0, n = time.monotonic(), 0
    with httpx.stream("POST", sleepy.url + "/completion", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and '"content"' in line:
                n += 1
                time.sleep(0.01)     # a slow reader: the stream lasts well past 1 s
    assert time.monotonic() - t0 > 1.5
    assert n >= 160


@pytest.mark.parametrize("value", ["0", "-2"])
def test_zero_or_below_minus_one_is_refused(smollm2_path, value):
    with pytest.raises(SystemExit, match="--sleep-idle-seconds"):
        config_from_args(serve_parser().parse_args(["-m", smollm2_path, "--sleep-idle-seconds", value]))
