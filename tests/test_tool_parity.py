"""Parity with llama-server's parser: for each recorded output (the raw text a model
wrote under llama-server, same GGUF and template), ggserve's parse gives the same
content, reasoning_content and tool calls that llama-server returned. The records
and how they were made: tests/data/tool_parity/ (record.py)."""
from __future__ import annotations

import json
import os

import pytest

from ggserve.models.chat_template import ChatTemplate
from ggserve.server.chat import output as co
from ggserve.server.chat.json_scan import minify

HERE = os.path.join(os.path.dirname(__file__), "data")
RECORDS = os.path.join(HERE, "tool_parity", "records.json")
records = json.load(open(RECORDS, encoding="utf-8"))["records"] if os.path.exists(RECORDS) else []


def _parse(rec) -> dict:
    with open(os.path.join(HERE, "templates", rec["template"] + ".jinja"), encoding="utf-8") as f:
        source = f.read()
    req = rec["request"]
    tools = req.get("tools") if req.get("tool_choice") != "none" else None
    fmt = co.detect(source)(tools)
    template = ChatTemplate(source)
    prompt = template.render(req["messages"], tools=tools)
    open_think = bool(fmt.think[0]) and prompt.rstrip().endswith(fmt.think[0])
    out = co.ChatOutput(fmt, tools=tools is not None, open_think=open_think)
    d = out.feed(rec["raw"])
    e = out.finish()
    return {"content": d.content + e.content, "reasoning_content": d.reasoning + e.reasoning,
            "tool_calls": [(c["function"]["name"], _args(c["function"]["arguments"])) for c in out.calls]}


def _args(text: str):
    """Arguments compared as JSON values; a call cut off by max_tokens as minified text."""
    try:
        return json.loads(text)
    except ValueError:
        return minify(text)


def _theirs(msg) -> dict:
    return {"content": msg["content"] or "", "reasoning_content": msg["reasoning_content"] or "",
            "tool_calls": [(c["name"], _args(c["arguments"])) for c in msg["tool_calls"]]}


def test_records_cover_the_families():
    if not records:
        pytest.skip("no records: run tests/data/tool_parity/record.py with a llama-server")
    assert len(records) >= 20
    assert len({r["template"] for r in records}) >= 8


@pytest.mark.parametrize("rec", records, ids=[f"{r['model']}-{r['template']}-{i}" for i, r in enumerate(records)])
def test_parsed_like_llama_server(rec):
    assert _parse(rec) == _theirs(rec["message"])
