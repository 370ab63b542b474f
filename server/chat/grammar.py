"""Constrained decoding with llguidance: JSON schemas, GBNF/Lark grammars, forced tool calls.

llguidance (the library llama.cpp, vLLM and SGLang use) turns a grammar into a
token mask per step: its Earley parser over a lexer is fast enough to compute a
mask for a 150k vocabulary in well under a millisecond, and it takes GBNF as
llama.cpp writes it, JSON schema and Lark. A request's grammar is compiled and
checked against the vocabulary once, on the prompt thread, before any token is
generated (an invalid one is a 400), in a worker process that a grammar can neither
stall past its timeout nor crash the server with (server/chat/grammar_worker.py). Each sequence then gets its own matcher
(server/engine/sampling/sampler.py), used as llama.cpp's common_sampler_sample uses its grammar:
a token is drawn from the row without the grammar, and only when the grammar
refuses it is the row masked and the token drawn again. A mask is computed only
for such a step; where masks were needed lately, `accept` starts the next one on
a worker thread, so it is usually ready before the next step's forward pass ends.
"""
from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ggserve.server.chat.grammar_worker import CompileFailed, CompilePool

COMPILE_TIMEOUT = 10.0          # seconds a grammar may take to compile (--grammar-timeout)
COMPILE_WORKERS = 2             # grammars compiled at once, each in its own process

# One worker computes next-step masks beside the forward pass (llguidance drops the GIL).
_POOL = ThreadPoolExecutor(1, thread_name_prefix="ggserve-grammar")


class GrammarError(ValueError):
    """The schema or grammar cannot be used (a 400)."""


class _Vocab:
    """llguidance's view of our tokenizer: bytes per token, control tokens marked by 0xFF."""

    def __init__(self, tok):
        self._tok = tok
        self.eos_token_id = tok.eos_id
        self.bos_token_id = tok.bos_id
        self.tokens = [b"\xff" + tok.token_bytes(i) if tok.is_special(i) else tok.token_bytes(i)
                       for i in range(tok.n_vocab)]
        self.special_token_ids = [i for i in range(tok.n_vocab) if tok.is_special(i)]

    def __call__(self, text) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        return self._tok.encode(text, add_special=False)


