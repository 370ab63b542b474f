"""The host-RAM prompt cache (`--cache-ram MiB`, as llama-server's): prefixes that
leave the KV cache wait here as snapshots (server/engine/memory/snapshot.py), bounded in
bytes, least recently used first out, and go back into a slot instead of being
computed again.

Entries are keyed by their cache salt and tokens; an image is part of them as its
placeholder ids, which come from the image's content hash, so the same image in a
later prompt matches. A prompt matches only entries of its own salt (Snapshot.salt,
Request.cache_salt): requests of different salts never see each other's prefixes.
As llama-server's cache: a prefix another entry of the salt already holds is not
stored twice, entries the new one extends are dropped, and an entry taken back
into a slot leaves the cache (the slot holds it now).
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from ggserve.server.engine.memory.snapshot import Snapshot


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


class HostCache:
    def __init__(self, limit_bytes: int):
        self.limit = max(0, limit_bytes)
        self._entries: OrderedDict[int, tuple[np.ndarray, Snapshot]] = OrderedDict()   # oldest first
        self._next = 0
        self.nbytes = 0
        self.stored = self.restored = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, snap: Snapshot) -> bool:
        """Keep snap (False: it is larger than the whole cache, or already held)."""
        if snap.nbytes > self.limit or not snap.n:
            return False
        tokens = np.asarray(snap.tokens, dtype=np.int64)
        for key, (held, other) in list(self._entries.items()):
            if other.salt != snap.salt:
                continue
            n = common_prefix(held, tokens)
            if n == len(tokens):            # already here (as itself or the start of a longer one)
                self._entries.move_to_end(key)
                return False
            if n == len(held):              # the new entry extends this one
                self._drop(key)
        while self._entries and self.nbytes + snap.nbytes > self.limit:
            self._drop(next(iter(self._entries)))
        self._entries[self._next] = (tokens, snap)
        self._next += 1
        self.nbytes += snap.nbytes
        self.stored += 1
        return True

    def best(self, prompt, limit: int, fit=lambda n: n, salt: str = "") -> tuple[int | None, int]:
        """(key, n): the entry of this salt that gives the longest prefix of prompt, n of
        its tokens (at most limit, cut by fit(n) and where the entry has memory for:
        Snapshot.reusable); (None, 0) when none gives any. Ties: the most recent."""
        if not self._entries:
            return None, 0
        tokens = np.asarray(prompt, dtype=np.int64)
        best, best_n = None, 0
        for key, (held, snap) in self._entries.items():
            if snap.salt != salt:
                continue
            n = snap.reusable(fit(min(common_prefix(held, tokens), limit)))
            if n >= best_n and n > 0:
                best, best_n = key, n
        return best, best_n

    def take(self, key: int) -> Snapshot:
        """Remove and return an entry (it goes back into a slot)."""
        snap = self._entries[key][1]
        self._drop(key)
        self.restored += 1
        return snap

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0

    def _drop(self, key: int) -> None:
        _, snap = self._entries.pop(key)
        self.nbytes -= snap.nbytes
