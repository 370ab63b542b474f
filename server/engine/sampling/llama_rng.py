"""llama.cpp's sampling RNG: its dist sampler draws `std::uniform_real_distribution<double>(0, 1)`
from `std::mt19937(seed)` once per token; with the same seed and logits a sampled answer
repeats llama-server's (libstdc++'s generate_canonical: two 32-bit draws, low word first)."""
from __future__ import annotations

import secrets

import numpy as np

_TWO_32 = 4294967296.0
_BELOW_ONE = np.nextafter(1.0, 0.0)


class LlamaRng:
    def __init__(self, seed: int | None):
        # RandomState seeds MT19937 with init_genrand(seed), std::mt19937's own seeding
        seed = secrets.randbits(32) if seed is None else seed & 0xFFFFFFFF
        key, pos = np.random.RandomState(seed).get_state()[1:3]
        self._mt = np.random.MT19937()
        self._mt.state = {"bit_generator": "MT19937", "state": {"key": key, "pos": pos}}

    def random(self) -> float:
        lo, hi = self._mt.random_raw(2)
        u = (float(lo) + float(hi) * _TWO_32) / (_TWO_32 * _TWO_32)
        return u if u < 1.0 else float(_BELOW_ONE)
