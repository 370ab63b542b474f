# Included by ggml.pyx: tensors, devices and buffers (one extension module).

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

    def read_bytes(self, size_t offset=0, n_bytes=None) -> bytes:
        """The tensor's raw bytes (any type, any device): all of them, or n_bytes
        from byte `offset`."""
        cdef size_t total = ggml_nbytes(self.ptr)
        cdef size_t n = total - offset if n_bytes is None else n_bytes
        if offset > total or n > total - offset:
            raise GGMLError(f"read of {n} bytes at {offset} overflows tensor {self.name} ({total} bytes)")
        cdef bytearray out = bytearray(n)
        cdef char * dst = out
        with nogil:
            ggml_backend_tensor_get(self.ptr, dst, offset, n)
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
    cdef readonly str endpoint     # "host:port" of an RPC worker's device, else None

    def memory(self):
        """(free, total) bytes as the device reports them."""
        cdef size_t free = 0, total = 0
        with nogil:       # an RPC device asks its worker (which may be lost: rpc_lost)
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
    cdef object pages      # the anonymous mapping behind a host buffer of our own (_alloc_zero_pages)

    def __dealloc__(self):
        self._free()

    @property
    def mapped(self) -> bool:
        """Do the tensors lie in a memory-mapped file (no copy of their own)?"""
        return self.keepalive is not None

    def lock(self):
        """Keep the buffer's memory in RAM (mlock: never swapped out, as llama.cpp's --mlock);
        OSError when the system refuses (RLIMIT_MEMLOCK). A buffer in device memory: nothing."""
        if self.buf == NULL or not ggml_backend_buffer_is_host(self.buf):
            return
        if mlock(ggml_backend_buffer_get_base(self.buf), ggml_backend_buffer_get_size(self.buf)) != 0:
            raise OSError(errno, f"cannot lock {ggml_backend_buffer_get_size(self.buf)} bytes in RAM: "
                                 f"{os.strerror(errno)}")

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
        self.pages = None

    @property
    def nbytes(self):
        return ggml_backend_buffer_get_size(self.buf) if self.buf != NULL else 0

    def clear(self, int value=0):
        cdef unsigned char v = value
        if self.buf != NULL:
            with nogil:
                ggml_backend_buffer_clear(self.buf, v)

    def __getitem__(self, name):
        return self.tensors[name]

    def __contains__(self, name):
        return name in self.tensors


cdef _alloc_zero_pages(Buffer b, ggml_backend_buffer_type_t buft):
    """Place b's tensors (laid out as buft lays them out) in a new anonymous mapping."""
    cdef size_t align = ggml_backend_buft_get_alignment(buft)
    cdef size_t total = 0
    cdef ggml_tensor * t
    offsets = []
    for tensor in b.tensors.values():
        t = (<Tensor>tensor).ptr
        offsets.append(total)
        total += (ggml_backend_buft_get_alloc_size(buft, t) + align - 1) // align * align
    try:
        b.pages = _mmap.mmap(-1, max(total, 1), flags=_mmap.MAP_PRIVATE | _mmap.MAP_ANONYMOUS)
    except OSError:
        raise MemoryError(f"cannot allocate {total / 2**20:.1f} MiB of host memory") from None
    cdef unsigned char[::1] view = b.pages
    cdef unsigned char * base = &view[0]
    b.buf = ggml_backend_cpu_buffer_from_ptr(<void *>base, max(total, 1))
    for tensor, off in zip(b.tensors.values(), offsets):
        if ggml_backend_tensor_alloc(b.buf, (<Tensor>tensor).ptr, <void *>(base + <size_t>off)) != GGML_STATUS_SUCCESS:
            raise GGMLError("cannot place a tensor in host memory")


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


def _release_pages(mm, size_t data_offset, list infos):
    """The map's pages of tensors that were copied out (to a GPU, a repack buffer, or
    with --no-mmap) leave the process's resident memory: MADV_DONTNEED on a read-only
    file map drops them, and a later touch reads them back from the page cache. So a
    model offloaded to a GPU is not counted twice, as llama.cpp unmaps such ranges."""
    cdef size_t page = _mmap.PAGESIZE
    cdef size_t lo, hi
    for info in infos:
        lo = (data_offset + <size_t>info.offset) // page * page
        hi = data_offset + <size_t>info.offset + <size_t>info.nbytes
        if hi > lo:
            mm.madvise(_mmap.MADV_DONTNEED, lo, hi - lo)
