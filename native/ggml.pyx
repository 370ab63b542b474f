# cython: language_level=3
"""ggml from Python: devices, the backend scheduler, weights, buffers and graphs.

This is the only module that touches ggml's C API. Models build graphs with the
ops of `Graph`; the engine computes them through `Backend`. Native lifetimes are
explicit: every owner has `close()` (and `with` support); nothing relies on the
garbage collector to free device memory.
"""
import mmap as _mmap
import os

import numpy as np
cimport numpy as cnp

from libc.stdint cimport int64_t, uintptr_t
from libc.string cimport memcpy
from ggml_api cimport *

ctypedef ggml_backend_buffer_type_t * (*get_extra_bufts_t)(ggml_backend_dev_t)

cnp.import_array()

from libc.stdio cimport fputs, stderr


cdef int _last_log_level = GGML_LOG_LEVEL_NONE

cdef void _log_warnings_only(ggml_log_level level, const char * text, void * user_data) noexcept nogil:
    """ggml's own log: warnings and errors to stderr; its info/debug chatter (one line
    per repacked tensor, buffer sizes) is dropped, as llama.cpp drops it by default."""
    global _last_log_level
    if level != GGML_LOG_LEVEL_CONT:
        _last_log_level = level
    if _last_log_level >= GGML_LOG_LEVEL_WARN:
        fputs(text, stderr)


ggml_log_set(_log_warnings_only, NULL)

# Python-visible type ids (values of enum ggml_type).
F32 = GGML_TYPE_F32
F16 = GGML_TYPE_F16
Q8_0 = GGML_TYPE_Q8_0
Q4_0 = GGML_TYPE_Q4_0
I32 = GGML_TYPE_I32
I64 = GGML_TYPE_I64
BF16 = GGML_TYPE_BF16

ROPE_NORMAL = 0
ROPE_NEOX = 2
ROPE_IMROPE = 40      # interleaved M-RoPE (Qwen3-VL, Qwen3.5)

SCALE_NEAREST = 0
SCALE_BILINEAR = 1
SCALE_BICUBIC = 2
SCALE_ALIGN_CORNERS = 1 << 8

POOL_AVG = GGML_OP_POOL_AVG
POOL_MAX = GGML_OP_POOL_MAX

_TYPE_BY_NAME = {"f32": F32, "f16": F16, "q8_0": Q8_0, "q4_0": Q4_0, "bf16": BF16}

_NP_DTYPE = {GGML_TYPE_F32: np.float32, GGML_TYPE_F16: np.float16,
             GGML_TYPE_I32: np.int32, GGML_TYPE_I64: np.int64}


def type_by_name(name):
    """'f16' -> ggml type id (cache types accepted on the command line)."""
    try:
        return _TYPE_BY_NAME[name.lower()]
    except KeyError:
        raise ValueError(f"unsupported tensor type {name!r}; use one of {sorted(_TYPE_BY_NAME)}")


def type_name(int t):
    return (<bytes>ggml_type_name(<ggml_type>t)).decode()


def row_size(int t, int64_t n):
    return ggml_row_size(<ggml_type>t, n)


class GGMLError(RuntimeError):
    pass


