"""End to end: each dense issue-16 architecture (qwen3, phi3, mistral3, gemma4, on
its synthetic golden model with its family's real chat template) served by real
uvicorn; /v1/chat/completions answers as llama-server did
(../shared/golden/synth/out/synth_chat.json, the system + user conversation)."""
import httpx
import pytest

from ggserve.server.app import ServerConfig, create_app
from server_harness import RunningServer
from synth_golden import chat, model_path

ARCHS = ("qwen3", "phi3", "mistral3", "gemma4")
LOGPROB_TOL = 0.01
_ANSWERS = {}


def _golden(arch):
    return next(c for c in chat()["models"][arch] if c["key"] == "system_user")["chat_completion"]


def _answer(arch) -> dict:
    """One greedy chat completion of the golden conversation, through a real server."""
    if arch not in _ANSWERS:
        cfg = ServerConfig(model=model_path(arch), n_ctx=4096, n_parallel=1, n_batch=512, n_threads=2)
        body = {"messages": _golden(arch)["request"]["messages"], "max_tokens": 24, "temperature": 0,
                "logprobs": True, "top_logprobs": 5}
        with RunningServer(create_app(cfg)) as srv:
            r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        _ANSWERS[arch] = r.json()
    return _ANSWERS[arch]


@pytest.mark.parametrize("arch", ARCHS)
def test_served_tokens_and_logprobs_equal_llama_server(arch):
    golden, answer = _golden(arch), _answer(arch)
    choice = answer["choices"][0]
    assert answer["usage"]["prompt_tokens"] == golden["prompt_tokens"]
    assert choice["finish_reason"] == golden["finish_reason"] == "length"
    ours = choice["logprobs"]["content"]
    assert [bytes(t["bytes"]) for t in ours] == [bytes(s["bytes"]) for s in golden["steps"]]
    worst = max(abs(t["logprob"] - s["logprob"]) for t, s in zip(ours, golden["steps"]))
    assert worst <= LOGPROB_TOL


@pytest.mark.parametrize("arch", [*ARCHS[:2], "mistral3", "gemma4"])
def test_served_message_equals_llama_servers_parsed_message(arch):
    message = _answer(arch)["choices"][0]["message"]
    assert message["content"] == _golden(arch)["message"]["content"]
    assert not message.get("reasoning_content") and not message.get("tool_calls")
