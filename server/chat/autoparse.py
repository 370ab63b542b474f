"""Reasoning split off generated text as llama.cpp 11434's autoparser does it, for templates
without a parser of their own (common/chat-auto-parser-generator.cpp, analyze_reasoning::
build_parser): the markers are the template's, found by its analysis
(models/template_reasoning.py), whitespace included.

What it parses is the generation prompt from its start marker on (a prompt that opens the
reasoning, e.g. Apriel's "<|begin_assistant|>\\nHere are my reasoning steps:\\n"), then the
generated text. Leading whitespace is skipped; then, optionally, the start marker (each
whitespace character around it optional), the reasoning up to the end marker, the end
marker (its whitespace optional likewise); the rest is the answer, as it comes.
"""
from __future__ import annotations

from ggserve.server.chat.tools.syntax import held

_WS = " \t\r\n"


def opened(prompt: str, start: str, end: str) -> str:
    """What of the prompt is parsed with the output: from the last start marker on, when no
    end marker follows it, or when the prompt ends with that block closed (an empty one, as
    a template writes with thinking off: the answer then starts right after it, its leading
    whitespace kept); "" otherwise."""
    tag, etag = start.strip(_WS), end.strip(_WS)
    i = prompt.rfind(tag) if tag else -1
    if i < 0:
        return ""
    k = prompt.find(etag, i + len(tag)) if etag else -1
    if k >= 0 and prompt[k + len(etag):].strip(_WS):
        return ""
    return prompt[i:]


def _optional_chars(text: str, i: int, chars: str) -> int:
    for c in chars:
        if text.startswith(c, i):
            i += 1
    return i


def split(text: str, start: str, end: str, partial: bool) -> tuple[str, str]:
    """(reasoning, answer) of text (the opened part of the prompt + what was generated)."""
    i = len(text) - len(text.lstrip(_WS))
    s_tag, e_tag = start.strip(_WS), end.strip(_WS)
    if s_tag:
        if partial and s_tag.startswith(text[i:]):
            return "", ""
        if not text.startswith(s_tag, i):
            return "", text[i:]
        i = _optional_chars(text, i + len(s_tag), start[len(start.rstrip(_WS)):])
    k = text.find(e_tag, i)
    if k < 0:
        if not s_tag:     # no end marker (yet): no reasoning after all, the whole text is the answer
            return ("", "") if partial else ("", text[i:])
        body = text[i:]
        # as llama.cpp's until, an end that may begin the end marker is not reasoning, even at the end
        return body[:len(body) - held(body, (e_tag,))], ""
    j = _optional_chars(text, k + len(e_tag), end[len(end.rstrip(_WS)):])
    return text[i:k], text[j:]
