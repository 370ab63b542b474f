"""llama.cpp's sampling RNG: its dist sampler draws `std::uniform_real_distribution<double>(0, 1)`
from `std::mt19937(seed)` once per token; with the same seed and logits a sampled answer
repeats llama-server's (libstdc++'s generate_canonical: two 32-bit draws, low word first).

The generator is std::mt19937 written out (C++ [rand.eng.mers]) rather than numpy.random's
MT19937: importing numpy.random costs a served process 3-7 MiB (bench/README.md, memory.py)."""
from __future__ import annotations

import secrets

import numpy as np

_TWO_32 = 4294967296.0
_BELOW_ONE = np.nextafter(1.0, 0.0)
_N, _M = 624, 397
_MATRIX_A, _UPPER, _LOWER = np.uint32(0x9908B0DF), np.uint32(0x80000000), np.uint32(0x7FFFFFFF)


class MT19937:
    """std::mt19937: seeded as its constructor seeds it, 32-bit outputs in its order."""

    def __init__(self, seed: int):
        mt = [seed & 0xFFFFFFFF]
        for i in range(1, _N):
            mt.append((1812433253 * (mt[-1] ^ (mt[-1] >> 30)) + i) & 0xFFFFFFFF)
        self._mt = np.array(mt, np.uint32)
        self._out: list[int] = []

    def _twist(self) -> None:
        # mt[k] takes mt[k + 1] and mt[(k + 397) % 624]: in blocks whose inputs are all
        # old values (k < 227) or already new ones (k - 227 in an earlier block)
        mt = self._mt
        for lo, hi in ((0, 227), (227, 454), (454, 623), (623, 624)):
            nxt = mt[lo + 1:hi + 1] if hi < _N else mt[:1]
            y = (mt[lo:hi] & _UPPER) | (nxt & _LOWER)
            far = np.take(mt, np.arange(lo + _M, hi + _M) % _N)
            mt[lo:hi] = far ^ (y >> np.uint32(1)) ^ np.where(y & np.uint32(1), _MATRIX_A, np.uint32(0))
        y = mt.copy()
        y ^= y >> np.uint32(11)
        y ^= (y << np.uint32(7)) & np.uint32(0x9D2C5680)
        y ^= (y << np.uint32(15)) & np.uint32(0xEFC60000)
        y ^= y >> np.uint32(18)
        self._out = y.tolist()[::-1]        # popped from the end

    def next32(self) -> int:
        if not self._out:
            self._twist()
        return self._out.pop()


class LlamaRng:
    def __init__(self, seed: int | None):
        self._seed = secrets.randbits(32) if seed is None else seed & 0xFFFFFFFF
        self._mt: MT19937 | None = None      # seeded at the first draw: a greedy request never draws

    def random(self) -> float:
        if self._mt is None:
            self._mt = MT19937(self._seed)
        lo, hi = self._mt.next32(), self._mt.next32()
        u = (float(lo) + float(hi) * _TWO_32) / (_TWO_32 * _TWO_32)
        return u if u < 1.0 else float(_BELOW_ONE)
