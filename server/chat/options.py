"""What a chat request asks beyond sampling: tools and tool_choice, structured
output (response_format, llama-server's json_schema / grammar), reasoning and
template variables -> the template's inputs, the grammar that constrains
decoding, and how each choice's output is parsed (server/chat/output.py)."""
from __future__ import annotations

import asyncio
import functools
import inspect
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ggserve.models.chat_template import ChatTemplate
from ggserve.server.chat import autoparse, output as co
from ggserve.server.chat.continued import Prefill, parsed_text
from ggserve.server.chat.grammar import COMPILE_TIMEOUT, COMPILE_WORKERS, GrammarError, Grammars
from ggserve.server.chat.tools.grammar import after_reasoning, tool_call_lark
from ggserve.server.request_errors import InvalidOption


@dataclass
class ChatOptions:
    tools: list | None                 # passed to the template (None: tool_choice none)
    template_kwargs: dict = field(default_factory=dict)
    fmt: co.Format | None = None       # tool-call syntax, when tools are on
    syntax: co.Format | None = None    # the template's output syntax (think tags), tools or not
    reasoning: bool = True
    parallel: bool = True
    grammar_kind: str | None = None    # json_schema | gbnf | lark
    # the prompt's reasoning opener is parsed with the output (models/chat_template.py)
    generation_prompt_parsed: bool = True
    # the end marker of reasoning the rendered prompt left open (note_prompt): a forced call
    # comes after it, as llama.cpp's grammar puts its reasoning rule before the calls
    open_reasoning_end: str | None = None
    grammar_text: object = None

    def messages(self, msgs: list[dict], template=None) -> list[dict]:
        """Messages as the template wants them. The template changes them further as
        llama.cpp does (models/template_inputs.py: arguments as objects where it reads
        them so); nothing is injected for a template that does not describe tools:
        llama.cpp 11434 renders every template through its autoparser (common/chat.cpp,
        common_chat_templates_apply_jinja), which passes `tools` to the template and adds
        no system message; only its generic fallback, taken when the analysis fails,
        writes one."""
        return msgs

    def note_prompt(self, prompt_text: str, prefill: str = "") -> None:
        """Whether the rendered prompt leaves reasoning open (before its grammar is compiled)."""
        fmt = self.syntax or co.Format()
        self.open_reasoning_end = None
        if not self.reasoning or prefill or not fmt.think[1]:
            return
        if fmt.autoparse is not None:
            opened = autoparse.opened(prompt_text, *fmt.autoparse) if self.generation_prompt_parsed else ""
            end = fmt.autoparse[1].strip(" \t\r\n")
            if opened and end and end not in opened:
                self.open_reasoning_end = end
        elif fmt.think[0] and prompt_text.rstrip().endswith(fmt.think[0]):
            self.open_reasoning_end = fmt.think[1]

    def output(self, prompt_text: str, prefill: Prefill | str = ""):
        """Factory of each choice's ChatOutput, given the rendered prompt. prefill: the
        continued final assistant message, which llama-server parses before the generated
        text, written back in the family's syntax (server/chat/continued.py)."""
        fmt = self.syntax or co.Format()
        if prefill:
            text, split = parsed_text(fmt, prefill if isinstance(prefill, Prefill) else Prefill(prefill))
            return functools.partial(co.ChatOutput, fmt, reasoning=self.reasoning and split,
                                     tools=self.fmt is not None, prefill=text)
        reasoning = self.reasoning
        if fmt.autoparse is not None:
            parsed = reasoning and self.generation_prompt_parsed
            opened = autoparse.opened(prompt_text, *fmt.autoparse) if parsed else ""
            return functools.partial(co.ChatOutput, fmt, reasoning=reasoning, tools=self.fmt is not None,
                                     opened=opened)
        open_think = bool(fmt.think[0]) and prompt_text.rstrip().endswith(fmt.think[0])
        return functools.partial(co.ChatOutput, fmt, reasoning=reasoning,
                                 tools=self.fmt is not None, open_think=open_think)


