/*
 * kernels/optim.h - per-element math of the optimizer updates and of the
 * element-wise helpers used by gradient clipping (scale, square).
 *
 * One call updates one parameter. The CPU backend loops over these; the
 * CUDA backend calls them from one thread per element. Formulas are those
 * of dp/optim.h (AdamW: Loshchilov & Hutter 2019; SGD as torch.optim.SGD).
 */
#ifndef DP_KERNELS_OPTIM_H
#define DP_KERNELS_OPTIM_H

#include <math.h>
#include <stddef.h>

#include "kernels/dp_hd.h"

/*
 * AdamW for one parameter. bias_corr1 = 1 - beta1^t and
 * bias_corr2 = 1 - beta2^t come from the host (computed once per step in
 * double). Weight decay is decoupled: it shrinks the parameter directly
 * instead of entering the moments, so a parameter with zero gradient still
 * decays by lr * weight_decay * p.
 */
static inline DP_HD void dp_adamw_element(float *param, float *m, float *v, float grad,
                                          float lr, float beta1, float beta2, float eps,
                                          float weight_decay, float bias_corr1,
                                          float bias_corr2)
{
    float mt = beta1 * *m + (1.0f - beta1) * grad;
    float vt = beta2 * *v + (1.0f - beta2) * grad * grad;
    float mhat = mt / bias_corr1;
    float vhat = vt / bias_corr2;
    float p = *param;
    *m = mt;
    *v = vt;
    *param = p - lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * p);
}

/*
 * SGD with momentum for one parameter (dampening 0, not Nesterov).
 * buf is the momentum buffer element, or NULL when momentum == 0 (then the
 * step is plain SGD). On the first step the buffer starts as the gradient
 * itself, as torch does, rather than as momentum * 0 + g.
 */
static inline DP_HD void dp_sgd_element(float *param, float *buf, float grad, float lr,
                                        float momentum, float weight_decay, int first_step)
{
    float p = *param;
    float g = grad + weight_decay * p;
    if (buf) {
        float b = first_step ? g : momentum * *buf + g;
        *buf = b;
        g = b;
    }
    *param = p - lr * g;
}

/* x * s, the element of dp_scale (gradient clipping multiplies by a factor). */
static inline DP_HD float dp_scale_element(float x, float s) { return x * s; }

/* x^2 in double: the square of a float is exact in double (24-bit mantissa
 * squared fits in 53 bits), so only the summation rounds. */
static inline DP_HD double dp_square_element(float x) { return (double)x * (double)x; }

// --- one element each (the entries of kernels/ops.h) --------------------------------

/* x[i] *= s. */
static inline DP_HD void dp_scale_elem(float *x, float s, size_t i)
{
    x[i] = dp_scale_element(x[i], s);
}

/* AdamW on params[i] (see dp_adamw_element). */
static inline DP_HD void dp_adamw_elem(float *params, const float *grads, float *m, float *v,
                                       float lr, float beta1, float beta2, float eps,
                                       float weight_decay, float bias_corr1, float bias_corr2,
                                       size_t i)
{
    dp_adamw_element(&params[i], &m[i], &v[i], grads[i], lr, beta1, beta2, eps, weight_decay,
                     bias_corr1, bias_corr2);
}

/* SGD on params[i]; momentum_buf may be NULL (see dp_sgd_element). */
static inline DP_HD void dp_sgd_elem(float *params, const float *grads, float *momentum_buf,
                                     float lr, float momentum, float weight_decay,
                                     int first_step, size_t i)
{
    dp_sgd_element(&params[i], momentum_buf ? &momentum_buf[i] : NULL, grads[i], lr, momentum,
                   weight_decay, first_step);
}

#endif /* DP_KERNELS_OPTIM_H */
