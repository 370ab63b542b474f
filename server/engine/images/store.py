"""Image embeddings by content key, shared by every request and step.

An image tile is encoded once; later chunks and later requests take its rows
from here. Each embedding is a ggml Buffer on the device of the first text layer.
Least recently used first out when over the byte budget, except tiles a live
sequence still needs (pinned while the sequence is in the engine): their pixels
are dropped once the embedding is stored, so they could not be encoded again.
"""
from __future__ import annotations

import collections
import logging

from ggserve.native import ggml

log = logging.getLogger("ggserve.engine")


class ImageStore:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._items: collections.OrderedDict[str, ggml.Buffer] = collections.OrderedDict()
        self._pins: collections.Counter[str] = collections.Counter()
        self.nbytes = 0
        self.hits = 0
        self.misses = 0
        self.encoded = 0

    def __contains__(self, key) -> bool:
        return key in self._items

    def get(self, key) -> ggml.Buffer | None:
        emb = self._items.get(key)
        if emb is not None:
            self._items.move_to_end(key)
        return emb

    def put(self, key, emb: ggml.Buffer) -> None:
        self.encoded += 1
        old = self._items.pop(key, None)
        if old is not None:
            self.nbytes -= old.nbytes
        self._items[key] = emb
        self.nbytes += emb.nbytes
        self._evict()

    def clear(self) -> None:
        """Drop every embedding no live sequence needs (tests; counts are kept)."""
        for key in [k for k in self._items if self._pins[k] <= 0]:
            self.nbytes -= self._items.pop(key).nbytes

    def close(self) -> None:
        """Free every embedding now (its memory may be on a device that goes away,
        an RPC worker), not whenever the garbage collector gets to it."""
        for emb in self._items.values():
            emb.close()
        self._items.clear()
        self.nbytes = 0

    def pin(self, spans) -> None:
        """A sequence holding these spans entered the engine."""
        self._pins.update(s.key for s in spans)

    def unpin(self, spans) -> None:
        self._pins.subtract(s.key for s in spans)
        self._pins += collections.Counter()      # drop zero counts
        self._evict()

    def reach(self, span) -> None:
        """A chunk reached this stored tile: a hit, counted once per request (not
        when it was encoded for that request); its pixels are no longer needed."""
        if not span.counted:
            span.counted = True
            self.hits += 1
        span.tile = None

    def miss(self, span) -> None:
        """This request's tile must be encoded: a miss, counted once."""
        if not span.counted:
            span.counted = True
            self.misses += 1

    def _evict(self) -> None:
        for key in list(self._items):
            if self.nbytes <= self.max_bytes or len(self._items) <= 1:
                break
            if self._pins[key] > 0:
                continue
            self.nbytes -= self._items.pop(key).nbytes
