/*
 * dp/optim.h - optimizer updates, gradient clipping and the LR schedule.
 *
 * The updates run on a device over a contiguous range of n floats; callers
 * with per-tensor weight-decay settings call them once per range.
 */
#ifndef DP_OPTIM_H
#define DP_OPTIM_H

#include <stddef.h>

#include "dp/device.h"
#include "dp/ops.h" /* dp_scale and dp_sum_squares, which clipping is built from */

#ifdef __cplusplus
extern "C" {
#endif

/*
 * AdamW (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization";
 * the same update as torch.optim.AdamW), for step t >= 1:
 *   m = beta1 m + (1-beta1) g;  v = beta2 v + (1-beta2) g^2
 *   mhat = m / (1 - beta1^t);   vhat = v / (1 - beta2^t)
 *   p = p - lr * (mhat / (sqrt(vhat) + eps) + weight_decay * p)
 * params, m, v are updated in place (m, v zero before step 1); grads is
 * read only. Errors: DP_ERR_INVALID_ARGUMENT (t < 1, NULL, n == 0).
 */
DP_API dp_status dp_adamw_update(dp_device *dev, float *params, const float *grads, float *m,
                                 float *v, size_t n, float lr, float beta1, float beta2,
                                 float eps, float weight_decay, long t);

/*
 * SGD with momentum, as torch.optim.SGD (dampening 0, not Nesterov):
 *   g' = g + weight_decay p;  buf = (t == 1) ? g' : momentum buf + g';
 *   p = p - lr buf
 * momentum_buf may be NULL when momentum == 0.
 */
DP_API dp_status dp_sgd_update(dp_device *dev, float *params, const float *grads,
                               float *momentum_buf, size_t n, float lr, float momentum,
                               float weight_decay, long t);

/*
 * Global L2 norm of grads(n) (in double), and clipping as
 * torch.nn.utils.clip_grad_norm_: when max_norm > 0 and norm > max_norm,
 * grads *= max_norm / (norm + 1e-6). *norm_out gets the norm before
 * clipping (may be NULL). A non-finite norm leaves grads untouched and
 * returns DP_ERR_NON_FINITE.
 */
DP_API dp_status dp_clip_grad_norm(dp_device *dev, float *grads, size_t n, float max_norm,
                                   double *norm_out);

/*
 * Learning rate at step (0-based) as nanoGPT: linear warmup from lr/warmup
 * to lr over the first `warmup` steps, then cosine decay to min_lr at
 * max_steps; min_lr after that. warmup == 0 starts at the cosine.
 */
DP_API float dp_lr_schedule(long step, long warmup, long max_steps, float lr, float min_lr);

#ifdef __cplusplus
}
#endif

#endif /* DP_OPTIM_H */
