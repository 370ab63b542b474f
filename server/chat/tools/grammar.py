"""Grammars that force tool calls (tool_choice "required" or a named function), in
the chat template's own syntax, as llguidance Lark: the model writes only calls
to the allowed tools, with arguments valid for each tool's parameter schema.

JSON-argument syntaxes embed the schema with `%json`; the XML-style syntaxes
(Qwen3-Coder, GLM) and Gemma 4's notation write each parameter by name: the
required ones in schema order, then any optional ones; a text value is a lazy
lexeme that ends at its closer (as llama.cpp's `until`)."""
from __future__ import annotations

import json

from ggserve.server.chat import output as co
from ggserve.server.chat.grammar import closed_objects


def _call_schema(fmt: co.Format, name: str, params: dict, args_key: str = "arguments") -> dict:
    # a forced call carries only its tool's arguments (objects closed as llama.cpp reads schemas)
    args = closed_objects(params) or {"type": "object"}
    return {"type": "object", "properties": {"name": {"const": name}, args_key: args}, "required": ["name", args_key]}


def _json(schema) -> str:
    return "%json " + json.dumps(schema)


def tool_call_lark(grammars, fmt: co.Format, names: list[str], parallel: bool) -> str | None:
    """A Lark grammar (for `grammars`, a server.grammar.Grammars) that makes the model
    write tool calls (only) in the template's syntax; None for a syntax it cannot force."""
    lit = grammars.literal
    schemas = fmt.schemas
    rules = []
    if isinstance(fmt, (co.Qwen3Coder, co.Glm45, co.Gemma4)):
        return _named_params_lark(lit, fmt, names, parallel)
    if isinstance(fmt, co.JsonSection):
        return _json_section_lark(lit, fmt, names, parallel)
    if isinstance(fmt, co.TaggedCalls):
        return _tagged_lark(lit, fmt, names, parallel)
    if isinstance(fmt, co.DeepSeekDsml):
        return _dsml_lark(lit, fmt, names, parallel)
    if isinstance(fmt, co.Lfm2):
        return _lfm2_lark(lit, fmt, names, parallel)
    if isinstance(fmt, co.FunctionaryV32):     # the prompt ends with ">>>": the recipient, then its JSON
        alts = [f'"{n}\\n" {_json(closed_objects(schemas[n]) or {"type": "object"})}' for n in names]
        call = "(" + " | ".join(f"({a})" for a in alts) + ")"
        return f'start: {call} (">>>" {call})*' if parallel else f"start: {call}"
    if isinstance(fmt, co.Hermes):
        anyof = {"anyOf": [_call_schema(fmt, n, schemas[n]) for n in names]}
        rules.append(f"call: {lit('<tool_call>')} \"\\n\" {_json(anyof)} \"\\n\" {lit('</tool_call>')}")
        sep = '"\\n"'
    elif isinstance(fmt, co.Llama3):
        anyof = {"anyOf": [_call_schema(fmt, n, schemas[n], "parameters") for n in names]}
        rules.append(f"call: {_json(anyof)}")
        sep = '";"'
    elif isinstance(fmt, co.MistralNemo):
        item = {"anyOf": [_call_schema(fmt, n, schemas[n]) for n in names]}
        arr = {"type": "array", "items": item, "minItems": 1, **({} if parallel else {"maxItems": 1})}
        return f"start: {lit('[TOOL_CALLS]')} {_json(arr)}"
    elif isinstance(fmt, co.Generic):
        one = {"anyOf": [_call_schema(fmt, n, schemas[n]) for n in names]}
        if parallel:
            top = {"type": "object", "properties": {"tool_calls": {"type": "array", "items": one, "minItems": 1}},
                   "required": ["tool_calls"]}
        else:
            top = {"type": "object", "properties": {"tool_call": one}, "required": ["tool_call"]}
        return f"start: {_json(top)}"
    elif isinstance(fmt, co._NameArgs):
        alts = []
        for n in names:
            if isinstance(fmt, co.KimiK2):
                head = f"{lit(fmt.call_open)} \"functions.{n}:\" /[0-9]{{1,4}}/ {lit(fmt.name_end)}"
            elif isinstance(fmt, co.DeepSeekR1):
                head = (f"{lit('<｜tool▁call▁begin｜>')} \"function\" {lit('<｜tool▁sep｜>')} "
                        f"\"{n}\\n```json\\n\"")
            else:
                head = f"{lit(fmt.call_open)} {json.dumps(n)} {lit(fmt.name_end)}"
            tail = ""
            if isinstance(fmt, co.DeepSeekR1):
                tail = f" \"\\n```\" {lit('<｜tool▁call▁end｜>')}"
            elif fmt.call_close:
                tail = f" {lit(fmt.call_close)}"
            alts.append(f"{head} {_json(closed_objects(schemas[n]) or {'type': 'object'})}{tail}")
        rules.append("call: " + " | ".join(f"({a})" for a in alts))
        sep = ""
        if fmt.block_open:
            body = "call+" if parallel else "call"
            return "\n".join([f"start: {lit(fmt.block_open)} {body} {lit(fmt.block_close)}"] + rules)
    elif isinstance(fmt, co.Harmony):
        alts = [f"{lit('<|channel|>')} \"commentary to=functions.{n} \" {lit('<|constrain|>')} \"json\" "
                f"{lit('<|message|>')} {_json(closed_objects(schemas[n]) or {'type': 'object'})}" for n in names]
        return "start: " + " | ".join(f"({a})" for a in alts)
    else:
        return None
    body = f"call ({sep} call)*" if parallel else "call"
    return "\n".join([f"start: {body}"] + rules)


