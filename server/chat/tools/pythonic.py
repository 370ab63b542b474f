"""LFM2 / LFM2.5's tool-call syntax: <|tool_call_start|>[NAME(key=VALUE, ...), ...]<|tool_call_end|>.

Calls are written almost as Python calls (llama.cpp 11434's common/parsers/lfm2.cpp with
python_style_tool_calls): keyword arguments whose values are quoted strings ('...' or
"...") or Python / JSON literals (numbers, True/False/None, true/false/null, lists,
dicts). The arguments become JSON, left to right, so that the JSON of a cut-off call is
a prefix of the whole call's (what streaming needs). The answer and the reasoning are
taken exactly as written (its parser skips no whitespace).
"""
from __future__ import annotations

import ast
import json
import re

from ggserve.server.chat.json_scan import Malformed, skip_ws
from ggserve.server.chat.tools.syntax import Call, Format, _dumps, _expect, _Incomplete

_NAME = re.compile(r"([A-Za-z_][\w.\-]*)\(")
_KEY = re.compile(r"([A-Za-z_]\w*)=")
_OPEN = {"[": "]", "{": "}", "(": ")"}


def _value_end(text: str, i: int) -> int | None:
    """Index after the literal at text[i] (up to a top-level ',' or ')'); None: cut off."""
    depth, quote = [], ""
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
                if not depth:
                    return i + 1
        elif c in "\"'":
            quote = c
        elif c in _OPEN:
            depth.append(_OPEN[c])
        elif depth and c == depth[-1]:
            depth.pop()
            if not depth:
                return i + 1
        elif not depth and c in ",)":
            return i
        i += 1
    return None


def _to_json(raw: str):
    raw = raw.strip()
    try:
        return json.loads(raw)
    except ValueError:
        pass
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError) as e:
        raise Malformed(f"not a value: {raw!r}") from e


def _cut_string(raw: str) -> str:
    """The JSON text of a quoted string cut off after `raw` (its opening quote included)."""
    body = raw[1:]
    if body.endswith("\\"):
        body = body[:-1]
    try:
        value = ast.literal_eval(raw[0] + body + raw[0])
    except (ValueError, SyntaxError):
        value = body
    return _dumps(value)[:-1]


class Lfm2(Format):
    """LFM2 / LFM2.5: <|tool_call_start|>[NAME(key=VALUE, ...), ...]<|tool_call_end|>."""

    name = "lfm2"
    markers = ("<|tool_call_start|>", "<|tool_call_end|>")
    starts = ("<|tool_call_start|>",)
    lstrip_content = lstrip_reasoning = lstrip_open_reasoning = lstrip_after_reasoning = False
    lenient_end = True                 # the answer runs up to the calls' marker, as llama.cpp's `until`
    think_in_source_only = True

    def block(self, text, i, partial):
        i = _expect(text, i, "<|tool_call_start|>", partial)
        i = _expect(text, i, "[", partial)
        calls: list[Call] = []
        while True:
            i = skip_ws(text, i)
            m = _NAME.match(text, i)
            if not m:
                if partial and re.fullmatch(r"[\w.\-]*", text[i:]):
                    raise _Incomplete(calls + [Call(None)])
                raise Malformed(f"expected a call at {i}")
            try:
                args, i = self._args(text, m.end(), partial, m.group(1))
            except _Incomplete as inc:
                raise _Incomplete(calls + inc.calls)
            calls.append(Call(m.group(1), args))
            j = skip_ws(text, i)
            if not text.startswith(",", j):
                break
            i = j + 1
        try:
            i = _expect(text, i, "]", partial)
            i = _expect(text, i, "<|tool_call_end|>", partial)
        except _Incomplete:
            raise _Incomplete(calls)
        return calls, i

    def _args(self, text: str, i: int, partial: bool, name: str) -> tuple[str, int]:
        """The minified JSON arguments of the call whose '(' ends at i, and the index after ')'."""
        parts: list[str] = []
        while True:
            i = skip_ws(text, i)
            if text.startswith(")", i):
                return "{" + ",".join(parts) + "}", i + 1
            if parts:
                if not text.startswith(",", i):
                    if partial and i >= len(text):
                        raise _Incomplete([Call(name, "{" + ",".join(parts))])
                    raise Malformed(f"expected ',' or ')' at {i}")
                i = skip_ws(text, i + 1)
            m = _KEY.match(text, i)
            if not m:
                if partial and re.fullmatch(r"\w*", text[i:]):
                    raise _Incomplete([Call(name, "{" + ",".join(parts))])
                raise Malformed(f"expected an argument at {i}")
            key = _dumps(m.group(1)) + ":"
            end = _value_end(text, m.end())
            if end is None:
                if not partial:
                    raise Malformed("unterminated argument")
                raw = text[m.end():]
                tail = _cut_string(raw) if raw[:1] and raw[:1] in "\"'" else ""
                raise _Incomplete([Call(name, "{" + ",".join(parts + [key + tail]))])
            parts.append(key + _dumps(_to_json(text[m.end():end])))
            i = end
