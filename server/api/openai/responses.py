"""OpenAI's Responses API (/v1/responses) as a translation onto chat completions.

A request's input items become chat messages (as llama-server's
`convert_responses_to_chatcmpl` does) and run through the chat path
(generation_api.submit_chat); the answer comes back as output items (reasoning,
message, function_call). Where llama-server and OpenAI differ, OpenAI is followed:
`previous_response_id` works (responses kept in memory, least recently used
dropped first), built-in tool types are refused rather than skipped, and the
response object carries OpenAI's fields (status, incomplete_details, usage).
"""
from __future__ import annotations

import functools

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ggserve.server.api import schemas as S
from ggserve.server.api.chat_answer import collect
from ggserve.server.api.common import API
from ggserve.server.api.delivery import named_frame, sse
from ggserve.server.api.errors import APIError, invalid
from ggserve.server.api.openai.generation import request_prompt, submit_chat
from ggserve.server.api.openai.responses_items import ResponseStore, Turn, output_items
from ggserve.server.api.openai.responses_stream import events

# Fields of the Responses API itself; every other field (sampling, llama.cpp's own)
# passes to the chat request under the same name, as llama-server passes them.
_OWN = {"input", "instructions", "previous_response_id", "max_output_tokens", "tools", "tool_choice",
        "text", "reasoning", "store", "metadata", "include", "truncation", "background", "prompt",
        "conversation", "service_tier", "top_logprobs", "max_tool_calls", "safety_identifier",
        "prompt_cache_key", "stream_options",
        # chat-only fields with a Responses spelling above
        "messages", "max_tokens", "max_completion_tokens", "response_format", "n", "logprobs"}
_REFUSED = ("background", "conversation", "prompt")     # OpenAI features with no local meaning


# -- request: input items -> chat messages -------------------------------------------