def after_reasoning(grammars, lark: str, end: str) -> str:
    """The forced calls after reasoning the prompt left open: any text up to its end marker
    first (as llama.cpp's grammar, whose reasoning rule comes before the calls)."""
    body = lark.replace("start:", "calls:", 1)
    marker = grammars.literal(end)
    gap = "(/[ \\t\\r\\n]+/)?"      # whitespace between them, as its parser skips
    if marker.startswith("<["):     # a control token ends it
        return f"start: think_text {marker} {gap} calls\nthink_text: /(.|\\n)*/\n{body}"
    return f"start: think_text {gap} calls\nthink_text[lazy]: {_until_regex(end)}\n{body}"


def _json_section_lark(lit, fmt, names: list[str], parallel: bool) -> str:
    """The section's markers around JSON call objects (comma-separated, in [...] where the
    template writes an array), as llama.cpp's standard_json_tools."""
    def one(n):
        args = closed_objects(fmt.schemas[n]) or {"type": "object"}
        if fmt.name_is_key:
            return {"type": "object", "properties": {n: args}, "required": [n], "additionalProperties": False}
        return {"type": "object", "properties": {fmt.name_key: {"const": n}, fmt.args_key: args},
                "required": [fmt.name_key, fmt.args_key]}
    call = _json({"anyOf": [one(n) for n in names]})
    body = f'{call} ("," {call})*' if parallel else call
    if fmt.array:
        body = f'"[" {body} "]"'
    return f"start: {lit(fmt.section_start)} {body}" + (f" {lit(fmt.section_end)}" if fmt.section_end else "")


def _seq(lit, *pieces: str) -> str:
    """Lark for text made of markers and plain text: each piece a literal (a control token where it is one)."""
    return " ".join(lit(p) for p in pieces if p)


def _until_regex(close: str) -> str:
    """A lazy Lark regex for any text up to and including `close`."""
    body = "".join("\\n" if c == "\n" else "\\" + c if c in "/\\.^$*+?{}[]()|" else c for c in close)
    return f"/(.|\\n)*{body}/"


def _tagged_lark(lit, fmt, names: list[str], parallel: bool) -> str:
    """Tagged calls with tagged arguments (server/chat/tools/tagged.py): each call's name between
    its markers, the required arguments in schema order then any optional ones, a text value
    up to its closer, other values as JSON."""
    rules, alts = [], []
    for t, n in enumerate(names):
        required, optional = _params(fmt.schemas[n])
        parts = []
        for j, (key, schema) in enumerate(required + optional):
            rule = f"p{t}_{j}"
            close = fmt.value_suffix + (key + ">" if fmt.value_close_named else "")
            head = _seq(lit, fmt.key_prefix, key, fmt.key_suffix, fmt.value_prefix)
            if _is_text(schema) and lit(close.strip()).startswith("<["):
                rules += [f"{rule}: {head} {rule}_text {lit(close.strip())}", f"{rule}_text: /(.|\\n)*/"]
            elif _is_text(schema):
                rules += [f"{rule}: {head} {rule}_text", f"{rule}_text[lazy]: {_until_regex(close)}"]
            else:
                rules.append(f"{rule}: {head} %json {json.dumps(closed_objects(schema) or {})} {_seq(lit, close)}")
            parts.append(rule)
        req = " ".join(parts[:len(required)])
        opt = f" ({' | '.join(parts[len(required):])})*" if optional else ""
        alts.append(f"{_seq(lit, fmt.per_call_start, fmt.name_prefix, n, fmt.name_suffix, fmt.args_sep)} {req}{opt} "
                    f"{_seq(lit, fmt.func_close, fmt.per_call_end)}")
    call = "(" + " | ".join(f"({a})" for a in alts) + ")"
    body = f"{call}+" if parallel else call
    return "\n".join([f"start: {_seq(lit, fmt.section_start)} {body} {_seq(lit, fmt.section_end)}"] + rules)


