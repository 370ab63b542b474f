"""Behaviours llama.cpp's own server test suite (tools/server/tests, build 11434; run by
scripts/llama_server_suite.py) checks, one per test, with llama-server's answers as its
source (tools/server/*.cpp) or the suite states them."""
from __future__ import annotations

import datetime
import json
import os

import httpx
import pytest

from ggserve.models.builtin_templates import BUILTIN
from ggserve.models.chat_template import ChatTemplate, TemplateError
from ggserve.server.app import ServerConfig, create_app
from server_harness import RunningServer


REF = json.load(open(os.path.join(os.path.dirname(__file__), "data", "llama_suite_items", "reference.json"),
                     encoding="utf-8"))["cases"]


@pytest.fixture(scope="module")
def server(smollm2_path):
    # as record.py ran llama-server: --temp 0.8 --seed 42 -c 512 -np 2 -b 32
    with RunningServer(create_app(ServerConfig(model=smollm2_path, n_ctx=512, n_parallel=2, n_batch=32,
                                               sampling_defaults={"temperature": 0.8, "seed": 42}))) as s:
        yield s


def replay(server, case):
    c = REF[case]
    r = post(server, c["path"], c["request"])
    assert r.status_code == c["status"] == 200
    return r.json(), c["response"]


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


def test_ignore_eos_bans_end_of_generation_tokens(server):
    # llama-server appends a -inf logit_bias for every EOG token (shown as null)
    got, want = replay(server, "ignore_eos")
    assert got["generation_settings"]["logit_bias"] == want["generation_settings"]["logit_bias"] \
        == [{"bias": None, "token": 0}, {"bias": None, "token": 2}, {"bias": None, "token": 4}]
    assert got["content"] == want["content"]


def _probs(answer):
    return [(t["id"], t["prob"], [(u["id"], u["prob"]) for u in t["top_probs"]])
            for t in answer["completion_probabilities"]]


def test_post_sampling_probs_are_the_sampler_chains_candidates(server):
    # seed 42 (the server's): the same draws, and each step's top_k/top_p/min_p/temperature candidates
    got, want = replay(server, "post_sampling_probs")
    assert got["content"] == want["content"]
    for (t, p, top), (t2, p2, top2) in zip(_probs(got), _probs(want), strict=True):
        assert t == t2 and p == pytest.approx(p2, abs=1e-5)
        assert [u for u, _ in top] == [u for u, _ in top2]
        assert [q for _, q in top] == pytest.approx([q for _, q in top2], abs=1e-5)
    assert "top_logprobs" not in got["completion_probabilities"][0]


def test_post_sampling_probs_of_a_greedy_pick_is_one_candidate(server):
    got, want = replay(server, "post_sampling_probs_greedy")
    assert _probs(got) == _probs(want) == [(599, 1.0, [(599, 1.0)]), (_probs(want)[1][0], 1.0, [(_probs(want)[1][0], 1.0)])]


def test_sampled_answer_repeats_llama_servers_with_its_seed(server):
    # llama.cpp's RNG (std::mt19937, uniform_real_distribution): --seed 42 draws the same tokens
    got, want = replay(server, "sampled_to_eos")
    assert got["content"] == want["content"]
    assert got["timings"]["predicted_n"] == want["timings"]["predicted_n"] == 84


def test_chat_n_choices_are_seeded_as_llama_servers_children(server):
    # choice i runs with seed + i (llama-server's child tasks)
    got, want = replay(server, "sampled_chat_n2")
    assert [c["message"]["content"] for c in got["choices"]] == [c["message"]["content"] for c in want["choices"]]
    assert [c["index"] for c in got["choices"]] == [0, 1]


def test_id_slot_pins_the_request_to_that_slot(server):
    a = "Tell me about the history of the Roman empire in detail please"
    b = "List three colours"
    for prompt in (a, b):
        r = post(server, "/completion", {"prompt": prompt, "id_slot": 1, "n_predict": 1, "temperature": 0})
        assert r.status_code == 200
    n_b = len(post(server, "/tokenize", {"content": b}).json()["tokens"])
    slots = httpx.get(server.url + "/slots").json()
    assert slots[1]["n_prompt_tokens"] == n_b != slots[0]["n_prompt_tokens"]


def test_id_slot_beyond_the_slots_is_refused(server):
    r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "id_slot": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "id_slot"


def test_undefined_plus_string_is_the_string_as_llama_cpps_jinja():
    # firefunction-v2 adds `functions` (never passed) to a string: llama.cpp's jinja treats it as ""
    data = os.path.join(os.path.dirname(__file__), "data")
    t = ChatTemplate(open(os.path.join(data, "templates", "fireworks-ai-llama-3-firefunction-v2.jinja"),
                          encoding="utf-8").read(), bos_token="<|im_start|>")      # SmolLM2's BOS text
    want = json.load(open(os.path.join(data, "llama_suite_items", "firefunction_v2_apply_template.json"),
                          encoding="utf-8"))["prompt"]
    got = t.render([{"role": "user", "content": "What is today?"}])
    today = datetime.date.today().strftime("%b %d %Y")
    assert got == want.replace("Today is Nov 25 2026.", f"Today is {today}.")


def test_undefined_plus_a_number_is_still_an_error():
    with pytest.raises(TemplateError, match="'x' is undefined"):
        ChatTemplate("{{ x + 1 }}").render([])


def test_completion_n_runs_each_prompt_n_times_as_llama_server(server):
    # llama-server's n_cmpl (alias n): prompt by prompt, child j seeded seed + j, index over all
    got, want = replay(server, "native_n2")
    assert [(a["index"], a["content"], a["generation_settings"]["seed"]) for a in got] \
        == [(b["index"], b["content"], b["generation_settings"]["seed"]) for b in want]
    assert [b["generation_settings"]["seed"] for b in want] == [42, 43, 42, 43]


def test_chat_input_tokens_counts_the_rendered_prompt(server):
    # llama-server's /chat/completions/input_tokens: {"input_tokens", "object": "response.input_tokens"}
    chat = {"messages": [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]}
    r = post(server, "/chat/completions/input_tokens", chat)
    assert r.json() == {"input_tokens": REF["greedy_chat_n2"]["response"]["usage"]["prompt_tokens"],
                        "object": "response.input_tokens"}
    assert post(server, "/v1/chat/completions/input_tokens", chat).json() == r.json()


def test_text_parts_join_with_a_newline_for_a_string_only_template(server):
    # llama-server 11434, SmolLM2's own template (content as a string): concat_content_parts joins
    # text parts with "\n" (recorded: POST /apply-template, this body)
    r = post(server, "/apply-template", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]})
    assert r.json() == {"prompt": "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                                  "Hugging Face<|im_end|>\n<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n"}
