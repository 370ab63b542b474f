"""Anthropic's Messages API through the official anthropic SDK against a real server
(SmolLM2 with Qwen3's template, started with an API key: the SDK sends it as
x-api-key, the openai client as a Bearer token). Greedy answers must equal what
/v1/chat/completions gives for the same conversation (llama.cpp-exact there)."""
from __future__ import annotations

import json
import os

import anthropic
import httpx
import openai
import pytest

from ggserve.server.app import ServerConfig, create_app
from server_harness import RunningServer

TEMPLATE = os.path.join(os.path.dirname(__file__), "data", "templates", "Qwen-Qwen3-0.6B.jinja")
KEY = "sk-test"
WEATHER = {"name": "get_weather", "description": "Current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CHAT_WEATHER = {"type": "function", "function": {"name": WEATHER["name"], "description": WEATHER["description"],
                                                 "parameters": WEATHER["input_schema"]}}
THINK_THEN_ANSWER = 'root ::= "<think>\\nThe user greets me.\\n</think>\\n\\n" "Hello!"'
ASK = [{"role": "user", "content": "Name three colours."}]
T0 = {"temperature": 0}       # greedy: the SDK has no sampling arguments, the API still takes them


@pytest.fixture(scope="module")
def server(smollm2_path):
    cfg = ServerConfig(model=smollm2_path, n_ctx=2048, n_parallel=2, n_batch=256, n_threads=1,
                       chat_template_file=TEMPLATE, api_keys=[KEY])
    with RunningServer(create_app(cfg)) as srv:
        yield srv


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def chat(oai, messages, **kw):
    """The same conversation through /v1/chat/completions, greedy."""
    return oai.chat.completions.create(model="x", messages=messages, temperature=0, **kw)


def test_text_equals_chat_completions(claude, oai):
    m = claude.messages.create(model="claude-x", system="Answer briefly.", messages=ASK, max_tokens=24,
                               extra_body=T0)
    c = chat(oai, [{"role": "system", "content": "Answer briefly."}] + ASK, max_tokens=24)
    assert [b.type for b in m.content] == ["text"]
    assert m.content[0].text == c.choices[0].message.content
    assert m.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[c.choices[0].finish_reason]
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant"
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == c.usage.prompt_tokens
    assert m.usage.output_tokens == c.usage.completion_tokens


def test_system_blocks_are_joined(claude):
    kw = dict(model="x", messages=ASK, max_tokens=12, extra_body=T0)
    whole = claude.messages.create(system="Answer briefly.", **kw)
    blocks = claude.messages.create(system=[{"type": "text", "text": "Answer "},
                                            {"type": "text", "text": "briefly."}], **kw)
    assert blocks.content == whole.content


def test_stream_sends_anthropic_events_in_order(server, claude):
    whole = claude.messages.create(model="x", messages=ASK, max_tokens=12, extra_body=T0)
    with httpx.stream("POST", server.url + "/v1/messages", headers={"x-api-key": KEY}, timeout=120, json={
            "model": "x", "messages": ASK, "max_tokens": 12, "temperature": 0, "stream": True}) as r:
        blocks = r.read().decode().strip().split("\n\n")
    events = []
    for b in blocks:
        name, data = b.split("\n")
        events.append(json.loads(data.removeprefix("data: ")))
        assert name == "event: " + events[-1]["type"]
    types = [e["type"] for e in events]
    n = types.count("content_block_delta")
    assert types == ["message_start", "ping", "content_block_start"] + ["content_block_delta"] * n + [
        "content_block_stop", "message_delta", "message_stop"]
    assert "".join(e["delta"]["text"] for e in events[3:3 + n]) == whole.content[0].text
    assert events[-2]["delta"] == {"stop_reason": whole.stop_reason, "stop_sequence": None}
    assert events[-2]["usage"]["output_tokens"] == whole.usage.output_tokens == 12


def test_messages_stream_helper(claude):
    kw = dict(model="x", messages=ASK, max_tokens=16, extra_body=T0)
    with claude.messages.stream(**kw) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    whole = claude.messages.create(**kw)
    assert text == final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason


def test_stop_sequence_ends_with_stop_reason_stop_sequence(claude, oai):
    text = claude.messages.create(model="x", messages=ASK, max_tokens=24, extra_body=T0).content[0].text
    word = text.split()[2]
    m = claude.messages.create(model="x", messages=ASK, max_tokens=24, extra_body=T0, stop_sequences=[word])
    c = chat(oai, ASK, max_tokens=24, stop=[word])
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", word)
    assert m.content[0].text == c.choices[0].message.content == text[:text.index(word)]


