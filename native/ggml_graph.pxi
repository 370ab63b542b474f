# Included by ggml.pyx: the graph under construction and its ops (one extension module).

# products of at most this many rows (a decode step's) quantize their activations
# inside ggserve's kernels; Q8_0 products of more rows stay with ggml
CPU_KERNEL_FEW_ROWS = FEW_ROWS_MAX


cdef bint _q5_k_dot_ok = ggserve_q5_k_dot_supported() != 0
cdef bint _q6_k_dot_ok = ggserve_q6_k_dot_supported() != 0
cdef bint _iq4_xs_dot_ok = ggserve_iq4_xs_dot_supported() != 0


cdef bint _own_kernel_takes(ggml_tensor * w, ggml_tensor * x):
    """Does one of ggserve's kernels take mul_mat(w, x): f32 rows times weights in host
    memory (not on a device): Q4_1 with any number of rows, Q8_0 with a decode step's
    few (more go to llamafile's tiled kernel, which ggml has for Q8_0), Q5_K, Q6_K and IQ4_XS
    with the rows ggml's vec_dot computes (from 8 its tiled kernel takes them)."""
    if x.type != GGML_TYPE_F32 or x.nb[0] != 4 or w.ne[2] != 1 or w.ne[3] != 1 or x.ne[2] != 1 or x.ne[3] != 1:
        return False
    if w.buffer == NULL or not ggml_backend_buffer_is_host(w.buffer):
        return False
    return (w.type == GGML_TYPE_Q4_1 or (w.type == GGML_TYPE_Q8_0 and x.ne[1] <= FEW_ROWS_MAX)
            or (x.ne[1] <= Q8K_DOT_ROWS_MAX and ((_q5_k_dot_ok and w.type == GGML_TYPE_Q5_K)
                                                  or (_q6_k_dot_ok and w.type == GGML_TYPE_Q6_K)
                                                  or (_iq4_xs_dot_ok and w.type == GGML_TYPE_IQ4_XS))))


