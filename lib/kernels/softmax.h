/*
 * kernels/softmax.h - log-softmax over the rows of a matrix, forward and
 * backward. (The softmax itself is the causal softmax of
 * kernels/attention.h with every key visible: dp_softmax_forward in
 * nn/softmax.c.)
 *
 * For a row x(C), with m = max_j x[j] and s = sum_j exp(x[j] - m):
 *   out[j]  = (x[j] - m) - log(s)              (= x[j] - logsumexp(x))
 *   dinp[j] = dout[j] - exp(out[j]) sum_i dout[i]
 * Subtracting m keeps every exp in (0, 1] (no overflow for |x| ~ 1e4) and
 * s >= 1; s and the gradient's sum are taken in double and x[j] - m is
 * exact in double, so the output is rounded once. A -inf entry (a masked
 * class) gives -inf and passes back dout[j] alone (exp(-inf) = 0); a row
 * of -inf only, or with a NaN, gives NaN, as torch.log_softmax does.
 */
#ifndef DP_KERNELS_SOFTMAX_H
#define DP_KERNELS_SOFTMAX_H

#include <math.h>
#include <stddef.h>

#include "kernels/crossentropy.h" /* dp_max8 */
#include "kernels/dp_hd.h"
#include "kernels/expf.h"

/* One row: out(C) = log_softmax(x(C)). out may alias x: every x[j] is
 * read for m and s before any out[j] is written. */
static inline DP_HD DP_HD_ALWAYS_INLINE void dp_log_softmax_forward_row(float *out,
                                                                         const float *x, size_t C)
{
    float m = dp_max8(x, C);
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (size_t j = 0; j < C; j++) acc[j % 8] += (double)dp_expf(x[j] - m);
    double s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    double ls = log(s);
    for (size_t j = 0; j < C; j++) out[j] = (float)(((double)x[j] - (double)m) - ls);
}

/* One row: dinp(C) from out(C) (the forward's output) and dout(C). dinp
 * may alias dout (the sum is taken first), not out. */
static inline DP_HD void dp_log_softmax_backward_row(float *dinp, const float *out,
                                                     const float *dout, size_t C)
{
    double g = dp_sum_double8(dout, C);
    for (size_t j = 0; j < C; j++)
        dinp[j] = (float)((double)dout[j] - (double)dp_expf(out[j]) * g);
}

/* Row r of (N,C). */
static inline DP_HD void dp_log_softmax_forward_item(float *out, const float *inp, size_t C,
                                                     size_t r)
{
    dp_log_softmax_forward_row(out + r * C, inp + r * C, C);
}

static inline DP_HD void dp_log_softmax_backward_item(float *dinp, const float *out,
                                                      const float *dout, size_t C, size_t r)
{
    dp_log_softmax_backward_row(dinp + r * C, out + r * C, dout + r * C, C);
}

#endif /* DP_KERNELS_SOFTMAX_H */
