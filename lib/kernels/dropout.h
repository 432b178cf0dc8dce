/*
 * kernels/dropout.h - inverted dropout (Srivastava et al. 2014; PyTorch's
 * nn.Dropout scaling) with a counter-based mask:
 *   out[r, c] = keep(r, c) ? x[r, c] / (1 - p) : 0
 *   keep(r, c) = u(key, row0 + r, c) >= p,  key = key(seed, step)
 * u is a pure function of (seed, step, global row, column): 24 bits of a
 * hash of the four, as a float in [0, 1) (exact: 24 bits fit a float's
 * significand). Counter-based as Philox (Salmon et al. 2011, "Parallel
 * random numbers: as easy as 1, 2, 3") and JAX's PRNG are: no generator
 * state advances, so any device computes the mask of any row, a row's
 * mask does not depend on how the batch was split over devices or
 * micro-batches, the backward recomputes the forward's mask instead of
 * storing it, and both backends give the same bits. The hash is the
 * splitmix64 finaliser (Steele, Lea & Flood 2014, the mixer of Java's
 * SplittableRandom) applied twice, once to fold in the row and once the
 * column.
 */
#ifndef DP_KERNELS_DROPOUT_H
#define DP_KERNELS_DROPOUT_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/dp_hd.h"

/* The splitmix64 finaliser: a bijection of 64-bit words that mixes every
 * input bit into every output bit. */
static inline DP_HD uint64_t dp_dropout_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The mask's key for one (seed, step): computed once per call, on the host. */
static inline DP_HD uint64_t dp_dropout_key(uint64_t seed, uint64_t step)
{
    return dp_dropout_mix(dp_dropout_mix(seed) + (step + 1) * 0x9e3779b97f4a7c15ull);
}

/* u(key, row, col) in [0, 1), a multiple of 2^-24. */
static inline DP_HD float dp_dropout_uniform(uint64_t key, uint64_t row, uint64_t col)
{
    uint64_t h = dp_dropout_mix(dp_dropout_mix(key ^ row) ^ col);
    return (float)(h >> 40) * 0x1p-24f;
}

/* Element i of a block of rows x cols whose first row is global row
 * row0: out[i] = x[i] * scale where kept, 0 where dropped (scale =
 * 1 / (1 - p), given by the caller). The backward is the same function
 * on the output's gradient. out may alias x. */
static inline DP_HD void dp_dropout_elem(float *out, const float *x, uint64_t key, size_t row0,
                                         size_t cols, float p, float scale, size_t i)
{
    size_t r = i / cols, c = i - r * cols;
    out[i] = dp_dropout_uniform(key, (uint64_t)(row0 + r), (uint64_t)c) >= p ? x[i] * scale
                                                                             : 0.0f;
}

#endif /* DP_KERNELS_DROPOUT_H */
