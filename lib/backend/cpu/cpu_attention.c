/*
 * backend/cpu/cpu_attention.c - the CPU backend's attention kernels: the
 * qkv <-> qkvr and y <-> out permutes and the causal softmax rows.
 *
 * Each entry loops, on the calling thread, over the DP_HD functions of
 * kernels/attention.h (the math the CUDA backend shares). The GEMMs of
 * attention are the backend's gemm_strided_batched, called from
 * lib/nn/attention.c. Arguments were validated by that wrapper.
 */
#include "backend/cpu/cpu_kernels.h"
#include "kernels/attention.h"

// --- permutes ------------------------------------------------------------------------

dp_status dp_cpu_attention_permute(dp_device *dev, float *qkvr, const float *qkv, size_t B,
                                   size_t T, size_t NH, size_t hs)
{
    size_t n = 3 * B * NH * T * hs;
    for (size_t i = 0; i < n; i++) dp_attention_permute_elem(qkvr, qkv, i, B, T, NH, hs);
    return DP_OK;
}

dp_status dp_cpu_attention_permute_backward(dp_device *dev, float *dqkv, const float *dqkvr,
                                            size_t B, size_t T, size_t NH, size_t hs)
{
    size_t n = B * T * 3 * NH * hs;
    for (size_t j = 0; j < n; j++)
        dp_attention_permute_backward_elem(dqkv, dqkvr, j, B, T, NH, hs);
    return DP_OK;
}

dp_status dp_cpu_attention_unpermute(dp_device *dev, float *out, const float *y, size_t B,
                                     size_t T, size_t NH, size_t hs)
{
    size_t n = B * T * NH * hs;
    for (size_t j = 0; j < n; j++) dp_attention_unpermute_elem(out, y, j, T, NH, hs);
    return DP_OK;
}

dp_status dp_cpu_attention_unpermute_backward(dp_device *dev, float *dy, const float *dout,
                                              size_t B, size_t T, size_t NH, size_t hs)
{
    size_t n = B * NH * T * hs;
    for (size_t i = 0; i < n; i++) dp_attention_unpermute_backward_elem(dy, dout, i, T, NH, hs);
    return DP_OK;
}

// --- causal softmax ------------------------------------------------------------------

dp_status dp_cpu_softmax_causal_forward(dp_device *dev, float *att, float scale, size_t BNH,
                                        size_t T)
{
    for (size_t r = 0; r < BNH * T; r++)
        dp_softmax_causal_forward_row(att + r * T, scale, r % T, T);
    return DP_OK;
}

dp_status dp_cpu_softmax_causal_backward(dp_device *dev, float *datt, const float *att,
                                         float scale, size_t BNH, size_t T)
{
    for (size_t r = 0; r < BNH * T; r++)
        dp_softmax_causal_backward_row(datt + r * T, att + r * T, scale, r % T, T);
    return DP_OK;
}
