/*
 * core/rng.c - xoshiro256** seeded by splitmix64 (Blackman & Vigna 2018).
 */
#include <math.h>

#include "dp/rng.h"

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void dp_rng_seed(dp_rng *rng, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) rng->s[i] = splitmix64(&x);
}

uint64_t dp_rng_u64(dp_rng *rng)
{
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

uint64_t dp_rng_below(dp_rng *rng, uint64_t n)
{
    if (n <= 1) return 0;
    /* Rejection sampling: discard the top partial block of 2^64 mod n values. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = dp_rng_u64(rng);
    while (x >= limit);
    return x % n;
}

float dp_rng_uniform(dp_rng *rng) { return (float)(dp_rng_u64(rng) >> 40) * 0x1.0p-24f; }

double dp_rng_normal(dp_rng *rng)
{
    /* u1 in (0, 1] so log(u1) is finite. */
    double u1 = ((double)(dp_rng_u64(rng) >> 11) + 1.0) * 0x1.0p-53;
    double u2 = (double)(dp_rng_u64(rng) >> 11) * 0x1.0p-53;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void dp_rng_fill_normal(dp_rng *rng, float *x, size_t n, float mean, float std)
{
    for (size_t i = 0; i < n; i++) x[i] = mean + std * (float)dp_rng_normal(rng);
}

void dp_rng_fill_uniform(dp_rng *rng, float *x, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * dp_rng_uniform(rng);
}
