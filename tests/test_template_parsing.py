"""What llama-server 11434 parsed out of model output, for the template families: each
record (tests/data/template_parsing/, record.py says how they were made) is a request
and the raw text the model wrote under llama-server with that template; ggserve's
parse of the same text, through the path /v1/chat/completions takes (the request's
options, the rendered prompt, the template's output syntax), must give the same
content, reasoning_content and tool calls, whitespace included."""
from __future__ import annotations

import json
import os

import pytest

from ggserve.models.chat_template import ChatTemplate
from ggserve.server.api import schemas as S
from ggserve.server.api.openai.generation import continuation, template_messages
from ggserve.server.app import ServerConfig
from ggserve.server.chat.json_scan import minify
from ggserve.server.chat.options import chat_options
from ggserve.server.chat.prompts import render_chat

DATA = os.path.join(os.path.dirname(__file__), "data")
with open(os.path.join(DATA, "template_parsing", "records.json"), encoding="utf-8") as f:
    RECORDS = [r for r in json.load(f)["records"] if r["status"] == 200]
CONFIG = ServerConfig(model="SmolLM2-135M-Instruct.Q4_1.gguf")
_TEMPLATES: dict[str, ChatTemplate] = {}


def _template(name: str) -> ChatTemplate:
    if name not in _TEMPLATES:
        with open(os.path.join(DATA, "templates", name + ".jinja"), encoding="utf-8") as f:
            _TEMPLATES[name] = ChatTemplate(f.read(), bos_token="<|im_start|>", eos_token="<|im_end|>")
    return _TEMPLATES[name]


def ggserve_parse(template: ChatTemplate, body: dict, raw: str) -> dict:
    req = S.ChatCompletionRequest.model_validate(body)
    opts = chat_options(req, CONFIG, template)
    msgs, _ = template_messages(req)
    cont, agp = continuation(req, msgs)
    prompt = render_chat(template, opts.messages(msgs, template), opts.tools, template_kwargs=opts.template_kwargs,
                         continue_final=cont, add_generation_prompt=agp)
    out = opts.output(prompt)()
    d, e = out.feed(raw), out.finish()
    return {"content": d.content + e.content, "reasoning_content": d.reasoning + e.reasoning,
            "tool_calls": [(c["function"]["name"], _args(c["function"]["arguments"])) for c in out.calls]}


def _args(text: str):
    """Arguments compared as JSON values; a call cut off by max_tokens as minified text."""
    try:
        return json.loads(text)
    except ValueError:
        return minify(text)


def _theirs(msg: dict) -> dict:
    return {"content": msg["content"] or "", "reasoning_content": msg["reasoning_content"] or "",
            "tool_calls": [(c["name"], _args(c["arguments"])) for c in msg["tool_calls"]]}


@pytest.mark.parametrize("rec", RECORDS, ids=[f"{r['template']}-{r['kind']}-{i}" for i, r in enumerate(RECORDS)])
def test_parsed_as_llama_server_parsed_it(rec):
    assert ggserve_parse(_template(rec["template"]), rec["request"], rec["raw"]) == _theirs(rec["message"])


def test_records_cover_the_families():
    assert len({r["template"] for r in RECORDS}) >= 6
    assert {"forced", "calls", "plain"} <= {r["kind"] for r in RECORDS}
