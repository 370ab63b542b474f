"""Small JSON helpers for text that is still being generated.

`value_end` finds where a JSON value ends (or says the text is a valid prefix so
far), and `minify` drops whitespace outside strings. Both work on prefixes, so a
streamed value's minified prefix is always a prefix of the finished value's
minified text: tool-call arguments stream append-only and end exactly equal to
the non-streamed ones.
"""
from __future__ import annotations

import re

_WS = " \t\r\n"
_LITERAL = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null")
_LITERAL_PREFIX = re.compile(r"-?\d*\.?\d*(?:[eE][+-]?\d*)?|t(?:r(?:ue?)?)?|f(?:a(?:l(?:se?)?)?)?|n(?:u(?:ll?)?)?")


class Malformed(ValueError):
    """The text cannot be (the start of) JSON."""


def skip_ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


def value_end(s: str, i: int = 0) -> int | None:
    """Index just past the JSON value starting at s[i] (after whitespace); None when
    s ends inside it while still a valid prefix; Malformed when it cannot be JSON."""
    i = skip_ws(s, i)
    if i >= len(s):
        return None
    c = s[i]
    if c not in "{[\"":
        m = _LITERAL.match(s, i)
        if m and m.end() < len(s):
            return m.end()
        if _LITERAL_PREFIX.fullmatch(s, i):
            return None           # may still grow (a number or a literal at the end)
        if m:
            return m.end()
        raise Malformed(f"unexpected {c!r} at {i}")
    stack = []                    # expected closers
    n = len(s)
    while i < n:
        c = s[i]
        if c == '"':
            j = i + 1
            while j < n and s[j] != '"':
                j += 2 if s[j] == "\\" else 1
            if j >= n:
                return None
            i = j + 1
        elif c in "{[":
            stack.append("}" if c == "{" else "]")
            i += 1
        elif c in "}]":
            if not stack or stack.pop() != c:
                raise Malformed(f"unbalanced {c!r} at {i}")
            i += 1
        elif c in _WS or c in ",:":
            i += 1
        else:
            m = _LITERAL.match(s, i)
            if not m:
                if _LITERAL_PREFIX.fullmatch(s, i):
                    return None
                raise Malformed(f"unexpected {c!r} at {i}")
            i = m.end()
        if not stack:
            return i
    return None


def as_written(s: str) -> str:
    """A call's JSON arguments as the model wrote them, without the whitespace around them
    (llama-server 11434 answers them so; while streaming, the part written so far)."""
    return s.strip(" \t\r\n")


def minify(s: str) -> str:
    """JSON text without the whitespace outside strings (works on prefixes)."""
    out, i, n = [], 0, len(s)
    while i < n:
        c = s[i]
        if c == '"':
            j = i + 1
            while j < n and s[j] != '"':
                j += 2 if s[j] == "\\" else 1
            out.append(s[i:j + 1])
            i = j + 1
        else:
            if c not in _WS:
                out.append(c)
            i += 1
    return "".join(out)
