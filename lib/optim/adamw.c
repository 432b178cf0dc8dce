/*
 * optim/adamw.c - dp_adamw_update and dp_sgd_update: argument checks, the
 * host-side bias corrections, then the backend's update loop.
 *
 * Hyper-parameters are checked as torch.optim does (lr, eps, weight decay
 * and momentum >= 0, betas in [0, 1)); a NaN learning rate, e.g. from
 * dp_lr_schedule given bad arguments, is refused here before it can turn
 * every parameter into NaN.
 */
#include <math.h>
#include <stdint.h>

#include "backend/backend.h"
#include "core/error.h"
#include "dp/ops.h"
#include "dp/optim.h"
#include "optim/adamw_segments.h"

// --- shared checks --------------------------------------------------------------

/* NaN fails every comparison, so "!(x >= 0)" also rejects NaN. */
static dp_status check_nonneg(const dp_device *dev, const char *what, float x)
{
    if (!(x >= 0.0f) || isinf(x))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: %s = %g must be finite and >= 0",
                       dev->name, what, (double)x);
    return DP_OK;
}

static dp_status check_range(const dp_device *dev, const float *params, const float *grads,
                             size_t n, long t)
{
    if (!params || !grads)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: params and grads must not be NULL",
                       dev->name);
    if (n == 0)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: n must be > 0 (number of parameters to "
                       "update)", dev->name);
    if (n > SIZE_MAX / sizeof(float))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: n = %zu floats overflows a byte count",
                       dev->name, n);
    if (t < 1)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: step t = %ld must be >= 1 (the first "
                       "update is t = 1)", dev->name, t);
    return DP_OK;
}

// --- AdamW ------------------------------------------------------------------------

/* The checks every AdamW call shares (n elements from params, grads, m
 * and v; weight decays are checked where they are given), then the step's
 * bias corrections 1 - beta^t into bc1, bc2. */
static dp_status adamw_prepare(dp_device *dev, const float *params, const float *grads,
                               const float *m, const float *v, size_t n, float lr, float beta1,
                               float beta2, float eps, long t, float *bc1, float *bc2)
{
    DP_TRY(check_range(dev, params, grads, n, t));
    if (!m || !v)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: AdamW moments m and v must not be NULL "
                       "(allocate them zeroed before step 1)", dev->name);
    DP_TRY(check_nonneg(dev, "lr", lr));
    DP_TRY(check_nonneg(dev, "eps", eps));
    if (!(beta1 >= 0.0f && beta1 < 1.0f) || !(beta2 >= 0.0f && beta2 < 1.0f))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: AdamW betas (%g, %g) must lie in [0, 1)",
                       dev->name, (double)beta1, (double)beta2);
    /* In double: beta2^t for t ~ 1e5 underflows nothing, and 1 - beta^t
     * loses no digits before the one rounding to float. */
    *bc1 = (float)(1.0 - pow((double)beta1, (double)t));
    *bc2 = (float)(1.0 - pow((double)beta2, (double)t));
    return DP_OK;
}

dp_status dp_adamw_update(dp_device *dev, float *params, const float *grads, float *m,
                          float *v, size_t n, float lr, float beta1, float beta2, float eps,
                          float weight_decay, long t)
{
    if (!dev) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "dev must not be NULL");
    float bc1 = 0.0f, bc2 = 0.0f;
    DP_TRY(adamw_prepare(dev, params, grads, m, v, n, lr, beta1, beta2, eps, t, &bc1, &bc2));
    DP_TRY(check_nonneg(dev, "weight_decay", weight_decay));
    return dev->ops->adamw(dev, params, grads, m, v, lr, beta1, beta2, eps, weight_decay, bc1,
                           bc2, n);
}

// --- AdamW over a slice's segments -------------------------------------------------

static dp_status check_segments(dp_device *dev, const dp_adamw_segs *segs, float clip)
{
    if (!segs || segs->n == 0 || segs->n > DP_ADAMW_SEGS)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: a segment table of %u entries; 1 to %d",
                       dev->name, segs ? segs->n : 0u, DP_ADAMW_SEGS);
    if (segs->begin[0] != 0)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: the first segment begins at %llu, not 0 "
                       "(the pointers are at the call's first element)",
                       dev->name, (unsigned long long)segs->begin[0]);
    for (uint32_t s = 0; s < segs->n; s++) {
        if (segs->end[s] <= segs->begin[s] || (s && segs->begin[s] < segs->end[s - 1]))
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: segment %u [%llu, %llu) is empty or "
                           "overlaps the one before; segments must ascend", dev->name, s,
                           (unsigned long long)segs->begin[s], (unsigned long long)segs->end[s]);
        DP_TRY(check_nonneg(dev, "weight_decay", segs->weight_decay[s]));
    }
    if (!(clip > 0.0f) || isinf(clip))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: clip factor %g must be finite and > 0",
                       dev->name, (double)clip);
    return DP_OK;
}

dp_status dp_adamw_update_segments(dp_device *dev, float *params, float *grads, float *m,
                                   float *v, uint16_t *replica, const dp_adamw_segs *segs,
                                   float lr, float beta1, float beta2, float eps, long t,
                                   float clip)
{
    if (!dev) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "dev must not be NULL");
    DP_TRY(check_segments(dev, segs, clip));
    if (!dev->ops->adamw_segments) {
        /* tensor by tensor: the three calls the fused entry stands for */
        for (uint32_t s = 0; s < segs->n; s++) {
            size_t b = (size_t)segs->begin[s], n = (size_t)(segs->end[s] - segs->begin[s]);
            if (clip != 1.0f) DP_TRY(dp_scale(dev, grads + b, clip, n));
            DP_TRY(dp_adamw_update(dev, params + b, grads + b, m ? m + b : NULL,
                                   v ? v + b : NULL, n, lr, beta1, beta2, eps,
                                   segs->weight_decay[s], t));
            if (replica)
                DP_TRY(dp_convert(dev, replica + b, DP_DTYPE_BF16, params + b, DP_DTYPE_F32, n));
        }
        return DP_OK;
    }
    float bc1 = 0.0f, bc2 = 0.0f;
    DP_TRY(adamw_prepare(dev, params, grads, m, v, (size_t)segs->end[segs->n - 1], lr, beta1,
                         beta2, eps, t, &bc1, &bc2));
    return dev->ops->adamw_segments(dev, params, grads, m, v, replica, segs, lr, beta1, beta2,
                                    eps, bc1, bc2, clip);
}

// --- SGD --------------------------------------------------------------------------

dp_status dp_sgd_update(dp_device *dev, float *params, const float *grads, float *momentum_buf,
                        size_t n, float lr, float momentum, float weight_decay, long t)
{
    if (!dev) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "dev must not be NULL");
    DP_TRY(check_range(dev, params, grads, n, t));
    DP_TRY(check_nonneg(dev, "lr", lr));
    DP_TRY(check_nonneg(dev, "momentum", momentum));
    DP_TRY(check_nonneg(dev, "weight_decay", weight_decay));
    if (momentum != 0.0f && !momentum_buf)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: momentum = %g needs a momentum buffer of "
                       "n floats; pass momentum_buf or momentum = 0", dev->name,
                       (double)momentum);
    /* With momentum 0 the buffer would only ever hold g: plain SGD, as torch. */
    return dev->ops->sgd(dev, params, grads, momentum != 0.0f ? momentum_buf : NULL, lr,
                         momentum, weight_decay, t == 1, n);
}
