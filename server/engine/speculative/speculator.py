"""Speculative decoding: drafting the tokens a decode step verifies.

Before a step the engine asks the Speculator for each decoding sequence's draft
(`Sequence.draft`); the scheduler gives the sequence 1 + len(draft) rows (its
pending token and the drafted ones, ordinary generated rows of one chunk), the
step computes them together, and the engine samples row after row with the
sequence's own sampler, keeping tokens while they equal the draft: the first
token that differs (or the one after the last drafted token) ends the step's
tokens and the drafted rows after it are dropped from the KV cache.

Lossless: every output token is drawn from the target model's own logits for
its row, with the same sampler state and RNG draw it would get without a draft,
and kernel parity gives a drafted row the result it would get alone. So greedy
and seeded sampled answers equal non-speculative ones token for token (the
"sample from the target, accept if equal" rule, exact for any proposal).

Drafters, as llama-server's `--spec-type`:
- `ngram` (ggserve's prompt lookup, as vLLM's `[ngram]`): the latest earlier
  occurrence of the last n tokens (n from `ngram_max` down to `ngram_min`) in the
  prompt and generated text proposes the tokens that followed it;
- `ngram-simple`: llama.cpp's `common_ngram_simple_draft` (size_n, size_m);
- `draft-simple` (`-md`): a draft model's greedy continuation, stopped where its
  top probability falls under p_min (llama.cpp's draft-simple).
Models with recurrent state cannot drop rejected rows (their state holds only
where the sequence is), so speculation is off for them.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np

log = logging.getLogger("ggserve.speculative")

TYPES = ("none", "ngram", "ngram-simple", "draft-simple")
# default draft lengths: llama.cpp's for a draft model (common.h, draft.n_max); ngram-simple
# drafts up to its size_m, as llama.cpp's
N_MAX = {"none": 0, "ngram": 8, "draft-simple": 3}


@dataclass(frozen=True)
class SpecConfig:
    type: str = "ngram"
    n_max: int | None = None  # most tokens drafted per step (--spec-draft-n-max; None: N_MAX[type])
    n_min: int = 0           # shorter drafts are dropped (--spec-draft-n-min)
    p_min: float = 0.0       # draft model: stop where its top probability is lower (--spec-draft-p-min)
    ngram_min: int = 3       # ngram: shortest suffix looked up
    ngram_max: int = 5       # ngram: longest suffix looked up
    simple_n: int = 12       # ngram-simple: lookup n-gram (llama.cpp --spec-ngram-simple-size-n)
    simple_m: int = 48       # ngram-simple: draft m-gram (--spec-ngram-simple-size-m)
    model_draft: str | None = None
    n_gpu_layers_draft: int = 0
    adaptive: bool = True    # draft as many as pay for their rows (draft_length); False: always n_max

    @classmethod
    def from_args(cls, args) -> "SpecConfig":
        """From `ggserve serve`'s flags (server/cli/serve_flags.py add_spec_flags); a bad value exits naming it."""
        kind = args.spec_type or ("draft-simple" if args.model_draft else "ngram")
        if args.model_draft and not os.path.exists(args.model_draft):
            raise SystemExit(f"ggserve serve: draft model file not found: {args.model_draft}")
        try:
            return cls(type=kind, n_max=args.draft_max, n_min=args.draft_min, p_min=args.draft_p_min,
                       simple_n=args.simple_n, simple_m=args.simple_m,
                       model_draft=args.model_draft if kind == "draft-simple" else None,
                       n_gpu_layers_draft=args.gpu_layers_draft)
        except ValueError as e:
            raise SystemExit(f"ggserve serve: speculative decoding: {e}")

    def __post_init__(self):
        if self.type not in TYPES:
            raise ValueError(f"spec type {self.type!r} is not one of {', '.join(TYPES)}")
        if self.n_max is None:
            object.__setattr__(self, "n_max", self.simple_m if self.type == "ngram-simple" else N_MAX[self.type])
        if self.n_max < 0 or self.n_min < 0:
            raise ValueError("draft sizes must be >= 0")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError("ngram sizes must satisfy 1 <= min <= max")
        if self.simple_n < 1 or self.simple_m < 1:
            raise ValueError("ngram-simple sizes must be >= 1")
        if not 0.0 <= self.p_min <= 1.0:
            raise ValueError("p_min must be in [0, 1]")
        if (self.type == "draft-simple") != (self.model_draft is not None):
            raise ValueError("a draft model (-md) goes with --spec-type draft-simple")


