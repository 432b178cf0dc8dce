/*
 * kernels/elementwise.h - element-wise add and accumulate (residual stream
 * and gradient sums), and a fill of a block of columns (the padded
 * vocabulary's logits set to -inf), in float32 or bfloat16.
 */
#ifndef DP_KERNELS_ELEMENTWISE_H
#define DP_KERNELS_ELEMENTWISE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/bf16.h"
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

/* Item i of the block of `cols` columns starting at column c0 of rows ld
 * floats apart: x[r * ld + c0 + c] = value, r = i / cols, c = i % cols
 * (n = rows * cols items; the other columns are not touched). */
static inline DP_HD void dp_fill_columns_elem(float *x, size_t ld, size_t c0, size_t cols,
                                              float value, size_t i)
{
    x[i / cols * ld + c0 + i % cols] = value;
}

/* dp_fill_columns_elem for bfloat16 x (uint16_t bits): value rounded to
 * bfloat16 (kernels/bf16.h; -inf is 0xFF80), for logits kept in bfloat16. */
static inline DP_HD void dp_fill_columns_bf16_elem(uint16_t *x, size_t ld, size_t c0,
                                                   size_t cols, float value, size_t i)
{
    x[i / cols * ld + c0 + i % cols] = dp_bf16_round(value);
}

#endif /* DP_KERNELS_ELEMENTWISE_H */
