# Declarations of the gguf C API (gguf.h) that ggserve uses.
from libc.stdint cimport int64_t, uint32_t, uint64_t, int8_t, uint8_t, int16_t, uint16_t, int32_t
from libc.stddef cimport size_t
from libcpp cimport bool as cbool


cdef extern from "ggml.h":
    struct ggml_context


cdef extern from "gguf.h":
    enum gguf_type:
        GGUF_TYPE_UINT8, GGUF_TYPE_INT8, GGUF_TYPE_UINT16, GGUF_TYPE_INT16,
        GGUF_TYPE_UINT32, GGUF_TYPE_INT32, GGUF_TYPE_FLOAT32, GGUF_TYPE_BOOL,
        GGUF_TYPE_STRING, GGUF_TYPE_ARRAY, GGUF_TYPE_UINT64, GGUF_TYPE_INT64,
        GGUF_TYPE_FLOAT64

    struct gguf_context

    struct gguf_init_params:
        cbool no_alloc
        ggml_context ** ctx

    gguf_context * gguf_init_from_file(const char * fname, gguf_init_params params)
    void gguf_free(gguf_context * ctx)

    uint32_t gguf_get_version(const gguf_context * ctx)
    size_t gguf_get_alignment(const gguf_context * ctx)
    size_t gguf_get_data_offset(const gguf_context * ctx)

    int64_t gguf_get_n_kv(const gguf_context * ctx)
    int64_t gguf_find_key(const gguf_context * ctx, const char * key)
    const char * gguf_get_key(const gguf_context * ctx, int64_t key_id)
    gguf_type gguf_get_kv_type(const gguf_context * ctx, int64_t key_id)
    gguf_type gguf_get_arr_type(const gguf_context * ctx, int64_t key_id)

    uint8_t gguf_get_val_u8(const gguf_context * ctx, int64_t key_id)
    int8_t gguf_get_val_i8(const gguf_context * ctx, int64_t key_id)
    uint16_t gguf_get_val_u16(const gguf_context * ctx, int64_t key_id)
    int16_t gguf_get_val_i16(const gguf_context * ctx, int64_t key_id)
    uint32_t gguf_get_val_u32(const gguf_context * ctx, int64_t key_id)
    int32_t gguf_get_val_i32(const gguf_context * ctx, int64_t key_id)
    float gguf_get_val_f32(const gguf_context * ctx, int64_t key_id)
    uint64_t gguf_get_val_u64(const gguf_context * ctx, int64_t key_id)
    int64_t gguf_get_val_i64(const gguf_context * ctx, int64_t key_id)
    double gguf_get_val_f64(const gguf_context * ctx, int64_t key_id)
    cbool gguf_get_val_bool(const gguf_context * ctx, int64_t key_id)
    const char * gguf_get_val_str(const gguf_context * ctx, int64_t key_id)
    size_t gguf_get_arr_n(const gguf_context * ctx, int64_t key_id)
    const void * gguf_get_arr_data(const gguf_context * ctx, int64_t key_id)
    const char * gguf_get_arr_str(const gguf_context * ctx, int64_t key_id, size_t i)

    int64_t gguf_get_n_tensors(const gguf_context * ctx)
    int64_t gguf_find_tensor(const gguf_context * ctx, const char * name)
    size_t gguf_get_tensor_offset(const gguf_context * ctx, int64_t tensor_id)
    const char * gguf_get_tensor_name(const gguf_context * ctx, int64_t tensor_id)
    const int64_t * gguf_get_tensor_ne(const gguf_context * ctx, int64_t tensor_id)
    int gguf_get_tensor_type(const gguf_context * ctx, int64_t tensor_id)
    size_t gguf_get_tensor_size(const gguf_context * ctx, int64_t tensor_id)
