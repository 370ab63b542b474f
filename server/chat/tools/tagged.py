"""Tool-call syntaxes llama.cpp 11434's autoparser reads as tagged calls with tagged
arguments (common/chat-auto-parser-generator.cpp, build_tool_parser_tag_tagged): an
optional section around the calls, each call a name between markers, then each argument
as a key and a value between markers (a string as written, other types as JSON). The
markers are each family's, as llama-server's analysis of its template finds them
(llama-server --verbose logs them: tool_section_start, func_name_prefix, arg_name_prefix, ...)."""
from __future__ import annotations

from ggserve.server.chat.json_scan import Malformed, skip_ws
from ggserve.server.chat.tools.syntax import Call, _expect, _Incomplete
from ggserve.server.chat.tools.xml import _XmlParams


class TaggedCalls(_XmlParams):
    section_start = section_end = per_call_start = per_call_end = ""
    value_close_named = False
    # the section holds call after call, each opened by the name's marker (MiniMax-M3's parser,
    # with parallel calls); elsewhere one call per section unless comma-separated
    names_repeat = False
    name_prefix = name_suffix = args_sep = func_close = ""
    key_prefix = key_suffix = value_prefix = value_suffix = ""

    @property
    def starts(self):
        return (self.section_start or self.per_call_start or self.name_prefix,)

    @property
    def markers(self):
        return tuple(m.strip() for m in (self.section_start, self.section_end, self.per_call_start, self.per_call_end,
                                         self.args_sep, self.key_prefix, self.key_suffix, self.value_prefix,
                                         self.value_suffix) if m.strip())

    @property
    def closers(self):
        return tuple(c.strip() for c in (self.func_close, self.per_call_end) if c.strip())

    def block(self, text, i, partial):
        if self.section_start:
            i = _expect(text, i, self.section_start.strip(), partial)
        calls: list[Call] = []
        while True:
            try:
                call, i = self._call(text, i, partial)
            except _Incomplete as inc:
                raise _Incomplete(calls + inc.calls)
            calls.append(call)
            j = skip_ws(text, i)
            if self.per_call_start and text.startswith(self.per_call_start, j):
                i = j
                continue
            if self.names_repeat and text.startswith(self.name_prefix.strip(), j):
                i = j
                continue
            if not self.per_call_start and text.startswith(",", j):
                i = j + 1
                continue
            if partial and j < len(text) and self.per_call_start.startswith(text[j:]):
                raise _Incomplete(calls)
            break
        if self.section_end:
            try:
                i = _expect(text, i, self.section_end.strip(), partial)
            except _Incomplete:
                raise _Incomplete(calls)
        return calls, i

    def _call(self, text: str, i: int, partial: bool) -> tuple[Call, int]:
        if self.per_call_start:
            i = _expect(text, i, self.per_call_start, partial)
        if self.name_prefix:
            i = _expect(text, i, self.name_prefix.strip(), partial)
        i = skip_ws(text, i)
        enders = [e for e in (self.name_suffix.strip() or "\n", self.args_sep, self.key_prefix,
                              *self.closers) if e]
        ends = [k for k in (text.find(e, i) for e in enders) if k >= 0]
        if not ends:
            if partial:
                raise _Incomplete([Call(None)])
            raise Malformed("unterminated tool call name")
        name, i = text[i:min(ends)].strip(), min(ends)
        if self.name_suffix.strip():
            i = _expect(text, i, self.name_suffix.strip(), partial)
        if self.args_sep:
            i = _expect(text, i, self.args_sep, partial)
        params: list[tuple[str, str]] = []
        # the key ends at its closer (or, without one, where the value's opener begins)
        key_end, value_end = self.key_suffix.strip() or self.value_prefix, self.value_suffix.strip()
        value_open = self.value_prefix if self.key_suffix.strip() else ""
        while text.startswith(self.key_prefix, j := skip_ws(text, i)):
            k = text.find(key_end, j + len(self.key_prefix))
            if k < 0:
                break
            v = k if not self.key_suffix.strip() else \
                skip_ws(text, k + len(key_end)) if value_open else k + len(key_end)
            if not text.startswith(self.value_prefix, v):
                break
            key = text[j + len(self.key_prefix):k].strip()
            e = text.find(value_end, v + len(self.value_prefix))
            if e < 0 or key.startswith("/"):
                break
            if self.value_close_named:       # the closer names the key again: </KEY>
                rest = text[e + len(value_end):e + len(value_end) + len(key) + 1]
                if partial and len(rest) <= len(key) and (key + ">").startswith(rest):
                    params.append((key, text[v + len(self.value_prefix):e]))   # the value is whole
                    raise _Incomplete([self.partial_call(name, params)])
                if not text.startswith(key + ">", e + len(value_end)):
                    break
                e += len(key) + 1
            params.append((key, text[v + len(self.value_prefix):e - (len(key) + 1 if self.value_close_named else 0)]))
            i = e + len(value_end)
        if partial:
            self.incomplete(text, i, name, params, self.key_prefix, key_end, value_open, value_end)
        try:
            for close in self.closers:
                i = _expect(text, i, close, partial)
        except _Incomplete:
            raise _Incomplete([self.partial_call(name, params)])
        return self.xml_call(name, params), i


