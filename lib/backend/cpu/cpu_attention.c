/*
 * backend/cpu/cpu_attention.c - the CPU backend's attention permutes:
 * qkv <-> qkvr and y <-> out (the causal softmax rows, and the fused
 * attention's rows of kernels/flash.h, are ops of kernels/ops.h,
 * generated in cpu_backend.c).
 *
 * Each entry loops, on the calling thread, over the DP_HD functions of
 * kernels/attention.h (the math the CUDA backend shares). The GEMMs of
 * attention are the backend's gemm_strided_batched, called from
 * lib/nn/attention.c. Arguments were validated by that wrapper.
 */
#include "backend/cpu/cpu_kernels.h"
#include "kernels/attention.h"

// --- permutes ------------------------------------------------------------------------

DP_CPU_SIMD dp_status dp_cpu_attention_permute(dp_device *dev, float *qkvr, const float *qkv, size_t B,
                                   size_t T, size_t NH, size_t hs)
{
    size_t runs = 3 * B * NH * T;
    for (size_t r = 0; r < runs; r++) dp_attention_permute_run(qkvr, qkv, r, B, T, NH, hs, 0, 1);
    return DP_OK;
}

DP_CPU_SIMD dp_status dp_cpu_attention_permute_bf16(dp_device *dev, uint16_t *qkvr,
                                                 const float *qkv, size_t B, size_t T, size_t NH,
                                                 size_t hs)
{
    size_t runs = 3 * B * NH * T;
    for (size_t r = 0; r < runs; r++) dp_attention_permute_bf16_run(qkvr, qkv, r, B, T, NH, hs, 0, 1);
    return DP_OK;
}

DP_CPU_SIMD dp_status dp_cpu_attention_permute_backward(dp_device *dev, float *dqkv, const float *dqkvr,
                                            size_t B, size_t T, size_t NH, size_t hs)
{
    size_t runs = B * T * 3 * NH;
    for (size_t r = 0; r < runs; r++)
        dp_attention_permute_backward_run(dqkv, dqkvr, r, B, T, NH, hs, 0, 1);
    return DP_OK;
}

DP_CPU_SIMD dp_status dp_cpu_attention_unpermute(dp_device *dev, float *out, const float *y, size_t B,
                                     size_t T, size_t NH, size_t hs)
{
    size_t n = B * T * NH * hs;
    for (size_t r = 0; r < n / hs; r++) dp_attention_unpermute_run(out, y, r, T, NH, hs, 0, 1);
    return DP_OK;
}

DP_CPU_SIMD dp_status dp_cpu_attention_unpermute_backward(dp_device *dev, float *dy, const float *dout,
                                              size_t B, size_t T, size_t NH, size_t hs)
{
    size_t n = B * NH * T * hs;
    for (size_t r = 0; r < n / hs; r++) dp_attention_unpermute_backward_run(dy, dout, r, T, NH, hs, 0, 1);
    return DP_OK;
}
