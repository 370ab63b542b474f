"""The end-of-generation token that ends an answer is listed last among its logprobs, with empty
text, as llama-server 11434 lists it (tests/data/eos_logprobs: how the reference was made)."""
import json
import pathlib

import httpx
import pytest
from server_harness import RunningServer

from ggserve.server.app import ServerConfig, create_app

REF = json.loads((pathlib.Path(__file__).parent / "data" / "eos_logprobs" / "reference.json").read_text())
LOGPROB_TOL = 0.01


@pytest.fixture(scope="module")
def server(smollm2_path):
    with RunningServer(create_app(ServerConfig(model=smollm2_path, n_ctx=512, n_parallel=1, n_threads=2))) as srv:
        yield srv


def answer(server, name: str) -> tuple[dict, dict]:
    case = REF["cases"][name]
    r = httpx.post(server.url + case["path"], json=case["request"], timeout=300)
    assert r.status_code == 200, r.text
    return r.json(), case["response"]


def assert_same_entries(ours: list[dict], theirs: list[dict]) -> None:
    assert [(e["token"], e["bytes"]) for e in ours] == [(e["token"], e["bytes"]) for e in theirs]
    for a, b in zip(ours, theirs):
        assert abs(a["logprob"] - b["logprob"]) <= LOGPROB_TOL, (a, b)


def test_completion_probabilities_end_with_the_eos_token(server):
    ours, theirs = answer(server, "completion")
    assert (ours["stop_type"], ours["tokens"]) == (theirs["stop_type"], theirs["tokens"])
    assert theirs["completion_probabilities"][-1]["token"] == ""
    assert [e["id"] for e in ours["completion_probabilities"]] == theirs["tokens"]
    assert_same_entries(ours["completion_probabilities"], theirs["completion_probabilities"])


def test_chat_logprobs_end_with_the_eos_token(server):
    ours, theirs = answer(server, "chat")
    ours, theirs = ours["choices"][0], theirs["choices"][0]
    assert (ours["finish_reason"], ours["message"]["content"]) == (theirs["finish_reason"], theirs["message"]["content"])
    assert_same_entries(ours["logprobs"]["content"], theirs["logprobs"]["content"])