def lookup(tokens: np.ndarray, n_min: int, n_max: int, k: int) -> list[int]:
    """Prompt lookup: up to k tokens that followed the latest earlier occurrence of
    the last n tokens (the longest n in n_max..n_min that occurs)."""
    L = len(tokens)
    for n in range(min(n_max, L - 1), n_min - 1, -1):
        starts = L - n                    # candidate i in [0, L - n - 1]: followed by a token
        hit = np.ones(starts, dtype=bool)
        for j in range(n):
            hit &= tokens[j:starts + j] == tokens[L - n + j]
        found = np.flatnonzero(hit)
        if len(found):
            i = int(found[-1]) + n
            return tokens[i:i + k].tolist()
    return []


def simple_draft(tokens: np.ndarray, size_n: int, size_m: int) -> list[int]:
    """llama.cpp's common_ngram_simple_draft (common/ngram-map.cpp): the last size_n
    tokens (the sampled one included) looked up backwards from just before
    themselves, never at index 0; the up to size_m tokens after the match, not
    counting the sampled token, if at least size_n."""
    cur = len(tokens) - 1                 # llama.cpp's `tokens` excludes the sampled one
    if cur <= size_n + size_m + 1:
        return []
    pattern = tokens[cur + 1 - size_n:]
    for j in range(cur - size_n - 1, 0, -1):
        if np.array_equal(tokens[j:j + size_n], pattern):
            n = min(size_m, cur - (j + size_n))
            return tokens[j + size_n:j + size_n + n].tolist() if n >= size_n else []
    return []


