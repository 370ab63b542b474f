"""Cython bindings over ggml (the only code that touches C).

The extensions link libggml from the installed libggml-python package. Loading
those libraries here first, by absolute path, makes the extensions work however
they were built (editable, isolated build env, wheel) without LD_LIBRARY_PATH.
"""
import ctypes
import os


def _preload_libggml() -> None:
    try:
        import libggml
    except ImportError:  # a system ggml found through the rpath instead
        return
    root = os.path.dirname(libggml.__file__)
    for sub in ("lib64", "lib"):
        libdir = os.path.join(root, sub)
        if os.path.isdir(libdir):
            break
    else:
        return
    for name in ("libggml-base.so", "libggml-cpu.so", "libggml.so"):
        path = os.path.join(libdir, name)
        if os.path.exists(path):
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


_preload_libggml()
