// IQ4_XS weights times a decode step's few activation rows, bit for bit as ggml's
// ggml_vec_dot_iq4_xs_q8_K (ggml-cpu/arch/x86/quants.c, its AVX2 code: the same in every
// x86 build), the kernel ggml runs for each row below the eight its tiled kernel takes.
// IQ4_XS is not repacked on x86: every product of an IQ4_XS file's decode step.
//
// ggml keeps eight int32 lanes per weight row: lane L sums, over the eight 32-value
// sub-blocks of a 256-value block, the products of values 4L..4L+3 (each weight a
// 4-bit index into kvalues_iq4nl) times the sub-block's 6-bit scale less 32; then one
// fused multiply-add per block, acc = fma(d_w * d_a, float(lane), acc), and at the end
// its horizontal sum. Those lane integers are exact whatever computes them, so here
// AVX512-VNNI builds them two sub-blocks at a time: the table gives each weight
// shifted by 128 (unsigned, for vpdpbusd), and a second vpdpbusd of 128 times the
// activations takes the shift back out, lane for lane the same sums. The float steps
// are ggml's, in ggml's order.
#include <immintrin.h>
#include <stdint.h>

#include "hsum.h"
#include "matmul.h"
#include "q8k_rows.h"

typedef struct {          // ggml-common.h
    uint16_t d;
    uint16_t scales_h;
    uint8_t scales_l[QK_K / 64];
    uint8_t qs[QK_K / 2];
} block_iq4_xs;

// ggml's kvalues_iq4nl (ggml-common.h) + 128
static const uint8_t kvalues_iq4nl_u8[16] = {1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241};

Q8K_VNNI static float dot_row(int nb, const void * row, const block_q8_K * y) {
    const block_iq4_xs * x = row;
    const __m512i table = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *) kvalues_iq4nl_u8));
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i c128 = _mm512_set1_epi8((char) 128);
    // a sub-block's 32 values: 16 low nibbles, then the same 16 bytes' high nibbles
    const __m512i nibble_shift = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < nb; i++) {
        const float d = _cvtsh_ss(x[i].d) * y[i].d;
        __m512i sumi = _mm512_setzero_si512();
        for (int j = 0; j < QK_K / 64; j++) {       // sub-blocks 2j (low half) and 2j + 1
            const int b = 2 * j;
            const int ls_a = ((x[i].scales_l[j] & 0xf) | (((x[i].scales_h >> (2 * b)) & 3) << 4)) - 32;
            const int ls_b = ((x[i].scales_l[j] >> 4) | (((x[i].scales_h >> (2 * b + 2)) & 3) << 4)) - 32;
            const __m512i qs = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *) (x[i].qs + 32 * j)));
            const __m512i idx = _mm512_and_si512(
                _mm512_srlv_epi64(_mm512_shuffle_i64x2(qs, qs, _MM_SHUFFLE(1, 1, 0, 0)), nibble_shift), m4);
            const __m512i w = _mm512_shuffle_epi8(table, idx);
            const __m512i a = _mm512_loadu_si512((const void *) (y[i].qs + 64 * j));
            const __m512i dots = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w, a),
                                                  _mm512_dpbusd_epi32(_mm512_setzero_si512(), c128, a));
            const __m512i scales = _mm512_inserti64x4(_mm512_set1_epi32(ls_a), _mm256_set1_epi32(ls_b), 1);
            sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(dots, scales));
        }
        // both halves hold ggml's eight lanes
        const __m256i lanes = _mm256_add_epi32(_mm512_castsi512_si256(sumi), _mm512_extracti64x4_epi64(sumi, 1));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc);
    }
    return hsum_float_8(acc);
}

Q8K_DOT_OPS(iq4_xs, dot_row)
