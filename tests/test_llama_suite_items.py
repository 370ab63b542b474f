"""Behaviours llama.cpp's own server test suite (tools/server/tests, build 11434; run by
scripts/llama_server_suite.py) checks, one per test, with llama-server's answers as its
source (tools/server/*.cpp) or the suite states them."""
from __future__ import annotations

import os

import httpx
import pytest

from ggserve.models.builtin_templates import BUILTIN
from ggserve.models.chat_template import ChatTemplate
from ggserve.server.app import ServerConfig, create_app
from server_harness import RunningServer


@pytest.fixture(scope="module")
def server(smollm2_path):
    with RunningServer(create_app(ServerConfig(model=smollm2_path, n_ctx=1024, n_parallel=2,
                                               n_predict=8))) as s:
        yield s


def post(server, path, body):
    return httpx.post(server.url + path, json=body, timeout=120)


def test_command_r_builtin_template_renders_as_llama_cpp():
    # llama-server --chat-template command-r, POST /apply-template (llama.cpp's test_apply_chat_template)
    t = ChatTemplate(BUILTIN["command-r"])
    text = t.render([{"role": "system", "content": "You are a test."},
                     {"role": "user", "content": " Hi there "}], add_generation_prompt=True)
    assert text == ("<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|>"
                    "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|>"
                    "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>")


GREEDY = {"temperature": 0, "n_predict": 6}
PROMPT = "I believe the meaning of life is"


def test_completion_json_prompt_is_its_prompt_string(server):
    # llama-server's tokenize_input_subprompt: {"prompt_string": s} without multimodal_data is s
    a = post(server, "/completion", {**GREEDY, "prompt": {"prompt_string": PROMPT}})
    b = post(server, "/completion", {**GREEDY, "prompt": PROMPT})
    assert a.status_code == 200 and a.json()["content"] == b.json()["content"]
    assert a.json()["tokens_evaluated"] == b.json()["tokens_evaluated"] == 7


def test_completion_list_mixing_ids_and_json_prompt_is_two_prompts(server):
    ids = post(server, "/tokenize", {"content": PROMPT, "add_special": True}).json()["tokens"]
    r = post(server, "/completion", {**GREEDY, "prompt": [ids, {"prompt_string": PROMPT}]})
    assert r.status_code == 200
    assert [x["index"] for x in r.json()] == [0, 1] and r.json()[0]["content"] == r.json()[1]["content"]


def test_completion_json_prompt_with_images_is_refused_without_vision(server):
    r = post(server, "/completion", {**GREEDY, "prompt": {"prompt_string": PROMPT + " <__media__>",
                                                          "multimodal_data": ["iVBORw0KGgo="]}})
    assert r.status_code == 400 and "multimodal_data" in r.json()["error"]["message"]


def test_assistant_prefill_joins_text_parts_with_a_blank_line():
    # llama.cpp's common_chat_msg::render_content("\n\n") (test_chat_template_assistant_prefill)
    path = os.path.join(os.path.dirname(__file__), "data", "templates", "meta-llama-Llama-3.1-8B-Instruct.jinja")
    t = ChatTemplate(open(path, encoding="utf-8").read(), bos_token="<|begin_of_text|>")
    text = t.render([{"role": "system", "content": "Book"},
                     {"role": "user", "content": "What is the best book"},
                     {"role": "assistant", "content": [{"type": "text", "text": "Wh"},
                                                       {"type": "text", "text": "ill"}]}],
                    add_generation_prompt=False, continue_final_message=True)
    assert text.endswith("<|start_header_id|>user<|end_header_id|>\n\nWhat is the best book<|eot_id|>"
                         "<|start_header_id|>assistant<|end_header_id|>\n\nWh\n\nill")