def _args_rules(fmt, t: int, n: str, param) -> tuple[list[str], str]:
    """Rules for tool n's arguments (param(key, schema, rule) -> its rule's body): the required
    ones in schema order, then any optional ones; -> (rules, the sequence)."""
    required, optional = _params(fmt.schemas[n])
    rules, parts = [], []
    for j, (key, schema) in enumerate(required + optional):
        rule = f"p{t}_{j}"
        rules.append(f"{rule}: {param(key, schema, rule)}")
        parts.append(rule)
    return rules, " ".join(parts[:len(required)]) + (f" ({' | '.join(parts[len(required):])})*" if optional else "")


def _dsml_lark(lit, fmt, names: list[str], parallel: bool) -> str:
    """DeepSeek V3.2 / V4: <｜DSML｜function_calls> (tool_calls), one invoke per call, each argument
    with its string="true|false" attribute (a text value up to its closer, others as JSON)."""
    def dsml(*pieces):   # ｜DSML｜ is a control token in DeepSeek's vocabulary
        return " ".join(lit(p) if p == "｜DSML｜" else json.dumps(p) for p in pieces)

    def param(key, schema, rule):
        head = dsml("<", "｜DSML｜", f'parameter name="{key}" string="{str(_is_text(schema)).lower()}">')
        close = dsml("</", "｜DSML｜", "parameter>") + ' "\\n"'
        if _is_text(schema):
            return f"{head} /[^<]*/ {close}"
        return f"{head} %json {json.dumps(closed_objects(schema) or {})} {close}"
    rules, alts = [], []
    for t, n in enumerate(names):
        more, args = _args_rules(fmt, t, n, param)
        rules += more
        head = dsml("<", "｜DSML｜", 'invoke name="' + n + '">')
        alts.append(f'{head} "\\n" {args} {dsml("</", "｜DSML｜", "invoke>")} "\\n"')
    call = "(" + " | ".join(f"({a})" for a in alts) + ")"
    body = f"{call}+" if parallel else call
    return "\n".join([f'start: {dsml("<", "｜DSML｜", fmt.block_name + ">")} "\\n" {body} '
                       f'{dsml("</", "｜DSML｜", fmt.block_name + ">")}'] + rules)


def _lfm2_lark(lit, fmt, names: list[str], parallel: bool) -> str:
    """LFM2: [NAME(key=VALUE, ...), ...] between its markers, a string argument quoted, others as JSON."""
    def param(key, schema, rule):
        value = "/'[^']*'/" if _is_text(schema) else f"%json {json.dumps(closed_objects(schema) or {})}"
        return f'"{key}=" {value}'
    rules, alts = [], []
    for t, n in enumerate(names):
        required, optional = _params(fmt.schemas[n])
        more, _ = _args_rules(fmt, t, n, param)
        rules += more
        parts = [f"p{t}_{j}" for j in range(len(required) + len(optional))]
        req = ' ", " '.join(parts[:len(required)])
        opt = parts[len(required):]
        if opt and req:
            req += f' (", " ({" | ".join(opt)}))*'
        elif opt:
            req = f'(({" | ".join(opt)}) (", " ({" | ".join(opt)}))*)?'
        alts.append(f'"{n}(" {req} ")"')
    call = "(" + " | ".join(f"({a})" for a in alts) + ")"
    body = f'{call} (", " {call})*' if parallel else call
    return "\n".join([f'start: {lit("<|tool_call_start|>")} "[" {body} "]" {lit("<|tool_call_end|>")}'] + rules)


# -- syntaxes that write each parameter by name --------------------------------------

_INTEGER = r"/-?(0|[1-9][0-9]*)/"
_NUMBER = r"/-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/"


def _params(schema: dict) -> tuple[list[tuple[str, dict]], list[tuple[str, dict]]]:
    props = schema.get("properties") if isinstance(schema, dict) else None
    props = props if isinstance(props, dict) else {}
    required = [k for k in schema.get("required", ()) if k in props] if isinstance(schema, dict) else []
    return ([(k, props[k]) for k in required],
            [(k, v) for k, v in props.items() if k not in required])


