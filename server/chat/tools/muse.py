"""Muse Glimmer's messages (llama.cpp 11434's common/parsers/muse-glimmer.cpp): the generation
prompt is "<|start|>assistant" and each message names its recipient: " to=self<|message|>"
reasoning up to <|eom|>, then (after "<|start|>assistant" again) the answer
(" to=user<|message|>" or "<|message|>", up to <|eot|> or <|eom|>), or calls:
" to=RECIPIENT<|message|><atem:function_calls><atem:invoke name="NAME"><atem:parameter
name="K">V</atem:parameter>...</atem:invoke></atem:function_calls>", one per message.
Everything as written; an end of text that may begin a marker is left out."""
from __future__ import annotations

import re

from ggserve.server.chat.tools.syntax import Call, Format, Parsed, _dumps, _typed, held

NEXT = "<|eom|><|start|>assistant"
_CALL = re.compile(r' to=[^<]*<\|message\|><atem:function_calls>\s*<atem:invoke name="([^"]*)">\s*')
_PARAM = re.compile(r'<atem:parameter name="([^"]*)">')


class MuseGlimmer(Format):
    name = "muse_glimmer"
    think = ("", "")
    markers = ("<|start|>", "<|message|>", "<|eom|>", "<|eot|>")
    always_shown = markers

    def parse(self, text: str, partial: bool, reasoning: bool, tools: bool) -> Parsed:
        out = Parsed()
        if not reasoning and not tools:
            out.content = text
            return out
        i = 0
        while text.startswith(" to=self<|message|>", i):
            i += len(" to=self<|message|>")
            k = text.find("<|eom|>", i)
            end = k if k >= 0 else len(text) - held(text[i:], ("<|eom|>",))
            if reasoning:
                out.reasoning += text[i:end]
            else:
                out.content += text[i:end]
            if k < 0 or not text.startswith(NEXT, k):
                return out
            i = k + len(NEXT)
        if tools and text.startswith(" to=", i) and not text.startswith((" to=user", " to=self"), i):
            out.calls = self._calls(text, i)
            return out
        i += len(" to=user") if text.startswith(" to=user", i) else 0
        if not text.startswith("<|message|>", i):
            return out
        i += len("<|message|>")
        k = min([j for j in (text.find("<|eot|>", i), text.find("<|eom|>", i)) if j >= 0], default=-1)
        out.content += text[i:k] if k >= 0 else text[i:len(text) - held(text[i:], ("<|eot|>", "<|eom|>"))]
        if tools and k >= 0 and text.startswith(NEXT, k):
            out.calls = self._calls(text, k + len(NEXT))
        return out

    def _calls(self, text: str, i: int) -> list[Call]:
        calls = []
        while (m := _CALL.match(text, i)):
            name, i, parts = m.group(1), m.end(), []
            while (p := _PARAM.match(text, i)):
                k = text.find("</atem:parameter>", p.end())
                key = _dumps(p.group(1)) + ":"
                schema = self.param_schema(name, p.group(1)) or {}
                if k < 0:
                    raw = text[p.end():len(text) - held(text[p.end():], ("</atem:parameter>",))]
                    parts.append(key + (_dumps(raw)[:-1] if schema.get("type") == "string" else raw))
                    return calls + [Call(name, "{" + ",".join(parts))]
                parts.append(key + _dumps(_typed(text[p.end():k], schema)))
                i = len(text[:k]) + len("</atem:parameter>")
                while i < len(text) and text[i] in " \t\r\n":
                    i += 1
            close = re.compile(r"\s*</atem:invoke>\s*</atem:function_calls>").match(text, i)
            if not close:
                return calls + [Call(name, "{" + ",".join(parts))]
            calls.append(Call(name, "{" + ",".join(parts) + "}"))
            i = close.end()
            if not text.startswith(NEXT, i):
                break
            i += len(NEXT)
        return calls
