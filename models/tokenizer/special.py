"""Split text around special tokens before the tokenizer proper sees it.

llama.cpp (tokenizer_st_partition) takes the special tokens longest first and
cuts every remaining text fragment at each leftmost occurrence. Control and
unknown tokens are only matched when parsing special tokens; user-defined ones
always are. We do exactly that, but only for the tokens that occur in the text:
a trie-shaped regex finds them in one pass, so a 262k vocabulary with thousands
of special tokens costs one scan, not one scan per token.
"""
from __future__ import annotations

import re
from bisect import bisect_right

from .vocab import Attr, Vocab

_C_SPACE = " \t\n\v\f\r"   # C isspace(), used by the lstrip/rstrip attributes


def _trie_regex(words: list[str]) -> re.Pattern | None:
    trie: dict = {}
    for w in words:
        node = trie
        for ch in w:
            node = node.setdefault(ch, {})
        node[""] = True

    def build(node: dict) -> str:
        alts = [re.escape(ch) + build(child) for ch, child in sorted(node.items()) if ch]
        if not alts:
            return ""
        body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
        if "" in node:   # a token ends here: longer continuations first, then stop
            return "(?:" + body + ")?"
        return body

    if not words:
        return None
    # at every position, the longest special token starting there
    return re.compile("(?=(" + build(trie) + "))", re.DOTALL)


_WINDOW = 1 << 20


class SpecialSplitter:
    """text -> list of str fragments and int special token ids, in order."""

    def __init__(self, vocab: Vocab):
        self._vocab = vocab
        self._rank = {tid: r for r, tid in enumerate(vocab.special_ids)}
        self._text_to_id = {vocab.tokens[i]: i for i in reversed(vocab.special_ids)}
        self._user_only = [i for i in vocab.special_ids
                           if not vocab.attrs[i] & (Attr.CONTROL | Attr.UNKNOWN)]
        self._patterns: dict[bool, re.Pattern | None] = {}

    def _pattern(self, parse_special: bool) -> re.Pattern | None:
        if parse_special not in self._patterns:
            ids = self._vocab.special_ids if parse_special else self._user_only
            self._patterns[parse_special] = _trie_regex([self._vocab.tokens[i] for i in ids])
        return self._patterns[parse_special]

    def _present(self, text: str, parse_special: bool) -> list[int]:
        """Special ids that occur in text, in llama.cpp's processing order."""
        pattern = self._pattern(parse_special)
        if pattern is None:
            return []
        # scanned a window at a time (one scan of a 10 MB text holds the GIL for half a
        # second); windows overlap by the longest token, so a match cut short at a window's
        # end (a prefix of the whole one, found again in the next window) adds nothing
        overlap = max(map(len, self._text_to_id))
        longest = set()
        for pos in range(0, len(text), _WINDOW):
            longest.update(m.group(1) for m in pattern.finditer(text, pos, pos + _WINDOW + overlap))
        found = set()
        for s in longest:   # any token occurring at a position is a prefix of the longest there
            for k in range(1, len(s) + 1):
                tid = self._text_to_id.get(s[:k])
                if tid is not None and (parse_special or not
                                        self._vocab.attrs[tid] & (Attr.CONTROL | Attr.UNKNOWN)):
                    found.add(tid)
        return sorted(found, key=self._rank.__getitem__)

    def split(self, text: str, parse_special: bool) -> list[str | int]:
        if not text:
            return []
        present = self._present(text, parse_special)
        if not present:
            return [text]
        tokens, attrs = self._vocab.tokens, self._vocab.attrs
        claimed: list[tuple[int, int, int]] = []   # (start, end, id) incl. stripped spaces
        starts: list[int] = []
        for tid in present:
            tok = tokens[tid]
            new = []
            pos = 0
            while True:
                s = text.find(tok, pos)
                if s < 0:
                    break
                e = s + len(tok)
                k = bisect_right(starts, s)
                lo = claimed[k - 1][1] if k else 0
                hi = claimed[k][0] if k < len(claimed) else len(text)
                if s < lo:    # inside an earlier (longer) token: resume after it
                    pos = lo
                    continue
                if e > hi:    # runs into the next one: no room left in this gap
                    pos = claimed[k][1]
                    continue
                # the gap may already hold matches of this same token: search only after them
                if new and new[-1][1] > lo and new[-1][0] >= lo:
                    lo = new[-1][1]
                if attrs[tid] & Attr.LSTRIP:
                    while s > lo and text[s - 1] in _C_SPACE:
                        s -= 1
                if attrs[tid] & Attr.RSTRIP:
                    while e < hi and text[e] in _C_SPACE:
                        e += 1
                new.append((s, e, tid))
                pos = e
            if new:
                claimed = sorted(claimed + new)
                starts = [c[0] for c in claimed]
        out: list[str | int] = []
        prev = 0
        for s, e, tid in claimed:
            if s > prev:
                out.append(text[prev:s])
            out.append(tid)
            prev = e
        if prev < len(text):
            out.append(text[prev:])
        return out
