// Q6_K weights times a decode step's few activation rows, bit for bit as ggml's
// ggml_vec_dot_q6_K_q8_K (ggml-cpu/arch/x86/quants.c, its AVX2 code: the same in every
// x86 build), the kernel ggml runs for each row below the eight its tiled kernel takes.
// Q6_K is not repacked on x86, so this is the Q6_K of a Q4_K_M file's LM head and of
// half its ffn_down and attn_v matrices in every decode step.
//
// ggml keeps eight int32 lanes per weight row: lane L sums, over the eight 32-value
// chunks of a 256-value block, the products of bytes 4L..4L+3 times the chunk half's
// scale, less 32 x the activations' block sums times the scales; then one fused
// multiply-add per block, acc = fma(d_a * d_w, float(lane), acc), and at the end its
// horizontal sum. Those lane integers are exact whatever computes them, so here
// AVX512-VNNI builds them two chunks at a time (one vpdpbusd per 64 weight values,
// lane for lane the same sums) and the float steps are ggml's, in ggml's order.
#include <immintrin.h>
#include <stdint.h>

#include "hsum.h"
#include "matmul.h"
#include "q8k_rows.h"

typedef struct {          // ggml-common.h
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    uint16_t d;
} block_q6_K;

Q8K_VNNI static float dot_row(int nb, const void * row, const block_q8_K * y) {
    const block_q6_K * x = row;
    // two chunks in a 512-bit vector: the low half takes the first's high bits
    // (qh bits 0-1 or 4-5), the high half the second's (bits 2-3 or 6-7)
    const __m512i m15 = _mm512_set1_epi8(15);
    const __m512i mask_a = _mm512_inserti64x4(_mm512_set1_epi8(0x03), _mm256_set1_epi8(0x0C), 1);
    const __m512i mask_b = _mm512_inserti64x4(_mm512_set1_epi8(0x30), _mm256_set1_epi8((char) 0xC0), 1);
    const __m512i shift_a = _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4);      // << 4 low, << 2 high
    const __m512i shift_b = _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0);      // >> 0 low, >> 2 high
    // the chunk halves' scales, lane by lane: 4 lanes (16 bytes) a scale
    const __m128i spread_a = _mm_set_epi8(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < nb; i++) {
        const float d = y[i].d * _cvtsh_ss(x[i].d);
        const __m128i scales = _mm_loadu_si128((const __m128i *) x[i].scales);
        const __m256i q8sums = _mm256_loadu_si256((const __m256i *) y[i].bsums);
        const __m256i q8sclsub = _mm256_slli_epi32(_mm256_madd_epi16(q8sums, _mm256_cvtepi8_epi16(scales)), 5);
        __m512i sumi = _mm512_setzero_si512();
        for (int j = 0; j < QK_K / 128; j++) {
            const __m512i ql = _mm512_loadu_si512((const void *) (x[i].ql + 64 * j));
            const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *) (x[i].qh + 32 * j)));
            // values 0-31 | 32-63 of these 128, then 64-95 | 96-127
            const __m512i q_a = _mm512_or_si512(_mm512_and_si512(ql, m15),
                                                _mm512_sllv_epi64(_mm512_and_si512(qh, mask_a), shift_a));
            const __m512i q_b = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m15),
                                                _mm512_srlv_epi64(_mm512_and_si512(qh, mask_b), shift_b));
            const __m512i y_a = _mm512_loadu_si512((const void *) (y[i].qs + 128 * j));
            const __m512i y_b = _mm512_loadu_si512((const void *) (y[i].qs + 128 * j + 64));
            const __m512i s_a = _mm512_cvtepi8_epi32(_mm_shuffle_epi8(scales, _mm_add_epi8(spread_a, _mm_set1_epi8((char) (8 * j)))));
            const __m512i s_b = _mm512_cvtepi8_epi32(_mm_shuffle_epi8(scales, _mm_add_epi8(spread_a, _mm_set1_epi8((char) (8 * j + 4)))));
            sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), q_a, y_a), s_a));
            sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), q_b, y_b), s_b));
        }
        // both halves hold ggml's eight lanes
        const __m256i lanes = _mm256_sub_epi32(_mm256_add_epi32(_mm512_castsi512_si256(sumi),
                                                                _mm512_extracti64x4_epi64(sumi, 1)), q8sclsub);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc);
    }
    return hsum_float_8(acc);
}

Q8K_DOT_OPS(q6_k, dot_row)
