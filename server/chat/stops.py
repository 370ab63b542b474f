"""Stop strings matched on generated text as it streams.

Text arrives in pieces (one detokenized token at a time) and a stop string may
straddle pieces. The matcher releases only text that can no longer be the start
of a stop string, so a stop string is never leaked, even partly, into a stream.
"""
from __future__ import annotations


class StopMatcher:
    """Feed text with `push`; it returns the text safe to emit.

    After a stop string is found, `stopped` is True, `push` returns the text
    before the stop string, and everything after it is dropped. At the end of a
    generation that did not stop, `flush` returns the text held back.
    """

    def __init__(self, stops: list[str] | None):
        self.stops = [s for s in (stops or []) if s]
        self.stopped = False
        self.matched: str | None = None
        self._held = ""
        self._longest = max((len(s) for s in self.stops), default=0)

    def push(self, text: str) -> str:
        if self.stopped:
            return ""
        if not self.stops:
            return text
        buf = self._held + text
        hit = None
        for stop in self.stops:
            i = buf.find(stop)
            if i >= 0 and (hit is None or i < hit[0]):
                hit = (i, stop)
        if hit is not None:
            self.stopped = True
            self.matched = hit[1]
            self._held = ""
            return buf[: hit[0]]
        keep = self._partial_suffix(buf)
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        held, self._held = self._held, ""
        return "" if self.stopped else held

    @property
    def held(self) -> int:
        """Characters held back because they may begin a stop string."""
        return len(self._held)

    def _partial_suffix(self, buf: str) -> int:
        """Length of the longest suffix of `buf` that is a proper prefix of a stop."""
        for n in range(min(len(buf), self._longest - 1), 0, -1):
            tail = buf[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0
