"""Token sampling over a batch of logits, with llama.cpp's sampler-chain semantics.

Chain per row (llama.cpp `common/sampling.cpp`, `src/llama-sampling.cpp`):
logit_bias -> penalties (repeat, frequency, presence) -> top_k -> typical_p
-> top_p -> min_p -> temperature -> draw from the softmax with the row's RNG.
Greedy (temperature <= 0 or top_k == 1) is the argmax of the biased, penalised
logits. Reported logprobs come from the raw logits (llama-server's
`post_sampling_probs=false`), or with post_probs from the chain's final candidates.

Ties between equal logits always go to the lower token id, so a row's result
depends only on its own logits and sampler, never on the other rows of the batch.
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ggserve.server.engine.sampling.filters import sorted_ids, top_k_rows, top_p_count, top_p_prefix, typical_keep
from ggserve.server.engine.sampling.llama_rng import LlamaRng

# Rows per block for the raw log-softmax: bounds the float32 temporary.
_LSE_BLOCK = 16


@dataclass
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40            # <= 0: disabled
    top_p: float = 0.95        # 1.0: disabled
    min_p: float = 0.05        # 0.0: disabled
    typical_p: float = 1.0     # 1.0: disabled
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64    # 0 disabled, -1 = whole context
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None    # None: random seed
    logit_bias: dict[int, float] = field(default_factory=dict)   # -inf bans a token
    n_probs: int = 0           # top-N logprobs to report (0 = none)
    post_probs: bool = False   # report the chain's final candidates instead (llama-server's post_sampling_probs)
    grammar: object = None     # server/chat/grammar.py Grammar: constrains the tokens drawn

    def __post_init__(self):
        self.validate()      # the one place sampling fields are checked

    def validate(self) -> None:
        """Raise ValueError naming the first out-of-range field."""
        def bad(name: str, value, want: str) -> ValueError:
            return ValueError(f"{name} must be {want}, got {value!r}")

        def is_int(v) -> bool:
            return isinstance(v, (int, np.integer)) and not isinstance(v, bool)

        def finite(name: str, v) -> float:
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) \
                    or not math.isfinite(v):
                raise bad(name, v, "a finite number")
            return float(v)

        if finite("temperature", self.temperature) < 0:
            raise bad("temperature", self.temperature, ">= 0")
        if not is_int(self.top_k):
            raise bad("top_k", self.top_k, "an integer")
        if not 0 < finite("top_p", self.top_p) <= 1:
            raise bad("top_p", self.top_p, "in (0, 1]")
        if not 0 <= finite("min_p", self.min_p) <= 1:
            raise bad("min_p", self.min_p, "in [0, 1]")
        if not 0 < finite("typical_p", self.typical_p) <= 1:
            raise bad("typical_p", self.typical_p, "in (0, 1]")
        if finite("repeat_penalty", self.repeat_penalty) <= 0:
            raise bad("repeat_penalty", self.repeat_penalty, "> 0")
        if not is_int(self.repeat_last_n) or self.repeat_last_n < -1:
            raise bad("repeat_last_n", self.repeat_last_n, "an integer >= -1")
        # OpenAI's documented range for both penalties.
        if not -2 <= finite("presence_penalty", self.presence_penalty) <= 2:
            raise bad("presence_penalty", self.presence_penalty, "in [-2, 2]")
        if not -2 <= finite("frequency_penalty", self.frequency_penalty) <= 2:
            raise bad("frequency_penalty", self.frequency_penalty, "in [-2, 2]")
        if self.seed is not None and (not is_int(self.seed) or self.seed < 0):
            raise bad("seed", self.seed, "None or an integer >= 0")
        if not isinstance(self.logit_bias, dict):
            raise bad("logit_bias", self.logit_bias, "a dict of token id -> bias")
        for tok, bias in self.logit_bias.items():
            if not is_int(tok) or tok < 0:
                raise bad("logit_bias token id", tok, "an integer >= 0")
            if isinstance(bias, bool) or not isinstance(bias, (int, float, np.integer, np.floating)) \
                    or math.isnan(bias) or bias == math.inf:
                raise bad(f"logit_bias[{tok}]", bias, "a finite number or -inf")
        if not is_int(self.n_probs) or self.n_probs < 0:
            raise bad("n_probs", self.n_probs, "an integer >= 0")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0 or self.top_k == 1


class SequenceSampler:
    """Per-sequence state: its RNG (llama.cpp's, seeded from params.seed) and its token history for penalties."""

    def __init__(self, params: SamplingParams, prompt_tokens: Sequence[int] = ()):
        self.params = params
        self.rng = LlamaRng(params.seed)
        self._history: list[int] = []
        self._counts: Counter[int] = Counter()   # whole-history counts, for repeat_last_n == -1
        self._bias_ids = np.fromiter(params.logit_bias.keys(), np.int64, len(params.logit_bias))
        self._bias_vals = np.fromiter(params.logit_bias.values(), np.float32, len(params.logit_bias))
        p = params
        self._penalised = p.repeat_last_n != 0 and (
            p.repeat_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0)
        self.constraint = None
        self.post: list[tuple[int, float]] = []     # post_probs: the last draw's candidates, best first
        for tok in prompt_tokens:
            self.accept(tok)
        if params.grammar is not None:    # its first mask starts computing now
            self.constraint = params.grammar.matcher()

    def accept(self, token: int) -> None:
        """Record a token (prompt or generated) in the history used by the penalties;
        a generated one also advances the grammar (which starts its next mask)."""
        self._history.append(int(token))
        if self.params.repeat_last_n < 0:
            self._counts[int(token)] += 1
        if self.constraint is not None:
            self.constraint.accept(token)

    @property
    def plain_greedy(self) -> bool:
        """An argmax of the raw logits is the whole answer: greedy, nothing adjusts the
        logits, no logprobs reported."""
        return self.params.greedy and self.params.n_probs == 0 and not self.params.post_probs \
            and not self.adjusts_logits

    @property
    def adjusts_logits(self) -> bool:
        """True when logit_bias, a penalty or a grammar would change this step's logits."""
        return bool(self._bias_ids.size) or (self._penalised and bool(self._history)) \
            or self.constraint is not None

    def _window_counts(self) -> tuple[np.ndarray, np.ndarray]:
        if self.params.repeat_last_n < 0:
            toks = np.fromiter(self._counts.keys(), np.int64, len(self._counts))
            counts = np.fromiter(self._counts.values(), np.int64, len(self._counts))
            return toks, counts
        window = np.asarray(self._history[-self.params.repeat_last_n:], dtype=np.int64)
        return np.unique(window, return_counts=True)

    def adjust(self, row: np.ndarray, grammar: bool = True) -> None:
        """Apply logit_bias, the penalties, then (with `grammar`) the grammar's mask to one float32 row in place."""
        n_vocab = row.shape[0]
        if self._bias_ids.size:
            ok = self._bias_ids < n_vocab
            row[self._bias_ids[ok]] += self._bias_vals[ok]
        if self._penalised and self._history:
            self._penalise(row, n_vocab)
        if grammar and self.constraint is not None:
            banned = self.constraint.banned()
            if banned is not None:
                row[:banned.shape[0]][banned] = -np.inf
                row[banned.shape[0]:] = -np.inf       # padding rows past the tokenizer

    def _penalise(self, row: np.ndarray, n_vocab: int) -> None:
        p = self.params
        toks, counts = self._window_counts()
        ok = (toks >= 0) & (toks < n_vocab)
        toks, counts = toks[ok], counts[ok]
        x = row[toks]
        if p.repeat_penalty != 1.0:
            rp = np.float32(p.repeat_penalty)
            # ref: llama_sampler_penalties_apply: shrink towards zero either side
            x = np.where(x <= 0, x * rp, x / rp)
        pen = (counts * p.frequency_penalty + (counts > 0) * p.presence_penalty).astype(np.float32)
        row[toks] = x - pen

    def sample(self, row: np.ndarray, top: np.ndarray | None) -> int:
        """Run top_k's successors of the chain on one adjusted row and draw a token.

        `top` is the top_k candidates, token ids sorted by (-logit, id); None when
        top_k is disabled (the whole vocabulary is the candidate set).
        """
        p = self.params
        u = self.rng.random()        # one draw per step, whatever the filters keep
        if top is None:
            idx, vals, is_sorted = None, row, False
        else:
            idx, vals, is_sorted = top, row[top], True

        if p.typical_p < 1.0:
            if not is_sorted:
                idx = sorted_ids(row)
                vals, is_sorted = row[idx], True
            keep = typical_keep(vals, p.typical_p)
            idx, vals = idx[keep], vals[keep]
        if p.top_p < 1.0:
            if is_sorted:
                n = top_p_count(vals, p.top_p)
                idx, vals = idx[:n], vals[:n]
            else:
                within = None
                if p.min_p > 0.0:
                    # top_p and min_p both keep a prefix of the same order, so the
                    # shorter one wins; min_p's is cheap to find and usually short.
                    thr = np.float32(row.max()) + np.float32(math.log(np.float32(p.min_p)))
                    within = np.flatnonzero(row >= thr)
                idx = top_p_prefix(row, p.top_p, within)
                vals, is_sorted = row[idx], True
        if p.min_p > 0.0:
            vmax = vals[0] if is_sorted else vals.max()
            thr = np.float32(vmax) + np.float32(math.log(np.float32(p.min_p)))
            if idx is None:
                idx = np.flatnonzero(row >= thr)
                vals = row[idx]
            else:
                keep = vals >= thr
                idx, vals = idx[keep], vals[keep]

        vmax = vals[0] if is_sorted else vals.max()
        if not np.isfinite(vmax):      # everything banned: nothing sensible to draw
            self.post = []
            return int(np.argmax(row))
        # softmax(logit / T) drawn by inverse CDF, as llama.cpp's dist sampler: logit / T and exp
        # in float32, sums in double, the first candidate whose running sum reaches u * sum
        scaled = vals.astype(np.float32) / np.float32(p.temperature)
        z = np.exp(scaled - scaled.max()).astype(np.float64)
        cdf = np.cumsum(z)
        j = min(int(np.searchsorted(cdf, u * cdf[-1], side="left")), len(cdf) - 1)
        tok = int(j if idx is None else idx[j])
        if p.post_probs:
            order = np.argsort(-z, kind="stable")[:max(p.n_probs, 1)]
            ids = order if idx is None else idx[order]
            self.post = [(tok, float(z[j] / cdf[-1]))] + [(int(t), float(q)) for t, q in zip(ids, z[order] / cdf[-1])]
        return tok


@dataclass
class SampleResult:
    token: int
    logprob: float | None                # log-softmax of the RAW logits (pre-sampling, over the whole vocab), of the chosen token; None if n_probs == 0
    top: list[tuple[int, float]]         # n_probs best (token, logprob) from the same raw log-softmax, best first; [] if n_probs == 0


def sample_batch(logits: np.ndarray, samplers: list[SequenceSampler]) -> list[SampleResult]:
    """logits: float32 [n_rows, n_vocab], row i belongs to samplers[i]. Vectorise what can be vectorised (log-softmax, greedy argmax, top-k partition over all rows); per-row work only where params differ."""
    logits = np.ascontiguousarray(logits, dtype=np.float32)
    if logits.ndim != 2 or logits.shape[0] != len(samplers):
        raise ValueError(f"logits shape {logits.shape} does not match {len(samplers)} samplers")
    n_rows, n_vocab = logits.shape
    if all(s.plain_greedy for s in samplers):      # the common decode: an argmax and nothing else
        return [SampleResult(int(t), None, []) for t in np.argmax(logits, axis=1)]
    # log-softmax only for the rows that report logprobs (a full pass over the vocab)
    wants_lp = [i for i, s in enumerate(samplers) if s.params.n_probs > 0 and not s.params.post_probs]
    lse = np.zeros(n_rows, dtype=np.float32)
    if wants_lp:
        lse[wants_lp] = _logsumexp_rows(_take_rows(logits, wants_lp))

    adjusting = [i for i, s in enumerate(samplers) if s.adjusts_logits]
    work = logits.copy() if adjusting else logits                   # [n_rows, n_vocab]
    for i in adjusting:
        samplers[i].adjust(work[i], grammar=False)
    tokens = _draw(work, samplers, range(n_rows))
    # a grammar refusing the token drawn: the row again, masked, and a second draw (llama.cpp's
    # grammar-based rejection sampling in common_sampler_sample)
    refused = [i for i, s in enumerate(samplers) if s.constraint is not None and not s.constraint.allows(int(tokens[i]))]
    if refused:
        for i in refused:
            work[i] = logits[i]
            samplers[i].adjust(work[i])
        tokens[refused] = _draw(work, samplers, refused)[refused]

    results = []
    by_n: dict[int, list[int]] = defaultdict(list)
    for i, s in enumerate(samplers):
        if s.params.n_probs > 0 and not s.params.post_probs:
            by_n[min(s.params.n_probs, n_vocab)].append(i)
    tops_raw: dict[int, np.ndarray] = {}
    for n, rows in by_n.items():
        tops_raw.update(zip(rows, top_k_rows(logits, rows, n)))
    for i in range(n_rows):
        tok = int(tokens[i])
        top = []
        if i in tops_raw:
            ids = tops_raw[i]
            top = [(int(t), float(lp)) for t, lp in zip(ids, logits[i, ids] - lse[i])]
        lp = float(logits[i, tok] - lse[i]) if samplers[i].params.n_probs > 0 else None
        if samplers[i].params.post_probs:    # probabilities as logs; a greedy pick had probability 1
            post = [(tok, 1.0), (tok, 1.0)] if samplers[i].params.greedy else samplers[i].post
            lp = math.log(post[0][1]) if post else 0.0
            top = [(t, math.log(q)) for t, q in post[1:] if q > 0]
        results.append(SampleResult(tok, lp, top))
    return results


def _draw(work: np.ndarray, samplers: list[SequenceSampler], rows) -> np.ndarray:
    """A token for each of `rows` from its adjusted row: greedy rows by argmax (vectorised),
    the others through their sampler chain, grouped by top_k."""
    n_vocab = work.shape[1]
    tokens = np.zeros(work.shape[0], dtype=np.int64)
    greedy = [i for i in rows if samplers[i].params.greedy]
    if greedy:
        tokens[greedy] = np.argmax(_take_rows(work, greedy), axis=1)
    by_k: dict[int, list[int]] = defaultdict(list)
    for i in rows:
        if not samplers[i].params.greedy:
            k = samplers[i].params.top_k
            by_k[k if 0 < k < n_vocab else 0].append(i)
    for k, ks in by_k.items():
        tops = top_k_rows(work, ks, k) if k else [None] * len(ks)
        for i, top in zip(ks, tops):
            tokens[i] = samplers[i].sample(work[i], top)
    return tokens


def _take_rows(x: np.ndarray, rows: list[int]) -> np.ndarray:
    return x if len(rows) == x.shape[0] else x[rows]


def _logsumexp_rows(x: np.ndarray) -> np.ndarray:
    """Stable float32 log-sum-exp of each row: [n_rows, n_vocab] -> [n_rows]."""
    out = np.empty(x.shape[0], dtype=np.float32)
    for b in range(0, x.shape[0], _LSE_BLOCK):
        blk = x[b:b + _LSE_BLOCK]
        m = blk.max(axis=1, keepdims=True)                          # [b, 1]
        e = np.subtract(blk, m)                                     # [b, n_vocab]
        np.exp(e, out=e)
        out[b:b + _LSE_BLOCK] = m[:, 0] + np.log(e.sum(axis=1))
    return out
