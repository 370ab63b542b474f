"""Generated chat text -> what OpenAI's API returns: reasoning, content, tool calls.

The tool-call syntax is the chat template's (llama.cpp's `common/chat*.cpp` define
the same families); `detect(template_source)` picks the format. `parse(text,
partial)` reads a whole output or the prefix generated so far; `ChatOutput` feeds
it the streamed text and returns only what is new: reasoning and content grow
append-only (text that may still become a marker is held back), a tool call
appears once its name is complete and its arguments then grow in pieces (minified
JSON, so the streamed pieces join to exactly the non-streamed arguments).

A call that is not valid at the end (broken JSON, a missing closer) leaves the
whole output as content, as llama-server does.
"""
from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass, field

from .json_scan import Malformed, minify, skip_ws, value_end

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
        name = json.loads(f'"{head.group(1)}"')
        a_end = value_end(text, head.end())
        args = text[head.end():a_end] if a_end is not None else text[head.end():]
        raise _Incomplete([Call(name, minify(args))])
    try:
        obj = json.loads(text[i:end])
    except ValueError as e:
        raise Malformed(str(e)) from None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise Malformed("a tool call needs a name")
    args = obj.get("arguments", obj.get("parameters", {}))
    if head and value_end(text, head.end()) is not None:
        raw = minify(text[head.end():value_end(text, head.end())])
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

    def __init__(self, tools: list | None = None):
        self.schemas = {}
        for t in tools or ():
            fn = t.get("function", t) if isinstance(t, dict) else {}
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                self.schemas[fn["name"]] = fn.get("parameters") or {}

    def preserved(self) -> tuple[str, ...]:
        return self.markers + tuple(t for t in self.think if t)

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
            keep = len(text) - (held(text, self.starts) if partial else 0)
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
        return text[:start] + after.strip(), calls

    def block(self, text: str, i: int, partial: bool) -> tuple[list[Call], int]:
        raise NotImplementedError


class Hermes(Format):
    """Hermes 2 Pro / Qwen 2.5 / Qwen3: <tool_call>{"name", "arguments"}</tool_call>."""

    name = "hermes"
    markers = ("<tool_call>", "</tool_call>")
    starts = ("<tool_call>",)

    def block(self, text, i, partial):
        i = _expect(text, i, "<tool_call>", partial)
        calls: list[Call] = []
        while True:     # llama-server also takes several calls in one tag, comma-separated
            try:
                call, i = json_call(text, i, partial)
            except _Incomplete as inc:
                raise _Incomplete(calls + inc.calls)
            calls.append(call)
            j = skip_ws(text, i)
            if not text.startswith(",", j):
                break
            i = j + 1
        try:
            i = _expect(text, i, "</tool_call>", partial)
        except _Incomplete:
            raise _Incomplete(calls)
        return calls, i


class _XmlParams(Format):
    """Shared by the XML-style formats: named parameters whose values are text,
    typed by the tool's schema. While streaming, the arguments grow as JSON: the
    finished parameters, then the key being written and its value so far (an open
    string, or the JSON written so far), as llama-server streams them."""

    def xml_call(self, name: str, params: list[tuple[str, str]]) -> Call:
        return Call(name, _dumps({k: _typed(v, self.param_schema(name, k)) for k, v in params}))

    def partial_call(self, name: str, params: list[tuple[str, str]], key: str | None = None,
                     raw: str = "") -> Call:
        parts = [f"{_dumps(k)}:{_dumps(_typed(v, self.param_schema(name, k)))}" for k, v in params]
        if key is not None:
            tail = f"{_dumps(key)}:"
            if raw:
                as_text = (self.param_schema(name, key) or {}).get("type") == "string"
                if not as_text:
                    try:
                        value_end(raw)
                    except Malformed:
                        as_text = True
                tail += _dumps(raw)[:-1] if as_text else minify(raw)
            parts.append(tail)
        return Call(name, "{" + ",".join(parts))

    def incomplete(self, text: str, i: int, name: str, params, key_open: str, key_close: str,
                   value_open: str, value_close: str):
        """Raise _Incomplete for the parameter being written at text[i:] (partial only)."""
        j = skip_ws(text, i)
        rest = text[j:]
        if not rest.startswith(key_open):
            if key_open.startswith(rest) or any(c.startswith(rest) for c in self.closers):
                raise _Incomplete([self.partial_call(name, params)])
            return
        k = text.find(key_close, j + len(key_open))
        if k < 0:
            raise _Incomplete([self.partial_call(name, params)])
        key = text[j + len(key_open):k].strip()
        v = k + len(key_close)
        if value_open:
            v = skip_ws(text, v)
            if not text.startswith(value_open, v):
                if value_open.startswith(text[v:]):
                    raise _Incomplete([self.partial_call(name, params, key)])
                return
            v += len(value_open)
        raw = text[v:]
        raw = raw[:len(raw) - held(raw, (value_close,))]
        if raw.startswith("\n") and not value_open:
            raw = raw[1:]
        raise _Incomplete([self.partial_call(name, params, key, raw.rstrip("\n"))])


