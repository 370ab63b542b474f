"""Tool-call syntaxes of the chat-template families (llama.cpp's `common/chat*.cpp`
define the same ones), and `detect(template_source)` which picks one."""
from __future__ import annotations

import json
import re

from ggserve.server.chat.json_scan import Malformed, as_written, skip_ws, value_end
from ggserve.server.chat.tools.gemma4 import Gemma4
from ggserve.server.chat.tools.json_sections import (
    Apertus,
    AprielCalls,
    Cohere2MoE,
    CommandR7B,
    CommandRPlus,
    FireFunction,
    FunctionaryV32,
    GigaChat3,
    GigaChat31,
    MiniMaxM1,
    NemotronV2,
)
from ggserve.server.chat.tools.kimi_k3 import KimiK3
from ggserve.server.chat.tools.muse import MuseGlimmer
from ggserve.server.chat.tools.pythonic import Lfm2
from ggserve.server.chat.tools.syntax import Call, Format, _dumps, _expect, _Incomplete, json_call
from ggserve.server.chat.tools.tagged import Hy3, MiniCPM5, MiniMaxM2, MiniMaxM3
from ggserve.server.chat.tools.xml import (
    DeepSeekDsml,
    DeepSeekDsmlV4,
    Glm45,
    Harmony,
    Ling3,
    LlmJpHarmony,
    Qwen3Coder,
    SeedOss,
)


class Hermes(Format):
    """Hermes 2 Pro / Qwen 2.5 / Qwen3: <tool_call>{"name", "arguments"}</tool_call>."""

    name = "hermes"
    lstrip_open_reasoning = False
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
                    raise _Incomplete(calls + [Call(name, as_written(text[a:]), cid)])
                raise Malformed("unterminated arguments")
            try:
                json.loads(text[a:end])
            except ValueError as e:
                raise Malformed(str(e)) from None
            call = Call(name, as_written(text[a:end]), cid)
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


class Ministral3(MistralArgs):
    """Ministral 3 / Mistral Large 3 (no [CALL_ID]): llama-server's parser for them
    skips the whitespace that opens the answer, with or without tools."""

    name = "ministral3"
    lstrip_content = True


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


def _nested(atoms: list[str]) -> str:
    """A regex for any non-empty prefix of the sequence of regex atoms."""
    atoms = [re.escape(a) if a != r"\s*" else a for a in atoms]
    out = atoms[-1]
    for a in reversed(atoms[:-1]):
        out = f"{a}(?:{out})?"
    return out


class Llama3(Format):
    """Llama 3.1/3.2/3.3: the output is {"name", "parameters"} JSON (or after <|python_tag|>)."""

    name = "llama3"
    markers = ("<|python_tag|>",)
    starts = ("<|python_tag|>",)
    _start = re.compile(r'\s*\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:')
    _maybe = re.compile(r'\s*\{\s*(?:' + _nested([*'"type"', r'\s*', ':', r'\s*', *'"function"', r'\s*', ',', r'\s*',
                                                     *'"name"', r'\s*', ':'])
                        + '|' + _nested([*'"name"', r'\s*', ':']) + r')?\s*$')   # the start of a call, cut anywhere

    # llama.cpp's autoparser reads a call after text too (content up to its "{")
    _anywhere = re.compile(r'\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:')

    def find_start(self, text):
        if self._start.match(text):
            return 0
        m = self._anywhere.search(text)
        hits = [i for i in (super().find_start(text), m.start() if m else -1) if i >= 0]
        return min(hits) if hits else -1

    def split_calls(self, text, partial):
        if partial and self._maybe.match(text) and text.strip():
            return "", []       # may still become a call: hold it back
        k = text.rfind("{") if partial else -1
        if k > 0 and self._maybe.match(text, k) and self.find_start(text) < 0:
            return super().split_calls(text[:k], partial)[0], []     # the text's end may start a call
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


class FunctionaryV31(_NameArgs):
    """Functionary v3.1 (llama.cpp's autoparser, patched as its analyzer patches it):
    <function=NAME>{...}</function>, call after call."""

    name = "functionary_v3_1"
    lenient_end = True
    markers = ("<function=", "</function>")
    call_open, name_end, call_close = "<function=", ">", "</function>"


