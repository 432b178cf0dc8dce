/*
 * kernels/ignored.h - the criterion contract's last word (dp/model.h): a
 * row of dlogits whose target elements are all ignored (class id -1, or
 * NaN float values) is made zero, whatever the criterion wrote there. The
 * engine runs it after every criterion call that wrote a gradient, so a
 * criterion that leaves such rows alone (in balanced mode they still hold
 * the logits: dlogits aliases them) cannot make the step differ from
 * gather mode's.
 */
#ifndef DP_KERNELS_IGNORED_H
#define DP_KERNELS_IGNORED_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/dp_hd.h"

/* Whether target element t is valid: a class id >= 0, or a float that is
 * not NaN (f32 != 0). */
static inline DP_HD int dp_target_is_valid(const void *targets, int f32, size_t t)
{
    if (f32) return !isnan(((const float *)targets)[t]);
    return ((const int32_t *)targets)[t] >= 0;
}

/* Row r of x(rows, cols): zeroed when its target elements r * per ..
 * r * per + per - 1 are all ignored, left alone otherwise. */
static inline DP_HD void dp_zero_ignored_rows_item(float *x, const void *targets, int f32,
                                                   size_t per, size_t cols, size_t r)
{
    for (size_t t = r * per; t < (r + 1) * per; t++)
        if (dp_target_is_valid(targets, f32, t)) return;
    for (size_t c = 0; c < cols; c++) x[r * cols + c] = 0.0f;
}

/* dp_zero_ignored_rows_item for a bfloat16 x(rows, cols) (uint16_t bits,
 * zero = +0): the bfloat16 dlogits of a chunk of logits kept in bfloat16. */
static inline DP_HD void dp_zero_ignored_rows_bf16_item(uint16_t *x, const void *targets,
                                                        int f32, size_t per, size_t cols,
                                                        size_t r)
{
    for (size_t t = r * per; t < (r + 1) * per; t++)
        if (dp_target_is_valid(targets, f32, t)) return;
    for (size_t c = 0; c < cols; c++) x[r * cols + c] = 0;
}

#endif /* DP_KERNELS_IGNORED_H */
