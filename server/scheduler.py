"""Who runs this step and how many tokens each: plain data, no tensors.

Like vLLM's v1 scheduler there are no prefill or decode phases: each sequence has
tokens computed and tokens pending, and a step hands out a token budget. Running
decodes go first (one token each) so streams never stall behind a long prompt;
prompt chunks fill what is left of the budget, oldest first.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ggserve.server.sequence import Sequence


@dataclass
class Chunk:
    seq: Sequence
    start: int          # index into seq.tokens (== its position)
    n: int
    wants_logits: bool  # the chunk reaches the end of the known tokens


class Scheduler:
    def __init__(self, n_slots: int, n_batch: int):
        self.n_slots = n_slots
        self.n_batch = n_batch
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def remove(self, seq_id: str) -> Sequence | None:
        for s in self.running:
            if s.id == seq_id:
                self.running.remove(s)
                return s
        for s in self.waiting:
            if s.id == seq_id:
                self.waiting.remove(s)
                return s
        return None

    def admit(self) -> list[Sequence]:
        """Move waiting sequences to running while slots are free (FIFO)."""
        admitted = []
        while self.waiting and len(self.running) < self.n_slots:
            seq = self.waiting.popleft()
            self.running.append(seq)
            admitted.append(seq)
        return admitted

    def schedule(self) -> list[Chunk]:
        budget = self.n_batch
        chunks = []
        for s in self.running:
            if not s.prefilling and s.n_pending == 1 and budget > 0:
                chunks.append(Chunk(s, s.n_computed, 1, True))
                budget -= 1
        for s in self.running:
            if s.prefilling and budget > 0:
                n = s.fit_chunk(s.n_computed, min(s.n_pending, budget))
                if n == 0:
                    continue   # an image span that must share a batch waits for the next step
                chunks.append(Chunk(s, s.n_computed, n, s.n_computed + n == len(s.tokens)))
                budget -= n
        return chunks

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)
