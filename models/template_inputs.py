"""The messages a chat template is given, changed as llama.cpp 11434 changes them before
rendering (common/chat.cpp, namespace workaround), by what the template can take
(models/template_caps.py)."""
from __future__ import annotations

import json

from ggserve.models.template_caps import Caps


class InputError(ValueError):
    """Messages llama.cpp refuses before rendering (arguments that are not JSON)."""


def polyfill(messages: list[dict], caps: Caps, source: str) -> list[dict]:
    """Messages (already copied, content normalized) as llama.cpp hands them to the template."""
    msgs = [_without_empty_reasoning(m) for m in messages]
    if "<|channel|>" not in source:     # every template but gpt-oss's: developer is system
        msgs = [{**m, "role": "system"} if m.get("role") == "developer" else m for m in msgs]
    if not caps.system_role and msgs and msgs[0].get("role") == "system":
        msgs = _fold_system(msgs)
    if caps.object_arguments:
        msgs = [_object_arguments(m) for m in msgs]
    return msgs


def _without_empty_reasoning(message: dict) -> dict:
    """common_chat_msg::to_json_oaicompat writes reasoning_content only when it has text."""
    if "reasoning_content" in message and not message["reasoning_content"]:
        return {k: v for k, v in message.items() if k != "reasoning_content"}
    return message


def _fold_system(msgs: list[dict]) -> list[dict]:
    """A template that never reads a system message: its text goes before the next
    message's, a newline between (alone, it is dropped)."""
    if len(msgs) == 1:
        return []
    first, second = msgs[0], msgs[1]
    return [{**second, "content": _text(first.get("content")) + "\n" + _text(second.get("content"))}, *msgs[2:]]


def _text(content) -> str:
    return content if isinstance(content, str) else "" if content is None else str(content)


def _object_arguments(message: dict) -> dict:
    """Tool calls' JSON-string arguments parsed, for templates that read them as objects."""
    if not message.get("tool_calls"):
        return message
    calls = []
    for call in message["tool_calls"]:
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
            try:
                fn = {**fn, "arguments": json.loads(fn["arguments"])}
            except ValueError as e:
                raise InputError(f"Failed to parse tool call arguments as JSON: {e}") from None
            call = {**call, "function": fn}
        calls.append(call)
    return {**message, "tool_calls": calls}