def test_tool_use_round_trip(claude, oai):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    m = claude.messages.create(model="x", messages=ask, tools=[WEATHER], max_tokens=60, extra_body=T0,
                               tool_choice={"type": "any", "disable_parallel_tool_use": True})
    c = chat(oai, ask, tools=[CHAT_WEATHER], tool_choice="required", max_tokens=60)
    [call] = c.choices[0].message.tool_calls
    assert m.stop_reason == "tool_use"
    [use] = [b for b in m.content if b.type == "tool_use"]
    assert (use.name, use.input) == ("get_weather", json.loads(call.function.arguments))
    result = "21 degrees, sunny"
    answer = claude.messages.create(
        model="x", tools=[WEATHER], tool_choice={"type": "none"}, max_tokens=24, extra_body=T0,
        messages=ask + [{"role": "assistant", "content": [b.model_dump() for b in m.content]},
                        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                      "content": result}]}])
    args = json.dumps(use.input, separators=(",", ":"))       # as the translation writes them
    c2 = chat(oai, ask + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": use.id, "type": "function", "function": {"name": use.name, "arguments": args}}]},
        {"role": "tool", "tool_call_id": use.id, "content": result}],
        tools=[CHAT_WEATHER], tool_choice="none", max_tokens=24)
    assert answer.content[0].text == c2.choices[0].message.content and answer.content[0].text


def test_streamed_tool_use_input_json(claude):
    kw = dict(model="x", messages=[{"role": "user", "content": "Weather in Rome?"}], tools=[WEATHER],
              max_tokens=60, extra_body=T0, tool_choice={"type": "tool", "name": "get_weather"})
    whole = claude.messages.create(**kw)
    with claude.messages.stream(**kw) as s:
        events = list(s)
        final = s.get_final_message()
    partial = "".join(e.delta.partial_json for e in events
                      if e.type == "content_block_delta" and e.delta.type == "input_json_delta")
    assert json.loads(partial) == whole.content[0].input == final.content[0].input
    assert final.content[0].id == [e for e in events if e.type == "content_block_start"][0].content_block.id


def test_thinking_comes_back_as_a_thinking_block(claude):
    kw = dict(model="x", messages=[{"role": "user", "content": "Hi"}], max_tokens=40,
              extra_body={"grammar": THINK_THEN_ANSWER})
    def blocks(message):
        return [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in message.content]

    assert blocks(claude.messages.create(**kw)) == [("thinking", "The user greets me.\n"), ("text", "Hello!")]
    with claude.messages.stream(**kw) as s:
        assert blocks(s.get_final_message()) == [("thinking", "The user greets me.\n"), ("text", "Hello!")]


def test_count_tokens_equals_the_chat_prompt(claude, oai):
    n = claude.messages.count_tokens(model="x", system="Answer briefly.", messages=ASK, tools=[WEATHER])
    c = chat(oai, [{"role": "system", "content": "Answer briefly."}] + ASK, tools=[CHAT_WEATHER], max_tokens=1)
    assert n.input_tokens == c.usage.prompt_tokens


def test_tool_results_come_before_the_rest_of_their_message():
    from ggserve.server.api.anthropic.messages import chat_body

    body = {"max_tokens": 8, "system": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "Call it.", "signature": "s"},
                                                  {"type": "tool_use", "id": "t1", "name": "w",
                                                   "input": {"city": "Zürich"}}]},
                {"role": "user", "content": [{"type": "text", "text": "Thanks."},
                                             {"type": "tool_result", "tool_use_id": "t1",
                                              "content": [{"type": "text", "text": "21 C"}]}]}]}
    assert chat_body(body)["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "reasoning_content": "Call it.", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "w", "arguments": '{"city":"Zürich"}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "21 C"},
        {"role": "user", "content": [{"type": "text", "text": "Thanks."}]}]


@pytest.mark.parametrize("key", ["wrong-key", None])
def test_auth_failure_in_anthropic_shape(server, key):
    headers = {"x-api-key": key} if key else {}
    r = httpx.post(server.url + "/v1/messages", headers=headers, timeout=30,
                   json={"model": "x", "messages": ASK, "max_tokens": 4})
    assert r.status_code == 401
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "authentication_error" and body["error"]["message"]


def test_sdk_raises_authentication_error(server):
    bad = anthropic.Anthropic(base_url=server.url, api_key="wrong-key", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        bad.messages.create(model="x", messages=ASK, max_tokens=4)
    assert e.value.body["error"]["type"] == "authentication_error"


def test_sdk_raises_bad_request_for_a_document_block(claude):
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model="x", max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "hi"}}]}])
    assert e.value.body["type"] == "error"
    err = e.value.body["error"]
    assert err["type"] == "invalid_request_error" and "document" in err["message"]


@pytest.mark.parametrize("body, where", [
    ({"messages": ASK}, "max_tokens"),
    ({"messages": [], "max_tokens": 4}, "messages"),
    ({"messages": [{"role": "system", "content": "hi"}], "max_tokens": 4}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "file"}}]}],
      "max_tokens": 4}, "messages.0.content.0.source"),
    ({"messages": ASK, "max_tokens": 4, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
     "tools.0"),
    ({"messages": ASK, "max_tokens": 4, "tool_choice": {"type": "sometimes"}}, "tool_choice"),
    ({"messages": ASK, "max_tokens": 4, "temperature": "hot"}, "temperature"),
])
def test_bad_requests_are_400_in_anthropic_shape(server, body, where):
    r = httpx.post(server.url + "/v1/messages", headers={"x-api-key": KEY}, json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()
    assert set(err) == {"type", "error"} and err["type"] == "error"
    assert err["error"]["type"] == "invalid_request_error" and err["error"]["message"].startswith(where)
