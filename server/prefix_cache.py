"""Slots, and the prompt prefixes their memory holds.

KV slots follow llama-server: `n_parallel` slots, each limited to
n_ctx // n_parallel tokens, so running sequences can never run out of cells. A
finished sequence's cells stay in its slot: a later prompt with the same prefix
(in that slot, or copied from any other slot) skips recomputing it. This module
owns which sequence runs in which slot and what an idle slot holds; it changes
memory only through server/memory.py.
"""
from __future__ import annotations

import time

from ggserve.server.memory import Memory
from ggserve.server.sequence import Sequence

SHARE_MIN_TOKENS = 32      # a prefix worth waiting for / copying from another sequence


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _whole_images(seq: Sequence, n: int) -> int:
    """n, or the start of the image n falls in when that image is taken whole or not
    at all: bidirectional spans, and any image of a model whose image rows share
    positions (M-RoPE: memory is cut by position)."""
    span = seq.span_at(n)
    return span.start if span is not None and (span.bidirectional or seq.n_pos > 1) else n


def _cut_position(seq: Sequence, n: int) -> int:
    """The position memory is cut at to keep seq's first n tokens (its n-th token's)."""
    return n if seq.n_pos == 1 else int(seq.positions(n, 1)[0, 0])


class PrefixCache:
    def __init__(self, n_slots: int, memory: Memory):
        self.n_slots = n_slots
        self.memory = memory
        self.running: dict[int, Sequence] = {}                 # busy slot -> its sequence
        self._idle_tokens: list[list[int]] = [[] for _ in range(n_slots)]   # what an idle slot holds
        self._used_at = [0.0] * n_slots

    def slot_tokens(self, slot: int) -> list[int]:
        """The tokens whose memory a slot holds: its running sequence's computed
        tokens, or what the last sequence in it left behind."""
        seq = self.running.get(slot)
        return seq.tokens[: seq.n_computed] if seq is not None else self._idle_tokens[slot]

    def assign(self, seq: Sequence) -> None:
        """Give seq a free slot, reusing the longest cached prefix of its prompt."""
        prompt = seq.tokens
        limit = len(prompt) - 1       # always compute the last prompt token: its logits start generation
        # what each slot's memory can give: the prompt's prefix it holds, as far as memory can be cut there
        usable = [self.memory.reusable(s, _whole_images(seq, min(common_prefix(self.slot_tokens(s), prompt), limit)))
                  for s in range(self.n_slots)]
        free = [s for s in range(self.n_slots) if s not in self.running]
        # the free slot whose own memory gives most; ties: least recently used
        slot = max(free, key=lambda s: (usable[s], -self._used_at[s]))
        # a longer prefix in another slot (running or idle) is shared instead
        src = max(range(self.n_slots), key=lambda s: (usable[s], s == slot))
        reuse = usable[src]
        if src == slot:
            self.memory.keep(slot, reuse, _cut_position(seq, reuse))
        elif not (reuse > 0 and self.memory.take_prefix(src, slot, reuse, _cut_position(seq, reuse))):
            reuse = 0
            self.memory.keep(slot, 0, 0)
        seq.slot = slot
        seq.n_computed = seq.n_cached = reuse
        self.running[slot] = seq

    def share(self, running: list[Sequence]) -> frozenset:
        """Prompts that share a prefix with another running sequence which is ahead
        take its memory instead of computing it again: what it has computed is
        copied now; while it still computes more of the shared part, they wait
        (returned: their ids). Many requests arriving together with one long,
        uncached system prompt then compute it once instead of once each."""
        if not self.memory.cuts_anywhere:
            # a recurrent state is only ever where its sequence is: sequences with a
            # common prefix each compute it (waiting would rarely find it at the point)
            return frozenset()
        running = [s for s in running if s.slot >= 0]
        rank = {id(s): (-s.n_computed, i) for i, s in enumerate(running)}   # lower: further ahead
        held = set()
        for b in running:
            if not b.prefilling:
                continue
            best, leader = 0, None
            for a in running:
                if a is not b and rank[id(a)] < rank[id(b)]:
                    n = min(common_prefix(a.tokens, b.tokens[:b.n_prompt]), b.n_prompt - 1)
                    if n > best:
                        best, leader = n, a
            if leader is None or best - b.n_computed < SHARE_MIN_TOKENS:
                continue
            ready = _whole_images(b, min(best, leader.n_computed))
            if ready - b.n_computed >= SHARE_MIN_TOKENS and \
                    self.memory.take_prefix(leader.slot, b.slot, ready, _cut_position(b, ready)):
                b.n_computed = b.n_cached = ready
            if leader.n_computed < best:
                held.add(b.id)
        return frozenset(held)

    def release(self, seq: Sequence, keep: bool) -> None:
        """seq leaves its slot; with keep, its computed tokens stay for later prompts."""
        slot = seq.slot
        if keep:
            self._idle_tokens[slot] = seq.tokens[: seq.n_computed]
        else:
            self.memory.free(slot)
            self._idle_tokens[slot] = []
        self._used_at[slot] = time.monotonic()
        del self.running[slot]
        seq.slot = -1

    def clear(self) -> None:
        self.memory.clear()
        self._idle_tokens = [[] for _ in range(self.n_slots)]
