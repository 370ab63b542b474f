"""Chat templates: the Jinja template stored in GGUF `tokenizer.chat_template`.

Rendered the way HF transformers' apply_chat_template does (sandboxed Jinja,
trim_blocks + lstrip_blocks, loop controls, `raise_exception`, `strftime_now`,
a `tojson` that keeps non-ASCII) with llama-server's handling of content parts:
image parts become the image marker text, and a template that cannot iterate
typed content gets each message's parts joined into one string.

A model without a template gets ChatML (`<|im_start|>role\\n...<|im_end|>\\n`),
as llama-server does, with a warning. `--chat-template-file` is simply
`ChatTemplate(open(path).read(), ...)`.
"""
from __future__ import annotations

import copy
import functools
import json
import logging
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.exceptions import SecurityError
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import SandboxedEnvironment

from ggserve.models.template_caps import note, probe_caps, probe_content, read_all
from ggserve.models.template_families import family
from ggserve.models.template_inputs import InputError, polyfill
from ggserve.models.template_reasoning import analyze, continued

log = logging.getLogger(__name__)

IMAGE_MARKER = "<__media__>"

# llama.cpp's "chatml" template, used when a GGUF has none
CHATML = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

_IMAGE_PART_TYPES = ("image", "image_url", "input_image")


class TemplateError(Exception):
    """A template failed: its own raise_exception message, or a Jinja error."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class _GenerationTag(Extension):
    """HF's {% generation %}...{% endgeneration %} marks assistant text; we only render it."""

    tags = {"generation"}

    def parse(self, parser) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _raise_exception(message):
    raise TemplateError(str(message))


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    if isinstance(value, list):   # a plain list: writing it is no array access (template_caps probes)
        value = list.__getitem__(value, slice(None))
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys, default=_json_default)


def _json_default(value):
    """What json cannot write as is: a filter's lazy result (map, select, ...) as its list."""
    if isinstance(value, jinja2.Undefined):
        return None
    try:
        return list(value)
    except TypeError:
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable") from None


def _as_list(f, name: str):
    """llama.cpp's map/select/... give arrays (which `length` and indexing take), jinja2's generators.
    What they are applied to is noted (template_caps: content probes)."""
    @functools.wraps(f)
    def listed(*args, **kwargs):
        for a in args[:2]:
            note(a, name)
        return list(f(*args, **kwargs))
    return listed


def now() -> datetime:
    """The clock templates read (today's date in a system prompt)."""
    return datetime.now()


def _strftime_now(fmt: str) -> str:
    return now().strftime(fmt)


class _Undefined(jinja2.ChainableUndefined):
    """llama.cpp's jinja: an undefined value + or ~ a string is that string (e.g.
    firefunction-v2's `functions`, which no caller passes), its attributes and items are
    undefined too (Command R+ reads an object schema's absent additionalProperties' type);
    anything else fails."""
    __slots__ = ()

    def __add__(self, other):
        return other if isinstance(other, str) else self._fail_with_undefined_error()

    def __radd__(self, other):
        return other if isinstance(other, str) else self._fail_with_undefined_error()


class _Sandbox(SandboxedEnvironment):
    def unsafe_undefined(self, obj, attribute):
        # refused at once: a chained undefined would render it as nothing
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")


