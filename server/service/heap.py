"""Heap pages the C allocator keeps after frees, given back to the system.

glibc returns freed memory to the system only from the top of a heap, and the model's
load (the tokenizer's tables, GGUF metadata, the Python objects of a request) leaves
freed pages below live ones in the engine thread's arena. `malloc_trim(0)` releases
every whole free page of every arena (bench/README.md, memory.py: 6-7 MiB of the
synthetic MoE's RSS). Called after the model loads and whenever the engine falls idle,
never during a step. Elsewhere than glibc (musl, macOS) it does nothing.
"""
from __future__ import annotations

import ctypes


def _malloc_trim():
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


_MALLOC_TRIM = _malloc_trim()


def give_back() -> bool:
    """Release the free pages of the C heap; whether any were released."""
    return bool(_MALLOC_TRIM(0)) if _MALLOC_TRIM is not None else False