def _is_text(schema) -> bool:
    return isinstance(schema, dict) and schema.get("type") == "string"


def _named_params_lark(lit, fmt, names: list[str], parallel: bool) -> str:
    rules, alts = [], []
    for t, n in enumerate(names):
        required, optional = _params(fmt.schemas[n])
        parts = []
        for j, (key, schema) in enumerate(required + optional):
            rule = f"p{t}_{j}"
            rules.append(f"{rule}: {_param(lit, fmt, key, schema, rule)}")
            parts.append(rule)
        req = " ".join(parts[:len(required)])
        opt = f" ({' | '.join(parts[len(required):])})*" if optional else ""
        if isinstance(fmt, co.Gemma4):
            sep_req = ' "," '.join(parts[:len(required)])
            opt = f' ("," ({" | ".join(parts[len(required):])}))*' if optional else ""
            if not required and optional:     # the first optional one has no comma before it
                opt = f' (({" | ".join(parts)}) ("," ({" | ".join(parts)}))*)?'
            alts.append(f'"call:{n}{{" {sep_req}{opt} "}}"')
        elif isinstance(fmt, co.Qwen3Coder):
            alts.append(f'"<function={n}>\\n" {req}{opt} "</function>\\n"')
        else:
            alts.append(f'"{n}\\n" {req}{opt}')
    if isinstance(fmt, co.Gemma4):
        call = f"{lit('<|tool_call>')} ({' | '.join(alts)}) {lit('<tool_call|>')}"
        rules += _gemma4_value_rules(lit)
    elif isinstance(fmt, co.Qwen3Coder):
        call = f"{lit(fmt.call_open)} \"\\n\" ({' | '.join(alts)}) {lit(fmt.call_close)}"
    else:
        call = f"{lit('<tool_call>')} ({' | '.join(alts)}) {lit('</tool_call>')}"
    sep = '"\\n"' if isinstance(fmt, co.Qwen3Coder) else ""
    body = f"call ({sep} call)*" if parallel else "call"
    return "\n".join([f"start: {body}", f"call: {call}"] + rules)


def _param(lit, fmt, key: str, schema: dict, rule: str) -> str:
    """One parameter, name and value, in the syntax's own markup."""
    k = json.dumps(key)[1:-1]
    if isinstance(fmt, co.Gemma4):
        return f'"{k}:" {_gemma4_value(schema)}'
    if isinstance(fmt, co.Qwen3Coder):
        head, close = f'"<parameter={k}>\\n"', "\n</parameter>\n"
    else:
        head, close = f'{lit("<arg_key>")} "{k}" {lit("</arg_key>")} "\\n" {lit("<arg_value>")}', "</arg_value>"
    tail = "" if isinstance(fmt, co.Qwen3Coder) else ' "\\n"'
    if _is_text(schema) and lit(close.strip()).startswith("<["):   # the closer is a control token
        return f"{head} {rule}_text {lit(close.strip())}{tail}\n{rule}_text: /(.|\\n)*/"
    if _is_text(schema):       # text up to the first closer, the closer included
        pattern = "/(.|\\n)*" + close.replace("/", "\\/").replace("\n", "\\n") + "/"
        return f"{head} {rule}_text{tail}\n{rule}_text[lazy]: {pattern}"
    closer = lit(close.strip()) if close.strip() == close else f'"{json.dumps(close)[1:-1]}"'
    return f'{head} %json {json.dumps(closed_objects(schema) or {})} {closer}{tail}'


def _gemma4_value(schema: dict) -> str:
    kind = schema.get("type") if isinstance(schema, dict) else None
    return {"string": "g_string", "integer": _INTEGER, "number": _NUMBER,
            "boolean": '("true" | "false")'}.get(kind, "g_value")


def _gemma4_value_rules(lit) -> list[str]:
    """Gemma 4's notation: strings between <|"|> tokens, bare keys, JSON scalars."""
    q = lit('<|"|>')
    return [f"g_string: {q} G_TEXT {q}", r"G_TEXT: /[^<]*/",
            f'g_value: g_string | g_dict | g_list | {_NUMBER} | "true" | "false" | "null"',
            r'g_dict: "{" (G_KEY ":" g_value ("," G_KEY ":" g_value)*)? "}"', r"G_KEY: /[A-Za-z_][A-Za-z0-9_]*/",
            r'g_list: "[" (g_value ("," g_value)*)? "]"']
