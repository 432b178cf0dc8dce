/*
 * kernels/elementwise.h - element-wise add and accumulate (residual stream
 * and gradient sums).
 */
#ifndef DP_KERNELS_ELEMENTWISE_H
#define DP_KERNELS_ELEMENTWISE_H

#include <stddef.h>

#include "kernels/dp_hd.h"

/* out[i] = a[i] + b[i]; out may alias a or b (each element is read before
 * it is written). */
static inline DP_HD void dp_add_elem(float *out, const float *a, const float *b, size_t i)
{
    out[i] = a[i] + b[i];
}

/* dst[i] += src[i]. */
static inline DP_HD void dp_accumulate_elem(float *dst, const float *src, size_t i)
{
    dst[i] += src[i];
}

#endif /* DP_KERNELS_ELEMENTWISE_H */
