"""Kimi K3's message syntax (llama.cpp 11434's common/parsers/kimi-k3.cpp): sections opened by
<|open|>NAME<|sep|> and closed by <|close|>NAME<|sep|>. The generation prompt opens the
message and its think section (or, thinking off, its response section); the reasoning runs
to the think section's closer or to the response opener, the answer to the response's
closer, the tools section or the message's closer; calls are <|open|>call tool="NAME" ...<|sep|>
with one <|open|>argument key="K" ...<|sep|>VALUE<|close|>argument<|sep|> per argument (a
string as written, other types as JSON). Everything is taken exactly as written; an end of
text that may begin a marker is left out, as llama.cpp's `until` leaves it."""
from __future__ import annotations

import re

from ggserve.server.chat.tools.syntax import Call, Format, Parsed, _dumps, _typed, held

SEP = "<|sep|>"
MSG_START = '<|open|>message role="assistant"<|sep|>'
THINK_START, THINK_END = "<|open|>think<|sep|>", "<|close|>think<|sep|>"
RESP_START, RESP_END = "<|open|>response<|sep|>", "<|close|>response<|sep|>"
TOOLS_START, TOOLS_END = "<|open|>tools<|sep|>", "<|close|>tools<|sep|>"
MSG_END = "<|close|>message<|sep|>"
_CALL = re.compile(r'<\|open\|>call tool="([^"]*)"[^<]*?<\|sep\|>')
_ARG = re.compile(r'<\|open\|>argument key="([^"]*)"[^<]*?<\|sep\|>')


def _until(text: str, i: int, ends: tuple[str, ...]) -> int:
    """Where the first of `ends` starts at or after i (else the end of text, less what may begin one)."""
    hits = [k for k in (text.find(e, i) for e in ends) if k >= 0]
    return min(hits) if hits else len(text) - held(text[i:], ends)


class KimiK3(Format):
    name = "kimi_k3"
    think = (THINK_START, THINK_END)
    markers = ("<|open|>", "<|close|>", SEP, "<|end_of_msg|>")
    always_shown = markers

    def parse(self, text: str, partial: bool, reasoning: bool, tools: bool, open_think: bool = True) -> Parsed:
        out = Parsed()
        i = len(MSG_START) if text.startswith(MSG_START) else 0
        if open_think or text.startswith(THINK_START, i):
            # the prompt's opener is the one its parser consumes: one the model repeats is reasoning
            i += len(THINK_START) if not open_think and text.startswith(THINK_START, i) else 0
            k = _until(text, i, (THINK_END, RESP_START))
            if reasoning:
                out.reasoning = text[i:k]
            else:
                out.content = text[i:k]
            if not text.startswith((THINK_END, RESP_START), k):
                return out          # the text ends in the reasoning (or in a marker)
            i = k + (len(THINK_END) if text.startswith(THINK_END, k) else 0)
        i += len(RESP_START) if text.startswith(RESP_START, i) else 0
        if i < len(text) and RESP_START.startswith(text[i:]):
            return out
        k = _until(text, i, (RESP_END, TOOLS_START, MSG_END))
        out.content += text[i:k]
        if not text.startswith((RESP_END, TOOLS_START, MSG_END), k):
            return out
        i = k + (len(RESP_END) if text.startswith(RESP_END, k) else 0)
        if tools and text.startswith(TOOLS_START, i):
            out.calls = self._calls(text, i + len(TOOLS_START), partial)
        return out

    def _calls(self, text: str, i: int, partial: bool) -> list[Call]:
        calls = []
        while (m := _CALL.match(text, i)):
            name, i, parts = m.group(1), m.end(), []
            while (a := _ARG.match(text, i)):
                k = text.find("<|close|>argument<|sep|>", a.end())
                key = _dumps(a.group(1)) + ":"
                if k < 0:      # the value being written: a string as it comes
                    raw = text[a.end():len(text) - held(text[a.end():], ("<|close|>argument<|sep|>",))]
                    as_text = (self.param_schema(name, a.group(1)) or {}).get("type", "string") == "string"
                    parts.append(key + (_dumps(raw)[:-1] if as_text else raw))
                    return calls + [Call(name, "{" + ",".join(parts))]
                schema = self.param_schema(name, a.group(1)) or {"type": "string"}
                parts.append(key + _dumps(_typed(text[a.end():k], schema)))
                i = k + len("<|close|>argument<|sep|>")
            if not text.startswith("<|close|>call<|sep|>", i):
                # a key written whole is in the arguments before its value comes
                key = re.compile(r'<\|open\|>argument key="([^"]*)').match(text, i)
                if key and key.group(1) in self.schemas.get(name, {}).get("properties", {}):
                    parts.append(_dumps(key.group(1)) + ":")
                return calls + [Call(name, "{" + ",".join(parts))]
            calls.append(Call(name, "{" + ",".join(parts) + "}"))
            i += len("<|close|>call<|sep|>")
        return calls
