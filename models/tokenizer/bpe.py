"""Byte-level BPE (GGUF `tokenizer.ggml.model = gpt2`).

Text is split into words by the pre-tokenizer, each word's UTF-8 bytes are
mapped to GPT-2's printable byte alphabet, and the native merge loop applies
`tokenizer.ggml.merges` by rank. Words repeat a lot in real text, so their ids
are cached.
"""
from __future__ import annotations

from ggserve.native.tokenizer_core import BPECore

from .pretokenize import PreTokenizer, drop
from .vocab import Vocab


def _byte_alphabet() -> list[str]:
    """GPT-2's bytes_to_unicode: byte -> printable character."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


BYTE_TO_CHAR = _byte_alphabet()
CHAR_TO_BYTE = {c: b for b, c in enumerate(BYTE_TO_CHAR)}
_ENCODE_TABLE = {b: c for b, c in enumerate(BYTE_TO_CHAR)}   # for str.translate on latin-1 text
_CACHE_LIMIT = 1 << 17


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


class BPE:
    def __init__(self, vocab: Vocab):
        self._pre = PreTokenizer(vocab.pre.regexes)
        self._spm_style = vocab.pre.spm_style
        byte_ids = None
        if self._spm_style:
            byte_ids = [vocab.token_to_id.get(f"<0x{b:02X}>", -1) for b in range(256)]
            self._vocab = vocab.token_to_id
        self._core = BPECore(list(vocab.tokens.iter_utf8()),
                             [_utf8(m) for m in vocab.merges],
                             vocab.pre.ignore_merges, byte_ids)
        self._cache: dict[str, list[int]] = {}

    def encode(self, text: str, out: list[int]) -> None:
        """Append the ids of one raw text fragment (no special tokens in it) to out."""
        cache = self._cache
        if len(cache) > _CACHE_LIMIT:
            cache.clear()
        if self._spm_style:
            self._encode_spm_style(text, out)
            return
        encode_word = self._core.encode_word
        words = self._pre.split(text)
        for word in words:
            ids = cache.get(word)
            if ids is None:
                raw = word.encode("utf-8", "replace").decode("latin-1").translate(_ENCODE_TABLE)
                ids = cache[word] = encode_word(raw.encode("utf-8"))
            out.extend(ids)
        drop(words)

    def _encode_spm_style(self, text: str, out: list[int]) -> None:
        """Gemma 4: spaces escaped to U+2581, merges over whole lines of raw UTF-8;
        a run of newlines that is a token is taken whole (llama.cpp PR 21343)."""
        cache = self._cache
        for word in self._pre.split(text.replace(" ", "\u2581")):
            ids = cache.get(word)
            if ids is None:
                whole = self._vocab.get(word) if word.strip("\n") == "" else None
                ids = [whole] if whole is not None else self._core.encode_word(_utf8(word))
                cache[word] = ids
            out.extend(ids)

    def piece(self, text: str) -> bytes:
        """Bytes of a normal token: undo the byte alphabet (llama_decode_text), or
        for SPM-style vocabularies unescape U+2581."""
        if self._spm_style:
            return _utf8(text.replace("\u2581", " "))
        out = bytearray()
        for ch in text:
            b = CHAR_TO_BYTE.get(ch)
            if b is not None:
                out.append(b)
            else:   # not a byte-alphabet character: llama.cpp writes a marker
                out += b"[UNK_BYTE_0x" + _utf8(ch).hex().encode() + _utf8(text) + b"]"
        return bytes(out)
