"""Who runs this step and how many tokens each: plain data, no tensors.

Like vLLM's v1 scheduler there are no prefill or decode phases: each sequence has
tokens computed and tokens pending, and a step hands out a token budget. Running
decodes go first (one token each) so streams never stall behind a long prompt;
prompt chunks fill what is left of the budget, oldest first. While streams are
decoding, the engine may cap the rows of a step (`max_rows`) so that a prompt
arriving mid-stream costs each stream a short pause per step instead of one long
one (on a CPU a full 512-token step takes seconds).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ggserve.server.sequence import Sequence


# smallest prompt chunk a capped step still takes: flash attention pads shorter
# pieces of a long prompt to 64 rows anyway (models.inputs / kv_cache)
MIN_PROMPT_ROWS = 64


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

    def schedule(self, max_rows: int | None = None, hold: set = frozenset()) -> list[Chunk]:
        """This step's chunks. max_rows: the most rows a step with decodes in it
        should have (prompt chunks get at least MIN_PROMPT_ROWS of them); hold: ids
        of prompts that wait this step (another sequence is computing their prefix)."""
        budget = self.n_batch
        chunks = []
        for s in self.running:
            if not s.prefilling and s.n_pending == 1 and budget > 0:
                chunks.append(Chunk(s, s.n_computed, 1, True))
                budget -= 1
        full = budget
        if chunks and max_rows is not None:
            budget = min(budget, max(MIN_PROMPT_ROWS, max_rows - len(chunks)))
        for s in self.running:
            if s.prefilling and budget > 0 and s.id not in hold:
                n = s.fit_chunk(s.n_computed, min(s.n_pending, budget))
                over_cap = False
                if n == 0 and budget < full:
                    # an image whose rows must share one batch goes whole, past the cap
                    span = s.span_at(s.n_computed)
                    if span is not None and span.end - s.n_computed <= full:
                        n, over_cap = span.end - s.n_computed, True
                if n == 0:
                    continue   # an image span that must share a batch waits for the next step
                chunks.append(Chunk(s, s.n_computed, n, s.n_computed + n == len(s.tokens)))
                budget = 0 if over_cap else budget - n
                full -= n
        return chunks

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)
