"""OpenAI's Responses API through the official openai SDKs (Python, and Node where
node is installed) against a real server: SmolLM2 with Qwen3's template (tool calls
in <tool_call> tags, think blocks). Greedy answers must equal what
/v1/chat/completions gives for the same conversation (llama.cpp-exact there)."""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess

import httpx
import openai
import pytest

from ggserve.server.app import ServerConfig, create_app
from ggserve.server.api.openai.responses_items import ResponseStore
from server_harness import RunningServer

TEMPLATE = os.path.join(os.path.dirname(__file__), "data", "templates", "Qwen-Qwen3-0.6B.jinja")
NODE = pathlib.Path(__file__).parent / "node"
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CHAT_WEATHER = {"type": "function", "function": {k: WEATHER[k] for k in ("name", "description", "parameters")}}
THINK_THEN_ANSWER = 'root ::= "<think>\\nThe user greets me.\\n</think>\\n\\n" "Hello!"'


@pytest.fixture(scope="module")
def server(smollm2_path):
    cfg = ServerConfig(model=smollm2_path, n_ctx=2048, n_parallel=2, n_batch=256, n_threads=1,
                       chat_template_file=TEMPLATE)
    with RunningServer(create_app(cfg)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


def chat(client, messages, **kw):
    """The same conversation through /v1/chat/completions, greedy."""
    return client.chat.completions.create(model="x", messages=messages, temperature=0, **kw).choices[0]


def test_plain_text_equals_chat_completions(client):
    r = client.responses.create(model="x", instructions="Answer briefly.", input="Name three colours.",
                                max_output_tokens=24, temperature=0)
    c = client.chat.completions.create(model="x", temperature=0, max_tokens=24, messages=[
        {"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name three colours."}])
    assert r.output_text == c.choices[0].message.content
    assert r.status == ("incomplete" if c.choices[0].finish_reason == "length" else "completed")
    assert [item.type for item in r.output] == ["message"]
    assert r.id.startswith("resp_") and r.object == "response"
    assert (r.usage.input_tokens, r.usage.output_tokens) == (c.usage.prompt_tokens, c.usage.completion_tokens)


def test_stream_sends_openai_events_in_order(client):
    kw = dict(model="x", input="Name three colours.", max_output_tokens=12, temperature=0)
    whole = client.responses.create(**kw)
    events = list(client.responses.create(stream=True, **kw))
    types = [e.type for e in events]
    n = types.count("response.output_text.delta")
    assert types == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added"] + ["response.output_text.delta"] * n + [
                     "response.output_text.done", "response.content_part.done", "response.output_item.done",
                     "response.incomplete" if whole.status == "incomplete" else "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-2].item.content[0].text == events[-1].response.output_text == whole.output_text
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens


def test_llama_server_telemetry_in_the_stream(server):
    """llama-server's return_progress and timings_per_token: prompt reports as response.in_progress
    events (a 256-token batch: one report as it starts, one after each of the ~330-token prompt's batches),
    timings on the text deltas and on the final event; the events OpenAI's SDK reads stay as they were."""
    body = {"input": "This is a test " * 80, "max_output_tokens": 4, "stream": True, "temperature": 0,
            "return_progress": True, "timings_per_token": True}
    text = httpx.post(server.url + "/v1/responses", json=body, timeout=120).text
    events = [json.loads(line[len("data: "):]) for line in text.splitlines() if line.startswith("data: ")]
    progress = [e["prompt_progress"] for e in events if "prompt_progress" in e]
    assert all(e["type"] == "response.in_progress" for e in events if "prompt_progress" in e)
    cached = progress[0]["cache"]          # what earlier requests left of the template's start
    assert [p["processed"] for p in progress] == [cached, cached + 256, progress[0]["total"]]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert deltas and all("prompt_per_second" in e["timings"] for e in deltas)
    assert events[-1]["type"] in ("response.completed", "response.incomplete") and "timings" in events[-1]


def test_stream_helper_gives_the_final_response(client):
    # the helper wants response.completed: an answer that ends before max_output_tokens
    kw = dict(model="x", input="What is 2+2?", max_output_tokens=32, temperature=0)
    with client.responses.stream(**kw) as s:
        final = s.get_final_response()
    whole = client.responses.create(**kw)
    assert final.status == whole.status == "completed"
    assert final.output_text == whole.output_text


def test_input_items_equal_the_same_chat(client):
    items = [{"role": "developer", "content": "You are terse."},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi, I am Ada."}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello Ada!"}]},
             {"role": "user", "content": "What is my name?"}]
    r = client.responses.create(model="x", input=items, max_output_tokens=16, temperature=0)
    c = chat(client, [{"role": "developer", "content": "You are terse."},
                      {"role": "user", "content": [{"type": "text", "text": "Hi, I am Ada."}]},
                      {"role": "assistant", "content": [{"type": "text", "text": "Hello Ada!"}]},
                      {"role": "user", "content": "What is my name?"}], max_tokens=16)
    assert r.output_text == c.message.content


def test_function_tool_round_trip(client):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.responses.create(model="x", input=ask, tools=[WEATHER], tool_choice="required",
                                max_output_tokens=60, temperature=0)
    [call] = [item for item in r.output if item.type == "function_call"]
    c = chat(client, ask, tools=[CHAT_WEATHER], tool_choice="required", max_tokens=60)
    [chat_call] = c.message.tool_calls
    assert (call.name, call.arguments) == (chat_call.function.name, chat_call.function.arguments) \
        and call.name == "get_weather"
    assert call.id.startswith("fc_") and call.status == "completed" and json.loads(call.arguments)["city"]
    # the call's output goes back with the whole earlier output, as the SDK docs do it
    result = json.dumps({"celsius": 21})
    answer = client.responses.create(
        model="x", tools=[WEATHER], tool_choice="none", max_output_tokens=24, temperature=0,
        input=ask + [item.model_dump(exclude_none=True) for item in r.output]
        + [{"type": "function_call_output", "call_id": call.call_id, "output": result}])
    c2 = chat(client, ask + [{"role": "assistant", "content": None, "tool_calls": [chat_call.model_dump()]},
                             {"role": "tool", "tool_call_id": chat_call.id, "content": result}],
              tools=[CHAT_WEATHER], tool_choice="none", max_tokens=24)
    assert answer.output_text == c2.message.content and answer.output_text


