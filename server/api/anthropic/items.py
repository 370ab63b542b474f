"""What a Messages API answer is made of (Anthropic's shapes): the error body, the
stop reason, usage and the message with its content blocks."""
from __future__ import annotations

import json

from starlette.responses import JSONResponse, Response

from ggserve.server.api.chat_answer import Answer
from ggserve.server.api.errors import APIError

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                503: "overloaded_error", 529: "overloaded_error"}


def error_body(err: APIError) -> dict:
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(err.status, "api_error"),
                                       "message": err.message}}


def error_response(err: APIError) -> Response:
    return JSONResponse(error_body(err), status_code=err.status, headers=err.headers)


def stop_reason(a: Answer) -> str:
    if a.finish == "length":
        return "max_tokens"
    if a.calls:
        return "tool_use"
    return "stop_sequence" if a.stop_sequence else "end_turn"


def usage(a: Answer) -> dict:
    """Anthropic counts cache reads apart from input_tokens."""
    return {"input_tokens": a.prompt_tokens - a.cached_tokens, "output_tokens": a.completion_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": a.cached_tokens}


def tool_use(call: dict) -> dict:
    try:
        args = json.loads(call["function"]["arguments"] or "{}")
    except ValueError:
        args = {}
    return {"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": args}


def message(mid: str, model: str, a: Answer) -> dict:
    blocks = []
    if a.reasoning:
        blocks.append({"type": "thinking", "thinking": a.reasoning, "signature": ""})
    if a.content:
        blocks.append({"type": "text", "text": a.content})
    blocks += [tool_use(c) for c in a.calls]
    return {"id": mid, "type": "message", "role": "assistant", "model": model, "content": blocks,
            "stop_reason": stop_reason(a), "stop_sequence": a.stop_sequence if a.finish != "length" else None,
            "usage": usage(a)}
