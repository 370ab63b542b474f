"""ggserve's parse of a model's raw output, through the path /v1/chat/completions takes (the
request's options, the rendered prompt, the template's output syntax), in the shape
llama-server's message is compared in. Shared by tests/test_template_parsing.py and
tests/test_tool_parity.py (not a test module itself)."""
from __future__ import annotations

import json
import os

from ggserve.models.chat_template import ChatTemplate
from ggserve.server.api import schemas as S
from ggserve.server.api.openai.generation import continuation, prefill, template_messages
from ggserve.server.app import ServerConfig
from ggserve.server.chat.json_scan import minify
from ggserve.server.chat.options import chat_options
from ggserve.server.chat.prompts import render_chat

DATA = os.path.join(os.path.dirname(__file__), "data")
CONFIG = ServerConfig(model="SmolLM2-135M-Instruct.Q4_1.gguf")
_TEMPLATES: dict[str, ChatTemplate] = {}


def template(name: str) -> ChatTemplate:
    """A template of tests/data/templates/ with SmolLM2's BOS/EOS, as llama-server ran it."""
    if name not in _TEMPLATES:
        with open(os.path.join(DATA, "templates", name + ".jinja"), encoding="utf-8") as f:
            _TEMPLATES[name] = ChatTemplate(f.read(), bos_token="<|im_start|>", eos_token="<|im_end|>")
    return _TEMPLATES[name]


def ggserve_prompt(tmpl: ChatTemplate, body: dict) -> str:
    """The prompt ggserve renders for a chat request."""
    req = S.ChatCompletionRequest.model_validate(body)
    opts = chat_options(req, CONFIG, tmpl)
    msgs, _ = template_messages(req)
    cont, agp = continuation(req, msgs)
    return render_chat(tmpl, opts.messages(msgs, tmpl), opts.tools, template_kwargs=opts.template_kwargs,
                       continue_final=cont, add_generation_prompt=agp)


def ggserve_parse(tmpl: ChatTemplate, body: dict, raw: str, pieces: int = 0) -> dict:
    """The message ggserve returns for `raw` (fed whole, or streamed in pieces of that many characters)."""
    req = S.ChatCompletionRequest.model_validate(body)
    opts = chat_options(req, CONFIG, tmpl)
    out = opts.output(ggserve_prompt(tmpl, body), prefill(req))()
    content = reasoning = ""
    for i in range(0, len(raw), pieces or len(raw) or 1):
        d = out.feed(raw[i:i + (pieces or len(raw))])
        content, reasoning = content + d.content, reasoning + d.reasoning
    e = out.finish()
    return {"content": content + e.content, "reasoning_content": reasoning + e.reasoning,
            "tool_calls": [(c["function"]["name"], _args(c["function"]["arguments"])) for c in out.calls]}


def _args(text: str) -> str:
    """Arguments compared as text, whitespace included (llama-server answers the JSON families'
    arguments as the model wrote them, the tagged families' minified); a call cut off by
    max_tokens as minified text (ggserve's stream of it joins to the minified text)."""
    try:
        json.loads(text)
    except ValueError:
        return minify(text)
    return text


def theirs(msg: dict) -> dict:
    """llama-server's recorded message in the same shape."""
    return {"content": msg["content"] or "", "reasoning_content": msg["reasoning_content"] or "",
            "tool_calls": [(c["name"], _args(c["arguments"])) for c in msg["tool_calls"]]}
