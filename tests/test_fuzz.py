"""Hostile requests against a running server (issue 21): random bytes, random JSON,
and request bodies with random values in the fields the endpoints read, to every
endpoint. No answer may be a 5xx; every error has the API's error shape; the server
is healthy and idle afterwards."""
from __future__ import annotations

import json
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ggserve.server.app import ServerConfig, create_app
from ggserve.server.api.media import MediaConfig
from server_harness import RunningServer

N_EXAMPLES = 560

POST = ["/v1/chat/completions", "/v1/completions", "/completion", "/infill", "/apply-template",
        "/tokenize", "/detokenize", "/v1/embeddings", "/embedding", "/v1/responses", "/v1/messages",
        "/slots/0?action=erase", "/slots/7?action=save", "/slots/x?action=restore"]
GET = ["/health", "/v1/models", "/metrics", "/slots", "/props", "/slots?fail_on_no_slot=1"]
FIELDS = ["model", "messages", "prompt", "max_tokens", "n_predict", "stream", "temperature", "top_p",
          "top_k", "min_p", "n", "logprobs", "top_logprobs", "n_probs", "logit_bias", "stop", "seed",
          "tools", "tool_choice", "response_format", "json_schema", "grammar", "content", "tokens",
          "input", "echo", "suffix", "input_prefix", "input_suffix", "input_extra", "system",
          "max_output_tokens", "stream_options", "chat_template_kwargs", "ignore_eos", "id_slot",
          "with_pieces", "add_special", "filename", "instructions", "presence_penalty",
          "repeat_penalty", "cache_prompt", "embd_normalize", "encoding_format", "dimensions"]

text = st.text(st.characters(codec=None, exclude_categories=()), max_size=12) | st.sampled_from(
    ["", "\ud800", "<__media__>", "<|im_start|>", "data:image/png;base64,AAAA", "http://127.0.0.1:1/x",
     "user", "assistant", "system", "tool", "function", "auto", "none", "json_object", "json_schema"])
scalars = (st.none() | st.booleans() | st.integers(-2**63, 2**64) | st.sampled_from([0, 1, 2, -1, 4, 50])
           | st.floats(allow_nan=False) | text)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(text | st.sampled_from(FIELDS), inner, max_size=4),
                           max_leaves=12)
message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "tool"]) | text},
                                optional={"content": json_values | st.lists(st.fixed_dictionaries(
                                    {"type": st.sampled_from(["text", "image_url", "input_image", "x"])},
                                    optional={"text": json_values, "image_url": json_values}), max_size=2),
                                    "tool_calls": json_values, "name": json_values})
field_bodies = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6).flatmap(
    lambda d: st.fixed_dictionaries({"messages": st.lists(message, max_size=3) | json_values},
                                    optional={"prompt": text | json_values})
    .map(lambda base: {**base, **d, "max_tokens": 4, "n_predict": 4}))
bodies = (st.binary(max_size=64).map(lambda b: ("raw", b))
          | json_values.map(lambda v: ("json", v))
          | field_bodies.map(lambda v: ("json", v)))


@pytest.fixture(scope="module")
def server(smollm2_path, tmp_path_factory):
    # every endpoint on (a feature turned off answers 501, as llama-server's)
    cfg = ServerConfig(model=smollm2_path, n_ctx=256, n_parallel=4, n_batch=256, n_threads=1, metrics=True,
                       embeddings=True, slot_save_path=str(tmp_path_factory.mktemp("slots")),
                       media=MediaConfig(fetch_enabled=False), timeout=5.0)
    with RunningServer(create_app(cfg)) as srv:
        yield srv


def check(r: httpx.Response) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:500])
    if r.status_code >= 400:
        err = r.json()
        assert "error" in err and err["error"]["message"], err


def test_hostile_requests_get_no_5xx(server):
    seen = set()
    with httpx.Client(base_url=server.url, timeout=60) as client:

        @settings(max_examples=N_EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(st.sampled_from(POST), bodies, st.sampled_from(["application/json", "text/plain", ""]))
        def post(path, body, ctype):
            kind, value = body
            content = value if kind == "raw" else json.dumps(value).encode()   # (lone surrogates escaped)
            r = client.post(path, content=content, headers={"content-type": ctype} if ctype else {})
            seen.add((path, content))
            check(r)

        @settings(max_examples=40, deadline=None, derandomize=True, database=None)
        @given(st.sampled_from(GET), st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=2))
        def get(path, params):
            check(client.get(path, params=params))

        post()
        get()
    assert len(seen) >= 400                                # distinct hostile requests
    assert httpx.get(server.url + "/health").status_code == 200
    deadline = time.monotonic() + 30
    while server.metric("ggserve_requests_running") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.metric("ggserve_requests_running") == 0  # nothing left generating


