// The kernels' loops, included by matmul.c once per instruction set:
// KERNEL(name) names this copy's functions, TARGET its target attribute, and
// DOT4(qx, qy) its integer dot products of four byte pairs per 32-bit lane
// (u8 weights x s8 activations; exact, so every copy gives the same floats).

// 32 nibbles -> 32 bytes, low nibbles first (ggml's bytes_from_nibbles_32): the 16
// bytes in both halves, the upper half shifted right by 4, both masked
TARGET static inline __m256i KERNEL(unpack)(const uint8_t * qs) {
    const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *) qs));
    return _mm256_and_si256(_mm256_srlv_epi64(both, _mm256_set_epi64x(4, 4, 0, 0)), _mm256_set1_epi8(0xF));
}
#define unpack_nibbles KERNEL(unpack)

// One tile: TILE_ROWS weight rows (w, w_stride bytes apart) by TILE_COLS activation
// rows (y, y_stride apart) over nb blocks; lane c * TILE_ROWS + r of the scale
// vectors belongs to output (r, c); out[c * out_stride + r] for c < C.
TARGET static inline __attribute__((always_inline)) void KERNEL(tile)(
        const int C, int nb, const char * w, size_t w_stride, const tile_scales * ws,
        const char * y, size_t y_stride, const tile_scales * ys, float * out, size_t out_stride) {
    __m256 acc[TILE_ROWS][TILE_COLS];
    for (int r = 0; r < TILE_ROWS; r++) {
        for (int c = 0; c < C; c++) {
            acc[r][c] = _mm256_setzero_ps();
        }
    }
    __m256 summs = _mm256_setzero_ps();
    for (int ib = 0; ib < nb; ib++) {
        // d_w * d_a as ggml's vmulss, m_w * s_a + summs as its vfmadd231ss: lane by lane
        const float * wb = ws + ib * 16, * yb = ys + ib * 16;
        const __m256 scale = _mm256_mul_ps(_mm256_load_ps(wb), _mm256_load_ps(yb));
        summs = _mm256_fmadd_ps(_mm256_load_ps(wb + 8), _mm256_load_ps(yb + 8), summs);
        for (int r = 0; r < TILE_ROWS; r++) {
            const __m256i qx = unpack_nibbles(((const block_q4_1 *) (w + r * w_stride) + ib)->qs);
            for (int c = 0; c < C; c++) {
                const block_q8_1 * b = (const block_q8_1 *) (y + c * y_stride) + ib;
                const __m256i qy = _mm256_loadu_si256((const __m256i *) b->qs);
                const __m256 xy = _mm256_cvtepi32_ps(DOT4(qx, qy));
                const __m256 s = _mm256_permutevar8x32_ps(scale, _mm256_set1_epi32(c * TILE_ROWS + r));
                acc[r][c] = _mm256_fmadd_ps(s, xy, acc[r][c]);
            }
        }
    }
    float sm[8];
    _mm256_storeu_ps(sm, summs);
    for (int r = 0; r < TILE_ROWS; r++) {
        for (int c = 0; c < C; c++) {
            out[c * out_stride + r] = hsum_float_8(acc[r][c]) + sm[c * TILE_ROWS + r];
        }
    }
}

// Whole row tiles of [m0, m1) against activation rows [n0, n1), given their scales.
TARGET static void KERNEL(tiles)(int64_t m0, int64_t m1, int64_t n0, int64_t n1, int nb,
                                 const char * w, size_t w_stride, const char * y, size_t y_stride,
                                 float * out, size_t out_stride, tile_scales * ws, const tile_scales * cs) {
    for (int64_t m = m0; m < m1; m += TILE_ROWS) {
        const char * wm = w + m * w_stride;
        row_tile_scales(ws, nb, wm, w_stride);
        int64_t n = n0;
        // constant shapes let the compiler keep a tile in registers
        for (; n + TILE_COLS <= n1; n += TILE_COLS) {
            KERNEL(tile)(TILE_COLS, nb, wm, w_stride, ws, y + n * y_stride, y_stride,
                         cs + (n - n0) / TILE_COLS * SCALES_PER_TILE(nb), out + n * out_stride + m, out_stride);
        }
        if (n < n1) {   // an odd activation row left: a tile of one column
            KERNEL(tile)(1, nb, wm, w_stride, ws, y + n * y_stride, y_stride,
                         cs + (n - n0) / TILE_COLS * SCALES_PER_TILE(nb), out + n * out_stride + m, out_stride);
        }
    }
}

