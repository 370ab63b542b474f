// ggserve's own CPU matmul kernels, bit for bit as ggml's CPU mul_mat.
//
// Q4_1 weights x Q8_1 activations, any number of rows. ggml computes each output of
// such a product alone (ggml_vec_dot_q4_1_q8_1, one weight row against one
// activation row): per 32-value block it unpacks the weight's nibbles and converts
// four fp16 scales, so a batch of N rows repeats that work N times; llamafile's
// tiled kernels do not cover Q4_1. Here a tile of weight rows meets a tile of
// activation rows, the unpacking and conversions are shared across the tile, and
// every output still takes exactly the arithmetic of ggml's AVX2 kernel in the same
// order: per block one fused multiply-add of d_w*d_a into 8 float lanes of integer
// dot products, one fused m_w*s_a into a scalar, then ggml's horizontal sum plus
// that scalar. So the result is the same float, whatever the tiling, and prompts
// and verification steps take fewer cycles.
//
// Q8_0 weights x a few Q8_0 activation rows (a decode step's LM head, Q8_0 models'
// layers in decode steps): ggml_vec_dot_q8_0_q8_0's arithmetic, four weight rows at
// a time, two activation rows at a time. (More rows: llamafile's tiled kernel.)
//
// A decode step reads every weight once: for a few activation rows both kernels
// fetch the weights ahead of use, which ggml's row-at-a-time loop does not; that,
// more than the arithmetic, is what makes a decode step faster.
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "ggml-cpu.h"
#include "hsum.h"
#include "matmul.h"

#define QK 32

typedef struct { uint16_t d, m; uint8_t qs[QK / 2]; } block_q4_1;   // ggml's layout
typedef struct { uint16_t d, s; int8_t qs[QK]; } block_q8_1;
typedef struct { uint16_t d; int8_t qs[QK]; } block_q8_0;

#define TILE_ROWS 4        // weight rows of a tile
#define TILE_COLS 2        // activation rows: a tile's 4 x 2 scales fill one 8-float vector
#define PREFETCH_GROUPS 4  // a few rows' product fetches the weights this many row groups ahead
#define COL_BLOCK 64       // activation rows kept hot in cache while weight tiles pass

#define AVX2 __attribute__((target("avx2,fma,f16c")))

AVX2 static inline float fp16(uint16_t h) {
    return _cvtsh_ss(h);
}

// A tile's fp16 scales as floats, laid out as its lanes: per block 8 floats of d
// then 8 of m (weights) or s (activations); for weight rows lane i holds row
// i % TILE_ROWS, for activation rows column i / TILE_ROWS. One cache line a block.
typedef float tile_scales;
#define SCALES_PER_TILE(nb) ((size_t) (nb) * 16)

AVX2 static void row_tile_scales(tile_scales * t, int nb, const char * w, size_t w_stride) {
    for (int r = 0; r < TILE_ROWS; r++) {
        const block_q4_1 * x = (const block_q4_1 *) (w + r * w_stride);
        for (int ib = 0; ib < nb; ib++) {
            const float d = fp16(x[ib].d), m = fp16(x[ib].m);
            for (int i = r; i < 8; i += TILE_ROWS) {
                t[ib * 16 + i] = d;
                t[ib * 16 + 8 + i] = m;
            }
        }
    }
}

// columns past n_cols (a last, partial tile) get zero scales
AVX2 static void col_tile_scales(tile_scales * t, int nb, const char * y, size_t y_stride, int n_cols) {
    for (int c = 0; c < TILE_COLS; c++) {
        const block_q8_1 * b = (const block_q8_1 *) (y + c * y_stride);
        for (int ib = 0; ib < nb; ib++) {
            const float d = c < n_cols ? fp16(b[ib].d) : 0.0f, s = c < n_cols ? fp16(b[ib].s) : 0.0f;
            for (int i = c * TILE_ROWS; i < (c + 1) * TILE_ROWS; i++) {
                t[ib * 16 + i] = d;
                t[ib * 16 + 8 + i] = s;
            }
        }
    }
}

#define KERNEL(name) name##_avx2
#define TARGET AVX2
#define DOT4(qx, qy) _mm256_madd_epi16(_mm256_set1_epi16(1), _mm256_maddubs_epi16(qx, qy))
#include "matmul_isa.h"
#undef KERNEL
#undef TARGET
#undef DOT4

// AVX512-VNNI sums the four products in one instruction; same integers
#define KERNEL(name) name##_vnni
#define TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")))
#define DOT4(qx, qy) _mm256_dpbusd_epi32(_mm256_setzero_si256(), qx, qy)
#include "matmul_isa.h"
#undef KERNEL
#undef TARGET
#undef DOT4

