/*
 * nn/mse.c - the bundled mean-squared-error criterion (dp/model.h),
 * PyTorch's MSELoss with reduction "mean": the loss sum is the sum of
 * (logit - target)^2 over the valid (non-NaN) target elements, in double
 * and in element order; the engine divides by N. The gradient of an
 * element is dscale * 2 * (logit - target), 0 for an ignored target.
 * Built on the chunked host loop of dp/ops.h, so it runs on every device.
 */
#include <math.h>
#include <string.h>

#include "nn/nn_check.h"
#include "nn/ops_internal.h"

#include "dp/model.h"

typedef struct mse_acc {
    double sum;
    size_t count;
    float gscale; /* 2 * dscale */
} mse_acc;

/* out (dlogits, may be NULL or alias x = logits), x logits, t targets. */
static dp_status mse_chunk(void *ctx, float *out, const float *x, const float *t, size_t n,
                           size_t first)
{
    (void)first;
    mse_acc *a = ctx;
    for (size_t i = 0; i < n; i++) {
        if (isnan(t[i])) {
            if (out) out[i] = 0.0f;
            continue;
        }
        double d = (double)x[i] - (double)t[i];
        a->sum += d * d;
        a->count++;
        if (out) out[i] = a->gscale * (x[i] - t[i]);
    }
    return DP_OK;
}

static dp_status mse_forward_backward(void *ctx, const dp_criterion_args *a,
                                      double *loss_sum_host, size_t *count_host)
{
    (void)ctx;
    dp_device *dev = a->dev;
    DP_NN_REQUIRE_DEV(dev);
    if (!loss_sum_host || !count_host)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: loss_sum_host and count_host must not be "
                       "NULL", dev->name);
    if (a->target_type != DP_TARGET_F32 || a->target_size != a->V)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: MSE takes float targets of the logits' shape "
                       "(target type DP_TARGET_F32, target_size == n_classes = %zu), got %s "
                       "with %zu per row; set the model's target_type to DP_TARGET_F32 and "
                       "target_size to 0", dev->name, a->V, dp_target_type_name(a->target_type),
                       a->target_size);
    DP_NN_REQUIRE_PTR(dev, a->logits);
    DP_NN_REQUIRE_PTR(dev, a->targets);
    size_t n;
    if (!a->n || !a->V || !dp_nn_count3(a->n, a->V, 1, &n))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: n=%zu and V=%zu must be > 0 and n*V floats "
                       "fit size_t", dev->name, a->n, a->V);
    if (!isfinite(a->dscale))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: dscale must be finite (got %g)", dev->name,
                       (double)a->dscale);
    mse_acc acc = {0.0, 0, 2.0f * a->dscale};
    *loss_sum_host = 0.0;
    *count_host = 0;
    if (a->dlogits && a->dlogits != a->logits)
        DP_TRY(dp_copy_d2d(dev, a->dlogits, a->logits, n * sizeof(float)));
    /* In place on dlogits (a copy of the logits, or the logits themselves);
     * loss only when there is no gradient to write. */
    float *out = a->dlogits;
    const float *x = out ? out : a->logits;
    DP_TRY(dp_ops_foreach(dev, out, x, a->targets, n, mse_chunk, &acc));
    *loss_sum_host = acc.sum;
    *count_host = acc.count;
    return DP_OK;
}

dp_criterion dp_criterion_mse(void)
{
    dp_criterion c;
    memset(&c, 0, sizeof c);
    c.forward_backward = mse_forward_backward;
    c.target_type = DP_TARGET_F32;
    return c;
}