// A few activation rows against whole groups of TILE_ROWS weight rows [m0, m1): the
// products of a decode step (one row per stream, a verified draft's rows). Weights
// stream from memory once, fetched PREFETCH_GROUPS groups ahead (the group's rows lie
// one after the other); one or two activation rows at a time meet a group. The
// group's fp16 scales convert together, one 32-bit load a row (lane 2r: the row's d,
// lane 2r + 1: its m for Q4_1, two quants for Q8_0, unused).
//
// A group's per-block work both types share. Its TILE_ROWS rows' first 4 bytes of
// block ib (fp16 d, then m or two quants) as 8 floats: lane 2r holds row r's d.
TARGET static inline __m256 KERNEL(group_scales)(const char * const * rows, int ib, size_t block_bytes) {
    int32_t bits[TILE_ROWS];
    for (int r = 0; r < TILE_ROWS; r++) {
        memcpy(&bits[r], rows[r] + ib * block_bytes, sizeof(int32_t));
    }
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) bits));
}

// The weights PREFETCH_GROUPS groups ahead (prefetch; NULL: none): a group is nb *
// TILE_ROWS blocks one after the other, so as many bytes an iteration as four blocks
// (80 for Q4_1, 136 for Q8_0: up to three cache lines). __builtin_prefetch, not
// _mm_prefetch: GCC 12 silently drops the latter from these target() functions.
TARGET static inline void KERNEL(fetch_ahead)(const char * prefetch, int ib, size_t block_bytes) {
    if (prefetch != NULL) {
        const char * p = prefetch + (size_t) ib * TILE_ROWS * block_bytes;
        __builtin_prefetch(p, 0, 3);
        __builtin_prefetch(p + 64, 0, 3);
        if (TILE_ROWS * block_bytes > 128) {
            __builtin_prefetch(p + 128, 0, 3);
        }
    }
}

// Q4_1 x Q8_1, per output ggml_vec_dot_q4_1_q8_1's arithmetic. C activation rows at
// y (y_stride apart, scales as floats yd[c * nb + ib] and ys) against one group.
TARGET static inline __attribute__((always_inline)) void KERNEL(group_q4_1)(
        const int C, int nb, const char * const * rows, const char * prefetch,
        const char * y, size_t y_stride, const float * yd, const float * ys, float * out, size_t out_stride) {
    const block_q4_1 * x[TILE_ROWS];
    for (int r = 0; r < TILE_ROWS; r++) {
        x[r] = (const block_q4_1 *) rows[r];
    }
    __m256 acc[TILE_ROWS][2], summs[2];
    for (int c = 0; c < C; c++) {
        summs[c] = _mm256_setzero_ps();          // odd lanes: the rows' m_w * s_a sums
        for (int r = 0; r < TILE_ROWS; r++) {
            acc[r][c] = _mm256_setzero_ps();
        }
    }
    for (int ib = 0; ib < nb; ib++) {
        KERNEL(fetch_ahead)(prefetch, ib, sizeof(block_q4_1));
        const __m256 dm = KERNEL(group_scales)(rows, ib, sizeof(block_q4_1));    // lane 2r + 1: m
        __m256 scale[2];
        __m256i qy[2];
        for (int c = 0; c < C; c++) {
            scale[c] = _mm256_mul_ps(dm, _mm256_set1_ps(yd[c * nb + ib]));   // lane 2r: d_w * d_a
            summs[c] = _mm256_fmadd_ps(dm, _mm256_set1_ps(ys[c * nb + ib]), summs[c]);
            qy[c] = _mm256_loadu_si256((const __m256i *) ((const block_q8_1 *) (y + c * y_stride) + ib)->qs);
        }
        for (int r = 0; r < TILE_ROWS; r++) {
            const __m256i qx = unpack_nibbles(x[r][ib].qs);
            for (int c = 0; c < C; c++) {
                const __m256 xy = _mm256_cvtepi32_ps(DOT4(qx, qy[c]));
                acc[r][c] = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(scale[c], _mm256_set1_epi32(2 * r)), xy, acc[r][c]);
            }
        }
    }
    for (int c = 0; c < C; c++) {
        float sm[8];
        _mm256_storeu_ps(sm, summs[c]);
        for (int r = 0; r < TILE_ROWS; r++) {
            out[c * out_stride + r] = hsum_float_8(acc[r][c]) + sm[2 * r + 1];
        }
    }
}

