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
from libc.errno cimport errno
from posix.mman cimport mlock
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


def cpu_kernels_isa(bint allow_vnni=True) -> str:
    """Which copy of ggserve's CPU kernels runs: "avx512vnni" where the CPU has it
    and allow_vnni, else "avx2" (both give the same floats; tests run each)."""
    return "avx512vnni" if ggserve_matmul_isa(allow_vnni) else "avx2"


def q6_k_dot_supported() -> bool:
    """Does ggserve's kernel for Q6_K weights (native/kernels/q6k_dot.c) run here."""
    return ggserve_q6_k_dot_supported() != 0


def q5_k_dot_supported() -> bool:
    """Does ggserve's kernel for Q5_K weights (native/kernels/q5k_dot.c) run here."""
    return ggserve_q5_k_dot_supported() != 0


def iq4_xs_dot_supported() -> bool:
    """Does ggserve's kernel for IQ4_XS weights (native/kernels/iq4xs_dot.c) run here."""
    return ggserve_iq4_xs_dot_supported() != 0

include "ggml_types.pxi"
include "ggml_tensors.pxi"
include "ggml_graph.pxi"
include "ggml_rpc.pxi"


cdef class Backend:
    """Devices, CPU threads and the ggml backend scheduler that runs graphs across them.

    Devices are ordered as llama.cpp orders them: remote (RPC) devices, local GPUs,
    the CPU last, as the scheduler prefers the first backend that holds an op's
    weights. `rpc`: "host:port" endpoints of workers (ggserve or llama.cpp rpc-server).
    """

    cdef ggml_backend_sched_t sched
    cdef ggml_backend_t cpu_backend
    cdef readonly list devices
    cdef readonly int n_threads
    cdef readonly int max_nodes
    cdef readonly dict compute_bytes
    cdef Graph _allocated      # the graph the scheduler's buffers hold now
    cdef ggml_threadpool * _threadpool
    cdef int _pool_threads     # the pool's size (steps may use fewer of its threads)
    # Q4_1 products and Q8_0 products of a few rows by ggserve's own kernels (the same floats
    # as ggml's; native/kernels/matmul.c): on where the CPU computes everything and runs them
    cdef public bint cpu_kernels

    def __init__(self, int n_threads=0, bint use_gpu=True, int max_nodes=16384, rpc=()):
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
        remote = _rpc_devices(list(rpc)) if rpc else []
        endpoint_of = {addr: ep for ep, addr in remote}
        for addr in ([a for _, a in remote] + gpus)[:15] + cpus[:1]:
            d = <ggml_backend_dev_t><uintptr_t>addr
            dv = Device.__new__(Device)
            dv.dev = d
            dv.backend = ggml_backend_dev_init(d, NULL)
            if dv.backend == NULL:
                raise GGMLError(f"cannot initialise device {(<bytes>ggml_backend_dev_name(d)).decode()}")
            dv.name = (<bytes>ggml_backend_dev_name(d)).decode()
            dv.description = (<bytes>ggml_backend_dev_description(d)).decode()
            dv.is_cpu = ggml_backend_dev_type(d) == GGML_BACKEND_DEVICE_TYPE_CPU
            dv.endpoint = endpoint_of.get(addr)
            self.devices.append(dv)
            backends[n] = dv.backend
            n += 1
        self.cpu_backend = (<Device>self.devices[-1]).backend
        self.set_n_threads(n_threads if n_threads > 0 else max(1, os.cpu_count() or 1))
        self.cpu_kernels = n == 1 and ggserve_matmul_supported() != 0
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
        attaches one; without it ggml sets up a pool for every graph). A pool as large
        or larger runs the next graphs on n of its threads (steps switch between -t
        and -tb); a larger n gets a new pool."""
        cdef ggml_threadpool_params tpp
        cdef ggml_threadpool * old = self._threadpool
        if old != NULL and n <= self._pool_threads:
            self.n_threads = n
            ggml_backend_cpu_set_n_threads(self.cpu_backend, n)
            return
        ggml_threadpool_params_init(&tpp, n)
        cdef ggml_threadpool * tp = ggml_threadpool_new(&tpp)
        if tp == NULL:
            raise GGMLError(f"cannot create a pool of {n} CPU threads")
        self.n_threads = n
        ggml_backend_cpu_set_n_threads(self.cpu_backend, n)
        ggml_backend_cpu_set_threadpool(self.cpu_backend, tp)
        self._threadpool = tp
        self._pool_threads = n
        if old != NULL:
            ggml_threadpool_free(old)

    def graph(self):
        return Graph(self.max_nodes, self.cpu_kernels)

    # -- memory ------------------------------------------------------------------

    def alloc(self, Device device, list specs):
        """Allocate tensors [(name, type, ne), ...] together on `device`, zeroed.

        In host memory they lie in an anonymous mapping, whose pages the kernel gives,
        zeroed, when they are first written: a KV cache holds RAM for the cells used so
        far, not for its whole size up front (llama.cpp clears its buffers at load,
        which makes every page resident)."""
        cdef ggml_context * ctx = _new_meta_context(len(specs))
        cdef Buffer b = Buffer.__new__(Buffer)
        b.ctx = ctx
        b.device = device
        b.tensors = {}
        for name, type_, ne in specs:
            p = _new_tensor(ctx, type_, tuple(ne))
            ggml_set_name(p, name.encode())
            b.tensors[name] = Tensor.wrap(p, b)
        if device.is_cpu:
            _alloc_zero_pages(b, ggml_backend_dev_buffer_type(device.dev))
            return b
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

    def load_weights(self, gguf_file, dict placement, repack=(), bint use_mmap=True):
        """Load every tensor of a GGUFFile; placement maps tensor name -> Device.

        CPU tensors point into the memory-mapped file (no second copy; with use_mmap
        False they are read into a buffer of their own, as llama.cpp's --no-mmap), except the
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
            if not dev.is_cpu or not use_mmap:
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
        copied = repacked + [i for dev, infos in by_device.items() if not dev.is_cpu or not use_mmap for i in infos]
        _release_pages(mm, data_offset, copied)
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
        cdef bint ok
        with nogil:
            ok = ggml_backend_sched_reserve(self.sched, g.gf)
        if not ok:
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
        cdef bint ok
        if g.gf == NULL:
            raise GGMLError("the graph is closed")
        if g is not self._allocated:
            if g.was_allocated:
                raise GGMLError("this graph was allocated before another one ran; build it again")
            self._allocated = None
            with nogil:       # may wait on RPC workers (rpc_lost)
                ggml_backend_sched_reset(self.sched)
                ok = ggml_backend_sched_alloc_graph(self.sched, g.gf)
            if not ok:
                raise MemoryError("cannot allocate the compute graph")
            g.was_allocated = True
            self._allocated = g
        for t, arr in inputs.items():
            if t.ptr.buffer != NULL:     # an input no op reads (a model without rope: the positions) has none
                t.write(arr)
        with nogil:
            st = ggml_backend_sched_graph_compute(self.sched, g.gf)
        if st != GGML_STATUS_SUCCESS:
            raise GGMLError(f"graph compute failed (status {st})")

    @property
    def n_splits(self):
        return ggml_backend_sched_get_n_splits(self.sched)
