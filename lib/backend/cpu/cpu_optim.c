/*
 * backend/cpu/cpu_optim.c - CPU entries for the optimizer updates (AdamW,
 * SGD) and the clipping helpers (scale, sum of squares): single-threaded
 * loops over the DP_HD functions of kernels/optim.h.
 */
#include "backend/cpu/cpu_kernels.h"
#include "kernels/optim.h"

DP_CPU_SIMD dp_status dp_cpu_adamw(dp_device *dev, float *params, const float *grads, float *m, float *v,
                       size_t n, float lr, float beta1, float beta2, float eps,
                       float weight_decay, float bias_corr1, float bias_corr2)
{
    (void)dev;
    for (size_t i = 0; i < n; i++)
        dp_adamw_element(&params[i], &m[i], &v[i], grads[i], lr, beta1, beta2, eps,
                         weight_decay, bias_corr1, bias_corr2);
    return DP_OK;
}

DP_CPU_SIMD dp_status dp_cpu_sgd(dp_device *dev, float *params, const float *grads, float *momentum_buf,
                     size_t n, float lr, float momentum, float weight_decay, int first_step)
{
    (void)dev;
    for (size_t i = 0; i < n; i++)
        dp_sgd_element(&params[i], momentum_buf ? &momentum_buf[i] : NULL, grads[i], lr,
                       momentum, weight_decay, first_step);
    return DP_OK;
}

DP_CPU_SIMD dp_status dp_cpu_scale(dp_device *dev, float *x, float s, size_t n)
{
    (void)dev;
    for (size_t i = 0; i < n; i++) x[i] = dp_scale_element(x[i], s);
    return DP_OK;
}

DP_CPU_SIMD dp_status dp_cpu_sum_squares(dp_device *dev, double *out_host, const float *x, size_t n)
{
    (void)dev;
    /* Index order, one double accumulator: reproducible bit for bit. */
    double acc = 0.0;
    for (size_t i = 0; i < n; i++) acc += dp_square_element(x[i]);
    *out_host = acc;
    return DP_OK;
}