class MiniMaxM2(TaggedCalls):
    """MiniMax-M2: <minimax:tool_call><invoke name="NAME"><parameter name="K">V</parameter></invoke>."""

    name = "minimax_m2"
    section_start, section_end = "<minimax:tool_call>\n", "</minimax:tool_call>"
    name_prefix, name_suffix, func_close = '<invoke name="', '">\n', "</invoke>\n"
    key_prefix, key_suffix, value_prefix, value_suffix = '<parameter name="', "", '">', "</parameter>\n"


class Hy3(TaggedCalls):
    """Hunyuan 3: <tool_calls:opensource><tool_call:opensource>NAME<tool_sep:opensource>
    <arg_key:opensource>K</arg_key:opensource><arg_value:opensource>V</arg_value:opensource>..."""

    name = "hy3"
    section_start, section_end = "<tool_calls:opensource>\n", "</tool_calls:opensource>"
    per_call_start, args_sep = "<tool_call:opensource>", "<tool_sep:opensource>"
    func_close = "</tool_call:opensource>\n"
    key_prefix, key_suffix = "<arg_key:opensource>", "</arg_key:opensource>\n"
    value_prefix, value_suffix = "<arg_value:opensource>", "</arg_value:opensource>\n"


class MiniCPM5(TaggedCalls):
    """MiniCPM 5 (llama.cpp's common/parsers/minicpm5.cpp): <function name="NAME"><param name="K">V</param>
    ...</function>, call after call, the answer before them."""

    name = "minicpm5"
    lenient_end = True
    lstrip_content = True              # its parser skips the whitespace after the reasoning
    name_prefix, name_suffix, func_close = '<function name="', '">', "</function>"
    key_prefix, value_prefix, value_suffix = '<param name="', '">', "</param>"


class MiniMaxM3(TaggedCalls):
    """MiniMax-M3 (llama.cpp's common/parsers/minimax-m3.cpp): every tag in its namespace
    "]<]minimax[>[": <tool_call>, <invoke name="NAME">, one <KEY>VALUE</KEY> per argument,
    </invoke>, </tool_call>; reasoning between <mm:think> tags; the answer as written, up to
    the calls. (Object and array arguments, which it writes as nested tags, are not read.)"""

    name = "minimax_m3"
    think = ("<mm:think>", "</mm:think>")
    think_bare_end = True
    lstrip_content = lstrip_reasoning = lstrip_after_reasoning = False
    lenient_end = True
    names_repeat = True
    section_start, section_end = "]<]minimax[>[<tool_call>", "]<]minimax[>[</tool_call>"
    name_prefix, name_suffix, func_close = ']<]minimax[>[<invoke name="', '">', "]<]minimax[>[</invoke>"
    key_prefix, key_suffix = "]<]minimax[>[<", ">"
    value_prefix, value_suffix, value_close_named = "", "]<]minimax[>[</", True

    @property
    def markers(self):
        return ("]<]minimax[>[",)