// A single output (the tiles' leftovers), exactly as ggml_vec_dot_q4_1_q8_1
AVX2 static float dot(int nb, const block_q4_1 * x, const block_q8_1 * b) {
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    const __m256i low = _mm256_set1_epi8(0xF);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int ib = 0; ib < nb; ib++) {
        summs = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(fp16(x[ib].m)), _mm_set_ss(fp16(b[ib].s)), _mm_set_ss(summs)));
        const __m128i packed = _mm_loadu_si128((const __m128i *) x[ib].qs);
        const __m256i qx = _mm256_and_si256(low, _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed));
        const __m256i qy = _mm256_loadu_si256((const __m256i *) b[ib].qs);
        const __m256 xy = _mm256_cvtepi32_ps(_mm256_madd_epi16(ones, _mm256_maddubs_epi16(qx, qy)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16(x[ib].d) * fp16(b[ib].d)), xy, acc);
    }
    return hsum_float_8(acc) + summs;
}

// One Q8_0 output (the groups' leftovers), exactly as ggml_vec_dot_q8_0_q8_0
AVX2 static float dot_q8_0(int nb, const block_q8_0 * x, const block_q8_0 * y) {
    __m256 acc = _mm256_setzero_ps();
    for (int ib = 0; ib < nb; ib++) {
        const __m256i qx = _mm256_loadu_si256((const __m256i *) x[ib].qs);
        const __m256i qy = _mm256_loadu_si256((const __m256i *) y[ib].qs);
        const __m256i dot = _mm256_madd_epi16(_mm256_set1_epi16(1),
                                              _mm256_maddubs_epi16(_mm256_sign_epi8(qx, qx), _mm256_sign_epi8(qy, qx)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16(x[ib].d) * fp16(y[ib].d)), _mm256_cvtepi32_ps(dot), acc);
    }
    return hsum_float_8(acc);
}

static int vnni_allowed = 1;

static int has_vnni(void) {
    return vnni_allowed && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
}

int ggserve_matmul_isa(int allow_vnni) {
    vnni_allowed = allow_vnni;
    return has_vnni();
}

// Weight rows [m0, m1) past the last whole group, against activation rows [n0, n1):
// one output at a time.
AVX2 static void leftover_rows(int q8_0, int64_t m0, int64_t m1, int64_t n0, int64_t n1, int nb,
                               const char * w, size_t w_stride, const char * y, size_t y_stride,
                               float * out, size_t out_stride) {
    for (int64_t m = m0; m < m1; m++) {
        for (int64_t n = n0; n < n1; n++) {
            out[n * out_stride + m] = q8_0
                ? dot_q8_0(nb, (const block_q8_0 *) (w + m * w_stride), (const block_q8_0 *) (y + n * y_stride))
                : dot(nb, (const block_q4_1 *) (w + m * w_stride), (const block_q8_1 *) (y + n * y_stride));
        }
    }
}

// Rows [m0, m1) of the weights against activation rows [n0, n1) (n1 - n0 <= COL_BLOCK).
AVX2 static void rows_by_cols(int64_t m0, int64_t m1, int64_t n0, int64_t n1, int nb,
                              const char * w, size_t w_stride, const char * y, size_t y_stride,
                              float * out, size_t out_stride, tile_scales * ws, tile_scales * cs) {
    for (int64_t n = n0; n < n1; n += TILE_COLS) {
        col_tile_scales(cs + (n - n0) / TILE_COLS * SCALES_PER_TILE(nb), nb, y + n * y_stride, y_stride,
                        n1 - n < TILE_COLS ? (int) (n1 - n) : TILE_COLS);
    }
    const int64_t m_tiles_end = m0 + (m1 - m0) / TILE_ROWS * TILE_ROWS;
    if (has_vnni()) {
        tiles_vnni(m0, m_tiles_end, n0, n1, nb, w, w_stride, y, y_stride, out, out_stride, ws, cs);
    } else {
        tiles_avx2(m0, m_tiles_end, n0, n1, nb, w, w_stride, y, y_stride, out, out_stride, ws, cs);
    }
    leftover_rows(0, m_tiles_end, m1, n0, n1, nb, w, w_stride, y, y_stride, out, out_stride);
}

