# Declarations of the ggml, ggml-backend and ggml-cpu C API that ggserve uses.
from libc.stdint cimport int32_t, int64_t, uint8_t
from libc.stddef cimport size_t
from libcpp cimport bool as cbool


cdef extern from "ggml.h":
    enum: GGML_MAX_DIMS

    enum ggml_type:
        GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0,
        GGML_TYPE_Q5_1, GGML_TYPE_Q8_0, GGML_TYPE_I32, GGML_TYPE_I64, GGML_TYPE_BF16,
        GGML_TYPE_IQ4_NL, GGML_TYPE_Q8_1, GGML_TYPE_Q6_K, GGML_TYPE_IQ4_XS, GGML_TYPE_Q5_K

    enum ggml_op_hint:
        GGML_HINT_NONE, GGML_HINT_SRC0_IS_HADAMARD

    enum ggml_prec:
        GGML_PREC_DEFAULT, GGML_PREC_F32

    enum ggml_status:
        GGML_STATUS_ALLOC_FAILED, GGML_STATUS_FAILED, GGML_STATUS_SUCCESS, GGML_STATUS_ABORTED

    enum ggml_sort_order:
        GGML_SORT_ORDER_ASC, GGML_SORT_ORDER_DESC

    enum ggml_op_pool:
        GGML_OP_POOL_MAX, GGML_OP_POOL_AVG

    enum ggml_scale_mode:
        GGML_SCALE_MODE_NEAREST, GGML_SCALE_MODE_BILINEAR, GGML_SCALE_MODE_BICUBIC

    struct ggml_context
    struct ggml_cgraph
    struct ggml_backend_buffer

    struct ggml_tensor:
        ggml_type type
        ggml_backend_buffer * buffer
        int64_t ne[4]
        size_t nb[4]
        void * data
        char name[64]

    struct ggml_init_params:
        size_t mem_size
        void * mem_buffer
        cbool no_alloc

    enum ggml_log_level:
        GGML_LOG_LEVEL_NONE, GGML_LOG_LEVEL_DEBUG, GGML_LOG_LEVEL_INFO,
        GGML_LOG_LEVEL_WARN, GGML_LOG_LEVEL_ERROR, GGML_LOG_LEVEL_CONT
    ctypedef void (*ggml_log_callback)(ggml_log_level level, const char * text, void * user_data) noexcept nogil
    void ggml_log_set(ggml_log_callback log_callback, void * user_data)

    ggml_context * ggml_init(ggml_init_params params)
    void ggml_free(ggml_context * ctx)
    size_t ggml_tensor_overhead()
    size_t ggml_graph_overhead_custom(size_t size, cbool grads)

    const char * ggml_type_name(ggml_type type)
    size_t ggml_type_size(ggml_type type)
    int64_t ggml_blck_size(ggml_type type)
    size_t ggml_row_size(ggml_type type, int64_t ne)
    size_t ggml_nbytes(const ggml_tensor * tensor) nogil
    int64_t ggml_nelements(const ggml_tensor * tensor)
    cbool ggml_is_contiguous(const ggml_tensor * tensor)
    int ggml_n_dims(const ggml_tensor * tensor)

    ggml_tensor * ggml_new_tensor(ggml_context * ctx, ggml_type type, int n_dims, const int64_t * ne)
    ggml_tensor * ggml_new_tensor_1d(ggml_context * ctx, ggml_type type, int64_t ne0)
    ggml_tensor * ggml_new_tensor_2d(ggml_context * ctx, ggml_type type, int64_t ne0, int64_t ne1)
    ggml_tensor * ggml_new_tensor_3d(ggml_context * ctx, ggml_type type, int64_t ne0, int64_t ne1, int64_t ne2)
    ggml_tensor * ggml_set_name(ggml_tensor * tensor, const char * name)
    void ggml_set_input(ggml_tensor * tensor)
    void ggml_set_output(ggml_tensor * tensor)

    ggml_cgraph * ggml_new_graph_custom(ggml_context * ctx, size_t size, cbool grads)
    void ggml_build_forward_expand(ggml_cgraph * cgraph, ggml_tensor * tensor)
    int ggml_graph_n_nodes(ggml_cgraph * cgraph)
    ggml_tensor * ggml_graph_node(ggml_cgraph * cgraph, int i)
    const char * ggml_op_desc(const ggml_tensor * t)
    const char * ggml_get_name(const ggml_tensor * tensor)

    ggml_tensor * ggml_dup(ggml_context * ctx, ggml_tensor * a)
    ggml_tensor * ggml_add(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b)
    ggml_tensor * ggml_sub(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b)
    ggml_tensor * ggml_mul(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b)
    ggml_tensor * ggml_div(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b)
    ggml_tensor * ggml_scale(ggml_context * ctx, ggml_tensor * a, float s)
    ggml_tensor * ggml_scale_bias(ggml_context * ctx, ggml_tensor * a, float s, float b)
    ggml_tensor * ggml_sqr(ggml_context * ctx, ggml_tensor * a)
    ggml_tensor * ggml_sqrt(ggml_context * ctx, ggml_tensor * a)
    ggml_tensor * ggml_tanh(ggml_context * ctx, ggml_tensor * a)
    ggml_tensor * ggml_gelu(ggml_context * ctx, ggml_tensor * a)
    ggml_tensor * ggml_gelu_erf(ggml_context * ctx, ggml_tensor * a)
    ggml_tensor * ggml_gelu_quick(ggml_context * ctx, ggml_tensor * a)
    ggml_tensor * ggml_silu(ggml_context * ctx, ggml_tensor * a)
    ggml_tensor * ggml_relu(ggml_context * ctx, ggml_tensor * a)
    ggml_tensor * ggml_swiglu_split(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b)
    ggml_tensor * ggml_geglu_split(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b)
    ggml_tensor * ggml_norm(ggml_context * ctx, ggml_tensor * a, float eps)
    ggml_tensor * ggml_rms_norm(ggml_context * ctx, ggml_tensor * a, float eps)
    ggml_tensor * ggml_mul_mat(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b)
    void ggml_mul_mat_set_prec(ggml_tensor * a, ggml_prec prec)
    void ggml_mul_mat_set_hint(ggml_tensor * a, ggml_op_hint hint)
    ggml_tensor * ggml_cpy(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b)
    ggml_tensor * ggml_cast(ggml_context * ctx, ggml_tensor * a, ggml_type type)
    ggml_tensor * ggml_cont(ggml_context * ctx, ggml_tensor * a)
    ggml_tensor * ggml_reshape_1d(ggml_context * ctx, ggml_tensor * a, int64_t ne0)
    ggml_tensor * ggml_reshape_2d(ggml_context * ctx, ggml_tensor * a, int64_t ne0, int64_t ne1)
    ggml_tensor * ggml_reshape_3d(ggml_context * ctx, ggml_tensor * a, int64_t ne0, int64_t ne1, int64_t ne2)
    ggml_tensor * ggml_reshape_4d(ggml_context * ctx, ggml_tensor * a, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3)
    ggml_tensor * ggml_view_1d(ggml_context * ctx, ggml_tensor * a, int64_t ne0, size_t offset)
    ggml_tensor * ggml_view_2d(ggml_context * ctx, ggml_tensor * a, int64_t ne0, int64_t ne1, size_t nb1, size_t offset)
    ggml_tensor * ggml_view_3d(ggml_context * ctx, ggml_tensor * a, int64_t ne0, int64_t ne1, int64_t ne2, size_t nb1, size_t nb2, size_t offset)
    ggml_tensor * ggml_view_4d(ggml_context * ctx, ggml_tensor * a, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3, size_t nb1, size_t nb2, size_t nb3, size_t offset)
    ggml_tensor * ggml_permute(ggml_context * ctx, ggml_tensor * a, int axis0, int axis1, int axis2, int axis3)
    ggml_tensor * ggml_transpose(ggml_context * ctx, ggml_tensor * a)
    ggml_tensor * ggml_get_rows(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b)
    ggml_tensor * ggml_set_rows(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b, ggml_tensor * c)
    ggml_tensor * ggml_concat(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b, int dim)
    ggml_tensor * ggml_pad(ggml_context * ctx, ggml_tensor * a, int p0, int p1, int p2, int p3)
    ggml_tensor * ggml_soft_max_ext(ggml_context * ctx, ggml_tensor * a, ggml_tensor * mask, float scale, float max_bias)
    ggml_tensor * ggml_rope_ext(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b, ggml_tensor * c,
                                int n_dims, int mode, int n_ctx_orig, float freq_base, float freq_scale,
                                float ext_factor, float attn_factor, float beta_fast, float beta_slow)
    ggml_tensor * ggml_flash_attn_ext(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
                                      ggml_tensor * mask, float scale, float max_bias, float logit_softcap)
    void ggml_flash_attn_ext_set_prec(ggml_tensor * a, ggml_prec prec)
    ggml_tensor * ggml_conv_2d(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b, int s0, int s1, int p0, int p1, int d0, int d1)
    ggml_tensor * ggml_pool_2d(ggml_context * ctx, ggml_tensor * a, ggml_op_pool op, int k0, int k1, int s0, int s1, float p0, float p1)
    # vision projectors: 2D RoPE halves (pixtral), unfold (mistral3 patch merger), sinusoids (minicpmv)
    ggml_tensor * ggml_rope_set_offset(ggml_tensor * a, int n_offs)
    ggml_tensor * ggml_im2col(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b, int s0, int s1, int p0, int p1,
                              int d0, int d1, bint is_2D, ggml_type dst_type)
    ggml_tensor * ggml_sin(ggml_context * ctx, ggml_tensor * a)
    ggml_tensor * ggml_cos(ggml_context * ctx, ggml_tensor * a)
    ggml_tensor * ggml_interpolate(ggml_context * ctx, ggml_tensor * a, int64_t ne0, int64_t ne1, int64_t ne2,
                                  int64_t ne3, unsigned int mode)
    ggml_tensor * ggml_argmax(ggml_context * ctx, ggml_tensor * a)
    # mixture of experts, attention sinks
    ggml_tensor * ggml_mul_mat_id(ggml_context * ctx, ggml_tensor * as_, ggml_tensor * b, ggml_tensor * ids)
    ggml_tensor * ggml_add_id(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b, ggml_tensor * ids)
    ggml_tensor * ggml_argsort_top_k(ggml_context * ctx, ggml_tensor * a, int k)
    ggml_tensor * ggml_sigmoid(ggml_context * ctx, ggml_tensor * a)
    ggml_tensor * ggml_sum_rows(ggml_context * ctx, ggml_tensor * a)
    ggml_tensor * ggml_clamp(ggml_context * ctx, ggml_tensor * a, float min, float max)
    ggml_tensor * ggml_swiglu_oai(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b, float alpha, float limit)
    ggml_tensor * ggml_repeat_4d(ggml_context * ctx, ggml_tensor * a, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3)
    void ggml_flash_attn_ext_add_sinks(ggml_tensor * a, ggml_tensor * sinks)
    # recurrent layers (gated delta net, Mamba-2), M-RoPE
    ggml_tensor * ggml_softplus(ggml_context * ctx, ggml_tensor * a)
    ggml_tensor * ggml_ssm_conv(ggml_context * ctx, ggml_tensor * sx, ggml_tensor * c)
    ggml_tensor * ggml_ssm_scan(ggml_context * ctx, ggml_tensor * s, ggml_tensor * x, ggml_tensor * dt,
                                ggml_tensor * A, ggml_tensor * B, ggml_tensor * C, ggml_tensor * ids, int64_t K)
    ggml_tensor * ggml_gated_delta_net(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
                                       ggml_tensor * g, ggml_tensor * beta, ggml_tensor * state, int64_t K)
    ggml_tensor * ggml_rope_multi(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b, ggml_tensor * c,
                                  int n_dims, int * sections, int mode, int n_ctx_orig, float freq_base,
                                  float freq_scale, float ext_factor, float attn_factor, float beta_fast,
                                  float beta_slow)


