// ggml's hsum_float_8 (ggml-cpu/arch/x86/quants.c), operation for operation: the last
// step of its AVX2 dot products, which ggserve's kernels reproduce bit for bit.
#pragma once
#include <immintrin.h>

__attribute__((target("avx2,fma,f16c"))) static inline float hsum_float_8(__m256 x) {
    __m128 res = _mm256_extractf128_ps(x, 1);
    res = _mm_add_ps(res, _mm256_castps256_ps128(x));
    res = _mm_add_ps(res, _mm_movehl_ps(res, res));
    res = _mm_add_ss(res, _mm_movehdup_ps(res));
    return _mm_cvtss_f32(res);
}
