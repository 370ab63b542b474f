# Included by ggml.pyx: tensor types and op constants as Python sees them, and the module's error.

# Python-visible type ids (values of enum ggml_type).
F32 = GGML_TYPE_F32
F16 = GGML_TYPE_F16
Q8_0 = GGML_TYPE_Q8_0
Q4_0 = GGML_TYPE_Q4_0
Q4_1 = GGML_TYPE_Q4_1
Q5_0 = GGML_TYPE_Q5_0
Q5_1 = GGML_TYPE_Q5_1
IQ4_NL = GGML_TYPE_IQ4_NL
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

# llama.cpp's KV cache types (common/arg.cpp, kv_cache_types)
_TYPE_BY_NAME = {"f32": F32, "f16": F16, "bf16": BF16, "q8_0": Q8_0, "q4_0": Q4_0, "q4_1": Q4_1,
                 "iq4_nl": IQ4_NL, "q5_0": Q5_0, "q5_1": Q5_1}

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