def _tool_names(tools: list) -> list[str]:
    names = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if t.get("type", "function") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str):
            raise InvalidOption("each tool must be {\"type\": \"function\", \"function\": {\"name\", "
                          "\"parameters\"}}", param=f"tools.{i}")
        names.append(fn["name"])
    return names


# the template variables the renderer sets itself (ChatTemplate.render's arguments): not a
# request's to set through chat_template_kwargs
RESERVED_TEMPLATE_VARS = frozenset(inspect.signature(ChatTemplate.render).parameters) - {"self", "extra"}


def chat_options(req, cfg, template) -> ChatOptions:
    """Check the request's tool, format and reasoning fields (400s name the field).
    template: the model's ChatTemplate (or only its source text)."""
    reserved = sorted(RESERVED_TEMPLATE_VARS & set(req.chat_template_kwargs or {}))
    if reserved:
        raise InvalidOption(f"chat_template_kwargs may not set {', '.join(reserved)}: the server sets "
                            f"{'it' if len(reserved) == 1 else 'them'} itself", param="chat_template_kwargs")
    kwargs = {**cfg.chat_template_kwargs, **(req.chat_template_kwargs or {})}
    if cfg.reasoning_budget == 0:
        kwargs.setdefault("enable_thinking", False)
    reasoning_format = req.reasoning_format or cfg.reasoning_format
    choice = req.tool_choice
    tools = req.tools or None
    names = _tool_names(tools) if tools else []
    if choice == "none":
        tools = None
    forced = _forced_tools(choice, tools, names)
    # a named tool_choice forces exactly one call
    opts = ChatOptions(tools, kwargs, reasoning=reasoning_format != "none",
                       parallel=req.parallel_tool_calls and not isinstance(choice, dict))
    opts.syntax = co.detect(_template_source(template))(tools)
    opts.generation_prompt_parsed = getattr(template, "generation_prompt_parsed", True)
    _reasoning_syntax(opts.syntax, template)
    if tools:
        opts.fmt = opts.syntax
    _constrain(opts, req, cfg, forced)
    return opts


def _template_source(template) -> str:
    """A ChatTemplate's source text; a template given as its text is its own source."""
    return template if isinstance(template, str) else getattr(template, "source", "") or ""


def _reasoning_syntax(syntax: co.Format, template) -> None:
    """Where the output's reasoning is: for a template llama.cpp parses with its autoparser
    (no handler of its own), the reasoning markers its analysis found in the template
    (models/template_reasoning.py; none: no reasoning is split off); else the format's tags."""
    markers = getattr(template, "reasoning", None)
    syntax.lenient_end = type(syntax).lenient_end or markers is not None and getattr(template, "family", None) is None
    if markers is None or getattr(template, "family", None) is not None or type(syntax).think != co.Format.think:
        syntax.reasoning_template = bool(syntax.think[0]) and syntax.think[0] in _template_source(template)
        if syntax.think_in_source_only and not syntax.reasoning_template:
            syntax.think = ("", "")      # its parser reads think tags only where the template writes them
        return
    syntax.think = (markers.start.strip(" \t\r\n"), markers.end.strip(" \t\r\n")) if markers.supported else ("", "")
    syntax.reasoning_template = markers.supported
    if markers.supported:
        syntax.autoparse = (markers.start, markers.end)


def _forced_tools(choice, tools: list | None, names: list[str]) -> list[str]:
    """The tools tool_choice makes the answer call: all with "required", the named one, else none."""
    if choice == "required":
        if not tools:
            raise InvalidOption("tool_choice \"required\" needs tools", param="tool_choice")
        return names
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if isinstance(choice.get("function"), dict) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise InvalidOption("tool_choice must be \"none\", \"auto\", \"required\" or "
                          "{\"type\": \"function\", \"function\": {\"name\"}}", param="tool_choice")
        if name not in names:
            raise InvalidOption(f"tool_choice names {name!r}, which is not in tools", param="tool_choice")
        return [name]
    return []


