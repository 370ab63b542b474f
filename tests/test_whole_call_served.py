"""A whole tool call written as the final assistant message (a prefill), SmolLM2's EOS forced
with logit_bias, served by a real server: the model ends at once and the answer is the parse
of the prefill, as llama-server 11434 answered the same request (tests/data/template_parsing/,
record.py's "whole_call" records; tests/test_template_parsing.py replays all of them through
the parser alone). One template per way llama-server writes the message back: JSON calls
(Granite 4.0), a think block then tagged calls (DeepSeek V3.2), parallel tagged calls
(MiniMax-M3), the harmony final channel (gpt-oss, where the call stays content)."""
from __future__ import annotations

import json
import os

import httpx
import pytest
from server_harness import RunningServer

from ggserve.server.app import ServerConfig, create_app

DATA = os.path.join(os.path.dirname(__file__), "data")
with open(os.path.join(DATA, "template_parsing", "records.json"), encoding="utf-8") as f:
    WHOLE = [r for r in json.load(f)["records"] if r["kind"] == "whole_call" and r["status"] == 200]


def _record(template: str, variant: str) -> dict:
    def kind(req):
        if "reasoning_content" in req["messages"][-1]:
            return "think"
        return "parallel" if req.get("parallel_tool_calls") else req["tool_choice"]
    return next(r for r in WHOLE if r["template"] == template and kind(r["request"]) == variant)


CASES = [("ibm-granite-granite-4.0", "auto"), ("deepseek-ai-DeepSeek-V3.2", "think"),
         ("MiniMax-M3", "parallel"), ("openai-gpt-oss-120b", "auto")]


def _served(smollm2_path, template: str, bodies: list[dict]) -> list[httpx.Response]:
    cfg = ServerConfig(model=smollm2_path, n_ctx=4096, n_parallel=1, n_batch=256, n_threads=1,
                       chat_template_file=os.path.join(DATA, "templates", template + ".jinja"))
    with RunningServer(create_app(cfg)) as srv:
        return [httpx.post(srv.url + "/v1/chat/completions", json=b, timeout=300) for b in bodies]


def _message(m: dict) -> dict:
    return {"content": m.get("content") or "", "reasoning_content": m.get("reasoning_content") or "",
            "tool_calls": [(c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls") or []]}


@pytest.mark.parametrize("template,variant", CASES, ids=[f"{t}-{v}" for t, v in CASES])
def test_whole_call_prefill_is_answered_as_llama_server_answered_it(smollm2_path, template, variant):
    rec = _record(template, variant)
    body = {**rec["request"], "temperature": 0, "max_tokens": 16}
    whole, streamed = _served(smollm2_path, template, [body, {**body, "stream": True}])
    assert whole.status_code == 200, whole.text
    out = whole.json()
    choice = out["choices"][0]
    assert out["usage"]["completion_tokens"] == 1           # the forced EOS, nothing else
    assert choice["finish_reason"] == rec["finish_reason"]
    assert _message(choice["message"]) == _message({**rec["message"], "tool_calls": [
        {"function": c} for c in rec["message"]["tool_calls"]]})
    # streamed: the same message, the calls' arguments joined from their pieces
    content = reasoning = ""
    calls: dict[int, list] = {}
    for line in streamed.text.splitlines():
        if not line.startswith("data: {"):
            continue
        delta = json.loads(line[6:])["choices"][0]["delta"] if json.loads(line[6:])["choices"] else {}
        content += delta.get("content") or ""
        reasoning += delta.get("reasoning_content") or ""
        for tc in delta.get("tool_calls") or []:
            got = calls.setdefault(tc["index"], ["", ""])
            got[0] += tc.get("function", {}).get("name") or ""
            got[1] += tc.get("function", {}).get("arguments") or ""
    assert {"content": content, "reasoning_content": reasoning,
            "tool_calls": [tuple(calls[i]) for i in sorted(calls)]} == _message(choice["message"])