cdef extern from "ggml-backend.h":
    ctypedef struct ggml_backend_buffer_type:
        pass
    ctypedef ggml_backend_buffer_type * ggml_backend_buffer_type_t
    ctypedef ggml_backend_buffer * ggml_backend_buffer_t
    ctypedef struct ggml_backend:
        pass
    ctypedef ggml_backend * ggml_backend_t
    ctypedef struct ggml_backend_device:
        pass
    ctypedef ggml_backend_device * ggml_backend_dev_t
    ctypedef struct ggml_backend_reg:
        pass
    ctypedef ggml_backend_reg * ggml_backend_reg_t
    ctypedef struct ggml_backend_sched:
        pass
    ctypedef ggml_backend_sched * ggml_backend_sched_t

    enum:
        GGML_BACKEND_DEVICE_TYPE_CPU, GGML_BACKEND_DEVICE_TYPE_GPU,
        GGML_BACKEND_DEVICE_TYPE_IGPU, GGML_BACKEND_DEVICE_TYPE_ACCEL

    enum ggml_backend_buffer_usage:
        GGML_BACKEND_BUFFER_USAGE_ANY, GGML_BACKEND_BUFFER_USAGE_WEIGHTS, GGML_BACKEND_BUFFER_USAGE_COMPUTE

    const char * ggml_backend_buft_name(ggml_backend_buffer_type_t buft)
    ggml_backend_buffer_t ggml_backend_buft_alloc_buffer(ggml_backend_buffer_type_t buft, size_t size)
    size_t ggml_backend_buft_get_alignment(ggml_backend_buffer_type_t buft)
    size_t ggml_backend_buft_get_alloc_size(ggml_backend_buffer_type_t buft, const ggml_tensor * tensor)
    cbool ggml_backend_buft_is_host(ggml_backend_buffer_type_t buft)

    void ggml_backend_buffer_free(ggml_backend_buffer_t buffer)
    void * ggml_backend_buffer_get_base(ggml_backend_buffer_t buffer)
    size_t ggml_backend_buffer_get_size(ggml_backend_buffer_t buffer)
    void ggml_backend_buffer_clear(ggml_backend_buffer_t buffer, uint8_t value) nogil
    cbool ggml_backend_buffer_is_host(ggml_backend_buffer_t buffer)
    void ggml_backend_buffer_set_usage(ggml_backend_buffer_t buffer, ggml_backend_buffer_usage usage)

    const char * ggml_backend_name(ggml_backend_t backend)
    void ggml_backend_free(ggml_backend_t backend)
    ggml_backend_dev_t ggml_backend_get_device(ggml_backend_t backend)
    void ggml_backend_tensor_set(ggml_tensor * tensor, const void * data, size_t offset, size_t size) nogil
    void ggml_backend_tensor_get(const ggml_tensor * tensor, void * data, size_t offset, size_t size) nogil
    void ggml_backend_tensor_copy(const ggml_tensor * src, ggml_tensor * dst) nogil
    ggml_status ggml_backend_tensor_alloc(ggml_backend_buffer_t buffer, ggml_tensor * tensor, void * addr)

    const char * ggml_backend_dev_name(ggml_backend_dev_t device)
    const char * ggml_backend_dev_description(ggml_backend_dev_t device)
    void ggml_backend_dev_memory(ggml_backend_dev_t device, size_t * free, size_t * total) nogil
    int ggml_backend_dev_type(ggml_backend_dev_t device)
    ggml_backend_reg_t ggml_backend_dev_backend_reg(ggml_backend_dev_t device)
    ggml_backend_t ggml_backend_dev_init(ggml_backend_dev_t device, const char * params)
    ggml_backend_buffer_type_t ggml_backend_dev_buffer_type(ggml_backend_dev_t device)
    void * ggml_backend_reg_get_proc_address(ggml_backend_reg_t reg, const char * name)
    cbool ggml_backend_dev_supports_op(ggml_backend_dev_t device, const ggml_tensor * op)

    size_t ggml_backend_dev_count()
    ggml_backend_dev_t ggml_backend_dev_by_name(const char * name)
    ggml_backend_reg_t ggml_backend_reg_by_name(const char * name)
    size_t ggml_backend_reg_dev_count(ggml_backend_reg_t reg)
    ggml_backend_dev_t ggml_backend_reg_dev_get(ggml_backend_reg_t reg, size_t index)
    ggml_backend_dev_t ggml_backend_dev_get(size_t index)
    void ggml_backend_load_all()

    ggml_backend_sched_t ggml_backend_sched_new(ggml_backend_t * backends, ggml_backend_buffer_type_t * bufts,
                                                int n_backends, size_t graph_size, cbool parallel, cbool op_offload)
    void ggml_backend_sched_free(ggml_backend_sched_t sched)
    cbool ggml_backend_sched_reserve(ggml_backend_sched_t sched, ggml_cgraph * measure_graph) nogil
    size_t ggml_backend_sched_get_buffer_size(ggml_backend_sched_t sched, ggml_backend_t backend)
    int ggml_backend_sched_get_n_splits(ggml_backend_sched_t sched)
    cbool ggml_backend_sched_alloc_graph(ggml_backend_sched_t sched, ggml_cgraph * graph) nogil
    ggml_status ggml_backend_sched_graph_compute(ggml_backend_sched_t sched, ggml_cgraph * graph) nogil
    void ggml_backend_sched_reset(ggml_backend_sched_t sched) nogil

    ggml_backend_buffer_t ggml_backend_cpu_buffer_from_ptr(void * ptr, size_t size)
    ggml_backend_buffer_type_t ggml_backend_cpu_buffer_type()


