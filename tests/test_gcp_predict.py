"""Vertex AI's prediction protocol (AIP_MODE=PREDICTION, server/api/vertex/predict.py), as llama-server 11434
serves it: POST /predict with `instances`, each answered by the endpoint its @requestFormat names."""
from __future__ import annotations

import httpx
import pytest

from ggserve.server.app import ServerConfig, create_app
from ggserve.server.api.vertex.predict import port, request_format
from server_harness import RunningServer

CHAT = {"max_tokens": 6, "temperature": 0, "messages": [{"role": "user", "content": "Say hello"}]}


@pytest.fixture(scope="module")
def vertex(smollm2_path):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AIP_MODE", "PREDICTION")
        mp.setenv("AIP_HEALTH_ROUTE", "healthz")
        app = create_app(ServerConfig(model=smollm2_path, n_ctx=1024, n_parallel=2, n_threads=2))
    with RunningServer(app) as srv:
        yield srv


def predict(srv, instances) -> httpx.Response:
    return httpx.post(srv.url + "/predict", json={"instances": instances}, timeout=120)


@pytest.mark.parametrize("path,alias", [("/v1/chat/completions", "chatCompletions"),
                                        ("/apply-template", "applyTemplate"), ("/tokenize", "tokenize"),
                                        ("/v1/messages/count_tokens", "messagesCountTokens"),
                                        ("/slots/{id_slot}", "slots")])
def test_request_format_aliases_are_llama_servers(path, alias):
    assert request_format(path) == alias


def test_instances_answered_in_order_as_their_endpoints(vertex):
    alone = httpx.post(vertex.url + "/v1/chat/completions", json=CHAT, timeout=120).json()
    r = predict(vertex, [{"@requestFormat": "chatCompletions", **CHAT},
                         {"@requestFormat": "/tokenize", "content": "Hello"},
                         {"@requestFormat": "chatCompletions", **CHAT, "stream": True}])
    assert r.status_code == 200
    first, tokens, streamed = r.json()["predictions"]
    assert first["choices"][0]["message"] == alone["choices"][0]["message"]
    assert tokens == httpx.post(vertex.url + "/tokenize", json={"content": "Hello"}).json()
    assert streamed["choices"][0]["message"] == alone["choices"][0]["message"]    # stream: false forced


def test_a_bad_instance_is_its_own_error(vertex):
    r = predict(vertex, [{"@requestFormat": "nope"}, 5, {"max_tokens": 2},
                         {"@requestFormat": "chatCompletions", "messages": "x"}])
    assert r.status_code == 200
    errors = [p["error"] for p in r.json()["predictions"]]
    assert errors[0]["message"] == "no handler registered for @requestFormat: nope"
    assert errors[1]["message"] == "each instance must be a JSON object"
    assert errors[2]["message"] == "each instance must include a string @requestFormat"
    assert errors[3]["type"] == "invalid_request_error"


@pytest.mark.parametrize("body,message", [
    ({"x": 1}, "request body must include an array field named instances"),
    ({"instances": [{}] * 129}, "instances array exceeds maximum size of 128"),
    ([1], "request body must be a JSON object"),
])
def test_bad_bodies_are_400(vertex, body, message):
    r = httpx.post(vertex.url + "/predict", json=body)
    assert r.status_code == 400
    assert r.json()["error"]["message"] == message


def test_health_route_from_the_environment(vertex):
    assert httpx.get(vertex.url + "/healthz").json() == {"status": "ok"}


def test_port_from_the_environment(monkeypatch):
    assert port(8080) == 8080 and port(9000) == 9000
    monkeypatch.setenv("AIP_MODE", "PREDICTION")
    assert port(9000) == 8080
    monkeypatch.setenv("AIP_HTTP_PORT", "7001")
    assert port(9000) == 7001


def test_off_without_aip_mode(smollm2_path):
    app = create_app(ServerConfig(model=smollm2_path, n_ctx=256, n_parallel=1, n_threads=2))
    assert "/predict" not in {r.path for r in app.routes}
