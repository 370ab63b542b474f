"""llama-server's sampling flags: every request's defaults, as llama-server takes them.

A request that leaves a field out samples with the command line's value (`--top-k 20`
and a request without `top_k`: top_k 20), as llama-server's params_base. The samplers
ggserve does not run (mirostat, DRY, XTC, dynamic temperature, top-n-sigma) are
accepted at their off value, which scripts often pass explicitly, and refused by name
otherwise; their tuning flags change nothing while the sampler is off.
"""
from __future__ import annotations

import argparse
import json

# (flags, SamplingParams field, type, llama-server's help)
DEFAULTS = [
    (("--temp", "--temperature"), "temperature", float, "temperature (default: 0.8)"),
    (("--top-k",), "top_k", int, "top-k sampling (default: 40, 0 = disabled)"),
    (("--top-p",), "top_p", float, "top-p sampling (default: 0.95, 1.0 = disabled)"),
    (("--min-p",), "min_p", float, "min-p sampling (default: 0.05, 0.0 = disabled)"),
    (("--typical", "--typical-p"), "typical_p", float, "locally typical sampling, parameter p (default: 1.0, "
                                                        "1.0 = disabled)"),
    (("--repeat-last-n",), "repeat_last_n", int, "last n tokens to consider for penalize (default: 64, "
                                                  "0 = disabled, -1 = ctx_size)"),
    (("--repeat-penalty",), "repeat_penalty", float, "penalize repeat sequence of tokens (default: 1.0, "
                                                      "1.0 = disabled)"),
    (("--presence-penalty",), "presence_penalty", float, "repeat alpha presence penalty (default: 0.0, "
                                                          "0.0 = disabled)"),
    (("--frequency-penalty",), "frequency_penalty", float, "repeat alpha frequency penalty (default: 0.0, "
                                                            "0.0 = disabled)"),
]

# samplers not run here: (the flag that turns one on, its off value) and the flags that only tune it
OFF_ONLY = {"--mirostat": (int, 0, ("--mirostat-lr", "--mirostat-ent")),
            "--dry-multiplier": (float, 0.0, ("--dry-base", "--dry-allowed-length", "--dry-penalty-last-n",
                                              "--dry-sequence-breaker")),
            "--xtc-probability": (float, 0.0, ("--xtc-threshold",)),
            "--dynatemp-range": (float, 0.0, ("--dynatemp-exp",)),
            "--top-nsigma": (float, -1.0, ("--top-n-sigma",))}


def add_grammar_flags(p) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--grammar", metavar="GRAMMAR",
                   help="a GBNF grammar that holds every request giving no grammar, schema, response_format "
                        "or tools of its own, as llama-server")
    g.add_argument("--grammar-file", metavar="FNAME", help="--grammar, read from a file")
    g.add_argument("-j", "--json-schema", metavar="SCHEMA",
                   help="a JSON schema that holds every request giving no grammar, schema, response_format "
                        "or tools of its own, as llama-server")
    g.add_argument("-jf", "--json-schema-file", metavar="FNAME", help="--json-schema, read from a file")


def default_grammar(args) -> tuple[str, object] | None:
    """("gbnf", text) or ("json_schema", schema) from the grammar flags, checked; None without them."""
    text, kind, flag = None, None, None
    for name, k in (("grammar", "gbnf"), ("grammar_file", "gbnf"), ("json_schema", "json_schema"),
                    ("json_schema_file", "json_schema")):
        value = getattr(args, name)
        if value is None:
            continue
        flag, kind = "--" + name.replace("_", "-"), k
        if name.endswith("_file"):
            try:
                with open(value, encoding="utf-8") as f:
                    text = f.read()
            except OSError as e:
                raise SystemExit(f"ggserve serve: {flag}: cannot read {value}: {e.strerror}")
        else:
            text = value
    if kind is None:
        return None
    from llguidance import grammar_from
    try:
        if kind == "json_schema":
            text = json.loads(text)
        grammar_from(kind, text if isinstance(text, str) else json.dumps(text))
    except (ValueError, TypeError) as e:
        raise SystemExit(f"ggserve serve: {flag}: not a valid {'JSON schema' if kind == 'json_schema' else 'grammar'}: {e}")
    return kind, text


def add_sampling_flags(p) -> None:
    add_grammar_flags(p)
    for flags, field, typ, text in DEFAULTS:
        p.add_argument(*flags, type=typ, default=None, metavar="N", dest=f"sampling_{field}",
                       help=f"default of requests that give none: {text}")
    for flag, (typ, off, tuning) in OFF_ONLY.items():
        aliases = (flag, "--top-n-sigma") if flag == "--top-nsigma" else (flag,)
        p.add_argument(*aliases, type=typ, default=off, metavar="N", dest=f"off_{flag[2:].replace('-', '_')}",
                       help=f"accepted at {off} (the sampler off), as llama-server's default: "
                            "ggserve does not run this sampler")
        for t in tuning:
            if t in aliases:
                continue
            p.add_argument(t, metavar="VALUE", default=argparse.SUPPRESS,
                           help=f"accepted: tunes {flag}, which is off here")


def check_sampling_flags(args) -> None:
    """A value the sampler would refuse, or a sampler turned on, stops the server at start."""
    from ggserve.server.engine.sampling.sampler import SamplingParams

    for flag, (typ, off, _) in OFF_ONLY.items():
        value = getattr(args, f"off_{flag[2:].replace('-', '_')}")
        if value != off:
            raise SystemExit(f"ggserve serve: {flag} {value} is not supported: ggserve does not run this "
                             f"sampler (only {off}, off)")
    for flags, field, _, _ in DEFAULTS:
        value = getattr(args, f"sampling_{field}")
        try:
            if value is not None:
                SamplingParams(**{field: value})
        except ValueError as e:
            raise SystemExit(f"ggserve serve: {flags[0]}: {e}")


def sampling_flag_defaults(args) -> dict:
    """SamplingParams fields the command line sets."""
    return {field: getattr(args, f"sampling_{field}") for _, field, _, _ in DEFAULTS
            if getattr(args, f"sampling_{field}") is not None}
