"""A token's id by its text, as a dict would give it, in 12 bytes a token.

A dict of a 151,936-token vocabulary costs 7.8 MiB (its table, and an int object for
every id above 256); the vocabulary's texts are already kept (`Vocab.tokens`). Here
the texts' hashes are sorted beside their ids and a lookup checks the text of each id
whose hash matches: 1.7 MiB (bench/README.md, memory.py).
"""
from __future__ import annotations

import numpy as np


class TokenIndex:
    def __init__(self, tokens: list[str]):
        hashes = np.fromiter((hash(t) for t in tokens), dtype=np.int64, count=len(tokens))
        order = np.argsort(hashes, kind="stable")       # equal hashes: the lower id first
        self._hashes = hashes[order]
        self._ids = order.astype(np.int32)
        self._tokens = tokens

    def get(self, text: str, default=None):
        """The lowest id whose text this is (a vocabulary may hold a text twice)."""
        h = hash(text)
        i = int(np.searchsorted(self._hashes, h))
        while i < len(self._hashes) and self._hashes[i] == h:
            tid = int(self._ids[i])
            if self._tokens[tid] == text:
                return tid
            i += 1
        return default

    def __getitem__(self, text: str) -> int:
        tid = self.get(text)
        if tid is None:
            raise KeyError(text)
        return tid

    def __contains__(self, text) -> bool:
        return isinstance(text, str) and self.get(text) is not None

    def __len__(self) -> int:
        return len(self._ids)
