"""Heap pages the C allocator keeps after frees, given back to the system.

glibc returns freed memory to the system only from the top of a heap, and the model's
load (the tokenizer's tables, GGUF metadata, the Python objects of a request) leaves
freed pages below live ones in the engine thread's arena. `malloc_trim(0)` releases
every whole free page of every arena (bench/README.md, memory.py: 6-7 MiB of the
synthetic MoE's RSS). Called after the model loads and whenever the engine falls idle,
never during a step. Elsewhere than glibc (musl, macOS) it does nothing. The Python
objects that live as long as the server are frozen out of the cyclic collector.
"""
from __future__ import annotations

import ctypes
import gc


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


def after_load() -> None:
    """Once the model is loaded: the C heap's free pages back, and every Python object
    that exists now (modules, the tokenizer's, the model's) moved out of the cyclic
    collector's reach (gc.freeze). They live as long as the server, and a full
    collection that walked them took ~30 ms (the 1B-shaped model): a pause in the
    middle of a stream, once every few hundred steps."""
    gc.collect()
    gc.freeze()
    give_back()


def close_engine(engine) -> None:
    """Free an engine (sleep): its frozen objects back in the collector's reach first,
    so that cycles among them are collected, then the freed pages back to the system."""
    engine.close()
    gc.unfreeze()
    gc.collect()
    give_back()