# -- grammars, schemas, tools and counts (issue 36) ------------------------------------------

N_LIMIT_EXAMPLES = 120
rule_names = st.sampled_from(["root", "a", "b", "r0", "r1", "x-y", "NAME", "?opt"])
grammar_atoms = st.sampled_from(['"a"', '"("', "[a-z]", "[^\\]]", "a", "b", "r0", "(", ")", "|", "*", "+", "?",
                                 "{2,3}", "{0,99999}", "/[0-9]+/", "%json {}", "<[1]>", "#c\n", "\n", "::=", ":"])
grammars = (st.lists(grammar_atoms, max_size=30).map(" ".join).map(lambda s: "root ::= " + s)
            | st.integers(0, 2000).map(lambda n: "root ::= r0\n" + "".join(f'r{i} ::= r{i + 1} | "0"\n' for i in range(n))
                                       + f'r{n} ::= "0"\n')
            | st.integers(1, 200).map(lambda d: "root ::= " + "(" * d + '"a"' + ")" * d)
            | text)
schemas = st.recursive(
    st.fixed_dictionaries({"type": st.sampled_from(["string", "integer", "number", "boolean", "null", "object",
                                                    "array", "nope"])},
                          optional={"pattern": st.sampled_from(["^a+$", "(a|b)*c", "[", "a{1,99999}", "(" * 40]),
                                    "enum": st.lists(scalars, max_size=4), "minLength": st.integers(-1, 10**6),
                                    "maxItems": st.integers(-1, 10**6), "format": st.sampled_from(["date", "x"])}),
    lambda inner: st.fixed_dictionaries({"type": st.sampled_from(["object", "array"])},
                                        optional={"properties": st.dictionaries(text, inner, max_size=3),
                                                  "items": inner, "anyOf": st.lists(inner, max_size=3),
                                                  "required": st.lists(text, max_size=3),
                                                  "additionalProperties": st.booleans() | inner,
                                                  "$ref": st.sampled_from(["#", "#/$defs/x", "#/nope"])}),
    max_leaves=8) | json_values
tools = st.lists(st.fixed_dictionaries({"type": st.just("function") | text, "function": st.fixed_dictionaries(
    {"name": text | st.just("f")}, optional={"parameters": schemas, "description": text})}), max_size=3) | json_values
counts = st.fixed_dictionaries({}, optional={
    "n": st.integers(-1, 2**40), "n_cmpl": st.integers(-1, 2**40), "n_probs": st.integers(-1, 10**6),
    "top_logprobs": st.integers(-1, 10**6), "logprobs": st.booleans() | st.integers(-1, 10**6),
    "logit_bias": st.integers(0, 20_000).map(lambda k: {str(i): -1 for i in range(k)}) | json_values,
    "stop": st.integers(0, 100).map(lambda k: ["s"] * k) | json_values})
limit_bodies = st.fixed_dictionaries({"messages": st.just([{"role": "user", "content": "Hi"}]), "prompt": st.just("Hi"),
                                      "max_tokens": st.just(2), "n_predict": st.just(2)},
                                     optional={"grammar": grammars, "json_schema": schemas | schemas.map(json.dumps),
                                               "response_format": st.fixed_dictionaries(
                                                   {"type": st.sampled_from(["json_schema", "json_object", "x"])},
                                                   optional={"json_schema": st.fixed_dictionaries(
                                                       {"name": st.just("x"), "schema": schemas}),
                                                       "schema": schemas}),
                                               "tools": tools, "tool_choice": st.sampled_from(["required", "auto"]),
                                               "chat_template_kwargs": st.dictionaries(
                                                   st.sampled_from(["messages", "tools", "add_generation_prompt",
                                                                    "enable_thinking", "image_marker"]), scalars,
                                                   max_size=2)}).flatmap(
    lambda b: counts.map(lambda c: {**b, **c}))


def test_grammars_schemas_tools_and_counts_get_no_5xx(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:

        @settings(max_examples=N_LIMIT_EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(st.sampled_from(["/v1/chat/completions", "/v1/completions", "/completion", "/v1/messages",
                                "/v1/responses", "/apply-template"]), limit_bodies)
        def post(path, body):
            check(client.post(path, content=json.dumps(body).encode()))

        post()
    assert httpx.get(server.url + "/health").status_code == 200
    deadline = time.monotonic() + 30
    while server.metric("ggserve_requests_running") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.metric("ggserve_requests_running") == 0
