"""Slots, and the prompt prefixes their memory holds.

KV slots follow llama-server: `n_parallel` slots (KV sequences). A finished
sequence's cells stay in its slot: a later prompt with the same prefix (in that
slot, or copied from any other slot) skips recomputing it. A new prompt takes the
free slot whose memory it continues (llama-server's --slot-prompt-similarity: the
common prefix is more than that fraction of the prompt, and it keeps nearly all of
what the slot holds: CONTINUE_MIN); otherwise the least recently used free slot, empty ones
first, so users taking turns each keep their own conversation. What a slot loses
goes to the host-RAM cache (server/engine/memory/host_cache.py) when one is on, and comes back
from there when a prompt continues it. A prefix is shared only among requests of the
same cache salt (Request.cache_salt): a slot, a running sequence or a host-cache entry
of another salt gives nothing. This module owns which sequence runs in
which slot and what an idle slot holds (and its salt); it changes memory only through
server/engine/memory/model_memory.py and server/engine/memory/snapshot.py.
"""
from __future__ import annotations

import time

from ggserve.server.engine.memory import snapshot as memory_snapshot
from ggserve.server.engine.memory.host_cache import HostCache
from ggserve.server.engine.memory.model_memory import Memory
from ggserve.server.engine.memory.snapshot import Snapshot
from ggserve.server.engine.sequence import Sequence

