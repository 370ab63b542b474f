// Q5_K weights times a decode step's few activation rows, bit for bit as ggml's
// ggml_vec_dot_q5_K_q8_K (ggml-cpu/arch/x86/quants.c, its AVX2 code: the same in every
// x86 build), the kernel ggml runs for each row below the eight its tiled kernel takes.
// Q5_K is repacked on ARM only: on x86 this is the bulk of a Q5_K_M file's decode step.
//
// ggml keeps eight int32 lanes per weight row: lane L sums, over the eight 32-value
// chunks of a 256-value block, the products of values 4L..4L+3 (5-bit, 0..31) times the
// chunk's 6-bit scale; then one fused multiply-add per block, acc = fma(d_a * d_w,
// float(lane), acc). The chunks' mins meet the activations' block sums as one integer
// per block, added to a float of their own, summs += (-d_a * dmin_w) * that integer; the
// result is the horizontal sum of acc plus summs. The integers are exact whatever
// computes them, so here AVX512-VNNI builds the lanes two chunks at a time (one
// vpdpbusd per 64 weight values) and the float steps are ggml's, in ggml's order.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "hsum.h"
#include "matmul.h"
#include "q8k_rows.h"

typedef struct {          // ggml-common.h
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
} block_q5_K;

// the 12 packed bytes -> 8 six-bit scales, then 8 six-bit mins (ggml's unpacking)
static inline void scales_and_mins(const uint8_t packed[12], uint8_t out[16]) {
    const uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
    uint32_t utmp[4];
    memcpy(utmp, packed, 12);
    utmp[3] = ((utmp[2] >> 4) & kmask2) | (((utmp[1] >> 6) & kmask3) << 4);
    const uint32_t uaux = utmp[1] & kmask1;
    utmp[1] = (utmp[2] & kmask2) | (((utmp[0] >> 6) & kmask3) << 4);
    utmp[2] = uaux;
    utmp[0] &= kmask1;
    memcpy(out, utmp, 16);
}

Q8K_VNNI static float dot_row(int nb, const void * row, const block_q8_K * y) {
    const block_q5_K * x = row;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i one = _mm512_set1_epi8(1);
    // chunk 2j (low half): the 32 bytes' low nibbles and bit 2j of qh; chunk 2j + 1: high nibbles, bit 2j + 1
    const __m512i nibble_shift = _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0);
    const __m512i bit_base = _mm512_set_epi64(1, 1, 1, 1, 0, 0, 0, 0);
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.f;
    for (int i = 0; i < nb; i++) {
        const float d = y[i].d * _cvtsh_ss(x[i].d);
        const float dmin = -y[i].d * _cvtsh_ss(x[i].dmin);
        uint8_t sm[16];
        scales_and_mins(x[i].scales, sm);
        int32_t mins = 0;
        for (int c = 0; c < 8; c++) {
            mins += sm[8 + c] * (y[i].bsums[2 * c] + y[i].bsums[2 * c + 1]);
        }
        summs = fmaf(dmin, (float) mins, summs);     // ggml's `summs += dmin * mins`, which compilers fuse
        const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *) x[i].qh));
        __m512i sumi = _mm512_setzero_si512();
        for (int j = 0; j < QK_K / 64; j++) {
            const __m512i ql = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *) (x[i].qs + 32 * j)));
            const __m512i lo = _mm512_and_si512(_mm512_srlv_epi64(ql, nibble_shift), m4);
            const __m512i bit = _mm512_add_epi64(bit_base, _mm512_set1_epi64(2 * j));
            const __m512i hi = _mm512_slli_epi64(_mm512_and_si512(_mm512_srlv_epi64(qh, bit), one), 4);
            const __m512i a = _mm512_loadu_si512((const void *) (y[i].qs + 64 * j));
            const __m512i dots = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_or_si512(lo, hi), a);
            const __m512i scales = _mm512_inserti64x4(_mm512_set1_epi32(sm[2 * j]), _mm256_set1_epi32(sm[2 * j + 1]), 1);
            sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(dots, scales));
        }
        // both halves hold ggml's eight lanes
        const __m256i lanes = _mm256_add_epi32(_mm512_castsi512_si256(sumi), _mm512_extracti64x4_epi64(sumi, 1));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc);
    }
    return hsum_float_8(acc) + summs;
}

Q8K_DOT_OPS(q5_k, dot_row)
