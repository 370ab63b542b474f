"""Host-side float32 math as llama.cpp's C++ computes it.

Inputs that llama.cpp fills on the host (rope frequencies, sinusoidal bases) come
from the C library's float functions; numpy's float32 `power` rounds differently in
the last bit for some arguments, and a model amplifies that. These call libm's own
(ggml links the same library), falling back to double precision rounded to float32,
which differs from powf in rare last-bit cases.
"""
from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np


def _libm():
    name = ctypes.util.find_library("m")
    if name is None:
        return None
    lib = ctypes.CDLL(name)
    lib.powf.restype, lib.powf.argtypes = ctypes.c_float, [ctypes.c_float, ctypes.c_float]
    return lib


_LIBM = _libm()


def powf(base: float, exponents) -> np.ndarray:
    """float32 base ** exponents, element by element, as C's powf."""
    e = np.asarray(exponents, dtype=np.float32)
    if _LIBM is None:
        return np.power(np.float64(np.float32(base)), e.astype(np.float64)).astype(np.float32)
    return np.array([_LIBM.powf(base, float(x)) for x in e.ravel()], dtype=np.float32).reshape(e.shape)
