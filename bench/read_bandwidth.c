/* How fast this machine's cores stream memory: the ceiling of a decode step that
 * reads every weight once (bench/read_limit.py compiles and runs it).
 *
 *     read_bandwidth MIB REPS THREADS   ->  one line: "<GB/s>" (the best of REPS passes)
 *
 * Each thread reads its own contiguous part of a buffer far larger than the caches,
 * folding 64-byte lines into an accumulator that the compiler vectorises (-O3
 * -march=native), as a matmul kernel streams its weight rows. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <omp.h>

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s MIB REPS THREADS\n", argv[0]);
        return 2;
    }
    size_t n = (size_t)atol(argv[1]) << 20;
    int reps = atoi(argv[2]), threads = atoi(argv[3]);
    uint64_t *buf = aligned_alloc(64, n);
    if (buf == NULL) {
        perror("aligned_alloc");
        return 1;
    }
    memset(buf, 1, n);                 /* every page present before timing */
    size_t words = n / sizeof(uint64_t);
    double best = 0.0;
    uint64_t sink = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = seconds();
        uint64_t total = 0;
#pragma omp parallel num_threads(threads) reduction(^ : total)
        {
            size_t part = words / omp_get_num_threads() / 8 * 8;
            const uint64_t *p = buf + part * omp_get_thread_num();
            uint64_t acc[8] = {0};
            for (size_t i = 0; i < part; i += 8)
                for (int j = 0; j < 8; j++)
                    acc[j] ^= p[i + j];
            for (int j = 0; j < 8; j++)
                total ^= acc[j];
        }
        double gbs = n / (seconds() - t0) / 1e9;
        sink ^= total;
        if (gbs > best)
            best = gbs;
    }
    printf("%.2f\n", best);
    free(buf);
    return sink == 42;                 /* keeps the reads from being optimised away */
}