class Qwen3Coder(_XmlParams):
    """Qwen3-Coder: <tool_call><function=NAME><parameter=K>V</parameter></function></tool_call>."""

    name = "qwen3_coder"
    markers = ("<tool_call>", "</tool_call>")
    starts = ("<tool_call>",)
    closers = ("</function>",)
    _fn = re.compile(r"\s*<function=([^>\n]+)>")
    _param = re.compile(r"\s*<parameter=([^>\n]+)>\n?")

    def block(self, text, i, partial):
        i = _expect(text, i, "<tool_call>", partial)
        m = self._fn.match(text, i)
        if not m:
            rest = text[skip_ws(text, i):]
            if partial and ("<function=".startswith(rest) or rest.startswith("<function=") and ">" not in rest):
                raise _Incomplete([Call(None)])
            raise Malformed("expected <function=NAME>")
        name, i, params = m.group(1).strip(), m.end(), []
        while True:
            p = self._param.match(text, i)
            end = text.find("</parameter>", p.end()) if p else -1
            if end < 0:
                break
            value = text[p.end():end]
            params.append((p.group(1).strip(), value[:-1] if value.endswith("\n") else value))
            i = end + len("</parameter>")
        if partial:
            self.incomplete(text, i, name, params, "<parameter=", ">", "", "</parameter>")
        try:
            i = _expect(text, i, "</function>", partial)
            i = _expect(text, i, "</tool_call>", partial)
        except _Incomplete:
            raise _Incomplete([self.partial_call(name, params)])
        return [self.xml_call(name, params)], i


class Glm45(_XmlParams):
    """GLM 4.5/4.6/4.7: <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>."""

    name = "glm"
    markers = ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")
    starts = ("<tool_call>",)
    closers = ("</tool_call>",)
    _kv = re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)

    def block(self, text, i, partial):
        i = _expect(text, i, "<tool_call>", partial)
        # the name ends at its line end (or the first key, or the closer)
        ends = [j for j in (text.find("<arg_key>", i), text.find("</tool_call>", i), text.find("\n", i + 1))
                if j >= 0]
        if not ends:
            raise _Incomplete([Call(None)]) if partial else Malformed("unterminated tool call")
        name, i, params = text[i:min(ends)].strip(), min(ends), []
        while (m := self._kv.match(text, i)):
            params.append((m.group(1).strip(), m.group(2)))
            i = m.end()
        if partial:
            self.incomplete(text, i, name, params, "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")
        try:
            i = _expect(text, i, "</tool_call>", partial)
        except _Incomplete:
            raise _Incomplete([self.partial_call(name, params)])
        return [self.xml_call(name, params)], i


class _NameArgs(Format):
    """[block_open] (call_open NAME name_end ARGS call_close)+ [block_close]."""

    block_open = ""
    call_open = ""
    name_end = ""
    call_close = ""
    block_close = ""

    @property
    def starts(self):
        return tuple(s for s in (self.block_open, self.call_open) if s)

    def call_name(self, raw: str) -> tuple[str, str | None]:
        return raw.strip(), None

    def block(self, text, i, partial):
        calls: list[Call] = []
        if self.block_open:
            i = _expect(text, i, self.block_open, partial)
        while True:
            j = skip_ws(text, i)
            if not text.startswith(self.call_open, j):
                if partial and j < len(text) and self.call_open.startswith(text[j:]) or partial and j >= len(text):
                    raise _Incomplete(calls)
                break
            j += len(self.call_open)
            k = text.find(self.name_end, j)
            if k < 0:
                if partial:
                    raise _Incomplete(calls + [Call(None)])
                raise Malformed("tool call without arguments")
            name, cid = self.call_name(text[j:k])
            a = k + len(self.name_end)
            end = value_end(text, a)
            if end is None:
                if partial:
                    raise _Incomplete(calls + [Call(name, minify(text[a:]), cid)])
                raise Malformed("unterminated arguments")
            try:
                json.loads(text[a:end])
            except ValueError as e:
                raise Malformed(str(e)) from None
            call = Call(name, minify(text[a:end]), cid)
            try:
                i = _expect(text, end, self.call_close, partial) if self.call_close else end
            except _Incomplete:
                raise _Incomplete(calls + [call])
            calls.append(call)
            if not self.block_open and not text.startswith(self.call_open, skip_ws(text, i)):
                break
        if self.block_close:
            try:
                i = _expect(text, i, self.block_close, partial)
            except _Incomplete:
                raise _Incomplete(calls)
            except Malformed:
                if skip_ws(text, i) < len(text):
                    raise
        return calls, i