class Speculator:
    """Drafts for the decoding sequences of a step, and the acceptance counts."""

    def __init__(self, config: SpecConfig, draft_model=None):
        self.config = config
        self.draft_model = draft_model
        self.n_drafted = 0          # tokens proposed
        self.n_accepted = 0         # of those, tokens the target agreed with
        self.n_steps = 0            # verification steps (chunks with a draft)

    @classmethod
    def build(cls, config: SpecConfig, memory, tokenizer, **draft_kw) -> "Speculator":
        """The engine's speculator: off where the memory cannot drop rejected tokens
        (recurrent state: refused when a draft model was asked for); draft_kw: the
        draft model's n_ctx, n_batch, n_parallel, n_threads (as the target's)."""
        if config.type != "none" and not memory.cuts_anywhere:
            if config.type == "draft-simple":
                raise ValueError("speculative decoding needs a model whose memory can drop rejected "
                                 "tokens; this model has recurrent layers")
            log.info("speculative decoding off: the model has recurrent layers")
            config = SpecConfig(type="none")
        draft = None
        if config.type == "draft-simple":
            from ggserve.server.engine.speculative.draft_model import DraftModel
            draft = DraftModel(config.model_draft, tokenizer, n_gpu_layers=config.n_gpu_layers_draft, **draft_kw)
        return cls(config, draft)

    @property
    def on(self) -> bool:
        return self.config.type != "none"

    def propose(self, seqs, n_ctx: int, step_cost=None) -> None:
        """Set `seq.draft` for each decoding sequence (empty where nothing is proposed).
        A draft never asks for more rows than the request may still generate or
        its context holds; with `adaptive`, no more than pay for their rows under
        step_cost (the scheduler's (fixed, per_row) fit of a decode step: draft_length)."""
        room = {}
        for s in seqs:
            s.draft = ()
            k = min(self.config.n_max, s.request.max_tokens - s.n_generated - 1, n_ctx - len(s.tokens))
            if k > 0 and self.config.adaptive:
                k = draft_length(s, len(seqs), step_cost, k)
                if k == 0:    # not worth a draft now: the estimate drifts back, to try again later
                    s.recent_accepted *= IDLE_DECAY
                    s.recent_rejected *= IDLE_DECAY
            if k > 0:
                room[s] = k
        if not room:
            return
        c = self.config
        if c.type == "draft-simple":
            drafts = self.draft_model.propose(list(room), room, c.p_min)
        else:
            drafts = {}
            for s, k in room.items():
                arr = np.asarray(s.tokens, dtype=np.int64)
                drafts[s] = lookup(arr, c.ngram_min, c.ngram_max, k) if c.type == "ngram" \
                    else simple_draft(arr, c.simple_n, c.simple_m)[:k]
        for s, d in drafts.items():
            if d and len(d) >= c.n_min:
                s.draft = tuple(int(t) for t in d)

    def record(self, seq, n_drafted: int, n_accepted: int) -> None:
        """A verified draft: the counts, and the sequence's recent acceptance, which
        sizes its next drafts (draft_length; older verifications fade by RECENT_DECAY)."""
        seq.recent_accepted = RECENT_DECAY * seq.recent_accepted + n_accepted
        seq.recent_rejected = RECENT_DECAY * seq.recent_rejected + (n_accepted < n_drafted)
        self.n_steps += 1
        self.n_drafted += n_drafted
        self.n_accepted += n_accepted
        seq.n_draft += n_drafted
        seq.n_draft_accepted += n_accepted

    def stats(self) -> dict:
        return {"spec_draft_tokens": self.n_drafted, "spec_accepted_tokens": self.n_accepted,
                "spec_drafts": self.n_steps}

    def close(self) -> None:
        if self.draft_model is not None:
            self.draft_model.close()


RECENT_DECAY = 0.8     # a verification's weight in the acceptance estimate, per later one
# ... and per step the stream did not draft because drafts did not pay: after some 50
# such steps it tries one again (text that starts to repeat itself pays again)
IDLE_DECAY = 0.99


def acceptance(seq) -> float:
    """The chance that the stream's next drafted token is accepted, given the one before
    it was: accepted tokens over accepted tokens plus rejections (each draft ends at its
    first rejected token, if any), recent verifications weighing most; 1/2 before any."""
    return (seq.recent_accepted + 1) / (seq.recent_accepted + seq.recent_rejected + 2)


def draft_length(seq, n_streams: int, step_cost, k_max: int) -> int:
    """How many tokens to draft for this stream: the k <= k_max that gives the step the
    most tokens per second. A step of B streams takes fixed + per_row * rows; a draft of
    k tokens, each accepted with probability p once the one before it was, brings
    p + p^2 + ... + p^k tokens more for k rows more. One stream on a CPU, where reading
    the weights dominates, drafts long where its drafts are accepted and short or not at
    all where they are not; many streams on a CPU, where rows dominate, draft only what
    is nearly always accepted; a GPU drafts. Before the step cost is known: one token,
    a probe whose verify step measures what a drafted row costs (a blind k_max draft
    was one stream's longest wait: under kernel parity a drafted row is a solo row,
    on a CPU about 0.7 of a decode step)."""
    if step_cost is None:
        return min(1, k_max)
    fixed, per_row = step_cost
    p = acceptance(seq)
    best_k, best = 0, n_streams / (fixed + per_row * n_streams)
    gain, p_k = 0.0, 1.0
    for k in range(1, k_max + 1):
        p_k *= p
        gain += p_k
        rate = (n_streams + gain) / (fixed + per_row * (n_streams + k))
        if rate > best:
            best_k, best = k, rate
    return best_k
