"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) as a
translation onto chat completions.

Content blocks become chat messages (as llama-server's `convert_anthropic_to_oai`
does) and run through the chat path (generation_api.submit_chat); the answer comes
back as content blocks (thinking, text, tool_use). Errors leave in Anthropic's shape
`{"type": "error", "error": {"type", "message"}}`. Where llama-server and Anthropic
differ, Anthropic is followed: `max_tokens` is required, a stop string ends with
stop_reason "stop_sequence" (llama-server: "end_turn"), tool_result blocks come
before the rest of their user message, and blocks this server cannot take
(documents, server tools, a `system` role in messages) are refused, not dropped.
"""
from __future__ import annotations

import functools
import json

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ggserve.server.api import schemas as S
from ggserve.server.api.anthropic.items import error_response, message
from ggserve.server.api.anthropic.stream import events
from ggserve.server.api.chat_answer import collect
from ggserve.server.api.common import API
from ggserve.server.api.delivery import named_frame, sse
from ggserve.server.api.errors import invalid
from ggserve.server.api.openai.generation import request_prompt, submit_chat

# Fields of the Messages API itself; the others (temperature, top_p, top_k, stream,
# llama.cpp's own such as grammar or chat_template_kwargs) pass to the chat request.
_OWN = {"messages", "system", "max_tokens", "stop_sequences", "tools", "tool_choice", "thinking",
        "metadata", "service_tier", "container", "context_management", "mcp_servers",
        # chat-only fields with a Messages spelling above
        "n", "max_completion_tokens", "response_format", "logprobs", "top_logprobs", "stop",
        "stream_options", "parallel_tool_calls"}


def new_id(prefix: str) -> str:
    return S.new_id(prefix).replace("-", "_")


# -- request: content blocks -> chat messages ----------------------------------------

def _image(block: dict, where: str) -> dict:
    src = block.get("source")
    kind = src.get("type") if isinstance(src, dict) else None
    if kind == "base64" and isinstance(src.get("data"), str):
        url = f"data:{src.get('media_type') or 'image/jpeg'};base64,{src['data']}"
    elif kind == "url" and isinstance(src.get("url"), str):
        url = src["url"]
    else:
        raise invalid(f"{where}.source: an image needs a base64 source (media_type, data) or a url source",
                      param=f"{where}.source")
    return {"type": "image_url", "image_url": {"url": url}}


def _text(block: dict, where: str) -> dict:
    if not isinstance(block.get("text"), str):
        raise invalid(f"{where}.text: Field required", param=f"{where}.text")
    return {"type": "text", "text": block["text"]}


def _tool_result(block: dict, where: str) -> dict:
    if not isinstance(block.get("tool_use_id"), str):
        raise invalid(f"{where}.tool_use_id: Field required", param=f"{where}.tool_use_id")
    content = block.get("content", "")
    if isinstance(content, list):
        parts = []
        for k, c in enumerate(content):
            kind = c.get("type") if isinstance(c, dict) else None
            if kind == "text":
                parts.append(_text(c, f"{where}.content.{k}"))
            elif kind == "image":
                parts.append(_image(c, f"{where}.content.{k}"))
            else:
                raise invalid(f"{where}.content.{k}: tool_result content must be text or image blocks",
                              param=f"{where}.content.{k}")
        # text only: one string, which every template can render
        content = parts if any(p["type"] == "image_url" for p in parts) else "".join(p["text"] for p in parts)
    elif not isinstance(content, str):
        raise invalid(f"{where}.content: a string or a list of blocks", param=f"{where}.content")
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": content}


def _message(m, i: int) -> list[dict]:
    where = f"messages.{i}"
    if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
        raise invalid(f"{where}.role: must be \"user\" or \"assistant\"", param=f"{where}.role")
    role, content = m["role"], m.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise invalid(f"{where}.content: a string or a list of content blocks", param=f"{where}.content")
    parts, calls, results, thinking = [], [], [], ""
    for j, block in enumerate(content):
        here = f"{where}.content.{j}"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            parts.append(_text(block, here))
        elif kind == "image" and role == "user":
            parts.append(_image(block, here))
        elif kind == "tool_result" and role == "user":
            results.append(_tool_result(block, here))
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise invalid(f"{here}: tool_use needs `id` and `name`", param=here)
            args = json.dumps(block.get("input") or {}, ensure_ascii=False, separators=(",", ":"))
            calls.append({"id": block["id"], "type": "function",
                          "function": {"name": block["name"], "arguments": args}})
        elif kind == "thinking" and role == "assistant":
            thinking += block.get("thinking") or ""
        elif kind == "redacted_thinking" and role == "assistant":
            continue          # encrypted by Anthropic: nothing a local model can read
        else:
            raise invalid(f"{here}.type: content block type {kind!r} is not supported in a {role} message",
                          param=f"{here}.type")
    out = list(results)       # tool results answer the calls of the turn before: they come first
    if parts or calls or thinking:
        msg: dict = {"role": role, "content": parts or ""}
        if calls:
            msg["tool_calls"] = calls
        if thinking:
            msg["reasoning_content"] = thinking
        out.append(msg)
    return out


def _system(system) -> list[dict]:
    if system is None:
        return []
    if isinstance(system, list):
        if not all(isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
                   for b in system):
            raise invalid("system: a string or a list of text blocks", param="system")
        system = "".join(b["text"] for b in system)      # joined as llama-server joins them
    if not isinstance(system, str):
        raise invalid("system: a string or a list of text blocks", param="system")
    return [{"role": "system", "content": system}]


def _tools(tools) -> list[dict]:
    if not isinstance(tools, list):
        raise invalid("tools: must be a list", param="tools")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str) or \
                t.get("type", "custom") != "custom" or "input_schema" not in t:
            raise invalid(f"tools.{i}: only client tools ({{name, description, input_schema}}) are supported",
                          param=f"tools.{i}")
        fn = {"name": t["name"], "parameters": t["input_schema"]}
        if t.get("description"):
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(tc) -> tuple[object, bool]:
    """-> (chat tool_choice, parallel tool calls allowed)."""
    if not isinstance(tc, dict) or tc.get("type") not in ("auto", "any", "tool", "none"):
        raise invalid('tool_choice.type: must be "auto", "any", "tool" or "none"', param="tool_choice")
    parallel = not tc.get("disable_parallel_tool_use", False)
    if tc["type"] == "tool":
        if not isinstance(tc.get("name"), str):
            raise invalid("tool_choice.name: Field required", param="tool_choice.name")
        return {"type": "function", "function": {"name": tc["name"]}}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[tc["type"]], parallel


def chat_body(body: dict, need_max_tokens: bool = True) -> dict:
    """A Messages request -> the chat request it runs as."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise invalid("messages: Field required (a non-empty list)", param="messages")
    if body.get("mcp_servers"):
        raise invalid("mcp_servers: MCP connectors are not supported by this server", param="mcp_servers")
    chat = {k: v for k, v in body.items() if k not in _OWN}
    chat["messages"] = _system(body.get("system")) + [x for i, m in enumerate(msgs) for x in _message(m, i)]
    limit = body.get("max_tokens")
    if limit is not None or need_max_tokens:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise invalid("max_tokens: Field required (an integer >= 1)", param="max_tokens")
        chat["max_tokens"] = limit
    if body.get("stop_sequences") is not None:
        chat["stop"] = body["stop_sequences"]
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"], chat["parallel_tool_calls"] = _tool_choice(body["tool_choice"])
    elif body.get("tools"):
        chat["parallel_tool_calls"] = True
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "disabled":
        chat["chat_template_kwargs"] = {"enable_thinking": False, **(chat.get("chat_template_kwargs") or {})}
    return chat


# -- endpoints -----------------------------------------------------------------------

async def messages(api: API, request: Request) -> Response:
    body = await api.json_body(request)
    req = S.ChatCompletionRequest.model_validate(chat_body(body))
    job = await submit_chat(api, req, salt=api.cache_salt(request, req))
    mid, model = new_id("msg"), api.model_id()
    if req.stream:
        return sse(job, events(mid, model, job), framer=named_frame, end="")
    return JSONResponse(message(mid, model, await collect(request, job)))


async def count_tokens(api: API, request: Request) -> Response:
    """The prompt's token count as /v1/messages would run it, nothing generated."""
    body = await api.json_body(request)
    req = S.ChatCompletionRequest.model_validate(chat_body(body, need_max_tokens=False))
    return JSONResponse({"input_tokens": len((await request_prompt(api, req)).tokens)})


def routes(api: API, route) -> list:
    """/v1/messages and /v1/messages/count_tokens, errors in Anthropic's shape."""
    out = []
    for path, fn, name in (("/v1/messages", messages, "messages"),
                           ("/v1/messages/count_tokens", count_tokens, "count_tokens")):
        out.append(route(path, functools.partial(fn, api), ["POST"], name, errors=error_response))
    return out