def _parts(content, where: str, assistant: bool) -> str | list[dict]:
    """A message item's content -> chat content (a string stays a string)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid("content must be a string or a list of content parts", param=where)
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        here = f"{where}.{j}"
        if kind in ("input_text", "output_text"):
            if not isinstance(part.get("text"), str):
                raise invalid(f"{kind} part needs `text`", param=here)
            out.append({"type": "text", "text": part["text"]})
        elif kind == "refusal" and assistant:
            out.append({"type": "text", "text": str(part.get("refusal", ""))})
        elif kind == "input_image" and not assistant:
            url = part.get("image_url")
            if not isinstance(url, str) or not url:
                raise invalid("input_image needs `image_url` (a data: or http(s) URL; file_id is not "
                              "supported)", param=here)
            out.append({"type": "image_url", "image_url": {"url": url}})
        elif kind == "input_audio" and not assistant:      # decoded as a chat's input_audio part
            out.append({"type": "input_audio", "input_audio": part.get("input_audio")})
        else:
            allowed = "output_text or refusal" if assistant else "input_text, input_image or input_audio"
            raise invalid(f"content part type {kind!r} is not supported here (use {allowed})", param=here)
    return out


def input_messages(items, where: str = "input") -> list[dict]:
    """`input` (a string or a list of items) -> chat messages. A function_call or an
    assistant message joins the assistant turn just before it (one turn: reasoning,
    text, calls), as the output items of one response do."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise invalid("input must be a string or a non-empty list of items", param=where)
    msgs: list[dict] = []

    def turn(fresh: bool) -> dict:
        if fresh or not msgs or msgs[-1]["role"] != "assistant":
            msgs.append({"role": "assistant", "content": ""})
        return msgs[-1]

    for i, item in enumerate(items):
        here = f"{where}.{i}"
        if not isinstance(item, dict):
            raise invalid("each input item must be an object", param=here)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise invalid("message role must be user, system, developer or assistant", param=f"{here}.role")
            content = _parts(item.get("content"), f"{here}.content", role == "assistant")
            if role == "assistant":
                last = turn(False)
                if last["content"] or last.get("tool_calls"):
                    last = turn(True)
                last["content"] = content
            else:
                msgs.append({"role": role, "content": content})
        elif kind == "function_call":
            for k in ("call_id", "name", "arguments"):
                if not isinstance(item.get(k), str):
                    raise invalid(f"function_call needs `{k}` (a string)", param=f"{here}.{k}")
            turn(False).setdefault("tool_calls", []).append({
                "id": item["call_id"], "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]}})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise invalid("function_call_output needs `call_id`", param=f"{here}.call_id")
            out = item.get("output")
            if not isinstance(out, str):
                out = _parts(out, f"{here}.output", False)
            msgs.append({"role": "tool", "tool_call_id": item["call_id"], "content": out})
        elif kind == "reasoning":
            text = "".join(c.get("text", "") for c in item.get("content") or [] if isinstance(c, dict))
            last = turn(False)
            if last["content"] or last.get("tool_calls") or last.get("reasoning_content"):
                last = turn(True)
            last["reasoning_content"] = text
        else:
            raise invalid(f"input item type {kind!r} is not supported", param=f"{here}.type")
    return msgs


def _tools(tools) -> list[dict]:
    if not isinstance(tools, list):
        raise invalid("tools must be a list", param="tools")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, dict) else None
            raise invalid(f"tool type {kind!r} is not supported: only function tools run here",
                          param=f"tools.{i}.type")
        if not isinstance(t.get("name"), str):
            raise invalid("a function tool needs `name`", param=f"tools.{i}.name")
        fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if t.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice):
    if choice is None or choice in ("none", "auto", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise invalid('tool_choice must be "none", "auto", "required" or {"type": "function", "name": ...}',
                  param="tool_choice")


def _text_format(text):
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name"), "schema": fmt.get("schema")}}
    raise invalid("text.format.type must be text, json_object or json_schema", param="text.format")


def chat_body(body: dict, history: list[dict]) -> tuple[dict, list[dict]]:
    """A Responses request -> (the chat request, the conversation to keep for it)."""
    if "input" not in body:
        raise invalid("'input' is required", param="input")
    for k in _REFUSED:
        if body.get(k):
            raise invalid(f"{k} is not supported by this server", param=k)
    chat = {k: v for k, v in body.items() if k not in _OWN}
    conversation = history + input_messages(body["input"])
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise invalid("instructions must be a string", param="instructions")
    chat["messages"] = ([{"role": "system", "content": instructions}] if instructions else []) + conversation
    limit = body.get("max_output_tokens")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise invalid("max_output_tokens must be a positive integer", param="max_output_tokens")
        chat["max_tokens"] = limit
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    if (rf := _text_format(body.get("text"))) is not None:
        chat["response_format"] = rf
    return chat, conversation


# -- endpoints -----------------------------------------------------------------------

def _history(store: ResponseStore, body: dict, owner: str) -> list[dict]:
    """The conversation `previous_response_id` continues (none without it); only the
    owner's own responses are found."""
    prev = body.get("previous_response_id")
    if prev is None:
        return []
    if not isinstance(prev, str):
        raise invalid("previous_response_id must be a string", param="previous_response_id")
    try:
        return list(store.get(prev, owner)[0])
    except APIError:
        raise APIError(404, f"Previous response with id '{prev}' not found.", type="invalid_request_error",
                       param="previous_response_id", code="previous_response_not_found") from None


async def create(api: API, store: ResponseStore, request: Request) -> Response:
    body = await api.json_body(request)
    chat, conversation = chat_body(body, _history(store, body, api.owner(request)))
    req = S.ChatCompletionRequest.model_validate(chat)
    job = await submit_chat(api, req, salt=api.cache_salt(request, req))
    turn = Turn(api, store, body, conversation, api.owner(request))
    if req.stream:
        return sse(job, events(turn, job, timed=req.timings_per_token), framer=named_frame, end="")
    a = await collect(request, job)
    return JSONResponse(turn.finish(output_items(a), a))


async def input_tokens(api: API, store: ResponseStore, request: Request) -> Response:
    """The prompt's token count as POST /v1/responses would run it, nothing generated."""
    body = await api.json_body(request)
    req = S.ChatCompletionRequest.model_validate(chat_body(body, _history(store, body, api.owner(request)))[0])
    n = len((await request_prompt(api, req)).tokens)
    return JSONResponse({"object": "response.input_tokens", "input_tokens": n})


async def retrieve(api: API, store: ResponseStore, request: Request) -> Response:
    return JSONResponse(store.get(request.path_params["rid"], api.owner(request))[1])


async def delete(api: API, store: ResponseStore, request: Request) -> Response:
    rid = request.path_params["rid"]
    store.delete(rid, api.owner(request))
    return JSONResponse({"id": rid, "object": "response.deleted", "deleted": True})


def routes(api: API, route) -> list:
    """/v1/responses (and /responses), /v1/responses/input_tokens, GET and DELETE
    /v1/responses/{id}."""
    store = ResponseStore()
    out = []
    for prefix in ("/v1/responses", "/responses"):
        out.append(route(prefix, functools.partial(create, api, store), ["POST"], "responses"))
        out.append(route(prefix + "/input_tokens", functools.partial(input_tokens, api, store), ["POST"],
                         "responses_input_tokens"))
        out.append(route(prefix + "/{rid}", functools.partial(retrieve, api, store), ["GET"], "responses"))
        out.append(route(prefix + "/{rid}", functools.partial(delete, api, store), ["DELETE"], "responses"))
    return out
