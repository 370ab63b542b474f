"""Generated chat text -> what OpenAI's API returns: reasoning, content, tool calls.

The tool-call syntax is the chat template's (llama.cpp's `common/chat*.cpp` define
the same families; server/chat/tools/formats.py, tool_formats_xml.py, tool_syntax.py);
`detect(template_source)` picks the format. `parse(text,
partial)` reads a whole output or the prefix generated so far; `ChatOutput` feeds
it the streamed text and returns only what is new: reasoning and content grow
append-only (text that may still become a marker is held back), a tool call
appears once its name is complete and its arguments then grow in pieces (as written for
a JSON family, minified JSON built from tagged parameters: the streamed pieces join to
exactly the non-streamed arguments).

A call that is not valid at the end (broken JSON, a missing closer) leaves the
whole output as content, as llama-server does.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from ggserve.server.chat import autoparse
from ggserve.server.chat.json_scan import Malformed, skip_ws
from ggserve.server.chat.tools.formats import (  # noqa: F401
    DeepSeekR1,
    Generic,
    Hermes,
    KimiK2,
    Llama3,
    MistralNemo,
    _NameArgs,
    detect,
)
from ggserve.server.chat.tools.gemma4 import Gemma4
from ggserve.server.chat.tools.json_sections import FunctionaryV32, JsonSection
from ggserve.server.chat.tools.kimi_k3 import KimiK3
from ggserve.server.chat.tools.muse import MuseGlimmer
from ggserve.server.chat.tools.pythonic import Lfm2
from ggserve.server.chat.tools.syntax import _ID_CHARS, Format, Parsed, held
from ggserve.server.chat.tools.tagged import TaggedCalls
from ggserve.server.chat.tools.xml import DeepSeekDsml, Glm45, Harmony, Qwen3Coder

# the formats are chosen and named through this module (grammar.py, chat_options.py)
__all__ = ["ChatOutput", "DeepSeekDsml", "DeepSeekR1", "Format", "FunctionaryV32", "Gemma4", "Generic", "Glm45",
           "Harmony", "Hermes", "JsonSection", "KimiK2", "Lfm2", "Llama3", "MistralNemo", "Parsed", "Qwen3Coder",
           "ShowingDecoder", "TaggedCalls", "detect", "new_call_id", "parse", "shown_tokens", "split_reasoning"]



def split_reasoning(text: str, think: tuple[str, str], partial: bool, open_at_start: bool,
                    lstrip: bool = True, lstrip_rest: bool = True, stops: tuple[str, ...] = ()) -> tuple[str, str]:
    """(reasoning, rest). A prompt that ends with the open tag starts inside reasoning.
    As llama-server: reasoning loses its leading whitespace unless `lstrip` is off (its
    trailing whitespace stays); after a think block the prompt opened, the content is
    kept verbatim. `stops`: markers that also end the reasoning, kept in the rest (the
    calls' start where a family's parser lets calls follow unclosed reasoning); with them
    an end of text that may begin one is left out, as llama.cpp's until does."""
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
    cut = [i for i in (body.find(s) for s in stops) if i >= 0 and (k < 0 or i < k)]
    if cut:
        return body[:min(cut)].lstrip() if lstrip else body[:min(cut)], body[min(cut):]
    if k < 0:
        body = body[:len(body) - held(body, (close_tag, *stops))]
        return body.lstrip() if lstrip else body, ""
    rest = body[k + len(close_tag):]
    return body[:k].lstrip() if lstrip else body[:k], rest if open_at_start or not lstrip_rest else rest.lstrip()


def unwrap(rest: str, fmt: Format, tools: bool, partial: bool) -> tuple[str, str]:
    """(answer, what follows it) of text whose answer the template wraps (Format.content_wrap):
    as llama.cpp's autoparser, the answer is what is between the markers (an end of text that
    may begin the end marker is not); with tools the wrapped answer is optional and the calls
    follow it; text without the start marker is left as it is (llama-server refuses it)."""
    start, end = fmt.content_wrap
    i = skip_ws(rest, 0) if tools else 0
    if not rest.startswith(start, i):
        if partial and start.startswith(rest[i:]):
            return "", ""
        return ("", rest[i:]) if tools else (rest, "")
    i += len(start)
    if not end:     # the answer runs to the end: no call after it (Functionary v3.2)
        return rest[i:], ""
    k = rest.find(end, i)
    if k < 0:
        return rest[i:len(rest) - held(rest[i:], (end,))], ""
    return rest[i:k], rest[k + len(end):]


