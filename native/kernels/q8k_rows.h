// The op around a vec_dot kernel of ggserve's own (q6k_dot.c, iq4xs_dot.c): weights of
// a k-quant-sized block type times a decode step's few f32 rows, which ggml computes
// one vec_dot per (weight row, activation row) against the rows quantized to Q8_K.
#pragma once
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

#include "ggml.h"
#include "ggml-cpu.h"

#define QK_K 256

typedef struct {          // ggml-common.h
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];
} block_q8_K;

// one weight row (nb blocks) dotted with one Q8_K row, as ggml's vec_dot
typedef float (*q8k_row_dot)(int nb, const void * w_row, const block_q8_K * y);

// dst [M, N] f32 = src[0] ([K, M], block type) x src[1] (F32 [K, N]). Each thread quantizes
// the rows to Q8_K itself, by ggml's own from_float as ggml's mul_mat does, then takes an
// even share of the weight rows; each weight row meets every activation row while it is
// in cache. Inlined into each kernel's op, so `dot` is a direct call.
static inline void q8k_rows_product(struct ggml_tensor * dst, int ith, int nth, q8k_row_dot dot) {
    const struct ggml_tensor * w = dst->src[0];
    const struct ggml_tensor * x = dst->src[1];
    const int64_t K = w->ne[0], M = w->ne[1], N = x->ne[1];
    const int nb = (int) (K / QK_K);
    const int64_t per_thread = (M + nth - 1) / nth;
    const int64_t m0 = ith * per_thread, m1 = m0 + per_thread < M ? m0 + per_thread : M;
    if (m0 >= m1) {
        return;
    }
    block_q8_K * q = aligned_alloc(64, ((size_t) N * nb * sizeof(block_q8_K) + 63) & ~(size_t) 63);
    const ggml_from_float_t quantize = ggml_get_type_traits_cpu(GGML_TYPE_Q8_K)->from_float;
    for (int64_t n = 0; n < N; n++) {
        quantize((const float *) ((const char *) x->data + n * x->nb[1]), q + n * nb, K);
    }
    const size_t row_bytes = w->nb[1];
    for (int64_t m = m0; m < m1; m++) {
        const char * row = (const char *) w->data + m * row_bytes;
        if (m + 1 < m1) {
            for (size_t line = 0; line < row_bytes; line += 64) {
                _mm_prefetch(row + row_bytes + line, _MM_HINT_T0);
            }
        }
        for (int64_t n = 0; n < N; n++) {
            ((float *) ((char *) dst->data + n * dst->nb[1]))[m] = dot(nb, row, q + n * nb);
        }
    }
    free(q);
}

// what the VNNI kernels need of the CPU
static inline int q8k_vnni_supported(void) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
        && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")
        && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("f16c")
        && __builtin_cpu_supports("fma");
}

#define Q8K_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

// The same for ggml_mul_mat_id: dst [M, n_used, T] f32, dst[m, j, t] = expert ids[j, t]
// (src[0]: [K, M, n_expert]) row m times src[1] ([K, n_x, T] f32, n_x 1 or n_used) row
// j % n_x of token t. ggml computes each such output by one vec_dot against that row
// quantized to Q8_K while an expert has fewer than 8 rows (T <= Q8K_DOT_ROWS_MAX).
// Each thread quantizes every row, then takes an even share of the weight rows of
// every expert chosen; an expert's row meets all the rows that chose it in turn.
static inline void q8k_experts_product(struct ggml_tensor * dst, int ith, int nth, q8k_row_dot dot) {
    const struct ggml_tensor * w = dst->src[0];
    const struct ggml_tensor * x = dst->src[1];
    const struct ggml_tensor * ids = dst->src[2];
    const int64_t K = w->ne[0], M = w->ne[1], n_x = x->ne[1], T = x->ne[2], n_used = ids->ne[0];
    const int nb = (int) (K / QK_K);
    const int64_t per_thread = (M + nth - 1) / nth;
    const int64_t m0 = ith * per_thread, m1 = m0 + per_thread < M ? m0 + per_thread : M;
    if (m0 >= m1) {
        return;
    }
    block_q8_K * q = aligned_alloc(64, ((size_t) n_x * T * nb * sizeof(block_q8_K) + 63) & ~(size_t) 63);
    const ggml_from_float_t quantize = ggml_get_type_traits_cpu(GGML_TYPE_Q8_K)->from_float;
    for (int64_t t = 0; t < T; t++) {
        for (int64_t i = 0; i < n_x; i++) {
            quantize((const float *) ((const char *) x->data + t * x->nb[2] + i * x->nb[1]), q + (t * n_x + i) * nb, K);
        }
    }
    // pair p = (slot j, token t) = (p % n_used, p / n_used) chose expert chose[p]
    const int64_t n_pairs = n_used * T;
    int32_t * chose = malloc((size_t) n_pairs * sizeof(int32_t));
    for (int64_t p = 0; p < n_pairs; p++) {
        chose[p] = *(const int32_t *) ((const char *) ids->data + (p / n_used) * ids->nb[1] + (p % n_used) * ids->nb[0]);
    }
    for (int64_t p = 0; p < n_pairs; p++) {
        const int32_t e = chose[p];
        int64_t seen = 0;              // each expert once, at the first pair that chose it
        while (seen < p && chose[seen] != e) {
            seen++;
        }
        if (seen < p) {
            continue;
        }
        const char * expert = (const char *) w->data + e * w->nb[2];
        for (int64_t m = m0; m < m1; m++) {
            const char * row = expert + m * w->nb[1];
            for (int64_t p2 = p; p2 < n_pairs; p2++) {
                if (chose[p2] == e) {
                    const int64_t j = p2 % n_used, t = p2 / n_used;
                    float * out = (float *) ((char *) dst->data + t * dst->nb[2] + j * dst->nb[1]);
                    out[m] = dot(nb, row, q + (t * n_x + j % n_x) * nb);
                }
            }
        }
    }
    free(chose);
    free(q);
}

// A kernel's entry points (matmul.h), from its row dot product:
// ggserve_<name>_dot_supported, ggserve_<name>_dot (mul_mat), ggserve_<name>_dot_id (mul_mat_id)
#define Q8K_DOT_OPS(name, dot)                                                                   \
    int ggserve_##name##_dot_supported(void) { return q8k_vnni_supported(); }                    \
    void ggserve_##name##_dot(struct ggml_tensor * dst, int ith, int nth, void * userdata) {     \
        (void) userdata;                                                                         \
        q8k_rows_product(dst, ith, nth, dot);                                                    \
    }                                                                                            \
    void ggserve_##name##_dot_id(struct ggml_tensor * dst, int ith, int nth, void * userdata) {  \
        (void) userdata;                                                                         \
        q8k_experts_product(dst, ith, nth, dot);                                                 \
    }
