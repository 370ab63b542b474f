"""Requests as the engine sees them, and the state of a sequence being generated."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ggserve.server.engine.sampling.sampler import SamplingParams, SequenceSampler


@dataclass
class Request:
    id: str
    prompt: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = 256
    ignore_eos: bool = False
    images: list = field(default_factory=list)   # TileSpans: image rows within `prompt`
    # where llama-server would start a new prompt batch at a user turn (chat prompts of
    # sliding-window models; server/engine/kernel_parity.py): only to compute rows as it does
    turn_starts: tuple = ()
    # int32 [n_pos, len(prompt)]: each token's positions where they are not its index
    # (M-RoPE: 4 per token, images advance them by their grid); None: the index
    positions: np.ndarray | None = None
    # an embedding request (server/engine/pooling.py): prompt only; its last step returns the
    # pooled final hidden states instead of sampling (max_tokens and params unused)
    embed: bool = False
    id_slot: int = -1          # llama-server's id_slot: the slot it takes when that one is free
    progress: bool = False     # report prompt processing as it goes (llama-server's return_progress)
    n_keep: int = 0            # prompt tokens a context shift keeps after the BOS (llama-server's; -1: all)
    # cached prefixes are shared only among requests with the same salt (vLLM's cache_salt; the API
    # folds in the client's API key with --cache-isolation key): slots, running prompts, host cache, slot files
    cache_salt: str = ""
    # LoRA adapters: (id, scale) pairs, scales non-zero, ids ascending (server/engine/adapter_step.py).
    # A prefix computed under one set is never reused under another: the cache salt folds them in.
    adapters: tuple = ()

    def __post_init__(self):
        if self.adapters:
            self.cache_salt = f"{self.cache_salt}\x00lora {self.adapters}"


@dataclass
class TokenEvent:
    request_id: str
    token: int | None
    logprob: float | None
    top_logprobs: list[tuple[int, float]]
    finish_reason: str | None     # "stop", "length", or "error" (then `error` says why)
    n_prompt: int
    n_cached: int
    error: str | None = None
    embedding: np.ndarray | None = None   # an embedding request's result (server/engine/pooling.py Pool.result)
    # speculative decoding: the request's drafted tokens so far, and how many were accepted
    n_draft: int = 0
    n_draft_accepted: int = 0
    progress: int | None = None   # a progress report (no token): prompt tokens in the KV cache so far


def progress_event(seq: "Sequence") -> TokenEvent:
    """Where a return_progress request's prompt stands: as it starts, then after each step with its tokens."""
    return TokenEvent(seq.id, None, None, [], None, seq.n_prompt, seq.n_cached, progress=seq.n_computed)


class Sequence:
    """One request in flight: its tokens (prompt + generated), how many are in the
    KV cache, and the KV sequence id (slot) it owns while running."""

    def __init__(self, request: Request):
        self.request = request
        self.tokens: list[int] = list(request.prompt)
        self.n_prompt = len(request.prompt)
        self.n_computed = 0
        self.n_cached = 0
        self.n_generated = 0
        self.n_discarded = 0      # tokens a context shift dropped (server/engine/context_shift.py)
        self.slot = -1
        self.images = request.images
        # prompt positions a chunk must end at, to save the recurrent state there (Memory.state_points)
        self.state_points: tuple[int, ...] = ()
        self.pool = None      # server/pooling.Pool of an embedding request (the engine sets it)
        # speculative decoding (server/engine/speculative/speculator.py): this step's drafted tokens, and the counts
        self.draft: tuple[int, ...] = ()
        self.n_draft = 0
        self.n_draft_accepted = 0
        # recent verifications, older ones fading (speculative.draft_length): drafted tokens
        # accepted, and drafts that ended on a rejected token
        self.recent_accepted = 0.0
        self.recent_rejected = 0.0
        self.n_pos = 1 if request.positions is None else request.positions.shape[0]
        # generated tokens continue after the prompt's last position in every dimension
        # (as mtmd's n_past: a prompt ending on an image goes on at p0 + max(grid w, h)),
        # in all dims alike, as llama.cpp's text positions for M-RoPE: p, p, p, 0
        self._next_pos = self.n_prompt if request.positions is None else int(request.positions[:3].max()) + 1
        # penalties only ever see real tokens, never image placeholders
        self.sampler = SequenceSampler(request.params, [t for t in request.prompt if t >= 0])

    @property
    def id(self) -> str:
        return self.request.id

    # n_computed (how many of its tokens its slot's memory holds) changes only here
    def start_from(self, n_cached: int) -> None:
        """Its first n_cached tokens are in its slot already: a cached or shared prefix."""
        self.n_computed = self.n_cached = n_cached

    def advance(self, n: int) -> None:
        """A step computed n more of its tokens."""
        self.n_computed += n

    def forget(self, n: int) -> None:
        """Its last n computed rows left memory (the rejected rows of a draft)."""
        self.n_computed -= n

    def discard(self, start: int, n: int) -> None:
        """A context shift dropped n tokens from start, in memory and here."""
        del self.tokens[start:start + n]
        self.n_computed -= n
        self.n_discarded += n

    @property
    def n_pending(self) -> int:
        """Tokens not yet in the KV cache (the last sampled token while decoding)."""
        return len(self.tokens) - self.n_computed

    @property
    def prefilling(self) -> bool:
        return self.n_computed + self.n_discarded < self.n_prompt

    def positions(self, start: int, n: int) -> np.ndarray:
        """int32 [n_pos, n]: the positions of tokens start .. start + n."""
        if self.request.positions is None:
            return np.arange(start, start + n, dtype=np.int32)[None, :]
        out = np.empty((self.n_pos, n), dtype=np.int32)
        k = max(0, min(n, self.n_prompt - start))
        out[:, :k] = self.request.positions[:, start:start + k]
        gen = self._next_pos + np.arange(start + k - self.n_prompt, start + n - self.n_prompt, dtype=np.int32)
        out[:, k:] = gen
        if self.n_pos == 4:
            out[3, k:] = 0
        return out

    def span_at(self, index: int):
        """The image span containing token index `index`, or None."""
        for span in self.images:
            if span.start <= index < span.end:
                return span
        return None

    def fit_chunk(self, start: int, n: int) -> int:
        """Shorten a chunk [start, start+n) so it ends at the first state point inside
        it and does not cut a bidirectional image span (those rows must share a
        batch); may return 0."""
        n = next((p - start for p in self.state_points if start < p < start + n), n)
        end = start + n
        for span in self.images:
            if span.bidirectional and span.start < end < span.end:
                return max(0, span.start - start) if span.start >= start else n
        return n
