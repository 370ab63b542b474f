"""Tool-call syntaxes llama.cpp 11434's autoparser reads as JSON objects in a section the
template writes around them (common/chat-peg-parser.cpp, standard_json_tools), each
family's markers and keys as llama-server's analysis of its template finds them
(llama-server --verbose logs them: tool_section_start, name_field, ...)."""
from __future__ import annotations

import json
import re

from ggserve.server.chat.json_scan import Malformed, as_written, skip_ws, value_end
from ggserve.server.chat.tools.syntax import Call, Format, _dumps, _expect, _Incomplete


def _string(body: str) -> str:
    """A JSON string's text from its body (between the quotes)."""
    try:
        return json.loads(f'"{body}"')
    except ValueError as e:
        raise Malformed(str(e)) from None


class JsonSection(Format):
    """llama.cpp 11434's autoparser reading JSON calls (common/chat-peg-parser.cpp,
    standard_json_tools): section_start, the calls as JSON objects (in a JSON array where
    the template writes one), comma-separated, section_end. A call is {name_key: NAME,
    args_key: ARGS} (other keys, such as an id, beside them), or {NAME: ARGS} where the
    template writes the function's name as the key."""

    section_start = section_end = ""
    array = False
    name_key, args_key, id_key = "name", "arguments", ""
    name_is_key = False

    @property
    def starts(self):
        return (self.section_start,)

    @property
    def markers(self):
        return tuple(m for m in (self.section_start, self.section_end) if m)

    def block(self, text, i, partial):
        i = _expect(text, i, self.section_start, partial)
        if self.array:
            i = _expect(text, i, "[", partial)
        calls: list[Call] = []
        while True:
            try:
                call, i = self._call(text, i, partial)
            except _Incomplete as inc:
                raise _Incomplete(calls + inc.calls)
            calls.append(call)
            j = skip_ws(text, i)
            if not text.startswith(",", j):
                break
            i = j + 1
        try:
            if self.array:
                i = _expect(text, i, "]", partial)
            if self.section_end:
                i = _expect(text, i, self.section_end, partial)
        except _Incomplete:
            raise _Incomplete(calls)
        return calls, i

    def _head(self, text: str, i: int):
        """(name, index where the arguments start) of a call object written from text[i] on."""
        if self.name_is_key:
            m = re.compile(r'\{\s*"((?:[^"\\]|\\.)*)"\s*:\s*').match(text, i)
            return (_string(m.group(1)), m.end()) if m else (None, -1)
        name = re.compile(rf'"{re.escape(self.name_key)}"\s*:\s*"((?:[^"\\]|\\.)*)"').search(text, i)
        args = re.compile(rf'"{re.escape(self.args_key)}"\s*:\s*').search(text, i)
        return (_string(name.group(1)) if name else None), (args.end() if args else -1)

    def _call(self, text: str, i: int, partial: bool) -> tuple[Call, int]:
        i = skip_ws(text, i)
        end = value_end(text, i)
        name, a = self._head(text[:end] if end is not None else text, i)
        if end is None:
            if not partial:
                raise Malformed("unterminated tool call")
            if name is None:
                raise _Incomplete([Call(None)])
            a_end = value_end(text, a) if a >= 0 else None
            raise _Incomplete([Call(name, as_written(text[a:a_end] if a_end else text[a:]) if a >= 0 else "")])
        try:
            obj = json.loads(text[i:end])
        except ValueError as e:
            raise Malformed(str(e)) from None
        if not isinstance(obj, dict) or name is None:
            raise Malformed("a tool call needs a name")
        args = obj.get(name) if self.name_is_key else obj.get(self.args_key, {})
        raw = as_written(text[a:value_end(text, a)]) if a >= 0 else _dumps(args)
        cid = obj.get(self.id_key) if self.id_key else None
        return Call(name, args if isinstance(args, str) else raw, cid if isinstance(cid, str) else None), end


class Apertus(JsonSection):
    """Apertus: <|tools_prefix|>[{"NAME": ARGS}, ...]<|tools_suffix|>."""

    name = "apertus"
    section_start, section_end, array, name_is_key = "<|tools_prefix|>", "<|tools_suffix|>", True, True


