"""The Hermes tool-use templates (Hermes 2 Pro / Hermes 3, llama.cpp's models/templates/)
served through the openai SDK: a plain chat (the template iterates `tools`, which a plain
request does not send), structured output, and tool calls parsed into `tool_calls`.
SmolLM2 stands in for the model. llama-server 11434's rendering of the same chat with the
same template is in tests/data/template_renderings/ (record.py says how it was made); how
it parses Hermes tool calls, in tests/data/template_parsing/ (tests/test_template_parsing.py)."""
from __future__ import annotations

import json
import os

import httpx
import openai
import pytest
from pydantic import BaseModel
from server_harness import RunningServer

from ggserve.server.app import ServerConfig, create_app

DATA = os.path.join(os.path.dirname(__file__), "data")
HERMES = "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
HELLO = [{"role": "user", "content": "Hello! Who are you?"}]


@pytest.fixture(scope="module")
def server(smollm2_path):
    cfg = ServerConfig(model=smollm2_path, n_ctx=4096, n_parallel=2, n_batch=256, n_threads=1,
                       chat_template_file=os.path.join(DATA, "templates", HERMES + ".jinja"))
    with RunningServer(create_app(cfg)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)


def test_plain_chat_renders_as_llama_server_renders_it(server):
    # without tools llama-server renders the template's tool list empty (no 400)
    with open(os.path.join(DATA, "template_renderings", "renderings.json"), encoding="utf-8") as f:
        theirs = json.load(f)["templates"][HERMES]["conversations"]["plain"]["prompt"]
    r = httpx.post(server.url + "/apply-template", json={"messages": HELLO}, timeout=120)
    assert r.status_code == 200 and r.json()["prompt"] == theirs


def test_plain_chat_is_answered(client):
    r = client.chat.completions.create(model="any", messages=HELLO, temperature=0, max_tokens=24)
    assert r.choices[0].message.content and r.choices[0].message.tool_calls is None


class City(BaseModel):
    name: str
    country: str


def test_response_format_parses_with_the_sdk(client):
    r = client.chat.completions.parse(
        model="any", response_format=City, temperature=0, max_tokens=80, extra_body={"repeat_penalty": 1.1},
        messages=[{"role": "user", "content": "Give me a city as JSON."}])
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(r.choices[0].message.parsed, City)


def test_tool_call_comes_back_parsed(client):
    r = client.chat.completions.create(
        model="any", tools=TOOLS, tool_choice="required", temperature=0, max_tokens=80,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert set(json.loads(call.function.arguments)) == {"city"}
