// Q4_1 x Q8_1 products for batches of rows, bit for bit as ggml's CPU mul_mat (q4_1_matmul.c).
#pragma once
#include "ggml.h"

// nonzero where ggml's own Q4_1 kernel is its AVX2 + FMA one and this CPU runs it
int ggserve_q4_1_matmul_supported(void);
// allow_vnni 0: the AVX2 copy even where AVX512-VNNI runs (tests reach both);
// returns whether the VNNI copy is in use
int ggserve_q4_1_matmul_isa(int allow_vnni);
// a ggml_custom_4d op: dst [M, N] f32 = src[0] (Q4_1 [K, M]) x src[1] (Q8_1 [K, N])
void ggserve_q4_1_matmul(struct ggml_tensor * dst, int ith, int nth, void * userdata);