def _environment() -> jinja2.Environment:
    # mutable: templates append to lists they build (Kimi K2's tool-call ids), as llama.cpp's jinja allows
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True, undefined=_Undefined,
                   extensions=[_GenerationTag, loopcontrols])
    env.filters["tojson"] = _tojson
    env.filters["safe"] = str    # no Markup: jinja2's would HTML-escape what is added to it (functionary)
    for name in ("map", "select", "reject", "selectattr", "rejectattr"):
        env.filters[name] = _as_list(env.filters[name], name)
    to_string = env.filters["string"]
    env.filters["string"] = lambda value: read_all(value) or to_string(value)
    string_test = env.tests["string"]
    env.tests["string"] = lambda value: note(value, "test_is_string") or string_test(value)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A compiled chat template with the model's BOS/EOS token texts."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "", add_bos: bool = False):
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.add_bos = add_bos   # the tokenizer adds BOS: a rendered leading BOS text is dropped
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as e:
            raise TemplateError(f"invalid chat template: {e}") from e
        self.thinking = False     # llama.cpp's probes leave enable_thinking undefined
        # which content shapes it takes, as llama.cpp's caps find them (common/jinja/caps.cpp)
        self.supports_string_content, self.supports_typed_content = probe_content(
            lambda msgs: self._template.render(messages=msgs, tools=[], bos_token="", eos_token="",
                                               add_generation_prompt=True))
        self.caps = probe_caps(lambda msgs, tools: self._template.render(
            messages=msgs, tools=tools, bos_token="", eos_token="", add_generation_prompt=True))
        # where it writes reasoning (llama.cpp's autoparser analysis): a continued message, and
        # llama-server's default enable_thinking (true only where the template has reasoning)
        self.reasoning = analyze(lambda msgs, agp, thinking, tools=None: self._render(
            [self._normalize(m, IMAGE_MARKER) for m in msgs], agp, tools, {"enable_thinking": thinking}),
            source, self.caps.tool_calls)
        self.family = family(source)   # a family llama.cpp renders with a handler of its own
        self.thinking = self.reasoning.supported if self.family is None or self.family.thinking is None \
            else self.family.thinking
        # Ministral 3 / Magistral: its handler writes typed system/assistant content (below)
        self._ministral3 = self.family is not None and self.family.name == "ministral_3"
        # llama.cpp parses the output after its generation prompt, the difference between the
        # prompt with and without one: none where the template turns it on by default (RWKV)
        self.generation_prompt_parsed = self.reasoning.supported and self._has_generation_prompt()

    def _has_generation_prompt(self) -> bool:
        probe = [{"role": "user", "content": "U"}]
        try:
            return self._render(probe, False, None, {}) != self._render(probe, True, None, {})
        except Exception:     # a template that cannot render the probe: as llama.cpp, parse after the prompt
            return True

    @classmethod
    def from_metadata(cls, meta: dict, add_bos: bool = False, tokens=None) -> "ChatTemplate":
        """The GGUF's template, or ChatML (with a warning) when it has none. add_bos:
        the model's tokenizer adds BOS (Tokenizer.vocab.add_bos); tokens: the token texts,
        where the metadata no longer holds them (Tokenizer.vocab.tokens)."""
        tokens = tokens if tokens is not None else meta.get("tokenizer.ggml.tokens") or []

        def text(key):
            i = meta.get("tokenizer.ggml." + key)
            return tokens[i] if i is not None and 0 <= int(i) < len(tokens) else ""

        source = meta.get("tokenizer.chat_template")
        if not source:
            log.warning("model has no tokenizer.chat_template: using ChatML")
            source = CHATML
        return cls(source, bos_token=text("bos_token_id"), eos_token=text("eos_token_id"), add_bos=add_bos)

    def _render(self, messages, add_generation_prompt, tools, extra) -> str:
        # llama.cpp's extra context (common/chat.cpp common_chat_extra_context): today's
        # date for templates that print it (Llama 3.x: "Today Date: 23 Nov 2026");
        # enable_thinking: llama-server's default where the template has reasoning
        today = now()
        context = {"bos_token": self.bos_token, "eos_token": self.eos_token,
                   "enable_thinking": self.thinking,
                   "datetime": today.strftime("%b %d %Y"), "date_string": today.strftime("%d %b %Y"), **extra}
        if tools:       # no tools: `tools` undefined, which a template iterates as empty (Hermes)
            context["tools"] = tools
        if add_generation_prompt:   # else undefined, as llama.cpp leaves it (RWKV's template defaults it on)
            context["add_generation_prompt"] = True
        # deep-copied: a template may change what it is given (append to a message's list)
        text = self._template.render(messages=copy.deepcopy(messages), **context)
        # common/chat.cpp: the tokenizer adds BOS, so a BOS the template wrote is dropped
        if self.add_bos and self.bos_token and text.startswith(self.bos_token):
            text = text[len(self.bos_token):]
        return text

    def render(self, messages: list[dict], add_generation_prompt: bool = True, tools=None, *,
               continue_final_message: bool = False, image_marker: str = IMAGE_MARKER,
               **extra) -> str:
        """The prompt text. Content is a string or a list of parts ({"type": "text"}
        / image parts, which become image_marker). With continue_final_message the
        last (assistant) message is left open for the model to continue, as
        llama-server's assistant prefill: the rest is rendered, then the part of the
        generation prompt that differs from the rendering without one, then the
        message's text (llama.cpp's autoparser continuation)."""
        msgs = [self._normalize(m, image_marker) for m in messages]
        extra = {**_reasoning_variables(extra), **extra}
        suffix = reasoning = None
        if continue_final_message:
            if not msgs or msgs[-1].get("role") != "assistant":
                raise TemplateError("continue_final_message needs a final assistant message")
            last = msgs.pop()
            # common_chat_msg::render_content: the text parts joined by a blank line
            raw = messages[-1].get("content")
            suffix = raw if isinstance(raw, str) or raw is None else "\n\n".join(
                p if isinstance(p, str) else p.get("text", "") for p in raw
                if isinstance(p, str) or p.get("type") == "text")
            suffix = suffix or ""
            reasoning = last.get("reasoning_content") or ""
            if self._ministral3:   # llama.cpp's ministral_3 handler writes the open turn itself
                suffix = "[THINK]" + reasoning + ("" if reasoning and not suffix else "[/THINK]" + suffix)
        try:
            msgs = polyfill(msgs, self.caps, self.source)
        except InputError as e:
            raise TemplateError(str(e)) from None
        if self._ministral3:
            msgs = [_ministral3_blocks(m) for m in msgs]
        elif self.family is not None:
            msgs = self.family.messages(msgs)
        try:
            if suffix is None:
                return self._render(msgs, add_generation_prompt, tools, extra)
            # llama.cpp (common_chat_template_generation_prompt): the prompt without a
            # generation prompt, then where the one with it differs, then the message
            # (Phi-3.5: "...<|end|>\n<|endoftext|>" + "assistant|>\n" + text)
            bare = self._render(msgs, False, tools, extra)
            if self._ministral3:
                return bare + suffix
            opened = self._render(msgs, True, tools, extra)
            n = 0
            while n < min(len(bare), len(opened)) and bare[n] == opened[n]:
                n += 1
            if self.family is not None and self.family.continuation is not None:
                return bare + self.family.continuation(opened[n:], bare, suffix, reasoning,
                                                       not reasoning or bool(suffix))
            return bare + continued(opened[n:], suffix, reasoning, self.reasoning)
        except TemplateError:
            raise
        except jinja2.TemplateError as e:
            raise TemplateError(f"chat template error: {e}") from e
        except Exception as e:   # e.g. str + list in a template that expects strings
            raise TemplateError(f"chat template error: {type(e).__name__}: {e}") from e

    def _normalize(self, message: dict, image_marker: str) -> dict:
        message = dict(message)
        content = message.get("content")
        if isinstance(content, (list, tuple)):
            parts, joined, after_image, after_any_image = [], "", False, False
            for part in content:
                if isinstance(part, str):
                    part = {"type": "text", "text": part}
                if part.get("type") in _IMAGE_PART_TYPES:
                    part = {"type": "text", "text": image_marker}
                    joined, after_image, after_any_image = joined + image_marker, True, True
                elif part.get("type") == "text":
                    # llama.cpp's concat_content_parts: texts joined by a newline, none beside an image
                    joined += ("\n" if joined and not after_image else "") + part.get("text", "")
                    after_image = False
                parts.append(part)
            # llama.cpp (common_chat_msg::to_json_oaicompat): content with media is always one string
            message["content"] = parts if self.supports_typed_content and not after_any_image else joined
        elif isinstance(content, str) and self.supports_typed_content and not self.supports_string_content:
            message["content"] = [{"type": "text", "text": content}]   # a template that takes parts only
        return message


