"""What llama-server 11434 parsed out of model output, for the template families: each
record (tests/data/template_parsing/, record.py says how they were made) is a request
and the raw text the model wrote under llama-server with that template; ggserve's
parse of the same text, through the path /v1/chat/completions takes (tests/chat_parity.py),
must give the same content, reasoning_content and tool calls, whitespace included."""
from __future__ import annotations

import datetime
import json
import os

import pytest
from chat_parity import DATA, ggserve_parse, ggserve_prompt, template, theirs

# a raw text with U+FFFD is not the text llama-server parsed: its JSON answer replaced the
# bytes of a character cut off by max_tokens (which its parser leaves out)
with open(os.path.join(DATA, "template_parsing", "records.json"), encoding="utf-8") as f:
    RECORDS = [r for r in json.load(f)["records"] if r["status"] == 200 and "\ufffd" not in r["raw"]]


IDS = [f"{r['template']}-{r['kind']}-{i}" for i, r in enumerate(RECORDS)]


@pytest.mark.parametrize("rec", RECORDS, ids=IDS)
def test_parsed_as_llama_server_parsed_it(rec):
    assert ggserve_parse(template(rec["template"]), rec["request"], rec["raw"]) == theirs(rec["message"])


@pytest.mark.parametrize("rec", RECORDS, ids=IDS)
def test_streamed_one_character_at_a_time_the_same(rec):
    assert ggserve_parse(template(rec["template"]), rec["request"], rec["raw"], pieces=1) == theirs(rec["message"])


with open(os.path.join(DATA, "template_parsing", "records.json"), encoding="utf-8") as f:
    _RECORDED = json.load(f)
WHOLE_CALL_PROMPTS = [r for r in _RECORDED["records"] if "prompt" in r]     # refused ones too


@pytest.fixture
def recording_day(monkeypatch):
    """Templates print today's date (strftime_now): render on the day llama-server did."""
    from ggserve.models import chat_template

    day = datetime.datetime.fromisoformat(_RECORDED["made_on"]).replace(hour=12)
    monkeypatch.setattr(chat_template, "now", lambda: day)


@pytest.mark.parametrize("rec", WHOLE_CALL_PROMPTS,
                         ids=[f"{r['template']}-{i}" for i, r in enumerate(WHOLE_CALL_PROMPTS)])
def test_continued_call_prompt_rendered_as_llama_server_renders_it(rec, recording_day):
    """The prompt of a whole call continued (with reasoning_content where the record has it)
    equals llama-server's /apply-template rendering of the same request."""
    assert ggserve_prompt(template(rec["template"]), rec["request"]) == rec["prompt"]


def test_records_cover_every_template_and_each_tool_call_family():
    """Forced texts for every template; generated calls for one template per family (record.py)."""
    with open(os.path.join(DATA, "template_parsing", "records.json"), encoding="utf-8") as f:
        every = json.load(f)["records"]
    templates = {n[:-len(".jinja")] for n in os.listdir(os.path.join(DATA, "templates")) if n.endswith(".jinja")}
    assert {r["template"] for r in every if r["kind"] == "forced"} == templates
    for kind in ("calls", "parallel", "plain"):
        assert len({r["template"] for r in every if r["kind"] == kind}) >= 40


def test_whole_calls_recorded_for_every_family_with_a_call_syntax():
    """A whole call in each family's syntax as the prefill (record.py's "whole_call"): llama-server
    answered a parsed call for nearly every family; each of those records is replayed above."""
    import sys
    sys.path.insert(0, os.path.join(DATA, "template_parsing"))
    from whole_calls import WHOLE_CALLS
    with open(os.path.join(DATA, "template_parsing", "records.json"), encoding="utf-8") as f:
        every = [r for r in json.load(f)["records"] if r["kind"] == "whole_call"]
    assert {r["template"] for r in every} == set(WHOLE_CALLS)
    called = {r["template"] for r in every if r["status"] == 200 and r["message"]["tool_calls"]}
    assert len(called) >= 35
    parallel = [r for r in every if r["request"].get("parallel_tool_calls") and r["status"] == 200
                and len(r["message"]["tool_calls"]) == 2]
    assert len(parallel) >= 30