cdef class Tensor:
    """A ggml tensor: a node of a graph under construction, a weight, or a buffer slice."""

    cdef ggml_tensor * ptr
    cdef object owner  # keeps the owning context alive

    @staticmethod
    cdef Tensor wrap(ggml_tensor * p, object owner):
        if p == NULL:
            raise GGMLError("ggml returned no tensor (context full?)")
        cdef Tensor t = Tensor.__new__(Tensor)
        t.ptr = p
        t.owner = owner
        return t

    @property
    def shape(self):
        """ggml order: ne0 (contiguous) first, trailing 1s dropped except the first."""
        n = ggml_n_dims(self.ptr)
        return tuple(self.ptr.ne[i] for i in range(n))

    @property
    def ne(self):
        return (self.ptr.ne[0], self.ptr.ne[1], self.ptr.ne[2], self.ptr.ne[3])

    @property
    def nb(self):
        return (self.ptr.nb[0], self.ptr.nb[1], self.ptr.nb[2], self.ptr.nb[3])

    @property
    def type(self):
        return <int>self.ptr.type

    @property
    def name(self):
        return (<bytes>self.ptr.name).decode()

    @property
    def nbytes(self):
        return ggml_nbytes(self.ptr)

    def set_name(self, str name):
        ggml_set_name(self.ptr, name.encode()[:63])
        return self

    def write(self, arr, size_t offset=0):
        """Copy a numpy array's bytes into this (allocated) tensor at byte `offset`."""
        cdef cnp.ndarray a = np.ascontiguousarray(arr)
        cdef size_t n = a.nbytes
        if offset + n > ggml_nbytes(self.ptr):
            raise GGMLError(f"write of {n} bytes at {offset} overflows tensor {self.name} ({ggml_nbytes(self.ptr)} bytes)")
        cdef const void * src = cnp.PyArray_DATA(a)
        with nogil:
            ggml_backend_tensor_set(self.ptr, src, offset, n)

    def copy_from(self, Tensor src):
        """Copy src's data into this tensor (same type and shape, both allocated), on
        whichever devices they live: GPU to GPU stays on the device."""
        if src.ptr.type != self.ptr.type or ggml_nbytes(src.ptr) != ggml_nbytes(self.ptr) \
                or not ggml_is_contiguous(src.ptr) or not ggml_is_contiguous(self.ptr):
            raise GGMLError(f"cannot copy {src!r} into {self!r}")
        with nogil:
            ggml_backend_tensor_copy(src.ptr, self.ptr)

    def read_bytes(self) -> bytes:
        """The tensor's raw bytes (any type, any device)."""
        cdef size_t n = ggml_nbytes(self.ptr)
        cdef bytearray out = bytearray(n)
        cdef char * dst = out
        with nogil:
            ggml_backend_tensor_get(self.ptr, dst, 0, n)
        return bytes(out)

    def read(self, dtype=None):
        """The tensor's contents as a numpy array shaped [ne3, ne2, ne1, ne0] (dropping 1s)."""
        if dtype is None:
            dtype = _NP_DTYPE.get(self.ptr.type)
            if dtype is None:
                raise GGMLError(f"cannot read tensor of type {type_name(self.ptr.type)} into numpy")
        cdef cnp.ndarray out = np.empty(ggml_nbytes(self.ptr) // np.dtype(dtype).itemsize, dtype=dtype)
        cdef void * dst = cnp.PyArray_DATA(out)
        cdef size_t n = ggml_nbytes(self.ptr)
        with nogil:
            ggml_backend_tensor_get(self.ptr, dst, 0, n)
        shape = [d for d in reversed(self.ne)]
        while len(shape) > 1 and shape[0] == 1:
            shape.pop(0)
        return out.reshape(shape)

    def __repr__(self):
        return f"Tensor({self.name!r}, {type_name(self.ptr.type)}, ne={self.ne})"


cdef class Device:
    """One ggml backend device (CPU, a CUDA GPU, ...) and its backend instance."""

    cdef ggml_backend_dev_t dev
    cdef ggml_backend_t backend
    cdef readonly str name
    cdef readonly str description
    cdef readonly bint is_cpu

    def memory(self):
        """(free, total) bytes as the device reports them."""
        cdef size_t free = 0, total = 0
        ggml_backend_dev_memory(self.dev, &free, &total)
        return free, total

    def __repr__(self):
        return f"Device({self.name!r}, {self.description!r})"


def list_devices():
    """Names and descriptions of the devices the linked ggml offers."""
    cdef size_t i
    cdef ggml_backend_dev_t d
    out = []
    for i in range(ggml_backend_dev_count()):
        d = ggml_backend_dev_get(i)
        out.append({
            "name": (<bytes>ggml_backend_dev_name(d)).decode(),
            "description": (<bytes>ggml_backend_dev_description(d)).decode(),
            "type": {GGML_BACKEND_DEVICE_TYPE_CPU: "cpu", GGML_BACKEND_DEVICE_TYPE_GPU: "gpu",
                     GGML_BACKEND_DEVICE_TYPE_IGPU: "igpu"}.get(ggml_backend_dev_type(d), "accel"),
        })
    return out


cdef class Buffer:
    """Tensors allocated together in one backend buffer (weights, KV cache, embeddings)."""

    cdef ggml_context * ctx
    cdef ggml_backend_buffer_t buf
    cdef readonly dict tensors
    cdef readonly object device
    cdef object keepalive  # the mmap behind a zero-copy CPU buffer

    def __dealloc__(self):
        self._free()

    cdef _free(self):
        if self.buf != NULL:
            ggml_backend_buffer_free(self.buf)
            self.buf = NULL
        if self.ctx != NULL:
            ggml_free(self.ctx)
            self.ctx = NULL

    def close(self):
        self._free()
        self.tensors = {}
        self.keepalive = None

    @property
    def nbytes(self):
        return ggml_backend_buffer_get_size(self.buf) if self.buf != NULL else 0

    def clear(self, int value=0):
        if self.buf != NULL:
            ggml_backend_buffer_clear(self.buf, value)

    def __getitem__(self, name):
        return self.tensors[name]

    def __contains__(self, name):
        return name in self.tensors


cdef ggml_context * _new_meta_context(size_t n_tensors) except NULL:
    cdef ggml_init_params p
    p.mem_size = ggml_tensor_overhead() * (n_tensors + 1)
    p.mem_buffer = NULL
    p.no_alloc = True
    cdef ggml_context * ctx = ggml_init(p)
    if ctx == NULL:
        raise MemoryError("ggml_init failed")
    return ctx


cdef ggml_tensor * _new_tensor(ggml_context * ctx, int type_, tuple ne) except NULL:
    cdef int64_t cne[4]
    cdef int i
    for i in range(4):
        cne[i] = ne[i] if i < len(ne) else 1
    return ggml_new_tensor(ctx, <ggml_type>type_, max(1, len(ne)), cne)


cdef Buffer _declare_weights(Device dev, list infos):
    """A Buffer whose context declares the GGUF tensors `infos` (no memory yet)."""
    cdef Buffer b = Buffer.__new__(Buffer)
    b.ctx = _new_meta_context(len(infos))
    b.device = dev
    b.tensors = {}
    cdef ggml_tensor * p
    for info in infos:
        p = _new_tensor(b.ctx, info.ggml_type, info.ne)
        ggml_set_name(p, info.name.encode()[:63])
        b.tensors[info.name] = Tensor.wrap(p, b)
    return b


cdef class Graph:
    """A compute graph under construction: the ops models are written with.

    Shapes follow ggml: ne0 is the contiguous dimension. Inputs are declared
    with `input()` and filled by `Backend.compute(graph, {tensor: array})`.
    """

    cdef ggml_context * ctx
    cdef ggml_cgraph * gf
    cdef readonly list inputs
    cdef readonly int max_nodes
    cdef bint was_allocated    # its tensors hold addresses in a compute buffer

    def __cinit__(self, int max_nodes=16384):
        cdef ggml_init_params p
        self.max_nodes = max_nodes
        p.mem_size = ggml_tensor_overhead() * max_nodes + ggml_graph_overhead_custom(max_nodes, False)
        p.mem_buffer = NULL
        p.no_alloc = True
        self.ctx = ggml_init(p)
        if self.ctx == NULL:
            raise MemoryError("ggml_init failed")
        self.gf = ggml_new_graph_custom(self.ctx, max_nodes, False)
        self.inputs = []

    def __dealloc__(self):
        if self.ctx != NULL:
            ggml_free(self.ctx)
            self.ctx = NULL

    def close(self):
        if self.ctx != NULL:
            ggml_free(self.ctx)
            self.ctx = NULL
            self.gf = NULL

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    cdef inline Tensor _t(self, ggml_tensor * p):
        return Tensor.wrap(p, self)

    # -- graph structure -----------------------------------------------------

    def input(self, str name, int type_, tuple ne):
        """A tensor filled from the host before compute."""
        cdef ggml_tensor * p = _new_tensor(self.ctx, type_, ne)
        ggml_set_name(p, name.encode())
        ggml_set_input(p)
        t = self._t(p)
        self.inputs.append(t)
        return t

    def new_tensor(self, int type_, tuple ne):
        return self._t(_new_tensor(self.ctx, type_, ne))

    def expand(self, Tensor t):
        """Add t (and everything it depends on) to the graph, in order."""
        ggml_build_forward_expand(self.gf, t.ptr)
        return t

    def output(self, Tensor t):
        ggml_set_output(t.ptr)
        ggml_build_forward_expand(self.gf, t.ptr)
        return t

    @property
    def n_nodes(self):
        return ggml_graph_n_nodes(self.gf)

    def ops(self):
        """(op, tensor name, shape) of every node in compute order: what the graph runs."""
        cdef ggml_tensor * t
        out = []
        for i in range(ggml_graph_n_nodes(self.gf)):
            t = ggml_graph_node(self.gf, i)
            out.append(((<bytes>ggml_op_desc(t)).decode(), (<bytes>ggml_get_name(t)).decode(),
                        tuple(t.ne[d] for d in range(4))))
        return out

    # -- elementwise ---------------------------------------------------------

    def add(self, Tensor a, Tensor b): return self._t(ggml_add(self.ctx, a.ptr, b.ptr))
    def sub(self, Tensor a, Tensor b): return self._t(ggml_sub(self.ctx, a.ptr, b.ptr))
    def mul(self, Tensor a, Tensor b): return self._t(ggml_mul(self.ctx, a.ptr, b.ptr))
    def div(self, Tensor a, Tensor b): return self._t(ggml_div(self.ctx, a.ptr, b.ptr))
    def scale(self, Tensor a, float s): return self._t(ggml_scale(self.ctx, a.ptr, s))
    def scale_bias(self, Tensor a, float s, float b): return self._t(ggml_scale_bias(self.ctx, a.ptr, s, b))
    def sqr(self, Tensor a): return self._t(ggml_sqr(self.ctx, a.ptr))
    def sqrt(self, Tensor a): return self._t(ggml_sqrt(self.ctx, a.ptr))
    def tanh(self, Tensor a): return self._t(ggml_tanh(self.ctx, a.ptr))
    def gelu(self, Tensor a): return self._t(ggml_gelu(self.ctx, a.ptr))
    def gelu_erf(self, Tensor a): return self._t(ggml_gelu_erf(self.ctx, a.ptr))
    def gelu_quick(self, Tensor a): return self._t(ggml_gelu_quick(self.ctx, a.ptr))
    def silu(self, Tensor a): return self._t(ggml_silu(self.ctx, a.ptr))
    def relu(self, Tensor a): return self._t(ggml_relu(self.ctx, a.ptr))
    def swiglu(self, Tensor gate, Tensor up):
        """silu(gate) * up, fused."""
        return self._t(ggml_swiglu_split(self.ctx, gate.ptr, up.ptr))
    def geglu(self, Tensor gate, Tensor up):
        """gelu(gate) * up, fused (tanh approximation, as llama.cpp's LLM_FFN_GELU)."""
        return self._t(ggml_geglu_split(self.ctx, gate.ptr, up.ptr))

    # -- normalisation, products ----------------------------------------------

    def norm(self, Tensor a, float eps): return self._t(ggml_norm(self.ctx, a.ptr, eps))
    def rms_norm(self, Tensor a, float eps): return self._t(ggml_rms_norm(self.ctx, a.ptr, eps))

    def mul_mat(self, Tensor w, Tensor x, bint f32_precision=False):
        """w: [k, m], x: [k, n] -> [m, n]."""
        cdef ggml_tensor * r = ggml_mul_mat(self.ctx, w.ptr, x.ptr)
        if f32_precision:
            ggml_mul_mat_set_prec(r, GGML_PREC_F32)
        return self._t(r)

    def soft_max(self, Tensor a, Tensor mask=None, float scale=1.0, float max_bias=0.0):
        return self._t(ggml_soft_max_ext(self.ctx, a.ptr, mask.ptr if mask is not None else NULL, scale, max_bias))

    def rope(self, Tensor a, Tensor pos, int n_dims, int mode, int n_ctx_orig=0,
             float freq_base=10000.0, float freq_scale=1.0, float ext_factor=0.0,
             float attn_factor=1.0, float beta_fast=32.0, float beta_slow=1.0, Tensor freq_factors=None):
        """Rotary embedding of a: [head_dim, n_head, n_tokens] at positions pos (i32 [n_tokens])."""
        return self._t(ggml_rope_ext(
            self.ctx, a.ptr, pos.ptr, freq_factors.ptr if freq_factors is not None else NULL,
            n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow))

    def flash_attn(self, Tensor q, Tensor k, Tensor v, Tensor mask, float scale,
                   float max_bias=0.0, float softcap=0.0, Tensor sinks=None):
        """q: [d, n_tokens, n_head], k/v: [d, n_kv, n_head_kv], mask f16 [n_kv, n_tokens]
        -> [d, n_head, n_tokens]. Accumulates in f32 as llama.cpp does. sinks: f32
        [n_head], one extra logit per head in the softmax's denominator (gpt-oss)."""
        cdef ggml_tensor * r = ggml_flash_attn_ext(self.ctx, q.ptr, k.ptr, v.ptr,
                                                   mask.ptr if mask is not None else NULL,
                                                   scale, max_bias, softcap)
        ggml_flash_attn_ext_set_prec(r, GGML_PREC_F32)
        if sinks is not None:
            ggml_flash_attn_ext_add_sinks(r, sinks.ptr)
        return self._t(r)

    def conv_2d(self, Tensor kernel, Tensor x, int s0=1, int s1=1, int p0=0, int p1=0, int d0=1, int d1=1):
        return self._t(ggml_conv_2d(self.ctx, kernel.ptr, x.ptr, s0, s1, p0, p1, d0, d1))

    def pool_2d(self, Tensor a, int op, int k0, int k1, int s0, int s1, float p0=0, float p1=0):
        return self._t(ggml_pool_2d(self.ctx, a.ptr, <ggml_op_pool>op, k0, k1, s0, s1, p0, p1))

    def argmax(self, Tensor a): return self._t(ggml_argmax(self.ctx, a.ptr))

    def rope_set_offset(self, Tensor a, int n_offs):
        """Rotate dims [n_offs, n_offs + n_dims) of a rope result a (in place of its op params) -> a."""
        ggml_rope_set_offset(a.ptr, n_offs)
        return a

    def im2col(self, Tensor kernel, Tensor x, int s0, int s1, int p0, int p1, int d0=1, int d1=1,
               bint is_2d=True, int dst_type=0):
        """Unfold x by kernel's shape (kernel's data unused) -> [k0*k1*C, OW, OH, N]."""
        return self._t(ggml_im2col(self.ctx, kernel.ptr, x.ptr, s0, s1, p0, p1, d0, d1, is_2d, <ggml_type>dst_type))

    def sin(self, Tensor a): return self._t(ggml_sin(self.ctx, a.ptr))
    def cos(self, Tensor a): return self._t(ggml_cos(self.ctx, a.ptr))

    def interpolate(self, Tensor a, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3, unsigned int mode):
        """Resample a to [ne0, ne1, ne2, ne3]; mode: SCALE_* | SCALE_ALIGN_CORNERS."""
        return self._t(ggml_interpolate(self.ctx, a.ptr, ne0, ne1, ne2, ne3, mode))

    # -- mixture of experts ------------------------------------------------------

    def mul_mat_id(self, Tensor experts, Tensor x, Tensor ids):
        """experts: [k, m, n_expert], x: [k, n_x, n_tokens] (n_x 1 or n_used),
        ids: i32 [n_used, n_tokens] -> [m, n_used, n_tokens]: x times each chosen expert."""
        return self._t(ggml_mul_mat_id(self.ctx, experts.ptr, x.ptr, ids.ptr))
    def add_id(self, Tensor a, Tensor b, Tensor ids):
        """a: [m, n_used, n_tokens] plus row ids[j, t] of b ([m, n_expert]): per-expert biases."""
        return self._t(ggml_add_id(self.ctx, a.ptr, b.ptr, ids.ptr))
    def argsort_top_k(self, Tensor a, int k):
        """i32 [k, rows]: the indices of each row's k largest values, largest first."""
        return self._t(ggml_argsort_top_k(self.ctx, a.ptr, k))
    def sigmoid(self, Tensor a): return self._t(ggml_sigmoid(self.ctx, a.ptr))
    def sum_rows(self, Tensor a): return self._t(ggml_sum_rows(self.ctx, a.ptr))
    def clamp(self, Tensor a, float lo, float hi): return self._t(ggml_clamp(self.ctx, a.ptr, lo, hi))
    def swiglu_oai(self, Tensor gate, Tensor up, float alpha, float limit):
        """gpt-oss's clamped SwiGLU: gate clamped above, up to [-limit, limit], (up + 1) * gate * sigmoid(alpha * gate)."""
        return self._t(ggml_swiglu_oai(self.ctx, gate.ptr, up.ptr, alpha, limit))
    def repeat_4d(self, Tensor a, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3=1):
        return self._t(ggml_repeat_4d(self.ctx, a.ptr, ne0, ne1, ne2, ne3))

    # -- recurrent layers (gated delta net), M-RoPE ---------------------------------

    def softplus(self, Tensor a): return self._t(ggml_softplus(self.ctx, a.ptr))

    def ssm_conv(self, Tensor sx, Tensor c):
        """Depthwise causal convolution: sx [d_conv - 1 + n_tokens, channels, n_seqs]
        (the previous d_conv - 1 inputs, then the new ones), c [d_conv, channels]
        -> [channels, n_tokens, n_seqs]."""
        return self._t(ggml_ssm_conv(self.ctx, sx.ptr, c.ptr))

    def gated_delta_net(self, Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, Tensor state):
        """q, k [S, H_k, n_tokens, n_seqs], v [S, H_v, n_tokens, n_seqs], g and beta
        [1, H_v, n_tokens, n_seqs], state [S, S, H_v, n_seqs] -> f32 holding the
        outputs [S, H_v, n_tokens, n_seqs] followed by the final states [S, S, H_v, n_seqs]."""
        return self._t(ggml_gated_delta_net(self.ctx, q.ptr, k.ptr, v.ptr, g.ptr, beta.ptr, state.ptr, 1))

    def rope_multi(self, Tensor a, Tensor pos, int n_dims, tuple sections, int mode, int n_ctx_orig=0,
                   float freq_base=10000.0, float freq_scale=1.0, float ext_factor=0.0,
                   float attn_factor=1.0, float beta_fast=32.0, float beta_slow=1.0):
        """Multi-dimensional rotary embedding (M-RoPE) of a: [head_dim, n_head, n_tokens]
        at positions pos (i32 [4 * n_tokens], dim-major); sections: 4 counts of
        rotated pairs per position dimension."""
        cdef int secs[4]
        for i in range(4):
            secs[i] = sections[i] if i < len(sections) else 0
        return self._t(ggml_rope_multi(self.ctx, a.ptr, pos.ptr, NULL, n_dims, secs, mode, n_ctx_orig,
                                       freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow))

    # -- layout ------------------------------------------------------------------

    def cont(self, Tensor a): return self._t(ggml_cont(self.ctx, a.ptr))
    def cast(self, Tensor a, int type_): return self._t(ggml_cast(self.ctx, a.ptr, <ggml_type>type_))
    def cpy(self, Tensor a, Tensor b): return self._t(ggml_cpy(self.ctx, a.ptr, b.ptr))
    def transpose(self, Tensor a): return self._t(ggml_transpose(self.ctx, a.ptr))
    def permute(self, Tensor a, int a0, int a1, int a2, int a3):
        return self._t(ggml_permute(self.ctx, a.ptr, a0, a1, a2, a3))
    def concat(self, Tensor a, Tensor b, int dim): return self._t(ggml_concat(self.ctx, a.ptr, b.ptr, dim))
    def pad(self, Tensor a, int p0, int p1=0, int p2=0, int p3=0):
        """Zeros appended at the end of each dimension."""
        return self._t(ggml_pad(self.ctx, a.ptr, p0, p1, p2, p3))

    def reshape(self, Tensor a, *ne):
        n = len(ne)
        if n == 1: return self._t(ggml_reshape_1d(self.ctx, a.ptr, ne[0]))
        if n == 2: return self._t(ggml_reshape_2d(self.ctx, a.ptr, ne[0], ne[1]))
        if n == 3: return self._t(ggml_reshape_3d(self.ctx, a.ptr, ne[0], ne[1], ne[2]))
        return self._t(ggml_reshape_4d(self.ctx, a.ptr, ne[0], ne[1], ne[2], ne[3]))

    def view(self, Tensor a, tuple ne, tuple nb=(), size_t offset=0):
        """A strided view: ne up to 4 dims, nb the byte strides of dims 1.. (len(ne)-1 values)."""
        n = len(ne)
        if n == 1: return self._t(ggml_view_1d(self.ctx, a.ptr, ne[0], offset))
        if n == 2: return self._t(ggml_view_2d(self.ctx, a.ptr, ne[0], ne[1], nb[0], offset))
        if n == 3: return self._t(ggml_view_3d(self.ctx, a.ptr, ne[0], ne[1], ne[2], nb[0], nb[1], offset))
        return self._t(ggml_view_4d(self.ctx, a.ptr, ne[0], ne[1], ne[2], ne[3], nb[0], nb[1], nb[2], offset))

    def get_rows(self, Tensor a, Tensor rows): return self._t(ggml_get_rows(self.ctx, a.ptr, rows.ptr))

    def set_rows(self, Tensor dst, Tensor src, Tensor rows):
        """Write src's rows into dst at indices rows (i64); returns the written view."""
        return self._t(ggml_set_rows(self.ctx, dst.ptr, src.ptr, rows.ptr))


cdef class Backend:
    """Devices, CPU threads and the ggml backend scheduler that runs graphs across them.

    Devices are ordered GPUs first, CPU last, as the scheduler prefers the first
    backend that holds an op's weights.
    """

    cdef ggml_backend_sched_t sched
    cdef ggml_backend_t cpu_backend
    cdef readonly list devices
    cdef readonly int n_threads
    cdef readonly int max_nodes
    cdef readonly dict compute_bytes
    cdef Graph _allocated      # the graph the scheduler's buffers hold now
    cdef ggml_threadpool * _threadpool

    def __init__(self, int n_threads=0, bint use_gpu=True, int max_nodes=16384):
        cdef size_t i
        cdef ggml_backend_dev_t d
        cdef Device dv
        cdef ggml_backend_t[16] backends
        cdef int n = 0
        self.devices = []
        self.max_nodes = max_nodes
        self.compute_bytes = {}
        gpus, cpus = [], []
        for i in range(ggml_backend_dev_count()):
            d = ggml_backend_dev_get(i)
            t = ggml_backend_dev_type(d)
            if t == GGML_BACKEND_DEVICE_TYPE_CPU:
                cpus.append(<uintptr_t>d)
            elif t == GGML_BACKEND_DEVICE_TYPE_GPU and use_gpu:
                gpus.append(<uintptr_t>d)
        if not cpus:
            raise GGMLError("the linked ggml has no CPU device")
        for addr in gpus[:15] + cpus[:1]:
            d = <ggml_backend_dev_t><uintptr_t>addr
            dv = Device.__new__(Device)
            dv.dev = d
            dv.backend = ggml_backend_dev_init(d, NULL)
            if dv.backend == NULL:
                raise GGMLError(f"cannot initialise device {(<bytes>ggml_backend_dev_name(d)).decode()}")
            dv.name = (<bytes>ggml_backend_dev_name(d)).decode()
            dv.description = (<bytes>ggml_backend_dev_description(d)).decode()
            dv.is_cpu = ggml_backend_dev_type(d) == GGML_BACKEND_DEVICE_TYPE_CPU
            self.devices.append(dv)
            backends[n] = dv.backend
            n += 1
        self.cpu_backend = (<Device>self.devices[-1]).backend
        self.set_n_threads(n_threads if n_threads > 0 else max(1, os.cpu_count() or 1))
        self.sched = ggml_backend_sched_new(backends, NULL, n, max_nodes, False, True)
        if self.sched == NULL:
            raise GGMLError("ggml_backend_sched_new failed")

    def __dealloc__(self):
        self._free()

    cdef _free(self):
        cdef Device dv
        self._allocated = None
        if self.sched != NULL:
            ggml_backend_sched_free(self.sched)
            self.sched = NULL
        for dv in self.devices or []:
            if dv.backend != NULL:
                ggml_backend_free(dv.backend)
                dv.backend = NULL
        self.devices = []
        if self._threadpool != NULL:
            ggml_threadpool_free(self._threadpool)
            self._threadpool = NULL

    def close(self):
        self._free()

    @property
    def cpu(self):
        return self.devices[-1]

    @property
    def gpus(self):
        return self.devices[:-1]

    def set_n_threads(self, int n):
        """CPU threads for compute, in a thread pool kept across graphs (as llama.cpp
        attaches one; without it ggml sets up a pool for every graph)."""
        cdef ggml_threadpool_params tpp
        cdef ggml_threadpool * old = self._threadpool
        ggml_threadpool_params_init(&tpp, n)
        cdef ggml_threadpool * tp = ggml_threadpool_new(&tpp)
        if tp == NULL:
            raise GGMLError(f"cannot create a pool of {n} CPU threads")
        self.n_threads = n
        ggml_backend_cpu_set_n_threads(self.cpu_backend, n)
        ggml_backend_cpu_set_threadpool(self.cpu_backend, tp)
        self._threadpool = tp
        if old != NULL:
            ggml_threadpool_free(old)

    def graph(self):
        return Graph(self.max_nodes)

    # -- memory ------------------------------------------------------------------

    def alloc(self, Device device, list specs):
        """Allocate tensors [(name, type, ne), ...] together on `device`, zeroed."""
        cdef ggml_context * ctx = _new_meta_context(len(specs))
        cdef Buffer b = Buffer.__new__(Buffer)
        b.ctx = ctx
        b.device = device
        b.tensors = {}
        for name, type_, ne in specs:
            p = _new_tensor(ctx, type_, tuple(ne))
            ggml_set_name(p, name.encode())
            b.tensors[name] = Tensor.wrap(p, b)
        b.buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, ggml_backend_dev_buffer_type(device.dev))
        if b.buf == NULL:
            total = sum(row_size(t, ne[0]) * int(np.prod(ne[1:])) for _, t, ne in specs)
            raise MemoryError(f"cannot allocate {total / 2**20:.1f} MiB on {device.name}")
        ggml_backend_buffer_clear(b.buf, 0)
        return b

    cdef ggml_backend_buffer_type_t _cpu_repack_buft(self):
        """The CPU backend's weight-repacking buffer type (ggml's "extra" buffer
        types, as llama.cpp uses them), or NULL when this ggml has none."""
        cdef Device cpu = self.devices[-1]
        cdef get_extra_bufts_t fn = <get_extra_bufts_t>ggml_backend_reg_get_proc_address(
            ggml_backend_dev_backend_reg(cpu.dev), b"ggml_backend_dev_get_extra_bufts")
        if fn == NULL:
            return NULL
        cdef ggml_backend_buffer_type_t * bufts = fn(cpu.dev)
        while bufts != NULL and bufts[0] != NULL:
            if b"REPACK" in <bytes>ggml_backend_buft_name(bufts[0]):
                return bufts[0]
            bufts += 1
        return NULL

    cdef bint _repacks(self, ggml_backend_buffer_t probe, int type_, tuple ne):
        """Would the CPU backend run mul_mat(w, x) (mul_mat_id for a 3-D stack of
        experts) with w of this type and shape from the repack buffer? (Asked as
        llama.cpp asks: a probe op whose weight sits in a buffer of that type.)"""
        cdef Device cpu = self.devices[-1]
        cdef ggml_context * ctx = _new_meta_context(4)
        cdef ggml_tensor * w = _new_tensor(ctx, type_, ne)
        cdef ggml_tensor * x
        cdef ggml_tensor * ids
        cdef ggml_tensor * op
        if len(ne) >= 3 and ne[2] > 1:
            x = _new_tensor(ctx, GGML_TYPE_F32, (ne[0], 1, 512))
            ids = _new_tensor(ctx, GGML_TYPE_I32, (1, 512))
            op = ggml_mul_mat_id(ctx, w, x, ids)
        else:
            x = _new_tensor(ctx, GGML_TYPE_F32, (ne[0], 512))
            op = ggml_mul_mat(ctx, w, x)
        w.buffer = probe
        cdef bint ok = ggml_backend_dev_supports_op(cpu.dev, op)
        w.buffer = NULL
        ggml_free(ctx)
        return ok

    def load_weights(self, gguf_file, dict placement, repack=()):
        """Load every tensor of a GGUFFile; placement maps tensor name -> Device.

        CPU tensors point into the memory-mapped file (no second copy), except the
        matrix weights named in `repack` whose type the CPU backend repacks into its
        interleaved layout (as llama.cpp loads them: other kernels, other rounding);
        those are copied into a repack buffer. Tensors placed on another device
        are copied there from the map.
        Returns {device name or "CPU_REPACK": Buffer}.
        """
        path = gguf_file.path
        cdef size_t data_offset = gguf_file.data_offset
        f = open(path, "rb")
        try:
            mm = _mmap.mmap(f.fileno(), 0, access=_mmap.ACCESS_READ)
        finally:
            f.close()
        cdef const unsigned char[::1] view = mm
        cdef const unsigned char * base = &view[0]
        cdef size_t file_size = len(mm)
        cdef Buffer b
        cdef Device dev
        cdef ggml_tensor * p
        cdef size_t end, off
        by_device = {}
        cdef ggml_backend_buffer_type_t repack_buft = self._cpu_repack_buft() if repack else NULL
        cdef ggml_backend_buffer_t probe = ggml_backend_buft_alloc_buffer(repack_buft, 0) if repack_buft != NULL else NULL
        repacked = []
        try:
            for name, info in gguf_file.tensors.items():
                dev = placement.get(name, self.cpu)
                if probe != NULL and dev.is_cpu and name in repack and tuple(info.ne[3:]) in ((), (1,)) \
                        and self._repacks(probe, info.ggml_type, tuple(info.ne)):
                    repacked.append(info)
                else:
                    by_device.setdefault(dev, []).append(info)
        finally:
            if probe != NULL:
                ggml_backend_buffer_free(probe)
        buffers = {}
        if repacked:
            buffers["CPU_REPACK"] = self._load_copies(gguf_file, base, file_size, self.cpu, repacked, repack_buft)
        for dev, infos in by_device.items():
            if not dev.is_cpu:
                buffers[dev.name] = self._load_copies(gguf_file, base, file_size, dev, infos,
                                                      ggml_backend_dev_buffer_type(dev.dev))
                continue
            b = _declare_weights(dev, infos)
            end = max(info.offset + info.nbytes for info in infos)
            if data_offset + end > file_size:
                raise GGMLError(f"{path}: truncated tensor data")
            b.buf = ggml_backend_cpu_buffer_from_ptr(<void *>(base + data_offset), end)
            b.keepalive = mm
            for info in infos:
                p = (<Tensor>b.tensors[info.name]).ptr
                off = info.offset
                if ggml_backend_tensor_alloc(b.buf, p, <void *>(base + data_offset + off)) != GGML_STATUS_SUCCESS:
                    raise GGMLError(f"{path}: cannot place tensor {info.name}")
            ggml_backend_buffer_set_usage(b.buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
            buffers[dev.name] = b
        return buffers

    cdef Buffer _load_copies(self, gguf_file, const unsigned char * base, size_t file_size, Device dev,
                             list infos, ggml_backend_buffer_type_t buft):
        """Tensors allocated in a buffer of type buft, their data copied in from the map."""
        path = gguf_file.path
        cdef size_t data_offset = gguf_file.data_offset
        for info in infos:
            if data_offset + info.offset + info.nbytes > file_size:
                raise GGMLError(f"{path}: truncated tensor data")
        cdef Buffer b = _declare_weights(dev, infos)
        b.buf = ggml_backend_alloc_ctx_tensors_from_buft(b.ctx, buft)
        if b.buf == NULL:
            need = sum(i.nbytes for i in infos)
            raise MemoryError(f"{path}: cannot allocate {need / 2**20:.1f} MiB of weights on {dev.name}")
        for info in infos:
            ggml_backend_tensor_set((<Tensor>b.tensors[info.name]).ptr, base + data_offset + <size_t>info.offset,
                                    0, <size_t>info.nbytes)
        ggml_backend_buffer_set_usage(b.buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
        return b

    # -- compute -----------------------------------------------------------------

    def reserve(self, Graph g):
        """Size the compute buffers for g (a worst-case graph) without running it."""
        cdef Device dv
        if not ggml_backend_sched_reserve(self.sched, g.gf):
            raise MemoryError("cannot reserve compute memory for the worst-case graph")
        self._allocated = None
        for dv in self.devices:
            self.compute_bytes[dv.name] = ggml_backend_sched_get_buffer_size(self.sched, dv.backend)
        ggml_backend_sched_reset(self.sched)

    def holds(self, Graph g):
        """Is g still allocated (no other graph computed since), so that computing
        it again skips the scheduler's split and allocation?"""
        return g is self._allocated and g.gf != NULL

    def compute(self, Graph g, dict inputs):
        """Allocate g, fill its inputs from numpy arrays, run it (GIL released).

        A graph computed again while the scheduler still holds it runs as allocated
        (as llama.cpp reuses its decode graph): only the inputs are written. Once
        another graph has been computed, g's tensors point at memory that is no
        longer its own: build it anew."""
        cdef Tensor t
        cdef ggml_status st
        if g.gf == NULL:
            raise GGMLError("the graph is closed")
        if g is not self._allocated:
            if g.was_allocated:
                raise GGMLError("this graph was allocated before another one ran; build it again")
            self._allocated = None
            ggml_backend_sched_reset(self.sched)
            if not ggml_backend_sched_alloc_graph(self.sched, g.gf):
                raise MemoryError("cannot allocate the compute graph")
            g.was_allocated = True
            self._allocated = g
        for t, arr in inputs.items():
            t.write(arr)
        with nogil:
            st = ggml_backend_sched_graph_compute(self.sched, g.gf)
        if st != GGML_STATUS_SUCCESS:
            raise GGMLError(f"graph compute failed (status {st})")

    @property
    def n_splits(self):
        return ggml_backend_sched_get_n_splits(self.sched)
