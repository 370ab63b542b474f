"""/openapi.json: a valid OpenAPI 3.1 document that lists every route the app serves, and
every documented operation answers the example request it documents (never 404 or 5xx),
its 200 answer matching the documented schema."""
import copy
from urllib.parse import urlsplit

import httpx
import jsonschema
import pytest
from openapi_spec_validator import validate
from server_harness import RunningServer
from synth_golden import SYNTH

from ggserve.server.agent_tools.config import AgentToolsConfig
from ggserve.server.app import ServerConfig, create_app


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    # the synthetic Qwen3 has FIM tokens (/infill) and a chat template; every optional
    # endpoint is switched on so that each documented one can answer (pooling rank: reranking, and
    # embeddings of the last token)
    cfg = ServerConfig(model=str(SYNTH / "models" / "synth-qwen3-q8_0.gguf"), n_ctx=2048, n_parallel=2,
                       n_threads=2, embeddings=True, pooling="rank", metrics=True, props_endpoint=True,
                       slot_save_path=str(tmp_path_factory.mktemp("slots")),
                       agent=AgentToolsConfig(tools=("get_info",), cors_proxy=True))
    with RunningServer(create_app(cfg)) as s:
        yield s


@pytest.fixture(scope="module")
def doc(srv):
    r = httpx.get(srv.url + "/openapi.json")
    assert r.status_code == 200
    return r.json()


def operations(doc):
    return [(path, method, op) for path, item in doc["paths"].items() for method, op in item.items()]


def test_valid_openapi_3_1(doc):
    assert doc["openapi"].startswith("3.1")
    validate(doc)          # raises on an invalid document


def test_every_route_is_documented(srv, doc):
    served = {(r.path, m.lower()) for r in srv.app.routes for m in r.methods if m != "HEAD"}
    documented = {(p, m) for p, m, _ in operations(doc)}
    assert served == documented, served ^ documented


def _request(srv, path, method, op):
    params = {}
    for p in op.get("parameters", []):
        if p["in"] == "path":
            value = p["example"]
            if p["name"] == "rid":     # an id the server keeps: made by the documented POST
                value = httpx.post(srv.url + "/v1/responses", json={"input": "Hi", "max_output_tokens": 2},
                                   timeout=120).json()["id"]
            path = path.replace("{" + p["name"] + "}", str(value))
        else:
            params[p["name"]] = p["example"]
            if p["name"] == "url":         # /cors-proxy: the documented path, on this server
                params["url"] = srv.url + urlsplit(p["example"]).path
            if p["name"] == "conv_id":     # a stream kept under that id: made by a streamed chat
                httpx.post(srv.url + "/v1/chat/completions", headers={"X-Conversation-Id": p["example"]},
                           json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "stream": True},
                           timeout=120)
    body = op.get("requestBody", {}).get("content", {}).get("application/json", {})
    kw = {"json": body["example"]} if "example" in body else {}
    return httpx.request(method.upper(), srv.url + path, params=params, timeout=120, **kw)


def test_every_documented_operation_answers_its_example(srv, doc):
    checked = 0
    for path, method, op in operations(doc):
        if "x-ggserve-requires" in op:   # not loaded here (an audio mmproj): tests/test_server_audio.py
            continue
        r = _request(srv, path, method, op)
        assert r.status_code < 400, (method, path, r.status_code, r.text[:300])
        if "200" not in op["responses"]:
            assert r.status_code == 204
            continue
        content = op["responses"]["200"]["content"]
        media = next(iter(content))
        assert r.headers["content-type"].startswith(media), (path, r.headers["content-type"])
        if media == "application/json":
            schema = {**copy.deepcopy(content[media]["schema"]), "components": doc["components"]}
            jsonschema.Draft202012Validator(schema).validate(r.json())
            checked += 1
    assert checked >= 25


def test_documented_errors_have_the_error_shape(srv, doc):
    """A bad body to a documented endpoint: the documented 400, in the documented shape."""
    for path, shape in (("/v1/chat/completions", "Error"), ("/completion", "Error"),
                        ("/v1/messages", "AnthropicError")):
        r = httpx.post(srv.url + path, json={"bad": 1})
        assert r.status_code == 400
        assert "400" in doc["paths"][path]["post"]["responses"]
        schema = {**doc["components"]["schemas"][shape], "components": doc["components"]}
        jsonschema.Draft202012Validator(schema).validate(r.json())
