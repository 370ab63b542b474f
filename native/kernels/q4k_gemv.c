// Q4_K weights repacked by ggml's CPU backend (block_q4_Kx8: eight rows interleaved)
// times a decode step's few activation rows, bit for bit as ggml's
// ggml_gemv_q4_K_8x8_q8_K (ggml-cpu/arch/x86/repack.cpp), the kernel ggml runs for
// every row of such a product below four rows.
//
// ggml's kernel gets each weight row's integer dot products per 32-value sub-block
// through a chain of byte shuffles and blends (its layout pairs rows 0-3 with 4-7) and
// 16-bit multiply-adds, then per 256-value super-block one fused multiply-add in
// float: acc = fma(float(isum), d_w * d_a, acc), the same for the mins' sum with
// dmin, and out = acc - acc_min. The integers are exact whatever computes them (no
// 16-bit sum of ggml's can saturate: at most 16 products of 15 x 128), so here
// AVX512-VNNI computes them straight from the interleaved bytes (one vpdpbusd per 64
// bytes of weights and nibble half) and the float steps are ggml's, in ggml's order,
// per row. A decode step is bound by how fast the weights stream; ggml's kernel is
// bound by its shuffles before that.
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "ggml-cpu.h"
#include "matmul.h"

#define QK_K 256
#define ROWS 8            // weight rows interleaved in a block_q4_Kx8

typedef struct {          // ggml-cpu/repack.h
    uint16_t d[ROWS];
    uint16_t dmin[ROWS];
    uint8_t scales[96];   // per 64 values of the eight rows: 12 bytes of 6-bit scales and mins, twice
    uint8_t qs[QK_K * ROWS / 2];
} block_q4_Kx8;

typedef struct {          // ggml-common.h
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];
} block_q8_K;

#define VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

int ggserve_q4_k_gemv_supported(void) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
        && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")
        && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("f16c")
        && __builtin_cpu_supports("fma");
}

// The 6-bit scales (out[0..7]) and mins (out[8..15]) of one 32-value sub-block of the
// eight rows, from its 12 packed bytes, as ggml unpacks them (the utmp steps).
static inline void unpack_scales(const uint8_t * packed, uint8_t out[16]) {
    const uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
    uint32_t u[4];
    memcpy(u, packed, 12);
    u[3] = ((u[2] >> 4) & kmask2) | (((u[1] >> 6) & kmask3) << 4);
    const uint32_t aux = u[1] & kmask1;
    u[1] = (u[2] & kmask2) | (((u[0] >> 6) & kmask3) << 4);
    u[2] = aux;
    u[0] &= kmask1;
    memcpy(out, u, 16);
}

