/* PLACEHOLDER: replaced by the real kernels */
#include "backend/cpu/cpu_kernels.h"
#include "core/error.h"

dp_status dp_cpu_encoder_forward(dp_device *dev, float *out, const int32_t *inp,
                                 const float *wte, const float *wpe, size_t B, size_t T,
                                 size_t C)
{
    (void)dev;
    return DP_FAIL(DP_ERR_UNSUPPORTED, "%s: not implemented yet", __func__);
}

dp_status dp_cpu_encoder_backward(dp_device *dev, float *dwte, float *dwpe, const float *dout,
                                  const int32_t *inp, size_t B, size_t T, size_t C)
{
    (void)dev;
    return DP_FAIL(DP_ERR_UNSUPPORTED, "%s: not implemented yet", __func__);
}

dp_status dp_cpu_bias_broadcast(dp_device *dev, float *out, const float *bias, size_t N,
                                size_t OC)
{
    (void)dev;
    return DP_FAIL(DP_ERR_UNSUPPORTED, "%s: not implemented yet", __func__);
}

dp_status dp_cpu_bias_backward(dp_device *dev, float *dbias, const float *dout, size_t N,
                               size_t OC)
{
    (void)dev;
    return DP_FAIL(DP_ERR_UNSUPPORTED, "%s: not implemented yet", __func__);
}

dp_status dp_cpu_layernorm_forward(dp_device *dev, float *out, float *mean, float *rstd,
                                   const float *inp, const float *weight, const float *bias,
                                   size_t N, size_t C)
{
    (void)dev;
    return DP_FAIL(DP_ERR_UNSUPPORTED, "%s: not implemented yet", __func__);
}

dp_status dp_cpu_layernorm_backward(dp_device *dev, float *dinp, float *dweight, float *dbias,
                                    const float *dout, const float *inp, const float *weight,
                                    const float *mean, const float *rstd, size_t N, size_t C)
{
    (void)dev;
    return DP_FAIL(DP_ERR_UNSUPPORTED, "%s: not implemented yet", __func__);
}

dp_status dp_cpu_gelu_forward(dp_device *dev, float *out, const float *inp, size_t n)
{
    (void)dev;
    return DP_FAIL(DP_ERR_UNSUPPORTED, "%s: not implemented yet", __func__);
}

dp_status dp_cpu_gelu_backward(dp_device *dev, float *dinp, const float *inp,
                               const float *dout, size_t n)
{
    (void)dev;
    return DP_FAIL(DP_ERR_UNSUPPORTED, "%s: not implemented yet", __func__);
}

dp_status dp_cpu_add(dp_device *dev, float *out, const float *a, const float *b, size_t n)
{
    (void)dev;
    return DP_FAIL(DP_ERR_UNSUPPORTED, "%s: not implemented yet", __func__);
}

dp_status dp_cpu_accumulate(dp_device *dev, float *dst, const float *src, size_t n)
{
    (void)dev;
    return DP_FAIL(DP_ERR_UNSUPPORTED, "%s: not implemented yet", __func__);
}



dp_status dp_cpu_crossentropy(dp_device *dev, float *losses, float *dlogits,
                              const float *logits, const int32_t *targets, size_t N, size_t V,
                              float dscale)
{
    (void)dev;
    return DP_FAIL(DP_ERR_UNSUPPORTED, "%s: not implemented yet", __func__);
}
