"""What every tool-call syntax shares: a parsed call, the output as parsed so far,
reading a JSON call object, and the Format base class each chat-template family
implements (server/chat/tools/formats.py, server/chat/tools/xml.py)."""
from __future__ import annotations

import json
import re
import string
from dataclasses import dataclass, field

from ggserve.server.chat.json_scan import Malformed, as_written, skip_ws, value_end

_ID_CHARS = string.ascii_letters + string.digits


@dataclass
class Call:
    name: str | None          # None while the name is still being written
    args: str = ""            # minified JSON text; a prefix of it while streaming
    id: str | None = None     # when the model writes one (Kimi K2, Mistral)


@dataclass
class Parsed:
    reasoning: str = ""
    content: str = ""
    calls: list[Call] = field(default_factory=list)


def held(text: str, markers) -> int:
    """Length of the longest end of `text` that is the start of a marker."""
    best = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:k]):
                best = k
                break
    return best


class _Incomplete(Exception):
    """The text ends inside a call (partial parsing only)."""

    def __init__(self, calls: list[Call]):
        self.calls = calls


def _expect(text: str, i: int, lit: str, partial: bool) -> int:
    """Index after `lit` at text[i] (whitespace skipped); _Incomplete at a prefix of it."""
    i = skip_ws(text, i) if lit and lit[0] not in " \n" else i
    if text.startswith(lit, i):
        return i + len(lit)
    if partial and lit.startswith(text[i:]):
        raise _Incomplete([])
    raise Malformed(f"expected {lit!r} at {i}")


def _typed(value: str, schema: dict | None):
    """An XML-style parameter's text as JSON: strings stay text, others parse."""
    kind = (schema or {}).get("type")
    if kind == "string":
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def _dumps(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


_HEAD = re.compile(r'\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*'
                   r'"(?:arguments|parameters)"\s*:\s*')


def json_call(text: str, i: int, partial: bool) -> tuple[Call, int]:
    """`{"name": ..., "arguments": {...}}` at text[i] -> (Call, index after it)."""
    i = skip_ws(text, i)
    end = value_end(text, i)
    head = _HEAD.match(text, i)
    if end is None:
        if not partial:
            raise Malformed("unterminated tool call")
        if not head:
            raise _Incomplete([Call(None)])
        try:
            name = json.loads(f'"{head.group(1)}"')
        except ValueError as e:      # a name with a broken escape: not a call
            raise Malformed(str(e)) from None
        a_end = value_end(text, head.end())
        args = text[head.end():a_end] if a_end is not None else text[head.end():]
        raise _Incomplete([Call(name, as_written(args))])
    try:
        obj = json.loads(text[i:end])
    except ValueError as e:
        raise Malformed(str(e)) from None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise Malformed("a tool call needs a name")
    args = obj.get("arguments", obj.get("parameters", {}))
    if head and value_end(text, head.end()) is not None:
        raw = as_written(text[head.end():value_end(text, head.end())])
    else:
        raw = args if isinstance(args, str) else _dumps(args)
    cid = obj.get("id") if isinstance(obj.get("id"), str) else None
    return Call(obj["name"], raw, cid), end


class Format:
    """Content only: no tool-call syntax (reasoning tags still split off)."""

    name = "content"
    think = ("<think>", "</think>")
    markers: tuple[str, ...] = ()      # token texts the output must show (preserved tokens)
    starts: tuple[str, ...] = ()       # what begins the tool calls
    # the answer's leading whitespace: None drops it unless a think block came first
    # (llama-server's default), True always drops it, False keeps it
    lstrip_content: bool | None = None
    lstrip_reasoning = True            # False: reasoning keeps its leading whitespace (DeepSeek V3.1)
    # reasoning in a think block the prompt opened: llama.cpp 11434's autoparser (the
    # families without a parser of their own: Hermes, generic) consumes the generation
    # prompt's tag and keeps the generated text's leading whitespace (False)
    lstrip_open_reasoning = True
    lstrip_after_reasoning = True      # False: the answer after a think block keeps its whitespace
    # the template writes think tags (set per template): llama.cpp's autoparser then
    # skips the answer's leading whitespace, tools or not (chat-auto-parser-generator.cpp:
    # only a template without reasoning is parsed as pure content)
    reasoning_template = False
    # (start, end) reasoning markers of a template llama.cpp parses with its autoparser, as its
    # analysis found them (whitespace included): the reasoning is split as it splits it
    # (server/chat/autoparse.py); None: by `think`
    autoparse: tuple[str, str] | None = None
    text_after_calls = True            # text after the last call is content (else dropped)
    # llama.cpp 11434's autoparser reads the answer up to the calls' start marker, and an end
    # of text that may begin that marker ends the answer even in its final parse (peg-parser.cpp,
    # until): set for the templates it parses (server/chat/options.py)
    lenient_end = False
    # (start, end) around the answer where the template always wraps it (Command R7B's
    # <|START_RESPONSE|>...<|END_RESPONSE|>): llama.cpp's autoparser reads the answer between them
    content_wrap: tuple[str, str] | None = None
    think_bare_end = False             # an end marker the output opens with, without a start, is skipped
    think_in_source_only = False       # reasoning split off only where the template's source writes `think`
    reasoning_stops: tuple[str, ...] = ()   # with tools: markers that also end reasoning the prompt opened
    reasoning_stops_always = False     # the stops end reasoning without tools too

    def __init__(self, tools: list | None = None):
        self.schemas = {}
        for t in tools or ():
            fn = t.get("function", t) if isinstance(t, dict) else {}
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                self.schemas[fn["name"]] = fn.get("parameters") or {}

    always_shown: tuple[str, ...] = ()  # markers llama-server shows even without tools

    def preserved(self, tools: bool = True) -> tuple[str, ...]:
        return (self.markers if tools else self.always_shown) + tuple(t for t in self.think if t)

    def param_schema(self, fn: str, param: str) -> dict | None:
        props = self.schemas.get(fn, {}).get("properties")
        return props.get(param) if isinstance(props, dict) else None

    # -- tool calls --

    def find_start(self, text: str) -> int:
        hits = [i for i in (text.find(s) for s in self.starts) if i >= 0]
        return min(hits) if hits else -1

    def split_calls(self, text: str, partial: bool) -> tuple[str, list[Call]]:
        """Content and calls; partial: _Incomplete never escapes (calls so far)."""
        start = self.find_start(text) if self.starts else -1
        if start < 0:
            keep = len(text) - (held(text, self.starts) if partial or self.lenient_end else 0)
            return text[:keep], []
        calls: list[Call] = []
        pos = start
        try:
            while True:
                got, pos = self.block(text, pos, partial)
                calls += got
                nxt = skip_ws(text, pos)
                if self.find_start(text[nxt:]) != 0:
                    break
                pos = nxt
        except _Incomplete as inc:
            return text[:start], calls + inc.calls
        after = text[pos:]
        if partial:
            after = after[:len(after) - held(after, self.starts)]
        # as llama-server: the text before the calls is kept as written
        return text[:start] + self.after_calls(after), calls

    def after_calls(self, after: str) -> str:
        """The content the text after the last call adds."""
        return after.strip() if self.text_after_calls else ""

    def block(self, text: str, i: int, partial: bool) -> tuple[list[Call], int]:
        raise NotImplementedError