cdef extern from "ggml-alloc.h":
    ggml_backend_buffer_t ggml_backend_alloc_ctx_tensors_from_buft(ggml_context * ctx, ggml_backend_buffer_type_t buft)


cdef extern from "ggml.h":
    cdef struct ggml_threadpool:
        pass
    cdef struct ggml_threadpool_params:
        int n_threads
    void ggml_threadpool_params_init(ggml_threadpool_params * p, int n_threads)


cdef extern from "ggml-cpu.h":
    void ggml_backend_cpu_set_n_threads(ggml_backend_t backend_cpu, int n_threads)
    ggml_threadpool * ggml_threadpool_new(ggml_threadpool_params * params)
    void ggml_threadpool_free(ggml_threadpool * threadpool)
    void ggml_backend_cpu_set_threadpool(ggml_backend_t backend_cpu, ggml_threadpool * threadpool)


cdef extern from "ggml.h":
    ctypedef void (*ggml_abort_callback_t)(const char * error_message) noexcept nogil
    ggml_abort_callback_t ggml_set_abort_callback(ggml_abort_callback_t callback)


cdef extern from "ggml.h":
    enum: GGML_N_TASKS_MAX
    ctypedef void (*ggml_custom_op_t)(ggml_tensor * dst, int ith, int nth, void * userdata) noexcept nogil
    ggml_tensor * ggml_custom_4d(ggml_context * ctx, ggml_type type, int64_t ne0, int64_t ne1, int64_t ne2,
                                 int64_t ne3, ggml_tensor ** args, int n_args, ggml_custom_op_t fun,
                                 int n_tasks, void * userdata)