def _wrapped(r: str, rest: str, fmt: Format, tools: bool, partial: bool) -> Parsed:
    content, after = unwrap(rest, fmt, tools, partial)
    if not tools:
        return Parsed(r, content)
    try:
        more, calls = fmt.split_calls(after, partial)
    except Malformed:
        return Parsed(r, content if partial else content + after)
    return Parsed(r, content + more, calls)


def parse(text: str, fmt: Format, *, partial: bool = False, reasoning: bool = True,
          tools: bool = True, open_think: bool = False) -> Parsed:
    """A whole output (or, partial, the part generated so far) -> Parsed. As llama.cpp's
    chat message mapper, reasoning that is only whitespace is no reasoning."""
    p = _parse(text, fmt, partial, reasoning, tools, open_think)
    if p.reasoning and not p.reasoning.strip(" \n\r\t"):
        p.reasoning = ""
    return p


def _parse(text: str, fmt: Format, partial: bool, reasoning: bool, tools: bool, open_think: bool) -> Parsed:
    if isinstance(fmt, (Harmony, MuseGlimmer)):
        return fmt.parse(text, partial, reasoning, tools)
    if isinstance(fmt, KimiK3):
        return fmt.parse(text, partial, reasoning, tools, open_think)
    if fmt.autoparse is not None and reasoning:
        r, rest = autoparse.split(text, *fmt.autoparse, partial)
        if fmt.content_wrap:
            return _wrapped(r, rest, fmt, tools, partial)
        if not tools:
            return Parsed(r, rest)
        try:
            content, calls = fmt.split_calls(rest, partial)
        except Malformed:
            return Parsed(r, "" if partial else rest)
        return Parsed(r, content, calls)
    if fmt.think_bare_end and not open_think and fmt.think[1]:
        if partial and fmt.think[1].startswith(text):
            return Parsed()
        if text.startswith(fmt.think[1]):
            text = text[len(fmt.think[1]):]
    lstrip = fmt.lstrip_open_reasoning if open_think else fmt.lstrip_reasoning
    stops = fmt.reasoning_stops if fmt.reasoning_stops_always or tools and open_think else ()
    r, rest = split_reasoning(text, fmt.think, partial, open_think, lstrip and fmt.lstrip_reasoning,
                              fmt.lstrip_after_reasoning, stops) \
        if reasoning else ("", text)
    if fmt.content_wrap:
        return _wrapped(r, rest, fmt, tools, partial)
    if not tools:
        strip = fmt.lstrip_content is True or fmt.lstrip_content is None and fmt.reasoning_template and rest is text
        return Parsed(r, rest.lstrip() if strip else rest)
    try:
        content, calls = fmt.split_calls(rest, partial)
    except Malformed:
        return Parsed(r, "" if partial else rest)
    if fmt.lstrip_content is True or rest is text and fmt.lstrip_content is None:
        content = content.lstrip()  # as llama-server: no leading whitespace
    return Parsed(r, content, calls)


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
                 open_think: bool = False, prefill: str = "", opened: str = ""):
        self.fmt = fmt
        self.opts = dict(reasoning=reasoning, tools=tools, open_think=open_think)
        # a continued assistant message, or the reasoning the prompt opened (autoparse.opened):
        # parsed with what follows
        self.text = prefill + opened
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


def shown_tokens(tokenizer, fmt: Format, tools: bool = True) -> frozenset[int]:
    """Ids of the control tokens among the format's markers and think tags."""
    if not hasattr(tokenizer, "token_to_id"):
        return frozenset()
    ids = (tokenizer.token_to_id(t) for t in fmt.preserved(tools))
    return frozenset(i for i in ids if i is not None and tokenizer.is_special(i))