int ggserve_matmul_supported(void) {
    // ggml's Q4_1 and Q8_0 dot products are its AVX2 + FMA ones only where ggml was built so
    return ggml_cpu_has_avx2() && ggml_cpu_has_fma() && ggml_cpu_has_f16c()
        && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

// Weight rows [m0, m1) of a Q4_1 or Q8_0 matrix against N <= FEW_ROWS_MAX activation
// rows (quantized, q_row bytes apart): groups of TILE_ROWS by few_rows, the rest one
// by one. scratch: 2 * N * nb floats.
AVX2 static void few_rows(int q8_0, int64_t m0, int64_t m1, int nb, const char * w, size_t w_stride,
                          const char * y, size_t q_row, int64_t N, float * out, size_t out_stride, float * scratch) {
    float * yd = scratch, * ys = scratch + N * nb;
    for (int64_t n = 0; n < N; n++) {
        for (int ib = 0; ib < nb; ib++) {
            if (q8_0) {
                yd[n * nb + ib] = fp16(((const block_q8_0 *) (y + n * q_row))[ib].d);
            } else {
                yd[n * nb + ib] = fp16(((const block_q8_1 *) (y + n * q_row))[ib].d);
                ys[n * nb + ib] = fp16(((const block_q8_1 *) (y + n * q_row))[ib].s);
            }
        }
    }
    const int64_t m_groups_end = m0 + (m1 - m0) / TILE_ROWS * TILE_ROWS;
    if (has_vnni()) {
        few_rows_vnni(q8_0, m0, m_groups_end, nb, w, w_stride, y, q_row, yd, ys, N, out, out_stride);
    } else {
        few_rows_avx2(q8_0, m0, m_groups_end, nb, w, w_stride, y, q_row, yd, ys, N, out, out_stride);
    }
    leftover_rows(q8_0, m_groups_end, m1, 0, N, nb, w, w_stride, y, q_row, out, out_stride);
}

// This thread's weight rows [*m0, *m1) of M: whole groups of TILE_ROWS, split evenly.
static int thread_rows(int64_t M, int ith, int nth, int64_t * m0, int64_t * m1) {
    const int64_t groups = (M + TILE_ROWS - 1) / TILE_ROWS;
    const int64_t per_thread = (groups + nth - 1) / nth;
    *m0 = ith * per_thread * TILE_ROWS;
    *m1 = *m0 + per_thread * TILE_ROWS < M ? *m0 + per_thread * TILE_ROWS : M;
    return *m0 < *m1;
}

// x's rows quantized by ggml's own from_float for `type` into scratch (q_row bytes apart).
static void quantize_rows(enum ggml_type type, const struct ggml_tensor * x, int64_t k, size_t q_row, char * scratch) {
    const ggml_from_float_t quantize = ggml_get_type_traits_cpu(type)->from_float;
    for (int64_t n = 0; n < x->ne[1]; n++) {
        quantize((const float *) ((const char *) x->data + n * x->nb[1]), scratch + n * q_row, k);
    }
}

// A few F32 activation rows (N <= FEW_ROWS_MAX, a decode step's) against Q4_1 or Q8_0
// weights: this thread's weight rows. Each thread quantizes the rows itself, by ggml's
// own from_float (Q8_1 for Q4_1, Q8_0 for Q8_0), as ggml's mul_mat quantizes them: for
// so few rows a node of its own would cost more than it saves.
static void few_rows_op(struct ggml_tensor * dst, int ith, int nth, int q8_0) {
    const struct ggml_tensor * w = dst->src[0];
    const struct ggml_tensor * x = dst->src[1];
    const int64_t N = x->ne[1];
    const int nb = (int) (w->ne[0] / QK);
    int64_t m0, m1;
    if (!thread_rows(w->ne[1], ith, nth, &m0, &m1)) {
        return;
    }
    const size_t q_row = (size_t) nb * (q8_0 ? sizeof(block_q8_0) : sizeof(block_q8_1));
    const size_t q_bytes = (q_row * N + 63) & ~(size_t) 63;
    char * scratch = aligned_alloc(64, (q_bytes + 2 * N * nb * sizeof(float) + 63) & ~(size_t) 63);
    quantize_rows(q8_0 ? GGML_TYPE_Q8_0 : GGML_TYPE_Q8_1, x, w->ne[0], q_row, scratch);
    few_rows(q8_0, m0, m1, nb, (const char *) w->data, w->nb[1], scratch, q_row, N,
             (float *) dst->data, dst->nb[1] / sizeof(float), (float *) (scratch + q_bytes));
    free(scratch);
}

// The Q4_1 custom op: dst [M, N] f32 = src[0] (Q4_1 [K, M]) x src[1] ([K, N]: F32, a
// decode step's few rows, or Q8_1 as ggml's mul_mat quantizes them, by a node of their
// own). Threads split the weight rows in whole groups; more rows take the tiles, each
// thread walking its rows once per block of COL_BLOCK activation rows.
void ggserve_q4_1_matmul(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    (void) userdata;
    const struct ggml_tensor * w = dst->src[0];
    const struct ggml_tensor * x = dst->src[1];
    if (x->type == GGML_TYPE_F32) {
        few_rows_op(dst, ith, nth, 0);
        return;
    }
    const int nb = (int) (w->ne[0] / QK);
    int64_t m0, m1;
    if (!thread_rows(w->ne[1], ith, nth, &m0, &m1)) {
        return;
    }
    // scratch per call: the tiles' scales
    const size_t n_scales = SCALES_PER_TILE(nb) * (1 + COL_BLOCK / TILE_COLS);
    float * scales = aligned_alloc(64, n_scales * sizeof(float));
    for (int64_t n0 = 0; n0 < x->ne[1]; n0 += COL_BLOCK) {
        const int64_t n1 = n0 + COL_BLOCK < x->ne[1] ? n0 + COL_BLOCK : x->ne[1];
        rows_by_cols(m0, m1, n0, n1, nb, (const char *) w->data, w->nb[1], (const char *) x->data, x->nb[1],
                     (float *) dst->data, dst->nb[1] / sizeof(float), scales, scales + SCALES_PER_TILE(nb));
    }
    free(scales);
}

// The Q8_0 custom op: dst [M, N] f32 = src[0] (Q8_0 [K, M]) x src[1] (F32 [K, N],
// N <= FEW_ROWS_MAX).
void ggserve_q8_0_matmul(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    (void) userdata;
    few_rows_op(dst, ith, nth, 1);
}
