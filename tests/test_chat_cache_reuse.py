"""A 4-turn chat reuses what the earlier turns computed, on a sliding-window model
(Gemma 3 270M: its ring keeps the window the next turn needs) and on a hybrid (the
synthetic Qwen3.5: its recurrent state saved at the prompt's checkpoints), as much as
llama-server 11434 reuses or more, and with its answers (tests/data/swa_memory:
chat_*.json, recorded by make_reference.py there, -c 4096 -np 1; tokens equal up to a
near tie of llama-server's)."""
import functools
import json
import pathlib

import httpx
import pytest
from server_harness import RunningServer
from synth_golden import NEAR_TIE, model_path

from ggserve.server.app import ServerConfig, create_app

DATA = pathlib.Path(__file__).parent / "data" / "swa_memory"


def _turns(model: str, ref: dict) -> list[dict]:
    """The recorded conversation's user turns sent one by one (with llama-server's
    answers as the assistant turns, so both servers see the same prompts)."""
    cfg = ServerConfig(model=model, n_ctx=4096, n_parallel=1, n_threads=2)
    out, messages = [], []
    with RunningServer(create_app(cfg)) as srv:
        for i, msg in enumerate(ref["messages"]):
            messages.append(msg)
            if msg["role"] != "user":
                continue
            r = httpx.post(srv.url + "/v1/chat/completions", timeout=600, json={
                "messages": messages, "max_tokens": 32, "temperature": 0, "logprobs": True, "top_logprobs": 2})
            assert r.status_code == 200, r.text
            out.append(r.json())
    return out


@functools.cache
def _answers(name: str, gemma3_path: str) -> tuple[dict, list[dict]]:
    ref = json.loads((DATA / f"chat_{name}.json").read_text())
    return ref, _turns(gemma3_path if name == "gemma3" else model_path("qwen35"), ref)


@pytest.mark.parametrize("name", ["gemma3", "qwen35"])
def test_every_later_turn_reuses_the_conversation(gemma3_path, name):
    ref, answers = _answers(name, gemma3_path)
    prompts = [a["usage"]["prompt_tokens"] for a in answers]
    cached = [a["usage"]["prompt_tokens_details"]["cached_tokens"] for a in answers]
    print(f"cached_tokens {cached}, llama-server {[t['cached_tokens'] for t in ref['turns']]}")   # with -s
    assert prompts == [t["prompt_tokens"] for t in ref["turns"]]
    for turn in range(1, 4):
        assert cached[turn] >= ref["turns"][turn]["cached_tokens"], (turn, cached, ref["turns"])
        assert cached[turn] >= 0.8 * prompts[turn - 1]


@pytest.mark.parametrize("name", ["gemma3", "qwen35"])
def test_every_turn_answers_as_llama_server(gemma3_path, name):
    ref, answers = _answers(name, gemma3_path)
    for answer, gold in zip(answers, ref["turns"]):
        _assert_same_answer(answer["choices"][0], gold)


def _assert_same_answer(choice: dict, gold: dict) -> None:
    """llama-server's tokens, up to a near tie of its own (its top two within NEAR_TIE)."""
    ours = [t["token"] for t in choice["logprobs"]["content"]]
    theirs = [t["token"] for t in gold["logprobs"]]
    i = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
    if i is None:
        assert ours == theirs and (choice["message"]["content"], choice["message"].get("reasoning_content")) == \
            (gold["content"], gold["reasoning_content"])
    else:
        top = gold["logprobs"][i]["top"]
        assert top[0][1] - top[1][1] < NEAR_TIE, f"token {i}: {ours[i]!r}, llama-server {theirs[i]!r} ({top})"