cdef extern from "matmul.h":
    # ggserve's own CPU kernels (native/kernels/matmul.c), compiled into the ggml extension
    int ggserve_matmul_supported()
    int ggserve_matmul_isa(int allow_vnni)
    void ggserve_q4_1_matmul(ggml_tensor * dst, int ith, int nth, void * userdata) noexcept nogil
    void ggserve_q8_0_matmul(ggml_tensor * dst, int ith, int nth, void * userdata) noexcept nogil
    # Q5_K, Q6_K and IQ4_XS weights times a decode step's rows (native/kernels/q5k_dot.c, q6k_dot.c, iq4xs_dot.c)
    int ggserve_q5_k_dot_supported()
    void ggserve_q5_k_dot(ggml_tensor * dst, int ith, int nth, void * userdata) noexcept nogil
    int ggserve_q6_k_dot_supported()
    void ggserve_q6_k_dot(ggml_tensor * dst, int ith, int nth, void * userdata) noexcept nogil
    int ggserve_iq4_xs_dot_supported()
    void ggserve_iq4_xs_dot(ggml_tensor * dst, int ith, int nth, void * userdata) noexcept nogil
    void ggserve_q5_k_dot_id(ggml_tensor * dst, int ith, int nth, void * userdata) noexcept nogil
    void ggserve_q6_k_dot_id(ggml_tensor * dst, int ith, int nth, void * userdata) noexcept nogil
    void ggserve_iq4_xs_dot_id(ggml_tensor * dst, int ith, int nth, void * userdata) noexcept nogil
    enum: Q8K_DOT_ROWS_MAX
    enum: FEW_ROWS_MAX


cdef extern from "ggml-rpc.h":
    # the protocol this ggml speaks (its functions are reached through the registry)
    enum: RPC_PROTO_MAJOR_VERSION, RPC_PROTO_MINOR_VERSION
