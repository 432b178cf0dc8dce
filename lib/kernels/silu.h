/*
 * kernels/silu.h - SiLU, the sigmoid-weighted linear unit (Elfwing,
 * Uchibe & Doya 2018; Ramachandran et al.'s "Swish" with beta = 1):
 *   silu(x)  = x s,  s = sigmoid(x) = 1 / (1 + e),  e = exp(-x)
 *   silu'(x) = s + x s (1 - s),  with s (1 - s) = e s^2
 * One exp per element (dp_expf, which vectorises: kernels/expf.h), as
 * kernels/gelu.h computes its sigmoid.
 */
#ifndef DP_KERNELS_SILU_H
#define DP_KERNELS_SILU_H

#include <math.h>
#include <stddef.h>

#include "kernels/dp_hd.h"
#include "kernels/expf.h"

/* out[i] = silu(inp[i]); out may alias inp. x / inf = -0 for very
 * negative x, the limit of x sigmoid(x). */
static inline DP_HD void dp_silu_forward_elem(float *out, const float *inp, size_t i)
{
    float x = inp[i];
    out[i] = x / (1.0f + dp_expf(-x));
}

/* silu'(x). Where the sigmoid saturates, e s^2 underflows to 0 (or e is
 * inf): the term is then skipped, so x * 0 * inf never makes a NaN. */
static inline DP_HD float dp_silu_grad(float x)
{
    float e = dp_expf(-x);
    float s = 1.0f / (1.0f + e);
    float sd = isinf(e) ? 0.0f : e * s * s;
    return s + (sd == 0.0f ? 0.0f : x * sd);
}

/* dinp[i] = dout[i] * silu'(inp[i]); dinp may alias dout. */
static inline DP_HD void dp_silu_backward_elem(float *dinp, const float *inp, const float *dout,
                                               size_t i)
{
    dinp[i] = dout[i] * dp_silu_grad(inp[i]);
}

#endif /* DP_KERNELS_SILU_H */
