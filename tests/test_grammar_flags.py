"""--grammar, --grammar-file, -j/--json-schema, -jf/--json-schema-file as llama-server: a request
that gives no grammar, schema, response_format or tools of its own is held to the flag's.
llama-server 11434's answers are in tests/data/grammar_flags (record.py says how)."""
from __future__ import annotations

import json
import os

import httpx
import pytest

from ggserve.server.app import create_app
from ggserve.server.cli.main import config_from_args, serve_parser
from server_harness import RunningServer

REF = json.load(open(os.path.join(os.path.dirname(__file__), "data", "grammar_flags", "reference.json"),
                     encoding="utf-8"))


@pytest.fixture(scope="module")
def server(smollm2_path):
    # the schema as llama-server got it (reference.json's own copy has its keys sorted)
    schema = REF["command"][REF["command"].index("-j") + 1]
    args = serve_parser().parse_args(["-m", smollm2_path, "-j", schema, "-c", "512", "-np", "1", "-t", "1",
                                      "--temp", "0"])
    with RunningServer(create_app(config_from_args(args))) as s:
        yield s


def replay(server, case):
    c = REF["cases"][case]
    return httpx.post(server.url + c["path"], json=c["request"], timeout=120), c


def test_a_completion_without_a_schema_is_held_to_the_flags(server):
    r, c = replay(server, "completion_takes_the_schema")
    assert r.status_code == c["status"] == 200
    assert r.json()["content"] == c["response"]["content"] == '{"name": "John", "age": 25}'


def test_a_request_grammar_wins_over_the_flags(server):
    r, c = replay(server, "own_grammar_wins")
    assert r.status_code == 200 and r.json()["content"] == c["response"]["content"] == "no"


def test_a_chat_without_a_schema_is_held_to_the_flags(server):
    # llama-server 11434 answers a chat under -j with a 400 ("Failed to initialize samplers", recorded)
    assert REF["cases"]["chat_takes_the_schema"]["status"] == 400
    r = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": "Give me a person's name and age as JSON."}], "max_tokens": 200})
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "stop"
    answer = json.loads(r.json()["choices"][0]["message"]["content"])
    assert isinstance(answer["name"], str) and isinstance(answer["age"], int)


def test_a_grammar_file_holds_requests(smollm2_path, tmp_path):
    grammar = tmp_path / "yes-no.gbnf"
    grammar.write_text('root ::= "yes" | "no"\n')
    args = serve_parser().parse_args(["-m", smollm2_path, "--grammar-file", str(grammar), "-c", "512", "-np", "1",
                                      "-t", "1", "--temp", "0"])
    with RunningServer(create_app(config_from_args(args))) as s:
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "Answer:", "max_tokens": 8}, timeout=120)
    assert r.json()["choices"][0]["text"] in ("yes", "no")


@pytest.mark.parametrize("argv,message", [
    (["-j", '{"type": "objec'], "--json-schema: not a valid JSON schema"),
    (["--grammar", 'root ::= "a'], "--grammar: not a valid grammar"),
    (["--json-schema-file", "/nonexistent/schema.json"], "--json-schema-file: cannot read /nonexistent/schema.json"),
])
def test_a_bad_grammar_flag_stops_the_server_naming_it(smollm2_path, argv, message):
    with pytest.raises(SystemExit) as e:
        config_from_args(serve_parser().parse_args(["-m", smollm2_path, *argv]))
    assert message in str(e.value)


def test_an_object_schema_with_properties_takes_no_other_keys_as_llama_cpp_reads_it():
    # common/json-schema.cpp: "properties" without "additionalProperties" allows no other key
    # (JSON Schema would allow them); {"type": "object"} alone still takes any object
    from ggserve.server.chat.grammar import closed_objects

    schema = {"type": "object", "properties": {"p": {"type": "object", "properties": {"q": {"type": "integer"}}},
                                               "free": {"type": "object"}},
              "$defs": {"d": {"properties": {"x": {}}}}, "anyOf": [{"properties": {}}]}
    closed = closed_objects(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["p"]["additionalProperties"] is False
    assert "additionalProperties" not in closed["properties"]["free"]
    assert closed["$defs"]["d"]["additionalProperties"] is False and closed["anyOf"][0]["additionalProperties"] is False
    assert "additionalProperties" not in schema           # the request's own schema is left as it was
