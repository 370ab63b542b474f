"""What agent frameworks need, through the official openai SDK against a real
server: SmolLM2 served with Qwen 2.5's real template (tool calls in <tool_call>
tags), structured outputs enforced by llguidance, forced tool calls, a tool
round trip, streamed tool calls, any model name."""
from __future__ import annotations

import enum
import json
import os
from typing import Literal, Optional

import httpx
import openai
import pytest
from pydantic import BaseModel, Field

from ggserve.server.app import ServerConfig, create_app
from server_harness import RunningServer

TEMPLATE = os.path.join(os.path.dirname(__file__), "data", "templates", "Qwen-Qwen2.5-7B-Instruct.jinja")


@pytest.fixture(scope="module")
def server(smollm2_path):
    cfg = ServerConfig(model=smollm2_path, n_ctx=4096, n_parallel=4, n_batch=256, n_threads=1,
                       chat_template_file=TEMPLATE)
    with RunningServer(create_app(cfg)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)


# -- structured outputs: ten pydantic models -------------------------------------------

class Person(BaseModel):
    name: str
    age: int


class Colour(str, enum.Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Paint(BaseModel):
    colour: Colour
    litres: float = Field(ge=0.5, le=20)


class Address(BaseModel):
    street: str
    city: str


class Customer(BaseModel):
    name: str
    address: Address


class ShoppingList(BaseModel):
    items: list[str] = Field(min_length=1, max_length=4)


class Review(BaseModel):
    stars: int = Field(ge=1, le=5)
    comment: Optional[str]


class Point(BaseModel):
    x: float
    y: float


class Polygon(BaseModel):
    points: list[Point] = Field(min_length=3, max_length=4)


class Task(BaseModel):
    title: str
    done: bool
    priority: Literal["low", "medium", "high"]


class Book(BaseModel):
    title: str
    year: int = Field(ge=1450, le=2030)
    authors: list[str]


class Team(BaseModel):
    name: str
    members: list[Person] = Field(max_length=2)


class Thermostat(BaseModel):
    room: str
    celsius: float = Field(ge=5, le=30)
    mode: Optional[Literal["heat", "cool"]]


MODELS = [Person, Paint, Customer, ShoppingList, Review, Polygon, Task, Book, Team, Thermostat]


@pytest.mark.parametrize("model", MODELS, ids=[m.__name__ for m in MODELS])
def test_parse_returns_a_valid_object(client, model):
    # a 135M model at temperature 0 can loop inside a free string: a mild repeat
    # penalty (a sampling choice, not part of the grammar) lets it close its strings
    r = client.chat.completions.parse(
        model="gpt-4o-mini", response_format=model, temperature=0, max_tokens=200,
        extra_body={"repeat_penalty": 1.1},
        messages=[{"role": "user", "content": f"Give me an example {model.__name__} as JSON."}])
    choice = r.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, model)


def test_json_object_gives_a_json_object(client):
    r = client.chat.completions.create(
        model="gpt-4o-mini", response_format={"type": "json_object"}, temperature=0, max_tokens=200,
        extra_body={"repeat_penalty": 1.1}, messages=[{"role": "user", "content": "Describe a cat in JSON."}])
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_llama_server_grammar_field(server):
    r = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": "Is the sky blue?"}], "temperature": 0,
        "grammar": 'root ::= "yes" | "no"'})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] in ("yes", "no")


def test_invalid_schema_is_a_400_naming_the_problem(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "hi"}],
            response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": {"type": "nope"}}})
    assert "nope" in e.value.body["message"] and e.value.body["param"] == "response_format"


# -- tools ---------------------------------------------------------------------------

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two integers",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1, "maximum": 10}},
            "required": ["query"]}}},
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _validates(call, tools=TOOLS) -> bool:
    spec = next(t["function"] for t in tools if t["function"]["name"] == call.function.name)
    args = json.loads(call.function.arguments)
    props = spec["parameters"]["properties"]
    return set(spec["parameters"]["required"]) <= set(args) and set(args) <= set(props) and all(
        {"string": str, "integer": int}[props[k]["type"]] is type(v) for k, v in args.items())


def test_tool_choice_required_gives_a_valid_call(client):
    r = client.chat.completions.create(model="gpt-4o-mini", messages=ASK, tools=TOOLS,
                                       tool_choice="required", temperature=0, max_tokens=120)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert _validates(call)


def test_named_tool_choice_calls_that_tool(client):
    r = client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "What is 2 + 3?"}], tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "add"}}, temperature=0, max_tokens=120)
    [call] = r.choices[0].message.tool_calls
    assert call.function.name == "add" and _validates(call)


def test_streamed_tool_calls_equal_non_streamed(client):
    kw = dict(model="gpt-4o-mini", messages=ASK, tools=TOOLS, tool_choice="required",
              temperature=0, max_tokens=120)
    whole = client.chat.completions.create(**kw).choices[0]
    calls, finish, content = {}, None, ""
    for chunk in client.chat.completions.create(stream=True, **kw):
        d = chunk.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            if tc.id:
                assert tc.function.name and tc.index not in calls
                calls[tc.index] = [tc.function.name, tc.function.arguments or ""]
            else:
                assert tc.function.name is None
                calls[tc.index][1] += tc.function.arguments
        finish = chunk.choices[0].finish_reason or finish
    assert finish == whole.finish_reason == "tool_calls"
    assert content == (whole.message.content or "")
    assert [tuple(calls[i]) for i in sorted(calls)] == \
        [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]


