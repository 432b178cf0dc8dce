/*
 * dp/checked.h - size arithmetic that reports overflow instead of
 * wrapping. Every size computed from user input (shapes, counts, bytes)
 * goes through these, so an absurd value is refused before any work.
 */
#ifndef DP_CHECKED_H
#define DP_CHECKED_H

#include <stddef.h>
#include <stdint.h>

/* *out = a * b; returns 1, or 0 (and leaves *out alone) on size_t overflow. */
static inline int dp_size_mul(size_t a, size_t b, size_t *out)
{
    if (a && b > SIZE_MAX / a) return 0;
    *out = a * b;
    return 1;
}

/* *out = a + b; returns 1, or 0 on size_t overflow. */
static inline int dp_size_add(size_t a, size_t b, size_t *out)
{
    if (b > SIZE_MAX - a) return 0;
    *out = a + b;
    return 1;
}

/* *acc += a * b; returns 1, or 0 (and leaves *acc alone) on overflow. */
static inline int dp_size_mad(size_t *acc, size_t a, size_t b)
{
    size_t p;
    return dp_size_mul(a, b, &p) && dp_size_add(*acc, p, acc);
}

#endif /* DP_CHECKED_H */
