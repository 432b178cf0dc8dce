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
#include <stdint.h>

#include "kernels/bf16.h"
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

// --- AdamW over the tensors of an optimizer slice at once ------------------------------

/* The most tensors (segments) one dp_adamw_segs holds: a GPU takes them
 * by value as a kernel argument (3 x 64 x 8 bytes, under the 4 KiB of a
 * launch's parameters), so a slice of more tensors takes one call per 64. */
#define DP_ADAMW_SEGS 64

/* Segments [begin[s], end[s]) of one call's elements, ascending and
 * disjoint, begin[0] = 0, each with its weight decay; the elements between
 * them (the parameter layout's alignment gaps) are not touched. */
typedef struct dp_adamw_segs {
    uint64_t begin[DP_ADAMW_SEGS], end[DP_ADAMW_SEGS];
    float weight_decay[DP_ADAMW_SEGS];
    uint32_t n; /* 1..DP_ADAMW_SEGS */
} dp_adamw_segs;

/* The segment of element i: the last one beginning at or before it. */
static inline DP_HD uint32_t dp_adamw_seg_of(const dp_adamw_segs *s, uint64_t i)
{
    uint32_t lo = 0, hi = s->n;
    while (hi - lo > 1) {
        uint32_t mid = (lo + hi) / 2;
        if (s->begin[mid] <= i) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* Element i of a segment with weight decay wd, what the engine's update
 * did in three passes (dp_scale, dp_adamw_update, dp_convert), in one:
 * the gradient scaled by clip (written back, as dp_scale did; clip 1: not
 * touched), AdamW on the parameter, and with replica (else NULL) the
 * parameter rounded to bfloat16 there. The same operations in the same
 * order, so the same bits. */
/* The clip and AdamW of dp_adamw_clip_element on values: *g scaled by
 * clip (unless 1), then AdamW on *p, *m, *v. The GPU's 4-wide kernel
 * (cuda/cuda_optim.cuh) runs it on registers. */
static inline DP_HD void dp_adamw_clip_value(float *p, float *g, float *m, float *v, float lr,
                                             float beta1, float beta2, float eps, float wd,
                                             float bias_corr1, float bias_corr2, float clip)
{
    if (clip != 1.0f) *g = dp_scale_element(*g, clip);
    dp_adamw_element(p, m, v, *g, lr, beta1, beta2, eps, wd, bias_corr1, bias_corr2);
}

static inline DP_HD void dp_adamw_clip_element(float *params, float *grads, float *m, float *v,
                                               uint16_t *replica, size_t i, float lr,
                                               float beta1, float beta2, float eps, float wd,
                                               float bias_corr1, float bias_corr2, float clip)
{
    float g = grads[i];
    dp_adamw_clip_value(&params[i], &g, &m[i], &v[i], lr, beta1, beta2, eps, wd, bias_corr1,
                        bias_corr2, clip);
    if (clip != 1.0f) grads[i] = g;
    if (replica) replica[i] = dp_bf16_round(params[i]);
}

#endif /* DP_KERNELS_OPTIM_H */
