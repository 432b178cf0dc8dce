/*
 * nn/nn_act16.h - the producers of bfloat16 activations (not installed):
 * layers that write their output as bfloat16 once, instead of float32
 * that a second kernel reads back and converts, and a linear backward
 * that rounds its float32 dout to bfloat16 once for both of its GEMMs
 * instead of once inside each. The GPT's bf16 activations
 * (DP_GPT_BF16_ACT, models/gpt_pass.c) are made by them.
 *
 * Each equals, bit for bit, the composition it replaces on the same
 * device: the float32 layer of dp/nn.h followed by dp_convert, or the
 * backward of dp/nn.h (the exceptions are said per function). A test hook
 * (dp_device_set_fused_producers, backend/device_testing.h) makes them
 * run as those compositions, so one binary can compare both.
 *
 * Parameters are dp_pref (kernels/bf16.h): float32 or bfloat16, a replica
 * of either type. Internal: DP_MODULE_API makes them visible to the tests,
 * no installed header declares them.
 */
#ifndef DP_NN_ACT16_H
#define DP_NN_ACT16_H

#include <stddef.h>

#include "core/module.h"
#include "dp/device.h"
#include "dp/dtype.h"
#include "kernels/bf16.h"

/*
 * LayerNorm over the last axis with a bfloat16 output: out(N,C) =
 * bf16((inp - mean) * rstd * weight + bias), the float32 value of
 * dp_layernorm_forward rounded once (kernels/bf16.h); mean(N) and rstd(N)
 * are float32, as the backward reads them. inp (N,C) float32; weight, bias
 * (C) float32 or bfloat16 (both required). All device pointers of dev,
 * owned by the caller; out must not overlap inp, mean or rstd.
 * Errors: DP_ERR_INVALID_ARGUMENT for a NULL pointer, N or C of 0, sizes
 * whose bytes overflow, overlapping buffers; a backend's error as is.
 */
DP_MODULE_API dp_status dp_layernorm_forward_out16(dp_device *dev, dp_bf16 *out, float *mean,
                                                   float *rstd, const float *inp, dp_pref weight,
                                                   dp_pref bias, size_t N, size_t C);

#endif /* DP_NN_ACT16_H */