// The outputs of weight row groups [g0, g1) (ROWS rows each) for one activation row.
VNNI static void gemv_rows(int64_t g0, int64_t g1, int nb, const block_q4_Kx8 * w, const block_q8_K * a, float * out) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int64_t g = g0; g < g1; g++) {
        const block_q4_Kx8 * b = w + g * nb;
        __m256 acc = _mm256_setzero_ps(), acc_min = _mm256_setzero_ps();
        for (int ib = 0; ib < nb; ib++) {
            if (ib + 1 < nb) {
                for (int line = 0; line < (int) sizeof(block_q4_Kx8); line += 64) {
                    _mm_prefetch((const char *) &b[ib + 1] + line, _MM_HINT_T0);
                }
            }
            // 16 lanes: lane 2r + h holds row r's products of values 4h..4h+3 of each 8
            __m512i isum = _mm512_setzero_si512();
            __m256i imin = _mm256_setzero_si256();
            for (int sb = 0; sb < QK_K / 64; sb++) {
                uint8_t lo_sm[16], hi_sm[16];      // sub-blocks 2sb (low nibbles), 2sb + 1 (high)
                unpack_scales(b[ib].scales + 24 * sb, lo_sm);
                unpack_scales(b[ib].scales + 24 * sb + 12, hi_sm);
                __m512i dot_lo = _mm512_setzero_si512(), dot_hi = _mm512_setzero_si512();
                for (int k8 = 0; k8 < 4; k8++) {
                    // 64 bytes: rows 0..7, 8 bytes each, values 8k8..8k8+7 of both sub-blocks
                    const __m512i q = _mm512_loadu_si512((const void *) (b[ib].qs + sb * 256 + k8 * 64));
                    int64_t a_lo, a_hi;
                    memcpy(&a_lo, a[ib].qs + sb * 64 + k8 * 8, 8);
                    memcpy(&a_hi, a[ib].qs + sb * 64 + 32 + k8 * 8, 8);
                    dot_lo = _mm512_dpbusd_epi32(dot_lo, _mm512_and_si512(q, low), _mm512_set1_epi64(a_lo));
                    dot_hi = _mm512_dpbusd_epi32(dot_hi, _mm512_and_si512(_mm512_srli_epi16(q, 4), low),
                                                 _mm512_set1_epi64(a_hi));
                }
                // each row's two lanes take its sub-block scale
                const __m512i s_lo = _mm512_cvtepu8_epi32(_mm_shuffle_epi8(
                    _mm_loadl_epi64((const __m128i *) lo_sm), _mm_set_epi8(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0)));
                const __m512i s_hi = _mm512_cvtepu8_epi32(_mm_shuffle_epi8(
                    _mm_loadl_epi64((const __m128i *) hi_sm), _mm_set_epi8(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0)));
                isum = _mm512_add_epi32(isum, _mm512_add_epi32(_mm512_mullo_epi32(dot_lo, s_lo),
                                                               _mm512_mullo_epi32(dot_hi, s_hi)));
                // the mins against the activations' sums of these two sub-blocks
                const int32_t bs_lo = a[ib].bsums[4 * sb] + a[ib].bsums[4 * sb + 1];
                const int32_t bs_hi = a[ib].bsums[4 * sb + 2] + a[ib].bsums[4 * sb + 3];
                const __m256i m_lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *) (lo_sm + 8)));
                const __m256i m_hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *) (hi_sm + 8)));
                imin = _mm256_add_epi32(imin, _mm256_add_epi32(_mm256_mullo_epi32(m_lo, _mm256_set1_epi32(bs_lo)),
                                                               _mm256_mullo_epi32(m_hi, _mm256_set1_epi32(bs_hi))));
            }
            // a row's two lanes summed: rows 0..7 in order
            const __m256i irow = _mm512_cvtepi64_epi32(_mm512_add_epi64(
                _mm512_and_si512(isum, _mm512_set1_epi64(0xFFFFFFFF)), _mm512_srli_epi64(isum, 32)));
            const __m256 ad = _mm256_set1_ps(a[ib].d);
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) b[ib].d));
            const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) b[ib].dmin));
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(irow), _mm256_mul_ps(d, ad), acc);
            acc_min = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), _mm256_mul_ps(dmin, ad), acc_min);
        }
        _mm256_storeu_ps(out + g * ROWS, _mm256_sub_ps(acc, acc_min));
    }
}

// The custom op: dst [M, N] f32 = userdata (Q4_K [K, M], repacked as block_q4_Kx8) x
// src[0] (F32 [K, N], N < 4). Each thread quantizes the rows to Q8_K itself, by ggml's
// own from_float as ggml's mul_mat does, then takes an even share of the row groups.
void ggserve_q4_k_gemv(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    const struct ggml_tensor * w = (const struct ggml_tensor *) userdata;
    const struct ggml_tensor * x = dst->src[0];
    const int64_t K = w->ne[0], groups = w->ne[1] / ROWS;
    const int nb = (int) (K / QK_K);
    const int64_t per_thread = (groups + nth - 1) / nth;
    const int64_t g0 = ith * per_thread, g1 = g0 + per_thread < groups ? g0 + per_thread : groups;
    if (g0 >= g1) {
        return;
    }
    block_q8_K * q = aligned_alloc(64, ((size_t) nb * sizeof(block_q8_K) + 63) & ~(size_t) 63);
    const ggml_from_float_t quantize = ggml_get_type_traits_cpu(GGML_TYPE_Q8_K)->from_float;
    for (int64_t n = 0; n < x->ne[1]; n++) {
        quantize((const float *) ((const char *) x->data + n * x->nb[1]), q, K);
        gemv_rows(g0, g1, nb, (const block_q4_Kx8 *) w->data, q, (float *) ((char *) dst->data + n * dst->nb[1]));
    }
    free(q);
}
