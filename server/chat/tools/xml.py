"""Tool-call syntaxes with XML-style parameters or channels: Qwen3-Coder, GLM 4.x,
gpt-oss harmony."""
from __future__ import annotations

import re

from ggserve.server.chat.json_scan import Malformed, as_written, minify, skip_ws, value_end
from ggserve.server.chat.tools.syntax import Call, Format, Parsed, _dumps, _expect, _Incomplete, _typed, held


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
    # llama.cpp's qwen3-coder parser skips whitespace before the answer, after reasoning or not,
    # and ends reasoning at a call too (its thinking_end_tags), where the template thinks at all
    lstrip_content = True
    reasoning_stops, reasoning_stops_always, think_in_source_only = ("<tool_call>",), True, True
    call_open, call_close = "<tool_call>", "</tool_call>"
    markers = ("<tool_call>", "</tool_call>")
    starts = ("<tool_call>",)
    closers = ("</function>",)
    _fn = re.compile(r"\s*<function=([^>\n]+)>")
    _param = re.compile(r"\s*<parameter=([^>\n]+)>\n?")

    def block(self, text, i, partial):
        i = _expect(text, i, self.call_open, partial)
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
            i = _expect(text, i, self.call_close, partial)
        except _Incomplete:
            raise _Incomplete([self.partial_call(name, params)])
        return [self.xml_call(name, params)], i


class SeedOss(Qwen3Coder):
    """ByteDance Seed-OSS: Qwen3-Coder's calls between <seed:tool_call> tags, read by llama.cpp's
    autoparser (the answer's whitespace as its other templates: Format's defaults)."""

    name = "seed_oss"
    lstrip_content = None
    reasoning_stops, reasoning_stops_always, think_in_source_only = (), False, False
    call_open, call_close = "<seed:tool_call>", "</seed:tool_call>"
    markers = ("<seed:tool_call>", "</seed:tool_call>")
    starts = ("<seed:tool_call>",)


class Glm45(_XmlParams):
    """GLM 4.5/4.6/4.7: <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>."""

    name = "glm"
    lstrip_content = True              # llama-server drops the answer's leading whitespace, tools or not
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


class Ling3(Glm45):
    """Ling 3.0 / Bailing V3 (llama.cpp's common/parsers/ling3.cpp): GLM's calls; reasoning and
    answer exactly as written, reasoning the prompt opened ended by a call too, and the text
    after the calls up to the turn's end token."""

    name = "ling3"
    lstrip_content = lstrip_reasoning = lstrip_open_reasoning = lstrip_after_reasoning = False
    lenient_end = True
    reasoning_stops = ("<tool_call>",)

    def after_calls(self, after: str) -> str:
        after = after.lstrip(" \t\r\n")
        k = after.find("<|role_end|>")
        return after[:k] if k >= 0 else after[:len(after) - held(after, ("<|role_end|>",))]


class Harmony(Format):
    """gpt-oss: channels. analysis -> reasoning, final -> content,
    commentary to=functions.NAME -> a call (its message is the arguments)."""

    name = "gpt_oss"
    think = ("", "")
    markers = ("<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|constrain|>")
    always_shown = markers             # llama-server reads the channels with or without tools
    _to = re.compile(r"to=functions\.([^\s<]+)")
    _final = re.compile(r"<\|channel\|>final\b")

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
                if last and (partial or self.lenient_end):
                    break
                out.content += msg
                continue
            if self._final.search(head) and not (tools and self._to.search(head)):
                # llama-server's final message is the last: its text runs up to <|end|>
                body = "<|start|>".join([body, *msgs[n + 1:]]).split("<|end|>", 1)[0]
                out.content += body[:len(body) - held(body, ("<|end|>",))] if partial else body
                break
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
                out.calls.append(Call(to.group(1), as_written(body)))
            elif channel == "analysis" and reasoning:
                out.reasoning += body
            else:
                out.content += body
        return out


