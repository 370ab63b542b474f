"""Every chat template llama.cpp 11434 ships (tests/data/templates/), rendered for a set of
conversations as llama-server renders them: its /apply-template answers were recorded
(tests/data/template_renderings/, record.py says how) and ggserve's rendering of the same
request must be the same text, or both must refuse it with a 4xx.

The rendering goes through what /apply-template runs (the request validated, its messages
and options as the API takes them, the template rendered by ggserve's renderer), without
the HTTP round trip: the model never takes part in a rendering. The template's BOS/EOS are
SmolLM2's, the model llama-server rendered with; the clock is set to the recording's day
(templates that print today's date)."""
from __future__ import annotations

import datetime
import functools
import json
import os

import pytest

from ggserve.models import chat_template as ct
from ggserve.server.api import schemas as S
from ggserve.server.api.errors import APIError
from ggserve.server.api.openai.generation import continuation, template_messages
from ggserve.server.app import ServerConfig
from ggserve.server.chat.options import chat_options
from ggserve.server.chat.prompts import render_chat
from ggserve.server.request_errors import RequestError

DATA = os.path.join(os.path.dirname(__file__), "data")
with open(os.path.join(DATA, "template_renderings", "renderings.json"), encoding="utf-8") as f:
    RECORDS = json.load(f)
DAY = datetime.datetime.fromisoformat(RECORDS["date"]).replace(hour=12)
CONFIG = ServerConfig(model="SmolLM2-135M-Instruct.Q4_1.gguf")

CASES = [pytest.param(t, c, id=f"{t}-{c}")
         for t, rec in sorted(RECORDS["templates"].items()) if "conversations" in rec
         for c in sorted(rec["conversations"])]


@functools.cache
def _template(name: str) -> ct.ChatTemplate:
    with open(os.path.join(DATA, "templates", name + ".jinja"), encoding="utf-8") as f:
        # SmolLM2's BOS and EOS texts (its tokenizer adds no BOS), as llama-server rendered with them
        return ct.ChatTemplate(f.read(), bos_token="<|im_start|>", eos_token="<|im_end|>", add_bos=False)


def ggserve_apply_template(template: ct.ChatTemplate, body: dict) -> tuple[int, str]:
    """(status, prompt or error) as ggserve's /apply-template answers `body`."""
    try:
        req = S.ChatCompletionRequest.model_validate(body)
        opts = chat_options(req, CONFIG, template.source)
        msgs, _ = template_messages(req)
        cont, agp = continuation(req, msgs)
        return 200, render_chat(template, opts.messages(msgs, template), opts.tools,
                                template_kwargs=opts.template_kwargs, continue_final=cont,
                                add_generation_prompt=agp, image_marker=ct.IMAGE_MARKER)
    except APIError as e:
        return e.status, str(e)
    except (RequestError, ct.TemplateError, ValueError) as e:
        return 400, str(e)


@pytest.fixture(autouse=True)
def recording_day(monkeypatch):
    monkeypatch.setattr(ct, "now", lambda: DAY)


@pytest.mark.parametrize("name,conversation", CASES)
def test_rendered_as_llama_server(name, conversation):
    theirs = RECORDS["templates"][name]["conversations"][conversation]
    status, text = ggserve_apply_template(_template(name), RECORDS["conversations"][conversation])
    if theirs["status"] == 200:
        assert (status, text) == (200, theirs["prompt"])
    else:
        assert 400 <= theirs["status"] < 500 and 400 <= status < 500, (theirs, text)


def test_every_shipped_template_is_recorded():
    shipped = {f[:-len(".jinja")] for f in os.listdir(os.path.join(DATA, "templates")) if f.endswith(".jinja")}
    assert shipped <= set(RECORDS["templates"])
    assert len(RECORDS["templates"]) >= 71


CAPS = [pytest.param(t, id=t) for t in sorted(RECORDS["templates"])]


@pytest.mark.parametrize("name", CAPS)
def test_capabilities_found_as_llama_server_finds_them(name):
    """What the polyfills hang on: llama-server's /props chat_template_caps for the template."""
    t, theirs = _template(name), RECORDS["templates"][name]["caps"]
    mine = {"supports_string_content": t.supports_string_content,
            "supports_typed_content": t.supports_typed_content, "supports_system_role": t.caps.system_role,
            "supports_tools": t.caps.tools, "supports_tool_calls": t.caps.tool_calls,
            "supports_object_arguments": t.caps.object_arguments}
    assert mine == {k: theirs[k] for k in mine}