def test_streamed_function_call_events(client):
    kw = dict(model="x", input="What is the weather in Rome?", tools=[WEATHER], tool_choice="required",
              max_output_tokens=60, temperature=0)
    whole = [item for item in client.responses.create(**kw).output if item.type == "function_call"]
    events = list(client.responses.create(stream=True, **kw))
    types = [e.type for e in events if e.type != "response.function_call_arguments.delta"]
    assert types == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert args == done.arguments == events[-1].response.output[0].arguments == whole[0].arguments


def test_previous_response_id_continues_the_conversation(client, server):
    first = client.responses.create(model="x", input="My name is Ada.", max_output_tokens=12, temperature=0)
    second = client.responses.create(model="x", previous_response_id=first.id, input="What is my name?",
                                     max_output_tokens=12, temperature=0)
    c = chat(client, [{"role": "user", "content": "My name is Ada."},
                      {"role": "assistant", "content": first.output_text},
                      {"role": "user", "content": "What is my name?"}], max_tokens=12)
    assert second.output_text == c.message.content
    assert second.previous_response_id == first.id
    assert client.responses.retrieve(first.id).output_text == first.output_text
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="x", previous_response_id="resp_unknown", input="Hi")
    assert e.value.body["param"] == "previous_response_id"


def test_delete_drops_a_kept_response(client):
    r = client.responses.create(model="x", input="Hi", max_output_tokens=2)
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_input_tokens_equal_the_prompt_tokens(client, server):
    body = {"model": "x", "instructions": "Answer briefly.", "input": "Name three colours.", "tools": [WEATHER]}
    r = httpx.post(server.url + "/v1/responses/input_tokens", json=body, timeout=30)
    assert r.status_code == 200, r.text
    c = client.responses.create(max_output_tokens=1, **body)
    assert r.json() == {"object": "response.input_tokens", "input_tokens": c.usage.input_tokens}


def test_store_false_is_not_kept(client):
    r = client.responses.create(model="x", input="Hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_output_items_sent_back_make_one_assistant_turn():
    from ggserve.server.api.openai.responses import input_messages

    items = [{"role": "user", "content": "Weather in Paris?"},
             {"type": "reasoning", "id": "rs_1", "summary": [],
              "content": [{"type": "reasoning_text", "text": "Look."}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
             {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
              "arguments": '{"city":"Paris"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "21 C"}]
    assert input_messages(items) == [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Checking."}], "reasoning_content": "Look.",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 C"}]


def test_response_store_drops_the_least_recently_used():
    store = ResponseStore(size=2)
    for rid in ("a", "b"):
        store.put(rid, [], {"id": rid})
    store.get("a")                       # a used: b is now the oldest
    store.put("c", [], {"id": "c"})
    assert [rid for rid in ("a", "b", "c") if rid in store] == ["a", "c"]


def test_response_store_keeps_within_its_byte_budget():
    one = len(json.dumps([[{"role": "user", "content": "x" * 100}], {"id": "a"}]))
    store = ResponseStore(size=10, max_bytes=2 * one)
    for rid in ("a", "b", "c"):
        store.put(rid, [{"role": "user", "content": "x" * 100}], {"id": rid})
    assert [rid for rid in ("a", "b", "c") if rid in store] == ["b", "c"] and store.bytes == 2 * one
    store.delete("b")
    assert store.bytes == one


def test_reasoning_comes_back_as_a_reasoning_item(client):
    r = client.responses.create(model="x", input="Hi", extra_body={"grammar": THINK_THEN_ANSWER})
    assert [item.type for item in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == "The user greets me.\n" and r.output_text == "Hello!"
    events = list(client.responses.create(model="x", input="Hi", stream=True,
                                          extra_body={"grammar": THINK_THEN_ANSWER}))
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "The user greets me.\n"
    assert [item.type for item in events[-1].response.output] == ["reasoning", "message"]


@pytest.mark.parametrize("body, param", [
    ({"input": 3}, "input"),
    ({"model": "x"}, "input"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input.0.type"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input.0.content.0"),
    ({"input": "Hi", "tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"input": "Hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "Hi", "temperature": "hot"}, "temperature"),
])
def test_bad_requests_are_400_in_openai_shape(server, body, param):
    r = httpx.post(server.url + "/v1/responses", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]


@pytest.mark.skipif(shutil.which("node") is None or not (NODE / "node_modules" / "openai").exists(),
                    reason="node or tests/node/node_modules (npm ci) missing")
def test_node_sdk_plain_and_streamed(client, server):
    out = subprocess.run(["node", str(NODE / "responses.mjs"), server.url + "/v1", "Name three colours.", "12"],
                         capture_output=True, text=True, timeout=120, check=True)
    got = json.loads(out.stdout)
    c = chat(client, [{"role": "user", "content": "Name three colours."}], max_tokens=12)
    assert got["plain"]["text"] == got["streamed"] == c.message.content
    assert got["plain"]["usage"]["output_tokens"] == 12
    assert [seq for _, seq in got["events"]] == list(range(len(got["events"])))
    assert got["events"][0][0] == "response.created" and got["events"][-1][0] in (
        "response.completed", "response.incomplete")