class MistralArgs(_NameArgs):
    """Mistral Small 3.2 / Ministral 3 / Devstral: [TOOL_CALLS]NAME[ARGS]{...}."""

    name = "mistral"
    think = ("[THINK]", "[/THINK]")
    markers = ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]")
    call_open, name_end = "[TOOL_CALLS]", "[ARGS]"

    def call_name(self, raw):
        name, _, cid = raw.partition("[CALL_ID]")
        return name.strip(), (cid.strip() or None)


class MistralNemo(Format):
    """Mistral Nemo: [TOOL_CALLS][{"name", "arguments", "id"}, ...]."""

    name = "mistral_nemo"
    think = ("[THINK]", "[/THINK]")
    markers = ("[TOOL_CALLS]",)
    starts = ("[TOOL_CALLS]",)

    def block(self, text, i, partial):
        i = _expect(text, i, "[TOOL_CALLS]", partial)
        i = _expect(text, i, "[", partial)
        calls: list[Call] = []
        while True:
            try:
                call, i = json_call(text, i, partial)
            except _Incomplete as inc:
                raise _Incomplete(calls + inc.calls)
            calls.append(call)
            j = skip_ws(text, i)
            if j >= len(text):
                if partial:
                    raise _Incomplete(calls)
                raise Malformed("unterminated list of tool calls")
            if text[j] == "]":
                return calls, j + 1
            if text[j] != ",":
                raise Malformed(f"expected ',' or ']' at {j}")
            i = j + 1


class Llama3(Format):
    """Llama 3.1/3.2/3.3: the output is {"name", "parameters"} JSON (or after <|python_tag|>)."""

    name = "llama3"
    markers = ("<|python_tag|>",)
    starts = ("<|python_tag|>",)
    _start = re.compile(r'\s*\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:')
    _maybe = re.compile(r'\s*\{\s*(?:"(?:t(?:y(?:p(?:e(?:"(?:\s*:(?:\s*"(?:f[a-z]*"?)?)?)?)?)?)?)?|'
                        r'n(?:a(?:m(?:e"?)?)?)?)?)?\s*$')

    def find_start(self, text):
        if self._start.match(text):
            return 0
        return super().find_start(text)

    def split_calls(self, text, partial):
        if partial and self._maybe.match(text) and text.strip():
            return "", []       # may still become a call: hold it back
        return super().split_calls(text, partial)

    def block(self, text, i, partial):
        if text.startswith("<|python_tag|>", i):
            i += len("<|python_tag|>")
        calls = []
        while True:
            try:
                call, i = json_call(text, i, partial)
            except _Incomplete as inc:
                raise _Incomplete(calls + inc.calls)
            calls.append(call)
            j = skip_ws(text, i)
            if text.startswith(";", j) and self._start.match(text, j + 1):
                i = j + 1
                continue
            return calls, i


class DeepSeekV31(_NameArgs):
    """DeepSeek V3.1/V3.2 (and R1 0528 without the code fence)."""

    name = "deepseek_v3_1"
    markers = ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>",
               "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>")
    block_open, call_open, name_end = "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>"
    call_close, block_close = "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>"


class DeepSeekR1(DeepSeekV31):
    """DeepSeek R1: function<｜tool▁sep｜>NAME ```json ARGS ```."""

    name = "deepseek_r1"
    call_open, name_end = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>", "```json"
    call_close = "```<｜tool▁call▁end｜>"


class KimiK2(_NameArgs):
    """Kimi K2: functions.NAME:IDX between section/call markers; the id is the model's."""

    name = "kimi_k2"
    markers = ("<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
               "<|tool_call_end|>", "<|tool_calls_section_end|>")
    block_open, call_open = "<|tool_calls_section_begin|>", "<|tool_call_begin|>"
    name_end, call_close = "<|tool_call_argument_begin|>", "<|tool_call_end|>"
    block_close = "<|tool_calls_section_end|>"

    def call_name(self, raw):
        raw = raw.strip()
        name = raw.split(".", 1)[-1].rsplit(":", 1)[0]
        return name, raw