def _reasoning_variables(kwargs: dict) -> dict:
    """The variables llama.cpp derives from preserve_reasoning (llama-server passes true unless
    --no-reasoning-preserve) and reasoning_effort (common/jinja/caps.cpp), under the names
    templates read; a request's own chat_template_kwargs still win."""
    out = {}
    keep = kwargs.get("preserve_reasoning", True)
    if isinstance(keep, bool):
        out.update(preserve_reasoning=keep, preserve_thinking=keep, clear_thinking=not keep,
                   truncate_history_thinking=not keep, drop_thinking=not keep)
    effort = kwargs.get("reasoning_effort")
    if isinstance(effort, str) and effort:
        out.update(reasoning_effort=effort, reasoning_strength=effort)
    return out


def _ministral3_blocks(message: dict) -> dict:
    """llama.cpp's common_chat_params_init_ministral_3: system and assistant messages
    get typed content, a reasoning_content first as a "thinking" block."""
    if message.get("role") not in ("system", "assistant"):
        return message
    blocks = []
    if isinstance(message.get("reasoning_content"), str):
        blocks.append({"type": "thinking", "thinking": message["reasoning_content"]})
    content = message.get("content")
    if isinstance(content, str):
        blocks.append({"type": "text", "text": content})
    elif isinstance(content, (list, tuple)):
        blocks.extend(content)
    out = {k: v for k, v in message.items() if k != "reasoning_content"}
    out["content"] = blocks
    return out

