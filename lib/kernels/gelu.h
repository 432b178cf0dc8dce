/*
 * kernels/gelu.h - GELU, tanh approximation (Hendrycks & Gimpel 2016, as
 * used by GPT-2):
 *   gelu(x)  = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
 *   gelu'(x) = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3*0.044715 x^2)
 * computed through the identity 0.5 (1 + tanh(u)) = sigmoid(2u) = s, so
 *   gelu(x) = x s,   gelu'(x) = s + 2 x s (1 - s) du/dx,   s (1 - s) = e s^2, e = exp(-2u):
 * one exp instead of tanhf (glibc's tanhf costs ~3x more), and no
 * cancellation in 1 + tanh(u) for negative u. The exp is dp_expf, which
 * the CPU compiler vectorises (kernels/expf.h).
 */
#ifndef DP_KERNELS_GELU_H
#define DP_KERNELS_GELU_H

#include <math.h>
#include <stddef.h>

#include "kernels/bf16.h"
#include "kernels/dp_hd.h"
#include "kernels/expf.h"

#define DP_GELU_SQRT_2_OVER_PI 0.7978845608028654f
#define DP_GELU_COEFF 0.044715f

/* gelu(x). */
static inline DP_HD float dp_gelu(float x)
{
    float u = DP_GELU_SQRT_2_OVER_PI * (x + DP_GELU_COEFF * x * x * x);
    /* x / inf = -0 for very negative x, as 0.5 x (1 + tanh(u)) gives. */
    return x / (1.0f + dp_expf(-2.0f * u));
}

/* out[i] = gelu(inp[i]). */
static inline DP_HD void dp_gelu_forward_elem(float *out, const float *inp, size_t i)
{
    out[i] = dp_gelu(inp[i]);
}

/* bf16(gelu(x)) of a bfloat16 x: the float32 GELU of the widened input,
 * rounded once. */
static inline DP_HD uint16_t dp_gelu_bf16(uint16_t x)
{
    return dp_bf16_round(dp_gelu(dp_bf16_widen(x)));
}

/* out[i] = dp_gelu_bf16(inp[i]). */
static inline DP_HD void dp_gelu_forward_bf16_elem(uint16_t *out, const uint16_t *inp, size_t i)
{
    out[i] = dp_gelu_bf16(inp[i]);
}

/* gelu'(x). */
static inline DP_HD float dp_gelu_grad(float x)
{
    float u = DP_GELU_SQRT_2_OVER_PI * (x + DP_GELU_COEFF * x * x * x);
    float e = dp_expf(-2.0f * u);
    float s = 1.0f / (1.0f + e);
    float du = DP_GELU_SQRT_2_OVER_PI * (1.0f + 3.0f * DP_GELU_COEFF * x * x);
    /* s (1 - s) underflows to 0 (or e is inf) where the sigmoid saturates;
     * skipping the term then keeps x * 0 * inf from giving NaN for huge x. */
    float sd = isinf(e) ? 0.0f : e * s * s;
    return s + (sd == 0.0f ? 0.0f : 2.0f * x * sd * du);
}

/* dinp[i] = dout[i] * gelu'(inp[i]); dinp may alias dout (dout[i] is read
 * before dinp[i] is written). */
static inline DP_HD void dp_gelu_backward_elem(float *dinp, const float *inp, const float *dout,
                                               size_t i)
{
    dinp[i] = dout[i] * dp_gelu_grad(inp[i]);
}

/* dout gelu'(x) of a bfloat16 x (widened exactly). */
static inline DP_HD float dp_gelu_backward_bf16_value(float dout, uint16_t x)
{
    return dout * dp_gelu_grad(dp_bf16_widen(x));
}

/* dp_gelu_backward_elem with inp kept as bfloat16. */
static inline DP_HD void dp_gelu_backward_bf16_inp_elem(float *dinp, const uint16_t *inp,
                                                        const float *dout, size_t i)
{
    dinp[i] = dp_gelu_backward_bf16_value(dout[i], inp[i]);
}

/* dinp[i] = bf16(dout[i] gelu'(inp[i])), all three bfloat16: the MLP's
 * activation gradient kept as bfloat16 (dout widened exactly, the float32
 * product rounded once), so dp_gelu_backward_bf16_inp_elem on the widened
 * dout followed by the cast, bit for bit. dinp may alias dout. */
static inline DP_HD void dp_gelu_backward_bf16_elem(uint16_t *dinp, const uint16_t *inp,
                                                    const uint16_t *dout, size_t i)
{
    dinp[i] = dp_bf16_round(dp_gelu_backward_bf16_value(dp_bf16_widen(dout[i]), inp[i]));
}

#endif /* DP_KERNELS_GELU_H */
