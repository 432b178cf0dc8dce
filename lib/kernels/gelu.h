/*
 * kernels/gelu.h - GELU, tanh approximation (Hendrycks & Gimpel 2016, as
 * used by GPT-2):
 *   gelu(x)  = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
 *   gelu'(x) = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3*0.044715 x^2)
 */
#ifndef DP_KERNELS_GELU_H
#define DP_KERNELS_GELU_H

#include <math.h>
#include <stddef.h>

#include "kernels/dp_hd.h"

#define DP_GELU_SQRT_2_OVER_PI 0.7978845608028654f
#define DP_GELU_COEFF 0.044715f

/* out[i] = gelu(inp[i]). */
static inline DP_HD void dp_gelu_forward_elem(float *out, const float *inp, size_t i)
{
    float x = inp[i];
    float u = DP_GELU_SQRT_2_OVER_PI * (x + DP_GELU_COEFF * x * x * x);
    out[i] = 0.5f * x * (1.0f + tanhf(u));
}

/* dinp[i] = dout[i] * gelu'(inp[i]); dinp may alias dout (dout[i] is read
 * before dinp[i] is written). */
static inline DP_HD void dp_gelu_backward_elem(float *dinp, const float *inp, const float *dout,
                                               size_t i)
{
    float x = inp[i];
    float u = DP_GELU_SQRT_2_OVER_PI * (x + DP_GELU_COEFF * x * x * x);
    float th = tanhf(u);
    float du = DP_GELU_SQRT_2_OVER_PI * (1.0f + 3.0f * DP_GELU_COEFF * x * x);
    float sech2 = 1.0f - th * th;
    /* Where tanh saturates the second term is exactly 0; skipping it keeps a
     * huge finite x (x*x overflowing du to inf) from giving 0 * inf = NaN. */
    float grad = 0.5f * (1.0f + th) + (sech2 == 0.0f ? 0.0f : 0.5f * x * sech2 * du);
    dinp[i] = dout[i] * grad;
}

#endif /* DP_KERNELS_GELU_H */
