/* PLACEHOLDER: replaced by the real kernels */
#include "backend/cpu/cpu_kernels.h"
#include "core/error.h"

dp_status dp_cpu_attention_permute(dp_device *dev, float *qkvr, const float *qkv, size_t B,
                                   size_t T, size_t NH, size_t hs)
{
    (void)dev;
    return DP_FAIL(DP_ERR_UNSUPPORTED, "%s: not implemented yet", __func__);
}

dp_status dp_cpu_attention_permute_backward(dp_device *dev, float *dqkv, const float *dqkvr,
                                            size_t B, size_t T, size_t NH, size_t hs)
{
    (void)dev;
    return DP_FAIL(DP_ERR_UNSUPPORTED, "%s: not implemented yet", __func__);
}

dp_status dp_cpu_attention_unpermute(dp_device *dev, float *out, const float *y, size_t B,
                                     size_t T, size_t NH, size_t hs)
{
    (void)dev;
    return DP_FAIL(DP_ERR_UNSUPPORTED, "%s: not implemented yet", __func__);
}

dp_status dp_cpu_attention_unpermute_backward(dp_device *dev, float *dy, const float *dout,
                                              size_t B, size_t T, size_t NH, size_t hs)
{
    (void)dev;
    return DP_FAIL(DP_ERR_UNSUPPORTED, "%s: not implemented yet", __func__);
}

dp_status dp_cpu_softmax_causal_forward(dp_device *dev, float *att, float scale, size_t BNH,
                                        size_t T)
{
    (void)dev;
    return DP_FAIL(DP_ERR_UNSUPPORTED, "%s: not implemented yet", __func__);
}

dp_status dp_cpu_softmax_causal_backward(dp_device *dev, float *datt, const float *att,
                                         float scale, size_t BNH, size_t T)
{
    (void)dev;
    return DP_FAIL(DP_ERR_UNSUPPORTED, "%s: not implemented yet", __func__);
}
