# cython: language_level=3
"""Read a GGUF file's header: metadata and tensor directory, no tensor data.

Uses ggml's own gguf parser (fast: Gemma's 262k-token vocabulary loads in well
under a second) and turns every failure into a Python exception naming the file.
"""
import os

import numpy as np

from libc.stdint cimport int64_t
from gguf_api cimport *

_NUMPY_OF = {
    GGUF_TYPE_UINT8: np.uint8, GGUF_TYPE_INT8: np.int8,
    GGUF_TYPE_UINT16: np.uint16, GGUF_TYPE_INT16: np.int16,
    GGUF_TYPE_UINT32: np.uint32, GGUF_TYPE_INT32: np.int32,
    GGUF_TYPE_FLOAT32: np.float32, GGUF_TYPE_BOOL: np.int8,
    GGUF_TYPE_UINT64: np.uint64, GGUF_TYPE_INT64: np.int64,
    GGUF_TYPE_FLOAT64: np.float64,
}

GGUF_MAGIC = b"GGUF"


class GGUFError(ValueError):
    """A file that is missing, not GGUF, truncated or inconsistent."""


class TensorInfo:
    """Where one tensor lives in the file: name, ggml type, shape (ne), bytes."""

    __slots__ = ("name", "ggml_type", "ne", "offset", "nbytes")

    def __init__(self, name, ggml_type, ne, offset, nbytes):
        self.name = name
        self.ggml_type = ggml_type
        self.ne = ne
        self.offset = offset
        self.nbytes = nbytes

    def __repr__(self):
        return f"TensorInfo({self.name!r}, type={self.ggml_type}, ne={self.ne})"


cdef str _decode(const char * s):
    # Token strings are bytes in principle; surrogateescape keeps any byte recoverable.
    return (<bytes>s).decode("utf-8", "surrogateescape")


cdef object _read_value(gguf_context * ctx, int64_t i):
    cdef gguf_type t = gguf_get_kv_type(ctx, i)
    cdef gguf_type at
    cdef size_t n, j
    if t == GGUF_TYPE_STRING:
        return _decode(gguf_get_val_str(ctx, i))
    if t == GGUF_TYPE_BOOL:
        return bool(gguf_get_val_bool(ctx, i))
    if t == GGUF_TYPE_UINT8: return gguf_get_val_u8(ctx, i)
    if t == GGUF_TYPE_INT8: return gguf_get_val_i8(ctx, i)
    if t == GGUF_TYPE_UINT16: return gguf_get_val_u16(ctx, i)
    if t == GGUF_TYPE_INT16: return gguf_get_val_i16(ctx, i)
    if t == GGUF_TYPE_UINT32: return gguf_get_val_u32(ctx, i)
    if t == GGUF_TYPE_INT32: return gguf_get_val_i32(ctx, i)
    if t == GGUF_TYPE_FLOAT32: return gguf_get_val_f32(ctx, i)
    if t == GGUF_TYPE_UINT64: return gguf_get_val_u64(ctx, i)
    if t == GGUF_TYPE_INT64: return gguf_get_val_i64(ctx, i)
    if t == GGUF_TYPE_FLOAT64: return gguf_get_val_f64(ctx, i)
    if t == GGUF_TYPE_ARRAY:
        at = gguf_get_arr_type(ctx, i)
        n = gguf_get_arr_n(ctx, i)
        if at == GGUF_TYPE_STRING:
            return [_decode(gguf_get_arr_str(ctx, i, j)) for j in range(n)]
        if at == GGUF_TYPE_ARRAY:
            return []  # nested arrays are not used by any model we load
        dtype = np.dtype(_NUMPY_OF[at])
        if n == 0:
            return np.zeros(0, dtype=dtype)
        raw = (<const char *>gguf_get_arr_data(ctx, i))[: n * dtype.itemsize]
        arr = np.frombuffer(raw, dtype=dtype).copy()
        return arr.astype(bool) if at == GGUF_TYPE_BOOL else arr
    raise GGUFError(f"unknown GGUF value type {t}")


cdef class GGUFFile:
    """The header of a GGUF file: `metadata` (dict) and `tensors` (name -> TensorInfo).

    `data_offset` is where tensor data starts; a tensor's bytes are at
    `data_offset + info.offset`. The file is closed once the header is read.
    """

    cdef readonly str path
    cdef readonly dict metadata
    cdef readonly dict tensors
    cdef readonly size_t data_offset
    cdef readonly size_t alignment
    cdef readonly int version

    def __init__(self, path):
        self.path = os.fspath(path)
        if not os.path.exists(self.path):
            raise FileNotFoundError(f"model file not found: {self.path}")
        if not os.path.isfile(self.path):
            raise GGUFError(f"{self.path}: not a regular file")
        size = os.path.getsize(self.path)
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if magic != GGUF_MAGIC:
            raise GGUFError(f"{self.path}: not a GGUF file (magic {magic!r})")

        cdef gguf_init_params params
        params.no_alloc = True
        params.ctx = NULL
        encoded = self.path.encode()
        cdef gguf_context * ctx = gguf_init_from_file(encoded, params)
        if ctx == NULL:
            raise GGUFError(f"{self.path}: cannot parse the GGUF header (truncated or corrupt)")
        cdef int64_t i, n_kv, n_tensors
        cdef const int64_t * ne
        try:
            self.version = gguf_get_version(ctx)
            self.alignment = gguf_get_alignment(ctx)
            self.data_offset = gguf_get_data_offset(ctx)
            n_kv = gguf_get_n_kv(ctx)
            self.metadata = {}
            for i in range(n_kv):
                self.metadata[_decode(gguf_get_key(ctx, i))] = _read_value(ctx, i)
            n_tensors = gguf_get_n_tensors(ctx)
            self.tensors = {}
            for i in range(n_tensors):
                ne = gguf_get_tensor_ne(ctx, i)
                info = TensorInfo(
                    _decode(gguf_get_tensor_name(ctx, i)),
                    gguf_get_tensor_type(ctx, i),
                    (ne[0], ne[1], ne[2], ne[3]),
                    gguf_get_tensor_offset(ctx, i),
                    gguf_get_tensor_size(ctx, i),
                )
                self.tensors[info.name] = info
        finally:
            gguf_free(ctx)

        end = max((t.offset + t.nbytes for t in self.tensors.values()), default=0)
        if self.tensors and self.data_offset + end > size:
            raise GGUFError(
                f"{self.path}: truncated: tensor data needs {self.data_offset + end} bytes, "
                f"file has {size}"
            )

    @property
    def architecture(self):
        return self.metadata.get("general.architecture")

    def get(self, key, default=None):
        return self.metadata.get(key, default)


def read_metadata(path):
    """Metadata of a GGUF file as a dict (strings, numbers, bools, lists of str, numpy arrays)."""
    return GGUFFile(path).metadata
