"""Cython bindings over ggml (the only code that touches C).

The extensions link libggml by rpath. Loading the same libraries here first, by
absolute path, makes them work however the package was built (editable,
isolated build environment, wheel) without LD_LIBRARY_PATH: the folder recorded
at build time when it still exists, else the installed libggml-python package.
"""
import ctypes
import os


def _libggml_dir() -> str | None:
    try:
        from ._linked import LIBDIR
        if os.path.isdir(LIBDIR):
            return LIBDIR
    except ImportError:
        pass
    try:
        import libggml
    except ImportError:  # a system ggml found through the rpath instead
        return None
    root = os.path.dirname(libggml.__file__)
    return next((d for d in (os.path.join(root, "lib64"), os.path.join(root, "lib")) if os.path.isdir(d)), None)


def _preload_libggml() -> None:
    libdir = _libggml_dir()
    if libdir is None:
        return
    # libggml.so needs the backends it registers (RPC where built with it) by soname
    for name in ("libggml-base.so", "libggml-cpu.so", "libggml-rpc.so", "libggml.so"):
        path = os.path.join(libdir, name)
        if os.path.exists(path):
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


_preload_libggml()
