"""Incremental detokenization for streaming: whole UTF-8 characters only."""
from __future__ import annotations

import codecs


class StreamDecoder:
    """Feed generated ids one at a time; get back the text they complete.

    A token may end in the middle of a multi-byte character (byte-level BPE and
    byte-fallback tokens split emoji and CJK); those bytes are held back until
    the character is complete, so every returned string is valid text and the
    concatenation of all pushes plus flush() equals decoding the whole sequence.
    Control tokens give nothing unless show_special is true (as llama-server's
    token_to_piece with special=false). Bytes that can never form a character
    come out as U+FFFD.
    """

    def __init__(self, tokenizer, show_special: bool = False):
        self._tokenizer = tokenizer
        self._show_special = show_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._utf8.decode(self._tokenizer.token_bytes(token_id, special=self._show_special))

    def flush(self) -> str:
        """Whatever is held back, at the end of the stream (incomplete bytes -> U+FFFD)."""
        return self._utf8.decode(b"", final=True)

    @property
    def pending(self) -> bool:
        """True while bytes of an unfinished character are held back."""
        return bool(self._utf8.getstate()[0])