SHARE_MIN_TOKENS = 32      # a prefix worth waiting for / copying from another sequence
# a prompt continues a slot's conversation when it keeps at least this part of what the
# slot holds (llama-server: 0.5, f_keep in get_available_slot; a shared system prompt is
# often half of a short conversation, and the user who arrives with it would take the
# slot of the one who wrote the rest); less, and the slot's memory goes to the host cache
CONTINUE_MIN = 0.9


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
    def __init__(self, n_slots: int, memory: Memory, similarity: float = 0.1, host: HostCache | None = None):
        self.n_slots = n_slots
        self.memory = memory
        self.similarity = similarity
        self.host = host if host is not None and host.limit else None
        self.running: dict[int, Sequence] = {}                 # busy slot -> its sequence
        self._idle_tokens: list[list[int]] = [[] for _ in range(n_slots)]   # what an idle slot holds
        self._idle_salt: list[str] = [""] * n_slots                          # and for which cache salt
        self._used_at = [0.0] * n_slots
        self.last: dict[int, Sequence] = {}                    # slot -> the last sequence that left it

    def slot_tokens(self, slot: int) -> list[int]:
        """The tokens whose memory a slot holds: its running sequence's computed
        tokens, or what the last sequence in it left behind."""
        seq = self.running.get(slot)
        return seq.tokens[: seq.n_computed] if seq is not None else self._idle_tokens[slot]

    def slot_salt(self, slot: int) -> str:
        """The cache salt of what a slot holds (its running sequence's, or its last one's)."""
        seq = self.running.get(slot)
        return seq.request.cache_salt if seq is not None else self._idle_salt[slot]

    def assign(self, seq: Sequence) -> None:
        """Give seq a free slot, reusing the longest cached prefix of its prompt: in
        the slot's memory, another slot's, or the host cache."""
        prompt = seq.tokens
        limit = len(prompt) - 1       # always compute the last prompt token: its logits start generation
        if seq.pool is not None:
            limit = 0                 # an embedding pools the hidden state of every row it computes
        # what each slot's memory can give: the prompt's prefix it holds, as far as memory can be cut
        # there; nothing from a slot of another cache salt
        salt = seq.request.cache_salt
        usable = [self.memory.reusable(s, _whole_images(seq, min(common_prefix(self.slot_tokens(s), prompt), limit)))
                  if self.slot_salt(s) == salt else 0 for s in range(self.n_slots)]
        free = [s for s in range(self.n_slots) if s not in self.running]
        slot = seq.request.id_slot if seq.request.id_slot in free else self._choose(free, usable, len(prompt))
        # a longer prefix in another slot (running or idle) is shared instead
        src = max(range(self.n_slots), key=lambda s: (usable[s], s == slot))
        reuse = usable[src]
        key, n_host = self.host.best(prompt, limit, lambda n: _whole_images(seq, n), salt) \
            if self.host is not None else (None, 0)
        snap = self.host.take(key) if n_host > reuse else None
        self._save(slot, reuse if snap is None and src == slot else 0)
        if snap is not None:
            self.memory.keep(slot, 0, 0)
            reuse = memory_snapshot.restore(self.memory, slot, snap, n_host)
            if reuse == 0:
                self.host.put(snap)
        elif src == slot:
            self.memory.keep(slot, reuse, _cut_position(seq, reuse))
        elif not (reuse > 0 and self.memory.take_prefix(src, slot, reuse, _cut_position(seq, reuse))):
            reuse = 0
            self.memory.keep(slot, 0, 0)
        seq.slot = slot
        seq.start_from(reuse)
        self.running[slot] = seq

    def _choose(self, free: list[int], usable: list[int], n_prompt: int) -> int:
        """The free slot whose conversation the prompt continues, else the least
        recently used one (empty slots first)."""
        def lru(s):
            return (bool(self._idle_tokens[s]), self._used_at[s], s)
        if self.similarity > 0:
            similar = [s for s in free if self._idle_tokens[s] and usable[s] > self.similarity * n_prompt]
            if similar:
                best = max(similar, key=lambda s: (usable[s], -self._used_at[s]))
                if usable[best] >= CONTINUE_MIN * len(self._idle_tokens[best]):
                    return best
        return min(free, key=lru)

    def _save(self, slot: int, kept: int) -> None:
        """slot is about to keep only its first `kept` tokens: what it holds goes to
        the host cache first unless the prompt continues it."""
        held = self._idle_tokens[slot]
        if self.host is None or not held or kept >= CONTINUE_MIN * len(held):
            return
        snap = memory_snapshot.capture(self.memory, slot, held)
        if snap is not None:
            snap.salt = self._idle_salt[slot]
            self.host.put(snap)

    def evict_idle(self) -> bool:
        """Free the least recently used idle slot that holds cells (saved to the host
        cache first when one is on): room for running sequences in a KV cache the
        slots share. False when no idle slot holds any."""
        idle = [s for s in range(self.n_slots) if s not in self.running and self._idle_tokens[s]]
        if not idle:
            return False
        slot = min(idle, key=lambda s: self._used_at[s])
        self._save(slot, 0)
        self.memory.free(slot)
        self._idle_tokens[slot], self._idle_salt[slot] = [], ""
        return True

    # -- one slot's memory as a snapshot (slot files) ------------------------------------

    def snapshot(self, slot: int) -> Snapshot | None:
        """What an idle slot holds, as bytes (None: it holds nothing, or the model's
        memory cannot be snapshotted)."""
        held = self._idle_tokens[slot]
        snap = memory_snapshot.capture(self.memory, slot, held) if held else None
        if snap is not None:
            snap.salt = self._idle_salt[slot]       # a slot file keeps it: restored, it serves that salt alone
        return snap

    def load(self, slot: int, snap: Snapshot) -> int:
        """An idle slot drops what it holds and gets snap's memory. -> tokens restored
        (0: no room)."""
        self.erase(slot)
        self.memory.keep(slot, 0, 0)
        n = memory_snapshot.restore(self.memory, slot, snap)
        self._idle_tokens[slot], self._idle_salt[slot] = list(snap.tokens[:n]), snap.salt
        self._used_at[slot] = time.monotonic()
        return n

    def erase(self, slot: int) -> int:
        """An idle slot forgets what it holds. -> how many tokens that was."""
        n = len(self._idle_tokens[slot])
        self.memory.free(slot)
        self._idle_tokens[slot], self._idle_salt[slot] = [], ""
        return n

    def share(self, running: list[Sequence]) -> frozenset:
        """Prompts that share a prefix with another running sequence which is ahead
        take its memory instead of computing it again: what it has computed is
        copied now; while it still computes more of the shared part, they wait
        (returned: their ids). Many requests arriving together with one long,
        uncached system prompt then compute it once instead of once each (if they
        have the same cache salt: a sequence never takes another salt's memory)."""
        if not self.memory.cuts_anywhere:
            # a recurrent state is only ever where its sequence is: sequences with a
            # common prefix each compute it (waiting would rarely find it at the point)
            return frozenset()
        running = [s for s in running if s.slot >= 0]
        rank = {id(s): (-s.n_computed, i) for i, s in enumerate(running)}   # lower: further ahead
        held = set()
        for b in running:
            if not b.prefilling or b.pool is not None:     # (an embedding computes every row)
                continue
            best, leader = 0, None
            for a in running:
                if a is not b and rank[id(a)] < rank[id(b)] and a.request.cache_salt == b.request.cache_salt:
                    n = min(common_prefix(a.tokens, b.tokens[:b.n_prompt]), b.n_prompt - 1)
                    if n > best:
                        best, leader = n, a
            if leader is None or best - b.n_computed < SHARE_MIN_TOKENS:
                continue
            ready = _whole_images(b, min(best, leader.n_computed))
            if ready - b.n_computed >= SHARE_MIN_TOKENS and \
                    self.memory.take_prefix(leader.slot, b.slot, ready, _cut_position(b, ready)):
                b.start_from(ready)
            if leader.n_computed < best:
                held.add(b.id)
        return frozenset(held)

    def release(self, seq: Sequence, keep: bool) -> None:
        """seq leaves its slot; with keep, its computed tokens stay for later prompts."""
        slot = seq.slot
        if keep:
            self._idle_tokens[slot], self._idle_salt[slot] = seq.tokens[: seq.n_computed], seq.request.cache_salt
        else:
            self.memory.free(slot)
            self._idle_tokens[slot], self._idle_salt[slot] = [], ""
        self._used_at[slot] = time.monotonic()
        self.last[slot] = seq
        del self.running[slot]
        seq.slot = -1

    def clear(self) -> None:
        self.memory.clear()
        self._idle_tokens = [[] for _ in range(self.n_slots)]
        self._idle_salt = [""] * self.n_slots
        if self.host is not None:
            self.host.clear()