def test_round_trip_call_result_answer(client):
    first = client.chat.completions.create(model="gpt-4o-mini", messages=ASK, tools=TOOLS,
                                           tool_choice="required", temperature=0, max_tokens=120)
    msg = first.choices[0].message
    [call] = msg.tool_calls
    messages = ASK + [msg.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21})}]
    final = client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS,
                                           tool_choice="none", temperature=0, max_tokens=40)
    answer = final.choices[0]
    assert answer.message.tool_calls is None and answer.message.content
    assert answer.finish_reason in ("stop", "length")


def test_tool_choice_naming_an_unknown_tool_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="x", messages=ASK, tools=TOOLS,
                                       tool_choice={"type": "function", "function": {"name": "nope"}})
    assert e.value.body["param"] == "tool_choice"


# -- compatibility ---------------------------------------------------------------------

def test_any_model_name_is_served_and_models_lists_the_real_id(client, server):
    r = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "Hi"}],
                                       max_tokens=4, temperature=0)
    assert r.choices[0].message.content
    assert httpx.get(server.url + "/v1/models").json()["data"][0]["id"] != "gpt-4o-mini"


def test_final_assistant_message_is_continued(server):
    body = {"messages": [{"role": "user", "content": "Count to five."},
                         {"role": "assistant", "content": "1, 2, 3,"}],
            "temperature": 0, "max_tokens": 6}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120).json()
    plain = httpx.post(server.url + "/v1/completions", timeout=120, json={
        "prompt": "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
                  "<|im_end|>\n<|im_start|>user\nCount to five.<|im_end|>\n<|im_start|>assistant\n1, 2, 3,",
        "temperature": 0, "max_tokens": 6}).json()
    # llama-server 11434's message starts with the prefill (../shared/golden/synth/out/synth_chat.json,
    # every assistant_prefill conversation: content = prefill + generated_text_raw)
    assert r["choices"][0]["message"]["content"] == "1, 2, 3," + plain["choices"][0]["text"]


def test_logit_bias_list_form_and_n_predict(server):
    tok = httpx.post(server.url + "/tokenize", json={"content": "Hello"}).json()["tokens"][0]
    r = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": "Say hello"}], "temperature": 0, "n_predict": 3,
        "logit_bias": [[tok, False]]}).json()
    assert r["usage"]["completion_tokens"] <= 3
    assert not r["choices"][0]["message"]["content"].startswith("Hello")


@pytest.mark.parametrize("field,value", [("mirostat", 2), ("samplers", ["top_k"]), ("dry_multiplier", 0.8),
                                         ("xtc_probability", 0.5)])
def test_llama_cpp_fields_not_done_here_are_refused(server, field, value):
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "hi"}], field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field


# -- reasoning (SmolLM2 with Qwen3's template) ------------------------------------------

QWEN3 = os.path.join(os.path.dirname(__file__), "data", "templates", "Qwen-Qwen3-0.6B.jinja")
THINK_THEN_ANSWER = 'root ::= "<think>\\nThe user greets me.\\n</think>\\n\\n" "Hello!"'


@pytest.fixture(scope="module")
def qwen3(smollm2_path):
    cfg = ServerConfig(model=smollm2_path, n_ctx=2048, n_parallel=2, n_batch=256, n_threads=1,
                       chat_template_file=QWEN3)
    with RunningServer(create_app(cfg)) as srv:
        yield srv


def _chat(srv, **body):
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_think_block_goes_to_reasoning_content(qwen3):
    r = _chat(qwen3, messages=[{"role": "user", "content": "Hi"}], grammar=THINK_THEN_ANSWER)
    msg = r["choices"][0]["message"]
    # exactly what llama-server answers to this request
    assert (msg["reasoning_content"], msg["content"]) == ("The user greets me.\n", "Hello!")


def test_streamed_reasoning_arrives_as_reasoning_deltas(qwen3):
    client = openai.OpenAI(base_url=qwen3.url + "/v1", api_key="none", max_retries=0)
    reasoning = content = ""
    for chunk in client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi"}],
                                                stream=True, extra_body={"grammar": THINK_THEN_ANSWER}):
        d = chunk.choices[0].delta
        reasoning += getattr(d, "reasoning_content", None) or ""
        content += d.content or ""
    assert (reasoning, content) == ("The user greets me.\n", "Hello!")


def test_reasoning_format_none_keeps_the_think_block_in_content(qwen3):
    r = _chat(qwen3, messages=[{"role": "user", "content": "Hi"}], grammar=THINK_THEN_ANSWER,
              reasoning_format="none")
    msg = r["choices"][0]["message"]
    assert "reasoning_content" not in msg
    assert msg["content"] == "<think>\nThe user greets me.\n</think>\n\nHello!"


def _prompt(srv, **body) -> str:
    r = httpx.post(srv.url + "/apply-template", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["prompt"]


def test_chat_template_kwargs_reach_the_template(qwen3):
    hi = [{"role": "user", "content": "Hi"}]
    assert _prompt(qwen3, messages=hi) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert _prompt(qwen3, messages=hi, chat_template_kwargs={"enable_thinking": False}) == \
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_earlier_reasoning_content_reaches_the_template(qwen3):
    turn = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "reasoning_content": "I should call the tool.",
             "tool_calls": [{"id": "call_1", "type": "function", "function": {
                 "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "21 C"}]
    assert "<|im_start|>assistant\n<think>\nI should call the tool.\n</think>\n\n<tool_call>" in \
        _prompt(qwen3, messages=turn, tools=TOOLS)


def test_final_assistant_message_is_left_open(qwen3):
    # llama-server 11434 writes the template's (empty) think block before the continued text
    # (tests/data/template_renderings/renderings.json, Qwen-Qwen3-0.6B assistant_prefill)
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, I am"}]
    assert _prompt(qwen3, messages=msgs).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nHello, I am")
