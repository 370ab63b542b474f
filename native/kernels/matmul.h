// ggserve's own CPU matmul kernels, bit for bit as ggml's CPU mul_mat (matmul.c).
#pragma once
#include "ggml.h"

// nonzero where ggml's own Q4_1 and Q8_0 kernels are its AVX2 + FMA ones and this CPU runs them
int ggserve_matmul_supported(void);
// allow_vnni 0: the AVX2 copies even where AVX512-VNNI runs (tests reach both);
// returns whether the VNNI copies are in use
int ggserve_matmul_isa(int allow_vnni);
// ggml_custom_4d ops:
// dst [M, N] f32 = src[0] (Q4_1 [K, M]) x src[1] ([K, N], Q8_1, or F32 for N <= FEW_ROWS_MAX)
void ggserve_q4_1_matmul(struct ggml_tensor * dst, int ith, int nth, void * userdata);
// dst [M, N] f32 = src[0] (Q8_0 [K, M]) x src[1] (F32 [K, N], N <= FEW_ROWS_MAX)
void ggserve_q8_0_matmul(struct ggml_tensor * dst, int ith, int nth, void * userdata);

// a decode step's rows: quantized inside the op, the weights streamed once
#define FEW_ROWS_MAX 16

// ggml computes products of fewer than 8 rows by k-quant-sized weights (not repacked)
// one vec_dot per row against the rows quantized to Q8_K (q8k_rows.h): ggserve's
// kernels take those, for Q5_K (q5k_dot.c), Q6_K (q6k_dot.c) and IQ4_XS (iq4xs_dot.c). They need
// AVX512-VNNI (the _supported functions).
#define Q8K_DOT_ROWS_MAX 7
// dst [M, N] f32 = src[0] (Q5_K [K, M]) x src[1] (F32 [K, N], N <= Q8K_DOT_ROWS_MAX)
int ggserve_q5_k_dot_supported(void);
void ggserve_q5_k_dot(struct ggml_tensor * dst, int ith, int nth, void * userdata);
// dst [M, N] f32 = src[0] (Q6_K [K, M]) x src[1] (F32 [K, N], N <= Q8K_DOT_ROWS_MAX)
int ggserve_q6_k_dot_supported(void);
void ggserve_q6_k_dot(struct ggml_tensor * dst, int ith, int nth, void * userdata);
// dst [M, N] f32 = src[0] (IQ4_XS [K, M]) x src[1] (F32 [K, N], N <= Q8K_DOT_ROWS_MAX)
int ggserve_iq4_xs_dot_supported(void);
void ggserve_iq4_xs_dot(struct ggml_tensor * dst, int ith, int nth, void * userdata);
// the same kernels for ggml_mul_mat_id's expert products of up to Q8K_DOT_ROWS_MAX tokens:
// dst [M, n_used, T] f32 from src[0] (experts [K, M, n_expert]), src[1] (F32 [K, 1 or n_used, T]),
// src[2] (I32 ids [n_used, T])
void ggserve_q5_k_dot_id(struct ggml_tensor * dst, int ith, int nth, void * userdata);
void ggserve_q6_k_dot_id(struct ggml_tensor * dst, int ith, int nth, void * userdata);
void ggserve_iq4_xs_dot_id(struct ggml_tensor * dst, int ith, int nth, void * userdata);