class CommandR7B(JsonSection):
    """Command R7B: <|START_ACTION|>[{"tool_call_id", "tool_name", "parameters"}, ...]<|END_ACTION|>."""

    name = "command_r7b"
    content_wrap = ("<|START_RESPONSE|>", "<|END_RESPONSE|>")
    section_start, section_end, array = "<|START_ACTION|>", "<|END_ACTION|>", True
    name_key, args_key, id_key = "tool_name", "parameters", "tool_call_id"


class CommandRPlus(JsonSection):
    """Command R+: Action:\\n```json\\n[{"tool_name", "parameters"}, ...]```."""

    name = "command_r_plus"
    content_wrap = ("<|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>")
    section_start, section_end, array = "Action:\n```json\n", "```", True
    name_key, args_key = "tool_name", "parameters"


class NemotronV2(JsonSection):
    """Nemotron Nano v2: <TOOLCALL>[{"name", "arguments"}, ...]</TOOLCALL>."""

    name = "nemotron_v2"
    section_start, section_end, array = "<TOOLCALL>", "</TOOLCALL>", True


class AprielCalls(JsonSection):
    """Apriel 1.5/1.6: <tool_calls>[{"name", "arguments"}, ...]</tool_calls>."""

    name = "apriel"
    section_start, section_end, array = "<tool_calls>", "</tool_calls>", True


class MiniMaxM1(JsonSection):
    """MiniMax-M1: <tool_calls>\\n{"name", "arguments"}, ...</tool_calls>."""

    name = "minimax_m1"
    section_start, section_end = "<tool_calls>\n", "</tool_calls>"


class GigaChat31(JsonSection):
    """GigaChat 3.1: <|function_call|>{"name", "arguments"} (no closing marker)."""

    name = "gigachat_3_1"
    section_start = "<|function_call|>"


class FireFunction(JsonSection):
    """FireFunction v2: functools[{"name", "arguments"}, ...] (no closing marker)."""

    name = "firefunction"
    section_start, array = "functools", True


class GigaChat3(JsonSection):
    """GigaChat 3 (llama.cpp's common/parsers/gigachat-v3.cpp): one call after a "function call"
    message header; the answer as written, up to the header."""

    name = "gigachat_3"
    think = ("", "")                   # its parser reads no reasoning
    section_start = "<|message_sep|>\n\nfunction call<|role_sep|>\n"
    lstrip_content = False
    lenient_end = True


def _string_or_value(text: str):
    try:
        return json.loads(text)
    except ValueError as e:
        raise Malformed(str(e)) from None


class FunctionaryV32(Format):
    """Functionary v3.2 (llama.cpp's common/parsers/functionary-v3-2.cpp): the prompt ends with
    ">>>" and the model names the recipient: "all\\n" and the answer (up to the next ">>>"), or
    a function's name, a newline and its JSON arguments, call after call. An answer runs to the
    end: llama-server 11434's parser reads the calls after it without their ">>>", so none parses
    and it answers the whole text as content."""

    name = "functionary_v3_2"
    think = ("", "")
    markers = (">>>",)
    lstrip_content = False
    content_wrap = ("all\n", "")
    _name = re.compile(r"(?:>>>)?([A-Za-z_][\w.\-]*)\n")

    def split_calls(self, text, partial):
        calls: list[Call] = []
        i = 0
        while (m := self._name.match(text, i)):
            end = value_end(text, m.end())
            if end is None:
                if partial:
                    return "", calls + [Call(m.group(1), as_written(text[m.end():]))]
                raise Malformed("unterminated arguments")
            _string_or_value(text[m.end():end])
            calls.append(Call(m.group(1), as_written(text[m.end():end])))
            i = end
        if partial and re.fullmatch(r">{0,3}[\w.\-]*", text[i:]):
            return "", calls
        if i < len(text):
            raise Malformed(f"unexpected text at {i}") if calls else Malformed("not a call")
        return "", calls


class Cohere2MoE(CommandR7B):
    """Cohere2 MoE / North Code (llama.cpp's common/parsers/cohere2moe.cpp): reasoning between
    <|START_THINKING|> and <|END_THINKING|> (or up to the answer or the calls), then either the
    answer between <|START_TEXT|> and <|END_TEXT|> or R7B's calls; all as written."""

    name = "cohere2moe"
    think = ("<|START_THINKING|>", "<|END_THINKING|>")
    content_wrap = ("<|START_TEXT|>", "<|END_TEXT|>")
    lstrip_reasoning = lstrip_open_reasoning = False
    reasoning_stops = ("<|START_TEXT|>", "<|START_ACTION|>")
    reasoning_stops_always = True
