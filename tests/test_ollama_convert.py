"""Ollama's request fields as ggserve takes them (server/api/ollama/convert.py): durations,
options, formats, messages with images and tool calls, names."""
from __future__ import annotations

import base64

import pytest

from ggserve.server.api.errors import APIError
from ggserve.server.api.ollama.convert import chat_messages, keep_alive_seconds, model_id, ollama_calls, sampling_fields

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 16).decode()


@pytest.mark.parametrize("value,seconds", [("5m", 300.0), ("1h30m", 5400.0), ("1.5s", 1.5), ("0", 0.0), (0, 0.0),
                                           (30, 30.0), ("-1", None), (-1, None), ("-5m", None), (None, None)])
def test_keep_alive_reads_go_durations_and_seconds(value, seconds):
    assert keep_alive_seconds(value) == seconds


def test_keep_alive_that_is_not_a_duration_is_a_400():
    with pytest.raises(APIError) as e:
        keep_alive_seconds("five minutes")
    assert e.value.status == 400 and e.value.param == "keep_alive"


def test_options_become_sampling_fields():
    body = {"options": {"temperature": 0.2, "top_k": 5, "repeat_last_n": 32, "num_predict": 7, "stop": "END",
                        "seed": 3, "num_ctx": 4096}, "format": "json"}
    assert sampling_fields(body) == {"temperature": 0.2, "top_k": 5, "repeat_last_n": 32, "seed": 3,
                                     "max_tokens": 7, "stop": ["END"], "json_schema": {"type": "object"}}
    assert "max_tokens" not in sampling_fields({"options": {"num_predict": -1}})


def test_an_unknown_option_is_a_400_naming_it():
    with pytest.raises(APIError) as e:
        sampling_fields({"options": {"temprature": 0}})
    assert e.value.param == "options.temprature"


def test_messages_carry_images_tool_calls_and_results():
    msgs = chat_messages([
        {"role": "user", "content": "what is here?", "images": [PNG]},
        {"role": "assistant", "content": "", "thinking": "look it up",
         "tool_calls": [{"function": {"name": "lookup", "arguments": {"q": "x"}}}]},
        {"role": "tool", "content": "42", "tool_name": "lookup"}])
    assert msgs[0]["content"] == [{"type": "text", "text": "what is here?"},
                                  {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}]
    assert msgs[1]["tool_calls"] == [{"id": "call_0", "type": "function",
                                      "function": {"name": "lookup", "arguments": '{"q": "x"}'}}]
    assert msgs[1]["reasoning_content"] == "look it up"
    assert msgs[2] == {"role": "tool", "content": "42", "tool_call_id": "call_0", "name": "lookup"}


def test_tool_calls_go_back_with_object_arguments():
    calls = [{"id": "c", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}]
    assert ollama_calls(calls) == [{"function": {"index": 0, "name": "lookup", "arguments": {"q": "x"}}}]


@pytest.mark.parametrize("name,found", [("gemma3", "gemma3"), ("gemma3:latest", "gemma3"), ("Gemma3", "gemma3"),
                                        ("org/repo:Q8_0", "org/repo:Q8_0"), ("gemma3:1b", None), ("llama3", None)])
def test_ollama_names_map_onto_router_ids(name, found):
    assert model_id(name, ["gemma3", "org/repo:Q8_0"]) == found
