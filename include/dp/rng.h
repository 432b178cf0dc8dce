/*
 * dp/rng.h - a small seeded random generator (splitmix64 seeding,
 * xoshiro256** stream; Blackman & Vigna 2018). Used for initialisation,
 * batch sampling and tests, so runs are reproducible from one seed on any
 * machine. Not thread-safe per state: give each thread its own.
 */
#ifndef DP_RNG_H
#define DP_RNG_H

#include <stddef.h>
#include <stdint.h>

#include "dp/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dp_rng {
    uint64_t s[4];
} dp_rng;

DP_API void dp_rng_seed(dp_rng *rng, uint64_t seed);
DP_API uint64_t dp_rng_u64(dp_rng *rng);
/* Uniform in [0, n), n >= 1, without modulo bias. */
DP_API uint64_t dp_rng_below(dp_rng *rng, uint64_t n);
/* Uniform float in [0, 1) with 24 random bits. */
DP_API float dp_rng_uniform(dp_rng *rng);
/* Standard normal (Box-Muller, double precision inside). */
DP_API double dp_rng_normal(dp_rng *rng);
/* x[i] = mean + std * normal, n floats (host memory). */
DP_API void dp_rng_fill_normal(dp_rng *rng, float *x, size_t n, float mean, float std);
/* x[i] uniform in [lo, hi), n floats (host memory). */
DP_API void dp_rng_fill_uniform(dp_rng *rng, float *x, size_t n, float lo, float hi);

#ifdef __cplusplus
}
#endif

#endif /* DP_RNG_H */