// Q8_0 x Q8_0, per output ggml_vec_dot_q8_0_q8_0's arithmetic: per block |x| times y
// signed as x (ggml's mul_sum_i8_pairs_float; no pair can saturate, q8_0 holds
// -127..127), scaled by d_w * d_a into 8 float lanes, then ggml's horizontal sum.
TARGET static inline __attribute__((always_inline)) void KERNEL(group_q8_0)(
        const int C, int nb, const char * const * rows, const char * prefetch,
        const char * y, size_t y_stride, const float * yd, float * out, size_t out_stride) {
    const block_q8_0 * x[TILE_ROWS];
    for (int r = 0; r < TILE_ROWS; r++) {
        x[r] = (const block_q8_0 *) rows[r];
    }
    __m256 acc[TILE_ROWS][2];
    for (int c = 0; c < C; c++) {
        for (int r = 0; r < TILE_ROWS; r++) {
            acc[r][c] = _mm256_setzero_ps();
        }
    }
    for (int ib = 0; ib < nb; ib++) {
        KERNEL(fetch_ahead)(prefetch, ib, sizeof(block_q8_0));
        const __m256 dw = KERNEL(group_scales)(rows, ib, sizeof(block_q8_0));
        __m256 scale[2];
        __m256i qy[2];
        for (int c = 0; c < C; c++) {
            scale[c] = _mm256_mul_ps(dw, _mm256_set1_ps(yd[c * nb + ib]));   // lane 2r: d_w * d_a
            qy[c] = _mm256_loadu_si256((const __m256i *) ((const block_q8_0 *) (y + c * y_stride) + ib)->qs);
        }
        for (int r = 0; r < TILE_ROWS; r++) {
            const __m256i qx = _mm256_loadu_si256((const __m256i *) x[r][ib].qs);
            const __m256i ax = _mm256_sign_epi8(qx, qx);
            for (int c = 0; c < C; c++) {
                const __m256 xy = _mm256_cvtepi32_ps(DOT4(ax, _mm256_sign_epi8(qy[c], qx)));
                acc[r][c] = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(scale[c], _mm256_set1_epi32(2 * r)), xy, acc[r][c]);
            }
        }
    }
    for (int c = 0; c < C; c++) {
        for (int r = 0; r < TILE_ROWS; r++) {
            out[c * out_stride + r] = hsum_float_8(acc[r][c]);
        }
    }
}

// Groups of weight rows [m0, m1) of Q4_1 or Q8_0 weights against N activation rows
// (quantized, q_row bytes apart; scales as floats yd, ys: [n * nb + ib], ys for Q4_1
// only): the first pair of activation rows fetches each group's weights ahead, the
// others find them in cache.
TARGET static void KERNEL(few_rows)(int q8_0, int64_t m0, int64_t m1, int nb, const char * w, size_t w_stride,
                                    const char * y, size_t q_row, const float * yd, const float * ys,
                                    int64_t N, float * out, size_t out_stride) {
    for (int64_t m = m0; m < m1; m += TILE_ROWS) {
        const char * x[TILE_ROWS];
        for (int r = 0; r < TILE_ROWS; r++) {
            x[r] = w + (m + r) * w_stride;
        }
        const char * ahead = x[0] + PREFETCH_GROUPS * TILE_ROWS * w_stride;
        for (int64_t n = 0; n < N; n += 2) {
            const char * pf = n == 0 ? ahead : NULL;
            const char * yn = y + n * q_row;
            float * o = out + n * out_stride + m;
            // constant column counts let the compiler keep the group's sums in registers
            if (q8_0 && n + 2 <= N) {
                KERNEL(group_q8_0)(2, nb, x, pf, yn, q_row, yd + n * nb, o, out_stride);
            } else if (q8_0) {
                KERNEL(group_q8_0)(1, nb, x, pf, yn, q_row, yd + n * nb, o, out_stride);
            } else if (n + 2 <= N) {
                KERNEL(group_q4_1)(2, nb, x, pf, yn, q_row, yd + n * nb, ys + n * nb, o, out_stride);
            } else {
                KERNEL(group_q4_1)(1, nb, x, pf, yn, q_row, yd + n * nb, ys + n * nb, o, out_stride);
            }
        }
    }
}
#undef unpack_nibbles
