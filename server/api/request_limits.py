"""What a request may ask for, checked on its parsed body before any work (every route's
body passes here, server/api/common.py json_body): grammar size, rules and nesting;
JSON schemas' depth, breadth and pattern length (response_format, json_schema, the
Responses API's text.format, each tool's parameters); the tools' total size; counts
(`n` / `n_cmpl` against the slots, `n_probs` / `top_logprobs` / `logprobs`,
`logit_bias` entries, stop strings). Each refusal is a 400 that names its limit's flag.

What the limits admit is still compiled in a worker process with a timeout
(server/chat/grammar_worker.py, --grammar-timeout): the limits answer the common
abuse at once, the worker bounds whatever else a grammar can cost."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields

from ggserve.server.api.errors import invalid


@dataclass(frozen=True)
class RequestLimits:
    grammar_bytes: int = 256 * 1024     # --grammar-max-bytes
    grammar_rules: int = 1000           # --grammar-max-rules
    grammar_depth: int = 64             # --grammar-max-depth: ( ) nesting in a grammar
    grammar_timeout: float = 10.0       # --grammar-timeout: seconds to compile a grammar or schema
    schema_depth: int = 32              # --schema-max-depth: schemas nested in a schema
    schema_breadth: int = 1000          # --schema-max-breadth: properties, enum, anyOf, ... of one schema
    schema_pattern: int = 1000          # --schema-max-pattern: characters of a pattern
    tools_bytes: int = 512 * 1024       # --tools-max-bytes: all tools together, as JSON
    n_probs: int = 20                   # --max-n-probs: n_probs, top_logprobs, logprobs (schemas.py: 20 at most)
    logit_bias: int = 8192              # --max-logit-bias: logit_bias entries
    stops: int = 16                     # --max-stop: stop strings (server/api/schemas.py takes 16 at most)

    @classmethod
    def from_args(cls, args) -> RequestLimits:
        return cls(**{f.name: getattr(args, "limit_" + f.name) for f in fields(cls)})


def _refuse(what: str, n, limit, flag: str, param: str):
    return invalid(f"{what} ({n}) is over the server's limit of {limit} ({flag})", param=param,
                   code="limit_exceeded")


def check_request(body: dict, lim: RequestLimits, n_parallel: int) -> None:
    """Every limit above, on a parsed body (a 400 for the first one over)."""
    _check_counts(body, lim, n_parallel)
    if isinstance(body.get("grammar"), str):
        check_grammar(body["grammar"], lim)
    for param, schema in _schemas(body):
        check_schema(schema, lim, param)
    tools = body.get("tools")
    if isinstance(tools, list):
        size = json_size(tools, lim.tools_bytes)
        if size > lim.tools_bytes:
            raise _refuse("the tools' size in bytes", f"over {lim.tools_bytes}", lim.tools_bytes,
                          "--tools-max-bytes", "tools")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_counts(body: dict, lim: RequestLimits, n_parallel: int) -> None:
    for key in ("n", "n_cmpl"):            # each choice takes a slot: refused before any copy is made
        if _is_int(body.get(key)) and body[key] > n_parallel:
            raise invalid(f"{key} ({body[key]}) must be at most {n_parallel} (the server's --parallel)",
                          param=key, code="limit_exceeded")
    for key in ("n_probs", "top_logprobs", "logprobs"):
        if _is_int(body.get(key)) and body[key] > lim.n_probs:
            raise _refuse(key, body[key], lim.n_probs, "--max-n-probs", key)
    bias = body.get("logit_bias")
    if isinstance(bias, (dict, list)) and len(bias) > lim.logit_bias:
        raise _refuse("logit_bias entries", len(bias), lim.logit_bias, "--max-logit-bias", "logit_bias")
    for key in ("stop", "stop_sequences"):
        if isinstance(body.get(key), list) and len(body[key]) > lim.stops:
            raise _refuse("stop strings", len(body[key]), lim.stops, "--max-stop", key)


# a rule's definition at the start of a line: GBNF's `name ::=`, Lark's `name:`, `?name:`, `NAME.2:`
_RULE = re.compile(r"^[ \t]*[?!]?[A-Za-z_][\w.-]*[ \t]*(?:::=|:)", re.MULTILINE)


def check_grammar(text: str, lim: RequestLimits, param: str = "grammar") -> None:
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > lim.grammar_bytes:
        raise _refuse("the grammar's size in bytes", size, lim.grammar_bytes, "--grammar-max-bytes", param)
    rules = len(_RULE.findall(text))
    if rules > lim.grammar_rules:
        raise _refuse("the grammar's rules", rules, lim.grammar_rules, "--grammar-max-rules", param)
    depth = grammar_depth(text)
    if depth > lim.grammar_depth:
        raise _refuse("the grammar's nesting of parentheses", depth, lim.grammar_depth,
                      "--grammar-max-depth", param)


def grammar_depth(text: str) -> int:
    """The deepest ( ) nesting, outside "strings", 'strings', GBNF's [classes] and Lark's /regexes/."""
    gbnf = "::=" in text
    depth = top = i = 0
    n = len(text)
    while i < n:
        c = text[i]
        close = {'"': '"', "'": "'", "[": "]" if gbnf else None, "/": None if gbnf else "/"}.get(c)
        if close:
            i += 1
            while i < n and text[i] != close and text[i] != "\n":
                i += 2 if text[i] == "\\" else 1
        elif c == "#" and gbnf:               # a comment, to the end of its line
            while i < n and text[i] != "\n":
                i += 1
        elif c == "(":
            depth += 1
            top = max(top, depth)
        elif c == ")":
            depth = max(depth - 1, 0)
        i += 1
    return top


def _schemas(body: dict):
    """(param, schema) for each JSON schema the body carries."""
    js = body.get("json_schema")
    if isinstance(js, str):
        try:
            js = json.loads(js)
        except (ValueError, RecursionError):
            js = None                        # refused later, with the parser's reason
    if js is not None:
        yield "json_schema", js
    rf = body.get("response_format")
    if isinstance(rf, dict):
        inner = rf.get("json_schema")
        yield "response_format", inner.get("schema") if isinstance(inner, dict) else None
        yield "response_format", rf.get("schema")
    text = body.get("text")
    if isinstance(text, dict) and isinstance(text.get("format"), dict):
        yield "text.format", text["format"].get("schema")
    for i, tool in enumerate(body.get("tools") if isinstance(body.get("tools"), list) else []):
        if isinstance(tool, dict):
            fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
            yield f"tools.{i}", fn.get("parameters")
            yield f"tools.{i}", tool.get("input_schema")


# where a schema holds other schemas: under each key of the first kind, a list of them under
# the second, a name -> schema map under the third (as server/chat/grammar.py's closed_objects)
_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
        "unevaluatedProperties", "unevaluatedItems", "additionalItems")
_LIST = ("prefixItems", "anyOf", "oneOf", "allOf", "items")
_MAP = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
_BROAD = ("properties", "patternProperties", "$defs", "definitions", "enum", "anyOf", "oneOf", "allOf",
          "prefixItems", "required")


def check_schema(schema, lim: RequestLimits, param: str) -> None:
    """Depth (schemas within schemas), breadth (entries of one keyword) and pattern length."""
    stack = [(schema, 1)]
    while stack:
        s, depth = stack.pop()
        if not isinstance(s, dict):
            continue
        if depth > lim.schema_depth:
            raise _refuse("the JSON schema's depth", depth, lim.schema_depth, "--schema-max-depth", param)
        for key in _BROAD:
            if isinstance(s.get(key), (dict, list)) and len(s[key]) > lim.schema_breadth:
                raise _refuse(f"the JSON schema's {key} entries", len(s[key]), lim.schema_breadth,
                              "--schema-max-breadth", param)
        pp = s.get("patternProperties")
        for p in [s.get("pattern"), *(pp if isinstance(pp, dict) else ())]:
            if isinstance(p, str) and len(p) > lim.schema_pattern:
                raise _refuse("the JSON schema's pattern length", len(p), lim.schema_pattern,
                              "--schema-max-pattern", param)
        for key in _ONE:
            stack.append((s.get(key), depth + 1))
        for key in _LIST:
            if isinstance(s.get(key), list):
                stack.extend((x, depth + 1) for x in s[key])
        for key in _MAP:
            if isinstance(s.get(key), dict):
                stack.extend((x, depth + 1) for x in s[key].values())


def json_size(value, budget: int) -> int:
    """About how many bytes `value` is as JSON; stops counting once over `budget`."""
    size, stack = 0, [value]
    while stack and size <= budget:
        v = stack.pop()
        if isinstance(v, dict):
            size += 2 + len(v)
            for k, x in v.items():
                size += len(k) + 3
                stack.append(x)
        elif isinstance(v, list):
            size += 2 + len(v)
            stack.extend(v)
        elif isinstance(v, str):
            size += len(v) + 2
        else:
            size += 4
    return size


def add_request_limit_flags(p, flag) -> None:
    """The command line's flags for these limits (server/cli/serve_flags.py's _flag)."""
    d = RequestLimits()
    for name, dest, kind, help_ in (
            ("--grammar-max-bytes", "grammar_bytes", int, "largest grammar a request may send, in bytes"),
            ("--grammar-max-rules", "grammar_rules", int, "most rules in a request's grammar"),
            ("--grammar-max-depth", "grammar_depth", int, "deepest ( ) nesting in a request's grammar"),
            ("--grammar-timeout", "grammar_timeout", float,
             "seconds a request's grammar or JSON schema may take to compile (in a worker process)"),
            ("--schema-max-depth", "schema_depth", int, "deepest nesting of schemas in a JSON schema"),
            ("--schema-max-breadth", "schema_breadth", int,
             "most properties, enum values, anyOf/oneOf/allOf branches ... in one schema"),
            ("--schema-max-pattern", "schema_pattern", int, "longest pattern in a JSON schema, in characters"),
            ("--tools-max-bytes", "tools_bytes", int, "largest `tools` list, as JSON bytes"),
            ("--max-n-probs", "n_probs", int, "largest n_probs / top_logprobs / logprobs"),
            ("--max-logit-bias", "logit_bias", int, "most logit_bias entries"),
            ("--max-stop", "stops", int, "most stop strings")):
        flag(p, name, env="GGSERVE_" + name[2:].upper().replace("-", "_"), type=kind, default=getattr(d, dest),
             metavar="N", dest="limit_" + dest, help=help_ + " (more: 400)")