class DeepSeekV31(_NameArgs):
    """DeepSeek V3.1/V3.2 (and R1 0528 without the code fence)."""

    name = "deepseek_v3_1"
    markers = ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>",
               "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>")
    block_open, call_open, name_end = "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>"
    call_close, block_close = "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>"
    lstrip_reasoning = False           # llama-server keeps the reasoning as generated (synth golden)


class DeepSeekR1(DeepSeekV31):
    """DeepSeek R1: function<｜tool▁sep｜>NAME ```json ARGS ```."""

    name = "deepseek_r1"
    lstrip_reasoning = True
    call_open, name_end = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>", "```json"
    call_close = "```<｜tool▁call▁end｜>"


class KimiK2(_NameArgs):
    """Kimi K2: functions.NAME:IDX between section/call markers; the id is the model's."""

    name = "kimi_k2"
    # llama.cpp's kimi_k2 parser takes reasoning and answer exactly as written
    lstrip_content = lstrip_reasoning = lstrip_after_reasoning = False
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
    lstrip_open_reasoning = False
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


def detect(source: str) -> type[Format]:
    """The tool-call format a chat template writes (as llama.cpp tells them apart)."""
    s = source or ""
    if "chat_format=llm-jp-harmony-v1" in s:
        return LlmJpHarmony
    if "<|channel|>" in s:
        return Harmony
    if "'<|tool_call>call:'" in s:
        return Gemma4
    if "<|tool_calls_section_begin|>" in s:
        return KimiK2
    if "<｜tool▁calls▁begin｜>" in s:
        return DeepSeekR1 if "```json" in s else DeepSeekV31
    if "<role>ASSISTANT</role>" in s and "<arg_key>" in s:
        return Ling3
    if "<arg_key>" in s:
        return Glm45
    if "dsml_token" in s and "DSML" in s and ("function_calls" in s or "tool_calls" in s):
        return DeepSeekDsml if "function_calls" in s else DeepSeekDsmlV4
    if "<|tool_call_start|>" in s or "<|tool_list_start|>" in s or "List of tools: [" in s:
        return Lfm2
    if "<atem:function_calls>" in s and "<|eom|>" in s:
        return MuseGlimmer
    if "<|open|>" in s and "<|close|>" in s and "<|end_of_msg|>" in s:
        return KimiK3
    if ">>>all" in s and ">>>${recipient}" in s:
        return FunctionaryV32
    if "Tool usage guidelines:" in s and '<function name="' in s and '<param name="' in s:
        return MiniCPM5
    if "]<]minimax[>[" in s and "<tool_call>" in s and "<invoke name=" in s:
        return MiniMaxM3
    if "<minimax:tool_call>" in s:
        return MiniMaxM2
    if "'<tool_calls{}>'.format(HYTK)" in s:
        return Hy3
    if "<|tools_prefix|>" in s:
        return Apertus
    if "<|START_TEXT|>" in s and "<|START_ACTION|>" in s:
        return Cohere2MoE
    if "<|START_ACTION|>" in s:
        return CommandR7B
    if "<|CHATBOT_TOKEN|>" in s and "Action:" in s:
        return CommandRPlus
    if "<TOOLCALL>" in s:
        return NemotronV2
    if "<tool_calls>[" in s:
        return AprielCalls
    if "<tool_calls>" in s and "<beginning_of_sentence>" in s:
        return MiniMaxM1
    if "<|function_call|>" in s:
        return GigaChat31
    if "<|role_sep|>" in s and "<|message_sep|>" in s:
        return GigaChat3
    if "functools[" in s:
        return FireFunction
    if "<seed:tool_call>" in s:
        return SeedOss
    if "<function=" in s and "<parameter=" in s:
        return Qwen3Coder
    if "<tool_call>" in s:
        return Hermes
    if "[TOOL_CALLS]" in s:
        if "[ARGS]" not in s:
            return MistralNemo
        return Ministral3 if "[SYSTEM_PROMPT]" in s and "[CALL_ID]" not in s else MistralArgs
    if "set has_code_interpreter = tools | selectattr(" in s and "<function=" in s:
        return FunctionaryV31
    if "<|start_header_id|>" in s and ("ipython" in s or "python_tag" in s):
        return Llama3
    if "tools" in s:
        return Hermes if "tool_call" in s else Generic
    return Generic

