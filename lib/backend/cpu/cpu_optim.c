/* PLACEHOLDER: replaced by the real kernels */
#include "backend/cpu/cpu_kernels.h"
#include "core/error.h"

dp_status dp_cpu_adamw(dp_device *dev, float *params, const float *grads, float *m, float *v,
                       size_t n, float lr, float beta1, float beta2, float eps,
                       float weight_decay, float bias_corr1, float bias_corr2)
{
    (void)dev;
    return DP_FAIL(DP_ERR_UNSUPPORTED, "%s: not implemented yet", __func__);
}

dp_status dp_cpu_sgd(dp_device *dev, float *params, const float *grads, float *momentum_buf,
                     size_t n, float lr, float momentum, float weight_decay, int first_step)
{
    (void)dev;
    return DP_FAIL(DP_ERR_UNSUPPORTED, "%s: not implemented yet", __func__);
}

dp_status dp_cpu_scale(dp_device *dev, float *x, float s, size_t n)
{
    (void)dev;
    return DP_FAIL(DP_ERR_UNSUPPORTED, "%s: not implemented yet", __func__);
}

dp_status dp_cpu_sum_squares(dp_device *dev, double *out_host, const float *x, size_t n)
{
    (void)dev;
    return DP_FAIL(DP_ERR_UNSUPPORTED, "%s: not implemented yet", __func__);
}