class Generic(Format):
    """llama-server's fallback for templates with tools but no known syntax: the
    whole output is {"tool_call": {...}}, {"tool_calls": [...]} or {"response": ...}."""

    name = "generic"
    starts = ("{",)

    def split_calls(self, text, partial):
        i = skip_ws(text, 0)
        if not text.startswith("{", i):
            return text, []
        try:
            end = value_end(text, i)
        except Malformed:
            return (text, []) if not partial else ("", [])
        if end is None:
            return "", []
        try:
            obj = json.loads(text[i:end])
        except ValueError:
            return text, []
        if isinstance(obj, dict) and isinstance(obj.get("response"), str):
            return obj["response"], []
        raw = obj.get("tool_calls") if isinstance(obj, dict) else None
        if raw is None and isinstance(obj, dict) and isinstance(obj.get("tool_call"), dict):
            raw = [obj["tool_call"]]
        if not isinstance(raw, list) or not all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in raw):
            return text, []
        return "", [Call(c["name"], _dumps(c.get("arguments", {})), c.get("id")) for c in raw]


class Harmony(Format):
    """gpt-oss: channels. analysis -> reasoning, final -> content,
    commentary to=functions.NAME -> a call (its message is the arguments)."""

    name = "gpt_oss"
    think = ("", "")
    markers = ("<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|constrain|>")
    _to = re.compile(r"to=functions\.([^\s<]+)")

    def parse(self, text: str, partial: bool, reasoning: bool, tools: bool) -> Parsed:
        out = Parsed()
        msgs = text.split("<|start|>")
        for n, msg in enumerate(msgs):
            last = n == len(msgs) - 1
            if n > 0 and not msg.startswith("assistant"):
                if last and partial and "assistant".startswith(msg):
                    break
                out.content += "<|start|>" + msg
                continue
            head, sep, body = msg.partition("<|message|>")
            if not sep:
                if last and partial:
                    break
                out.content += msg
                continue
            closed = False
            for end in ("<|end|>", "<|call|>", "<|return|>"):
                if end in body:
                    body, closed = body.split(end, 1)[0], True
                    break
            if partial and not closed:
                body = body[:len(body) - held(body, ("<|end|>", "<|call|>", "<|return|>"))]
            channel = head.split("<|channel|>", 1)[-1].split()[0] if "<|channel|>" in head else ""
            to = self._to.search(head)
            if to and tools:
                out.calls.append(Call(to.group(1), minify(body)))
            elif channel == "analysis" and reasoning:
                out.reasoning += body
            else:
                out.content += body
        return out


def detect(source: str) -> type[Format]:
    """The tool-call format a chat template writes (as llama.cpp tells them apart)."""
    s = source or ""
    if "<|channel|>" in s:
        return Harmony
    if "<|tool_calls_section_begin|>" in s:
        return KimiK2
    if "<｜tool▁calls▁begin｜>" in s:
        return DeepSeekR1 if "```json" in s else DeepSeekV31
    if "<arg_key>" in s:
        return Glm45
    if "<function=" in s and "<parameter=" in s:
        return Qwen3Coder
    if "<tool_call>" in s:
        return Hermes
    if "[TOOL_CALLS]" in s:
        return MistralArgs if "[ARGS]" in s else MistralNemo
    if "<|start_header_id|>" in s and ("ipython" in s or "python_tag" in s):
        return Llama3
    if "tools" in s:
        return Hermes if "tool_call" in s else Generic
    return Generic


def split_reasoning(text: str, think: tuple[str, str], partial: bool, open_at_start: bool) -> tuple[str, str]:
    """(reasoning, rest). A prompt that ends with the open tag starts inside reasoning.
    As llama-server: reasoning loses its leading whitespace (its trailing whitespace
    stays); after a think block the prompt opened, the content is kept verbatim."""
    open_tag, close_tag = think
    if not close_tag:
        return "", text
    body = text
    if not open_at_start:
        j = skip_ws(text, 0)
        if partial and open_tag.startswith(text[j:]):
            return "", ""
        if not text.startswith(open_tag, j):
            return "", text
        body = text[j + len(open_tag):]
    k = body.find(close_tag)
    if k < 0:
        if partial:
            body = body[:len(body) - held(body, (close_tag,))]
        return body.lstrip(), ""
    rest = body[k + len(close_tag):]
    return body[:k].lstrip(), rest if open_at_start else rest.lstrip()


