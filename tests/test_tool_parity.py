"""Parity with llama-server's parser: for each recorded output (the raw text a model
wrote under llama-server, same GGUF and template), ggserve's parse gives the same
content, reasoning_content and tool calls that llama-server returned. The records
and how they were made: tests/data/tool_parity/ (record.py)."""
from __future__ import annotations

import json
import os

import pytest
from chat_parity import ggserve_parse, template, theirs

HERE = os.path.join(os.path.dirname(__file__), "data")
RECORDS = os.path.join(HERE, "tool_parity", "records.json")
records = json.load(open(RECORDS, encoding="utf-8"))["records"] if os.path.exists(RECORDS) else []


def test_records_cover_the_families():
    if not records:
        pytest.skip("no records: run tests/data/tool_parity/record.py with a llama-server")
    assert len(records) >= 20
    assert len({r["template"] for r in records}) >= 8


@pytest.mark.parametrize("rec", records, ids=[f"{r['model']}-{r['template']}-{i}" for i, r in enumerate(records)])
def test_parsed_like_llama_server(rec):
    # parsed through the path /v1/chat/completions takes (tests/chat_parity.py)
    assert ggserve_parse(template(rec["template"]), rec["request"], rec["raw"]) == theirs(rec["message"])