def _constrain(opts: ChatOptions, req, cfg, forced: list[str]) -> None:
    """The one grammar the answer runs under: response_format, json_schema, grammar or the
    forced tool calls, else --grammar / --json-schema when no tools are on."""
    asked = _response_format_grammar(req.response_format)
    if req.json_schema is not None:
        asked.append(("json_schema", req.json_schema))
    if req.grammar:
        asked.append(("gbnf", req.grammar))
    if forced:
        if opts.fmt is None or asked:
            raise InvalidOption("tool_choice required/named cannot be combined with a grammar or "
                          "response_format", param="tool_choice")
        asked.append(("tools", forced))
    if len(asked) > 1:
        raise InvalidOption("give at most one of response_format, json_schema and grammar",
                      param="response_format")
    if asked:
        opts.grammar_kind, opts.grammar_text = asked[0]
    elif not opts.tools and getattr(cfg, "default_grammar", None):      # --grammar / --json-schema
        opts.grammar_kind, opts.grammar_text = cfg.default_grammar


def _response_format_grammar(rf) -> list[tuple[str, object]]:
    """response_format's JSON schema as [("json_schema", schema)]; [] for text or none."""
    if rf is None:
        return []
    kind = rf.get("type")
    if kind == "json_object":
        return [("json_schema", rf.get("schema") or {"type": "object"})]
    if kind == "json_schema":
        js = rf.get("json_schema")
        schema = js.get("schema") if isinstance(js, dict) else None
        if schema is None:
            schema = rf.get("schema")
        if not isinstance(schema, dict):
            raise InvalidOption("response_format json_schema needs json_schema.schema (an object)",
                          param="response_format")
        return [("json_schema", schema)]
    if kind != "text":
        raise InvalidOption("response_format.type must be text, json_object or json_schema",
                      param="response_format")
    return []


def completion_options(req, cfg) -> ChatOptions:
    """/v1/completions: llama-server's json_schema or grammar field (else --grammar / --json-schema)."""
    opts = ChatOptions(None)
    if req.json_schema is not None and req.grammar:
        raise InvalidOption("give json_schema or grammar, not both", param="grammar")
    if req.json_schema is not None:
        opts.grammar_kind, opts.grammar_text = "json_schema", req.json_schema
    elif req.grammar:
        opts.grammar_kind, opts.grammar_text = "gbnf", req.grammar
    elif getattr(cfg, "default_grammar", None):
        opts.grammar_kind, opts.grammar_text = cfg.default_grammar
    return opts


# threads that wait for a grammar's compile worker (server/chat/grammar_worker.py): no other
# request waits behind them (the prompt thread does not compile)
_WAITERS = ThreadPoolExecutor(4 * COMPILE_WORKERS, thread_name_prefix="ggserve-grammar-wait")


async def compile_grammar_async(grammars: Grammars, opts: ChatOptions, timeout: float = COMPILE_TIMEOUT):
    """compile_grammar on a thread of its own (its worker process does the work)."""
    if opts.grammar_kind is None:
        return None
    return await asyncio.wrap_future(_WAITERS.submit(compile_grammar, grammars, opts, timeout))


def compile_grammar(grammars: Grammars, opts: ChatOptions, timeout: float = COMPILE_TIMEOUT):
    """The request's grammar, compiled and checked, in at most `timeout` seconds."""
    if opts.grammar_kind is None:
        return None
    try:
        if opts.grammar_kind == "tools":
            lark = tool_call_lark(grammars, opts.fmt, opts.grammar_text, opts.parallel)
            if lark is None:
                return None          # a syntax the grammar cannot write: parsed, not forced
            if opts.open_reasoning_end:
                lark = after_reasoning(grammars, lark, opts.open_reasoning_end)
            return grammars.compile("lark", lark, timeout)
        return grammars.compile(opts.grammar_kind, opts.grammar_text, timeout)
    except GrammarError as e:
        param = {"gbnf": "grammar", "tools": "tool_choice"}.get(opts.grammar_kind, "response_format")
        raise InvalidOption(str(e), param=param) from None
