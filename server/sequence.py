"""Requests as the engine sees them, and the state of a sequence being generated."""
from __future__ import annotations

from dataclasses import dataclass, field

from ggserve.server.sampling import SamplingParams, SequenceSampler


@dataclass
class Request:
    id: str
    prompt: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = 256
    ignore_eos: bool = False


@dataclass
class TokenEvent:
    request_id: str
    token: int | None
    logprob: float | None
    top_logprobs: list[tuple[int, float]]
    finish_reason: str | None
    n_prompt: int
    n_cached: int


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
        self.slot = -1
        self.sampler = SequenceSampler(request.params, request.prompt)

    @property
    def id(self) -> str:
        return self.request.id

    @property
    def n_pending(self) -> int:
        """Tokens not yet in the KV cache (the last sampled token while decoding)."""
        return len(self.tokens) - self.n_computed

    @property
    def prefilling(self) -> bool:
        return self.n_computed < self.n_prompt
