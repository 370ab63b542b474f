"""Tokenizer built from GGUF metadata, token for token what llama.cpp does."""
from __future__ import annotations

from .bpe import BPE
from .special import SpecialSplitter
from .spm import SPM, byte_value
from .vocab import HIDDEN_ATTRS, Attr, Vocab

_USER_DEFINED, _NORMAL, _BYTE = int(Attr.USER_DEFINED), int(Attr.NORMAL), int(Attr.BYTE)


class Tokenizer:
    """encode/decode with llama_tokenize / llama_detokenize semantics.

    Two families, picked by `tokenizer.ggml.model`: "gpt2" (byte-level BPE with a
    pre-tokenizer chosen by `tokenizer.ggml.pre`) and "llama" (SentencePiece-style
    with scores and byte fallback).
    """

    def __init__(self, vocab: Vocab):
        self.vocab = vocab
        self._impl = SPM(vocab) if vocab.model == "spm" else BPE(vocab)
        self._specials = SpecialSplitter(vocab)
        self._pieces: list[bytes | None] = [None] * len(vocab.tokens)

    @classmethod
    def from_metadata(cls, meta: dict) -> "Tokenizer":
        return cls(Vocab(meta))

    @classmethod
    def from_gguf(cls, path: str) -> "Tokenizer":
        from ggserve.native.gguf_file import GGUFFile

        return cls.from_metadata(GGUFFile(path).metadata)

    # -- properties --

    @property
    def n_vocab(self) -> int:
        return len(self.vocab.tokens)

    @property
    def bos_id(self) -> int:
        return self.vocab.bos

    @property
    def eos_id(self) -> int:
        return self.vocab.eos

    @property
    def eog_ids(self) -> frozenset[int]:
        return self.vocab.eog

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.vocab.eog

    def is_special(self, token_id: int) -> bool:
        """Control or unknown tokens: hidden from decoded text unless asked for."""
        return bool(self.vocab.attrs[token_id] & HIDDEN_ATTRS)

    def token_to_id(self, text: str) -> int | None:
        return self.vocab.token_to_id.get(text)

    def id_to_token(self, token_id: int) -> str:
        """The raw vocabulary entry (GPT-2 byte alphabet / U+2581 spaces included)."""
        return self.vocab.tokens[token_id]

    # -- encoding --

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """llama_tokenize: add_special adds BOS/EOS as the GGUF's add_bos/add_eos say;
        parse_special lets control tokens in the text become their ids."""
        v = self.vocab
        out: list[int] = []
        if add_special and v.add_bos:
            out.append(v.bos)
        prev_special = True   # SPM: prefix a space at the start and after a special token
        for frag in self._specials.split(text, parse_special):
            if isinstance(frag, int):
                out.append(frag)
                prev_special = True
            else:
                if v.model == "spm" and v.add_space_prefix and prev_special:
                    frag = " " + frag
                self._impl.encode(frag, out)
                prev_special = False
        if add_special and v.add_eos:
            out.append(v.eos)
        return out

    # -- decoding --

    def token_bytes(self, token_id: int, special: bool = True) -> bytes:
        """llama_token_to_piece: the bytes this token stands for. Control and unknown
        tokens give their text when special is true, nothing otherwise."""
        attr = self.vocab.attrs[token_id]
        if not special and attr & HIDDEN_ATTRS:
            return b""
        piece = self._pieces[token_id]
        if piece is None:
            piece = self._pieces[token_id] = self._piece(token_id, attr)
        return piece

    def _piece(self, token_id: int, attr: int) -> bytes:
        text = self.vocab.tokens[token_id]
        if attr & (HIDDEN_ATTRS | _USER_DEFINED):
            return text.encode("utf-8", "surrogateescape")
        if attr & _NORMAL:
            return self._impl.piece(text)
        if attr & _BYTE:
            return bytes([byte_value(text)])
        return b""   # unused / undefined tokens render as nothing

    def decode_bytes(self, ids, skip_special: bool = False) -> bytes:
        """llama_detokenize(remove_special=skip_special, unparse_special=not skip_special)."""
        v = self.vocab
        ids = list(ids)
        strip_space = v.add_space_prefix
        if skip_special and v.add_bos and ids and ids[0] == v.bos:
            strip_space = False
            ids = ids[1:]
        if skip_special and v.add_eos and ids and ids[-1] == v.eos:
            ids = ids[:-1]
        parts = []
        for i in ids:
            piece = self.token_bytes(i, special=not skip_special)
            if strip_space and piece.startswith(b" "):
                piece = piece[1:]
            strip_space = False
            parts.append(piece)
        out = b"".join(parts)
        return _clean_spaces(out) if v.clean_spaces else out

    def decode(self, ids, skip_special: bool = False) -> str:
        return self.decode_bytes(ids, skip_special).decode("utf-8", "replace")


def _clean_spaces(data: bytes) -> bytes:
    """llama.cpp's detokenize clean-up, three in-place passes over the bytes:
    drop the space in " ?", " !", " .", " ,"; in " ' " drop both spaces; and in
    " 's", " 'm", " 're", " 've" drop the space."""
    t = bytearray(data)
    n = len(t)
    total = 1 if n else 0
    for i in range(1, n):
        x = t[i]
        if t[i - 1] == 0x20 and x in b"?!.,":
            total -= 1
        t[total] = x
        total += 1
    n, total, i = total, 1 if total else 0, 1
    while i < n:
        x = t[i]
        if x == 0x27 and i + 1 < n and t[i - 1] == 0x20 and t[i + 1] == 0x20:
            total -= 1
            i += 1
            t[i] = 0
        t[total] = x
        total += 1
        i += 1
    n, total = total, 1 if total else 0
    for i in range(1, n):
        x = t[i]
        if t[i - 1] == 0x20 and x == 0x27 and i + 1 < n:
            x1 = t[i + 1]
            if x1 in b"sm":
                total -= 1
            elif x1 not in b"td" and i + 2 < n and (x1, t[i + 2]) in ((0x72, 0x65), (0x76, 0x65)):
                total -= 1
        t[total] = x
        total += 1
    return bytes(t[:total])