class Grammars:
    """Compiles grammars for one tokenizer (its llguidance vocabulary and compile workers
    are built once, with the first grammar)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._ll = None
        self._pool: CompilePool | None = None
        self._lock = threading.Lock()         # the pool's
        self._ll_lock = threading.Lock()      # the vocabulary's

    @property
    def built(self) -> bool:
        """Has a grammar needed llguidance yet (its vocabulary or a compile worker)?"""
        return self._ll is not None or self._pool is not None

    @property
    def ll_tokenizer(self):
        with self._ll_lock:
            if self._ll is None:
                import llguidance
                self._ll = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Vocab(self.tokenizer)),
                                                  n_vocab=self.tokenizer.n_vocab,
                                                  eos_token=sorted(self.tokenizer.eog_ids))
            return self._ll

    @property
    def pool(self) -> CompilePool:
        """The compile workers, which get the same vocabulary as ll_tokenizer."""
        with self._lock:
            if self._pool is None:
                tok, v = self.tokenizer, _Vocab(self.tokenizer)
                self._pool = CompilePool({"tokens": v.tokens, "special": v.special_token_ids, "bos": tok.bos_id,
                                          "eos": sorted(tok.eog_ids), "n_vocab": tok.n_vocab}, COMPILE_WORKERS)
            return self._pool

    def compile(self, kind: str, text, timeout: float = COMPILE_TIMEOUT) -> Grammar:
        """kind: json_schema (dict or str), gbnf (llama.cpp's GBNF, or Lark), lark. Compiled in
        a worker process: past `timeout` seconds, or when the compiler dies, a GrammarError."""
        if kind == "json_schema":
            try:
                schema = json.loads(text) if isinstance(text, str) else text
                text = json.dumps(closed_objects(schema))
            except (ValueError, TypeError, RecursionError) as e:
                raise GrammarError(f"invalid {kind}: {e}") from None
        elif not isinstance(text, str):
            raise GrammarError(f"invalid {kind}: not a string")
        try:
            src = self.pool.compile(kind, text, timeout)
        except CompileFailed as e:
            raise GrammarError(str(e)) from None
        return Grammar(src, self.ll_tokenizer)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()

    def literal(self, text: str) -> str:
        """A Lark literal for a marker: the control token itself when the vocabulary has one."""
        tid = self.tokenizer.token_to_id(text)
        if tid is not None and self.tokenizer.is_special(tid):
            return f"<[{tid}]>"
        return json.dumps(text)


# where a schema nests other schemas: one schema under each key of the first kind, a list
# of them under the second, a name -> schema map under the third
_ONE, _LIST, _MAP = ("items", "additionalProperties", "not", "if", "then", "else"), \
    ("prefixItems", "anyOf", "oneOf", "allOf", "items"), ("properties", "$defs", "definitions", "patternProperties")

_NESTING = tuple(dict.fromkeys(_ONE + _LIST))


def closed_objects(schema):
    """The schema as llama.cpp reads it: an object schema that lists `properties` and says
    nothing of `additionalProperties` takes no other keys (common/json-schema.cpp; JSON
    Schema itself would allow them, and llguidance does)."""
    if isinstance(schema, list):
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    for key in _NESTING:         # once per key: "items" is in both kinds (twice would be 2^depth calls)
        if isinstance(out.get(key), (dict, list)):
            out[key] = closed_objects(out[key])
    for key in _MAP:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed_objects(s) for name, s in out[key].items()}
    return out


class Grammar:
    """A checked llguidance grammar; `matcher()` starts one sequence's state."""

    def __init__(self, source: str, ll_tokenizer):
        self.source = source
        self.ll_tokenizer = ll_tokenizer

    def matcher(self) -> Constraint:
        return Constraint(self)


# A mask starts computing in the background after a token while the share of recent
# steps that needed one is above this (an exponential average, the newest step 1/5)
PRECOMPUTE_ABOVE = 0.25


class Constraint:
    """One sequence's grammar state: whether it allows a token, and the banned-token
    mask for a step whose first draw it refused (computed then, or in the background
    ahead of the step when recent steps needed masks)."""

    def __init__(self, grammar: Grammar):
        from llguidance import LLMatcher
        self._m = LLMatcher(grammar.ll_tokenizer, grammar.source, log_level=0)
        self._n_vocab = grammar.ll_tokenizer.vocab_size
        self._needed = 1.0            # the first token is often refused (an answer that must open with "{")
        self._needed_now = False
        self._next = _POOL.submit(self._banned)

    def _banned(self) -> np.ndarray | None:
        if self._m.is_error():
            return None
        bits = np.frombuffer(self._m.compute_bitmask(), dtype=np.uint8)
        return np.unpackbits(bits, bitorder="little")[:self._n_vocab] == 0    # [n_vocab] bool

    def allows(self, token: int) -> bool:
        """Would the grammar take this token now? (A broken grammar takes any.)"""
        if self._next is not None:       # a mask in flight is the answer (and the matcher is busy)
            banned = self._next.result()
            if banned is None:
                return True
            return token < banned.shape[0] and not banned[token]
        if self._m.is_error():
            return True
        return token < self._n_vocab and self._m.validate_tokens([int(token)]) == 1

    def banned(self) -> np.ndarray | None:
        """Tokens the grammar forbids now ([n_vocab] bool); None once it is broken."""
        self._needed_now = True
        if self._next is None:
            self._next = _POOL.submit(self._banned)
        return self._next.result()

    def accept(self, token: int) -> None:
        if self._next is not None:
            self._next.result()          # the matcher is not thread-safe: one call at a time
        self._needed = 0.8 * self._needed + 0.2 * self._needed_now
        self._needed_now = False
        self._m.consume_token(int(token))
        self._next = _POOL.submit(self._banned) if self._needed > PRECOMPUTE_ABOVE else None

    @property
    def error(self) -> str:
        return self._m.get_error()
