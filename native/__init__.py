"""Cython bindings over ggml (the only code that touches C).

The extensions link libggml by rpath. Loading the same libraries here first, by
absolute path, makes them work however the package was built (editable,
isolated build environment, wheel) without LD_LIBRARY_PATH: the folder recorded
at build time when it still exists, else the installed libggml-python package.

The CPU backend is the variant native/cpu_variants.py chooses (the best this CPU
runs among those built, or GGSERVE_CPU_VARIANT's): loaded first, it is the
libggml-cpu.so.0 every later library and extension binds to. CPU_VARIANT names it.
"""
import ctypes
import os

from . import cpu_variants


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


def _preload_libggml() -> str:
    """Load ggml's libraries from their folder; the CPU variant's name."""
    libdir = _libggml_dir()
    if libdir is None:
        return cpu_variants.BASE
    variant = cpu_variants.choose(libdir, os.environ.get(cpu_variants.ENV))
    # libggml.so needs the backends it registers (RPC where built with it) by soname
    for path in (os.path.join(libdir, "libggml-base.so"), cpu_variants.library(libdir, variant),
                 os.path.join(libdir, "libggml-rpc.so"), os.path.join(libdir, "libggml.so")):
        if os.path.exists(path):
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    return variant


CPU_VARIANT = _preload_libggml()