cdef void * _own_expert_kernel(ggml_tensor * w, ggml_tensor * x, ggml_tensor * ids):
    """ggserve's kernel for mul_mat_id(w, x, ids), or NULL: Q5_K, Q6_K and IQ4_XS expert
    stacks in host memory times at most Q8K_DOT_ROWS_MAX tokens, where ggml computes
    every expert's rows by vec_dot (from 8 rows of one expert its tiled kernel takes them)."""
    if x.type != GGML_TYPE_F32 or x.nb[0] != 4 or x.ne[3] != 1 or w.ne[3] != 1 or ids.type != GGML_TYPE_I32:
        return NULL
    if x.ne[2] > Q8K_DOT_ROWS_MAX or w.buffer == NULL or not ggml_backend_buffer_is_host(w.buffer):
        return NULL
    if _q5_k_dot_ok and w.type == GGML_TYPE_Q5_K:
        return <void *> ggserve_q5_k_dot_id
    if _q6_k_dot_ok and w.type == GGML_TYPE_Q6_K:
        return <void *> ggserve_q6_k_dot_id
    if _iq4_xs_dot_ok and w.type == GGML_TYPE_IQ4_XS:
        return <void *> ggserve_iq4_xs_dot_id
    return NULL


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
    cdef readonly bint cpu_kernels   # some products of weights in host memory by ggserve's kernels

    def __cinit__(self, int max_nodes=16384, bint cpu_kernels=False):
        cdef ggml_init_params p
        self.max_nodes = max_nodes
        self.cpu_kernels = cpu_kernels
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

    def mul_mat(self, Tensor w, Tensor x, bint f32_precision=False, bint hadamard=False):
        """w: [k, m], x: [k, n] -> [m, n]. hadamard: w is a Walsh-Hadamard matrix (the
        CPU backend then runs a fast transform, as llama.cpp's quantized KV rotation)."""
        if self.cpu_kernels and _own_kernel_takes(w.ptr, x.ptr):
            return self._t(self._own_mul_mat(w.ptr, x.ptr))
        cdef ggml_tensor * r = ggml_mul_mat(self.ctx, w.ptr, x.ptr)
        if f32_precision:
            ggml_mul_mat_set_prec(r, GGML_PREC_F32)
        if hadamard:
            ggml_mul_mat_set_hint(r, GGML_HINT_SRC0_IS_HADAMARD)
        return self._t(r)

    cdef ggml_tensor * _own_mul_mat(self, ggml_tensor * w, ggml_tensor * x):
        """mul_mat(w, x) by native/kernels/ (matmul.c, q5k_dot.c, q6k_dot.c, iq4xs_dot.c): the same floats as ggml's. A Q4_1
        product's x is quantized to Q8_1 as ggml's mul_mat quantizes it: by a node of
        its own (all threads share the work) or, for a decode step's few rows, by each
        thread inside the op (one barrier fewer); a Q8_0 product's few rows, inside the op."""
        cdef ggml_tensor * args[2]
        args[0] = w
        args[1] = x
        if w.type == GGML_TYPE_Q8_0:
            return ggml_custom_4d(self.ctx, GGML_TYPE_F32, w.ne[1], x.ne[1], 1, 1, args, 2,
                                  ggserve_q8_0_matmul, GGML_N_TASKS_MAX, NULL)
        if w.type == GGML_TYPE_Q5_K:
            return ggml_custom_4d(self.ctx, GGML_TYPE_F32, w.ne[1], x.ne[1], 1, 1, args, 2,
                                  ggserve_q5_k_dot, GGML_N_TASKS_MAX, NULL)
        if w.type == GGML_TYPE_Q6_K:
            return ggml_custom_4d(self.ctx, GGML_TYPE_F32, w.ne[1], x.ne[1], 1, 1, args, 2,
                                  ggserve_q6_k_dot, GGML_N_TASKS_MAX, NULL)
        if w.type == GGML_TYPE_IQ4_XS:
            return ggml_custom_4d(self.ctx, GGML_TYPE_F32, w.ne[1], x.ne[1], 1, 1, args, 2,
                                  ggserve_iq4_xs_dot, GGML_N_TASKS_MAX, NULL)

        if x.ne[1] > FEW_ROWS_MAX:
            # a cast, not a copy into a new tensor: that tensor would be a graph leaf, which
            # ggml's allocator keeps for the whole graph (one per product: 80 MiB of SmolLM2's
            # compute buffer); the cast is a node, freed after its product as llama.cpp's are
            args[1] = ggml_cast(self.ctx, x, GGML_TYPE_Q8_1)
        return ggml_custom_4d(self.ctx, GGML_TYPE_F32, w.ne[1], x.ne[1], 1, 1, args, 2,
                              ggserve_q4_1_matmul, GGML_N_TASKS_MAX, NULL)

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
        cdef ggml_tensor * args[3]
        cdef void * kernel = _own_expert_kernel(experts.ptr, x.ptr, ids.ptr) if self.cpu_kernels else NULL
        if kernel != NULL:
            args[0], args[1], args[2] = experts.ptr, x.ptr, ids.ptr
            return self._t(ggml_custom_4d(self.ctx, GGML_TYPE_F32, experts.ptr.ne[1], ids.ptr.ne[0], x.ptr.ne[2], 1,
                                          args, 3, <ggml_custom_op_t> kernel, GGML_N_TASKS_MAX, NULL))
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

    # -- recurrent layers (gated delta net, Mamba-2), M-RoPE ------------------------

    def softplus(self, Tensor a): return self._t(ggml_softplus(self.ctx, a.ptr))

    def ssm_conv(self, Tensor sx, Tensor c):
        """Depthwise causal convolution: sx [d_conv - 1 + n_tokens, channels, n_seqs]
        (the previous d_conv - 1 inputs, then the new ones), c [d_conv, channels]
        -> [channels, n_tokens, n_seqs]."""
        return self._t(ggml_ssm_conv(self.ctx, sx.ptr, c.ptr))

    def ssm_scan(self, Tensor s, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, Tensor ids):
        """Mamba-2's selective scan: states s [d_state, head_dim, n_head, n_rows] (the
        sequences' rows picked by ids, i32 [n_seqs]), x [head_dim, n_head, n_tokens, n_seqs],
        dt [n_head, n_tokens, n_seqs], A [1, n_head], B and C [d_state, n_group, n_tokens,
        n_seqs] -> f32 holding y (as x) followed by the final states [d_state, head_dim,
        n_head, n_seqs]."""
        return self._t(ggml_ssm_scan(self.ctx, s.ptr, x.ptr, dt.ptr, A.ptr, B.ptr, C.ptr, ids.ptr, 1))

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
