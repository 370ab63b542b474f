"""A vocabulary's token texts in one UTF-8 buffer: a sequence of str by id.

As a list of str, the 151,936 texts of Qwen's vocabulary cost 12.9 MiB (an object of
~80 bytes per text, most texts a few characters); here their bytes sit end to end
with an int32 end offset per id: 1.6 MiB (bench/README.md, memory.py). A text is
decoded when it is read; the hot readers keep what they derive from it (the
tokenizer's pieces, the native BPE/SPM tables).
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np


def _utf8(text: str) -> bytes:
    # GGUF texts are bytes in principle: surrogateescape keeps every byte (native/gguf_file.pyx)
    return text.encode("utf-8", "surrogateescape")


class TokenTexts(Sequence):
    def __init__(self, texts: Iterable[str]):
        encoded = [_utf8(t) for t in texts]
        self._blob = b"".join(encoded)
        self._ends = np.cumsum(np.fromiter(map(len, encoded), np.int64, len(encoded)), dtype=np.int64)
        if len(self._blob) < 2**31:
            self._ends = self._ends.astype(np.int32)

    def __len__(self) -> int:
        return len(self._ends)

    def utf8(self, token_id: int) -> bytes:
        """The text's bytes, as GGUF stores them."""
        if token_id < 0:
            token_id += len(self._ends)
        if not 0 <= token_id < len(self._ends):
            raise IndexError(f"token id {token_id} out of range")
        start = int(self._ends[token_id - 1]) if token_id else 0
        return self._blob[start:int(self._ends[token_id])]

    def __getitem__(self, token_id):
        if isinstance(token_id, slice):
            return [self[i] for i in range(*token_id.indices(len(self)))]
        return self.utf8(token_id).decode("utf-8", "surrogateescape")

    def __iter__(self) -> Iterator[str]:
        blob, start = self._blob, 0
        for end in self._ends.tolist():
            yield blob[start:end].decode("utf-8", "surrogateescape")
            start = end

    def iter_utf8(self) -> Iterator[bytes]:
        blob, start = self._blob, 0
        for end in self._ends.tolist():
            yield blob[start:end]
            start = end

    @property
    def nbytes(self) -> int:
        return len(self._blob) + self._ends.nbytes
