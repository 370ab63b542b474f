"""SentencePiece-style BPE by score (GGUF `tokenizer.ggml.model = llama`).

Spaces become U+2581, the native loop merges the adjacent pair whose merged text
is the token with the highest score, and characters that no token covers fall
back to `<0xXX>` byte tokens.
"""
from __future__ import annotations

from ggserve.native.tokenizer_core import SPMCore

from .vocab import Attr, Vocab

SPACE = "\u2581"


class SPM:
    def __init__(self, vocab: Vocab):
        byte_ids = []
        for b in range(256):
            i = vocab.token_to_id.get(f"<0x{b:02X}>")
            if i is None:   # llama.cpp falls back to the byte itself as a token
                i = vocab.token_to_id.get(bytes([b]).decode("utf-8", "surrogateescape"), -1)
            byte_ids.append(i)
        self._core = SPMCore(list(vocab.tokens.iter_utf8()),
                             vocab.scores, byte_ids)

    def encode(self, text: str, out: list[int]) -> None:
        """Append the ids of one raw text fragment (already space-prefixed if wanted)."""
        out.extend(self._core.encode(text.replace(" ", SPACE).encode("utf-8", "replace")))

    @staticmethod
    def piece(text: str) -> bytes:
        return text.replace(SPACE, " ").encode("utf-8", "surrogateescape")


def byte_value(text: str) -> int:
    """<0xAB> -> 0xAB (llama.cpp token_to_byte)."""
    return int(text[3:5], 16)


__all__ = ["SPM", "SPACE", "byte_value", "Attr"]