def parse(text: str, fmt: Format, *, partial: bool = False, reasoning: bool = True,
          tools: bool = True, open_think: bool = False) -> Parsed:
    """A whole output (or, partial, the part generated so far) -> Parsed."""
    if isinstance(fmt, Harmony):
        return fmt.parse(text, partial, reasoning, tools)
    r, rest = split_reasoning(text, fmt.think, partial, open_think) if reasoning else ("", text)
    if not tools:
        return Parsed(r, rest)
    try:
        content, calls = fmt.split_calls(rest, partial)
    except Malformed:
        return Parsed(r, "" if partial else rest)
    if rest is text:
        content = content.lstrip()  # as llama-server: no leading whitespace
    return Parsed(r, content, calls)


_PROBE_ARGS = '{"probe_key": "probe_value"}'


def template_arguments(render) -> str:
    """How a template wants earlier calls' arguments: "string" (as OpenAI sends them)
    or "object" (parsed), probed as llama.cpp does: a template that does not write a
    string argument back as given gets objects. render(messages) -> text."""
    msgs = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "call00001", "type": "function",
             "function": {"name": "probe_tool", "arguments": _PROBE_ARGS}}]},
            {"role": "tool", "tool_call_id": "call00001", "content": "ok"}]
    try:
        if _PROBE_ARGS in render(msgs):
            return "string"
    except Exception:
        pass
    return "object"


def object_arguments(messages: list[dict]) -> list[dict]:
    """Messages with each tool call's JSON arguments string parsed into an object."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                fn = c.get("function") if isinstance(c, dict) else None
                if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                    try:
                        fn = {**fn, "arguments": json.loads(fn["arguments"])}
                    except ValueError:
                        pass
                    c = {**c, "function": fn}
                calls.append(c)
            m = {**m, "tool_calls": calls}
        out.append(m)
    return out


def new_call_id() -> str:
    return "call_" + "".join(secrets.choice(_ID_CHARS) for _ in range(24))


@dataclass
class MessageDelta:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[dict] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)


class ChatOutput:
    """One choice's streamed text -> deltas in OpenAI's shape (see the module doc)."""

    def __init__(self, fmt: Format, *, reasoning: bool = True, tools: bool = True,
                 open_think: bool = False):
        self.fmt = fmt
        self.opts = dict(reasoning=reasoning, tools=tools, open_think=open_think)
        self.text = ""
        self.reasoning = ""
        self.content = ""
        self.calls: list[dict] = []      # OpenAI tool_calls, as emitted so far

    def feed(self, piece: str) -> MessageDelta:
        if not piece:
            return MessageDelta()
        self.text += piece
        return self._emit(parse(self.text, self.fmt, partial=True, **self.opts))

    def finish(self) -> MessageDelta:
        p = parse(self.text, self.fmt, partial=False, **self.opts)
        if len(p.calls) < len(self.calls):
            # the text ended inside a call (max_tokens) or broke one after it had
            # started streaming: what was streamed stands, nothing is repeated as content
            return MessageDelta()
        return self._emit(p)

    def _emit(self, p: Parsed) -> MessageDelta:
        d = MessageDelta()
        if p.reasoning.startswith(self.reasoning):
            d.reasoning = p.reasoning[len(self.reasoning):]
            self.reasoning = p.reasoning
        if p.content.startswith(self.content):
            d.content = p.content[len(self.content):]
            self.content = p.content
        for i, call in enumerate(p.calls):
            if call.name is None:
                break
            if i >= len(self.calls):
                cid = call.id or new_call_id()
                self.calls.append({"id": cid, "type": "function",
                                   "function": {"name": call.name, "arguments": call.args}})
                d.tool_calls.append({"index": i, "id": cid, "type": "function",
                                     "function": {"name": call.name, "arguments": call.args}})
                continue
            fn = self.calls[i]["function"]
            if call.args.startswith(fn["arguments"]) and len(call.args) > len(fn["arguments"]):
                d.tool_calls.append({"index": i, "function": {"arguments": call.args[len(fn["arguments"]):]}})
                fn["arguments"] = call.args
        return d


class ShowingDecoder:
    """Detokenizer that keeps the text of the given control tokens (a format's
    markers, llama-server's preserved tokens) and drops the other control tokens."""

    def __init__(self, tokenizer, show: frozenset[int]):
        import codecs
        self._tok = tokenizer
        self._show = show
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._utf8.decode(self._tok.token_bytes(token_id, special=token_id in self._show))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


def shown_tokens(tokenizer, fmt: Format) -> frozenset[int]:
    """Ids of the control tokens among the format's markers and think tags."""
    if not hasattr(tokenizer, "token_to_id"):
        return frozenset()
    ids = (tokenizer.token_to_id(t) for t in fmt.preserved())
    return frozenset(i for i in ids if i is not None and tokenizer.is_special(i))
