"""Gemma 4's tool-call syntax: <|tool_call>call:NAME{key:VALUE,...}<tool_call|>.

Arguments are written in Gemma 4's own notation, not JSON: keys are bare words,
strings are delimited by the <|"|> token, numbers, booleans, null, arrays and
objects are as in JSON. llama-server converts them to JSON arguments (its
`gemma4_to_json`); so does `_Gemma4Args` below, left to right, so that the JSON
written for a prefix of the call is a prefix of the JSON of the whole call (what
streaming needs). Reasoning is the `<|channel>thought ... <channel|>` block.
"""
from __future__ import annotations

import json
import re

from ggserve.server.chat.json_scan import Malformed
from ggserve.server.chat.tools.syntax import Call, Format, _expect, _Incomplete, held

QUOTE = '<|"|>'
_SCALAR = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null")


class _Gemma4Args:
    """Gemma 4 notation -> minified JSON. `convert(i)` reads one value at text[i];
    when the text ends inside it, raises _Cut with the JSON written so far."""

    class Cut(Exception):
        pass

    def __init__(self, text: str):
        self.text = text
        self.out: list[str] = []

    def ws(self, i: int) -> int:
        while i < len(self.text) and self.text[i] in " \t\r\n":
            i += 1
        if i >= len(self.text):
            raise self.Cut()
        return i

    def value(self, i: int) -> int:
        t = self.text
        i = self.ws(i)
        if t.startswith(QUOTE, i):
            return self.string(i + len(QUOTE))
        if QUOTE.startswith(t[i:]):
            raise self.Cut()
        if t[i] == "{":
            return self.container(i + 1, "{", "}", self.member)
        if t[i] == "[":
            return self.container(i + 1, "[", "]", self.value)
        m = _SCALAR.match(t, i)
        if not m or m.end() == len(t):
            tail = t[i:i + 5]
            if m or any(w.startswith(tail) for w in ("true", "false", "null")) or re.fullmatch(r"-?[\d.eE+-]*", tail):
                self.out.append(t[i:])
                raise self.Cut()
            raise Malformed(f"unexpected {t[i]!r} at {i} in Gemma 4 arguments")
        self.out.append(m.group())
        return m.end()

    def string(self, i: int) -> int:
        end = self.text.find(QUOTE, i)
        if end < 0:
            body = self.text[i:]
            body = body[:len(body) - held(body, (QUOTE,))]
            self.out.append(json.dumps(body, ensure_ascii=False)[:-1])
            raise self.Cut()
        self.out.append(json.dumps(self.text[i:end], ensure_ascii=False))
        return end + len(QUOTE)

    def member(self, i: int) -> int:
        i = self.ws(i)
        colon = self.text.find(":", i)
        stop = self.text.find("}", i)
        if colon < 0 or 0 <= stop < colon:
            if stop >= 0:
                raise Malformed(f"a key without a value at {i} in Gemma 4 arguments")
            self.out.append(json.dumps(self.text[i:], ensure_ascii=False)[:-1])
            raise self.Cut()
        self.out.append(json.dumps(self.text[i:colon], ensure_ascii=False) + ":")
        return self.value(colon + 1)

    def container(self, i: int, open_: str, close: str, item) -> int:
        self.out.append(open_)
        i = self.ws(i)
        if self.text[i] == close:
            self.out.append(close)
            return i + 1
        while True:
            i = self.ws(item(i))
            if self.text[i] == close:
                self.out.append(close)
                return i + 1
            if self.text[i] != ",":
                raise Malformed(f"expected ',' or {close!r} at {i} in Gemma 4 arguments")
            self.out.append(",")
            i += 1


class Gemma4(Format):
    """Gemma 4: <|tool_call>call:NAME{...}<tool_call|>, one block per call."""

    name = "gemma4"
    think = ("<|channel>thought", "<channel|>")
    markers = ("<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|turn>", QUOTE)
    starts = ("<|tool_call>",)
    always_shown = ("<|channel>", "<channel|>")
    text_after_calls = False           # llama-server's Gemma 4 parser ends at the last call
    lstrip_content = False             # ... and keeps the answer as written

    def block(self, text, i, partial):
        i = _expect(text, i, "<|tool_call>call:", partial)
        brace = text.find("{", i)
        if brace < 0:
            if partial:
                raise _Incomplete([Call(None)])
            raise Malformed("a Gemma 4 tool call without arguments")
        name = text[i:brace]
        reader = _Gemma4Args(text)
        try:
            if text[brace:brace + 1] != "{":
                raise Malformed("Gemma 4 arguments must be an object")
            end = reader.container(brace + 1, "{", "}", reader.member)
        except _Gemma4Args.Cut:
            if partial:
                raise _Incomplete([Call(name, "".join(reader.out))])
            raise Malformed("unterminated Gemma 4 tool call") from None
        try:
            end = _expect(text, end, "<tool_call|>", partial)
        except _Incomplete:
            raise _Incomplete([Call(name, "".join(reader.out))])
        return [Call(name, "".join(reader.out))], end
