"""What llama-server 11434 parsed out of model output, for the template families: each
record (tests/data/template_parsing/, record.py says how they were made) is a request
and the raw text the model wrote under llama-server with that template; ggserve's
parse of the same text, through the path /v1/chat/completions takes (tests/chat_parity.py),
must give the same content, reasoning_content and tool calls, whitespace included."""
from __future__ import annotations

import json
import os

import pytest
from chat_parity import DATA, ggserve_parse, template, theirs

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


def test_records_cover_every_template_and_each_tool_call_family():
    """Forced texts for every template; generated calls for one template per family (record.py)."""
    with open(os.path.join(DATA, "template_parsing", "records.json"), encoding="utf-8") as f:
        every = json.load(f)["records"]
    templates = {n[:-len(".jinja")] for n in os.listdir(os.path.join(DATA, "templates")) if n.endswith(".jinja")}
    assert {r["template"] for r in every if r["kind"] == "forced"} == templates
    for kind in ("calls", "parallel", "plain"):
        assert len({r["template"] for r in every if r["kind"] == kind}) >= 40