class DeepSeekDsml(_XmlParams):
    """DeepSeek V3.2 (llama.cpp's common/parsers/deepseek.cpp): <｜DSML｜function_calls>, then
    <｜DSML｜invoke name="NAME">\n with <｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>
    each; the answer runs up to the block (a blank line right before it is not part of it)."""

    name = "deepseek_v3_2"
    lenient_end = True
    lstrip_reasoning = lstrip_open_reasoning = False    # its parser takes the reasoning as written
    block_name = "function_calls"
    markers = ("｜DSML｜",)
    _invoke = re.compile(r'\s*<｜DSML｜invoke name="([^"]*)">\n')
    _param = re.compile(r'\s*<｜DSML｜parameter name="([^"]*)" string="(true|false)">')

    @property
    def starts(self):
        return ("\n\n<｜DSML｜" + self.block_name + ">", "<｜DSML｜" + self.block_name + ">")

    @property
    def reasoning_stops(self):      # its parser lets the calls end reasoning the prompt opened
        return self.starts

    def block(self, text, i, partial):
        i = _expect(text, i, self.starts[1], partial)
        calls: list[Call] = []
        while (m := self._invoke.match(text, i)):
            name, i, params = m.group(1), m.end(), []
            while (p := self._param.match(text, i)):
                end = text.find("</｜DSML｜parameter>", p.end())
                if end < 0:
                    if partial:     # the value being written: a string as it comes, JSON as written so far
                        raw = text[p.end():]
                        raw = raw[:len(raw) - held(raw, ("</｜DSML｜parameter>",))]
                        call = self.partial_call(name, params, p.group(1), raw)
                        raise _Incomplete(calls + [call])
                    raise Malformed("unterminated parameter")
                value = text[p.end():end]
                params.append((p.group(1), value if p.group(2) == "true" else _typed(value, {})))
                i = end + len("</｜DSML｜parameter>")
            j = skip_ws(text, i)
            if not text.startswith("</｜DSML｜invoke>", j):
                if partial and j < len(text) and not text.startswith("</｜DSML｜invoke>"[:len(text) - j], j) \
                        and not text.startswith('<｜DSML｜parameter name="'[:len(text) - j], j):
                    raise Malformed(f"expected a parameter at {j}")
                if partial:
                    raise _Incomplete(calls + [self.partial_call(name, params)])
                raise Malformed("unterminated invoke")
            calls.append(self.xml_call(name, params))
            i = j + len("</｜DSML｜invoke>")
        rest = text[skip_ws(text, i):]
        if partial and '<｜DSML｜invoke name="'.startswith(rest[:21]) and not rest.startswith("</"):
            raise _Incomplete(calls + ([Call(None)] if rest else []))
        try:
            i = _expect(text, i, "</｜DSML｜" + self.block_name + ">", partial)
        except _Incomplete:
            raise _Incomplete(calls)
        return calls, i

    def xml_call(self, name, params):
        return Call(name, _dumps(dict(params)))

    def partial_call(self, name, params, key=None, raw=""):
        return super().partial_call(name, [(k, v if isinstance(v, str) else _dumps(v)) for k, v in params], key, raw)


class DeepSeekDsmlV4(DeepSeekDsml):
    """DeepSeek V4: the same calls in a <｜DSML｜tool_calls> block."""

    name = "deepseek_v4"
    block_name = "tool_calls"


class LlmJpHarmony(Harmony):
    """LLM-jp 4.1 (llama.cpp's common/parsers/llm-jp-harmony.cpp): gpt-oss's channels with the
    tokenizer's spaces after the special tokens (one after <|message|> is not the message's),
    and a message cut off before its <|message|> is dropped."""

    name = "llm_jp_harmony"
    lenient_end = True
    _spaces = re.compile(r"(<\|start\|>|<\|channel\|>|<\|constrain\|>) +|(<\|message\|>) ")
    _final_open = re.compile(r"<\|channel\|> *final *<\|message\|> ?")

    def parse(self, text: str, partial: bool, reasoning: bool, tools: bool) -> Parsed:
        # the final message's own text is kept as written (its parser reads it to the end)
        m = self._final_open.search(text)
        cut = m.end() if m else len(text)
        head = self._spaces.sub(lambda m: m.group(1) or m.group(2), text[:cut])
        return super().parse(head + text[cut:], partial, reasoning, tools)
