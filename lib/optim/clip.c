/*
 * optim/clip.c - global-norm gradient clipping (as
 * torch.nn.utils.clip_grad_norm_), on the device's sum of squares and
 * scale (the vector ops of dp/ops.h).
 *
 * The norm is summed in double so that a few large gradients do not hide
 * millions of small ones (in float, 1e8 + 1 == 1e8).
 */
#include <math.h>

#include "backend/backend.h"
#include "core/error.h"
#include "dp/optim.h"
#include "optim/clip.h"

/* torch's clip_grad_norm_ adds this to the norm so the factor stays finite. */
#define DP_CLIP_EPS 1e-6

float dp_clip_factor(double norm, float max_norm)
{
    if (max_norm > 0.0f && norm > (double)max_norm)
        return (float)((double)max_norm / (norm + DP_CLIP_EPS));
    return 1.0f;
}

dp_status dp_clip_grad_norm(dp_device *dev, float *grads, size_t n, float max_norm,
                            double *norm_out)
{
    if (!dev) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "dev must not be NULL");
    if (!grads) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: grads must not be NULL", dev->name);
    if (n == 0) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: n must be > 0", dev->name);
    if (isnan(max_norm))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: max_norm is NaN; pass a positive value, "
                       "or 0 to only measure the norm", dev->name);
    double sumsq = 0.0;
    DP_TRY(dev->ops->sum_squares(dev, &sumsq, grads, n));
    double norm = sqrt(sumsq);
    if (norm_out) *norm_out = norm;
    /* Squares of finite floats cannot overflow a double sum, so a
     * non-finite norm means a NaN or Inf gradient. */
    if (!isfinite(norm))
        return DP_FAIL(DP_ERR_NON_FINITE, "%s: gradient norm is %g: the gradients hold NaN or "
                       "Inf (diverged training: lower the learning rate or check the data); "
                       "gradients left unscaled", dev->name, norm);
    float factor = dp_clip_factor(norm, max_norm);
    if (factor != 1.0f) DP_TRY(dev->ops->scale(dev, grads, factor, n));
    return DP_OK;
}
