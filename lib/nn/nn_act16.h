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
#include "dp/model.h" /* dp_target_type */
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

/*
 * The LayerNorm backward of dp/nn.h (dinp(N,C) += the input gradient,
 * dweight(C) and dbias(C) += the parameter gradients) from a bfloat16
 * dout(N,C): the GPT's bf16 activation gradients of ln_1 and ln_2's
 * outputs, written by c_attn's and c_fc's backward
 * (dp_linear_backward_to16). Each value is the float32 backward's on the
 * widened dout, bit for bit; inp, mean, rstd and dinp (the residual
 * stream's gradient) stay float32; weight float32 or bfloat16. Device
 * pointers of dev owned by the caller; dinp must not overlap dout.
 * Errors: DP_ERR_INVALID_ARGUMENT for a NULL pointer, N or C of 0, sizes
 * whose bytes overflow, dinp overlapping dout; a backend's error as is.
 */
DP_MODULE_API dp_status dp_layernorm_backward_dout16(dp_device *dev, float *dinp, float *dweight,
                                                     float *dbias, const dp_bf16 *dout,
                                                     const float *inp, dp_pref weight,
                                                     const float *mean, const float *rstd,
                                                     size_t N, size_t C);

/*
 * The residual stream's update fused with the next LayerNorm: x(N,C) +=
 * add(N,C) (written back), then out(N,C) = LayerNorm(x) as out_type
 * (DP_DTYPE_F32, or DP_DTYPE_BF16 rounded once), mean(N), rstd(N) float32;
 * weight, bias (C) float32 or bfloat16. One pass over x where
 * dp_accumulate then the LayerNorm take two; the same bits. All device
 * pointers of dev, owned by the caller; out, x and add pairwise apart.
 * Errors: DP_ERR_INVALID_ARGUMENT for a NULL pointer, N or C of 0, sizes
 * whose bytes overflow, another out_type, overlapping buffers; a
 * backend's error as is.
 */
DP_MODULE_API dp_status dp_residual_layernorm_forward(dp_device *dev, void *out, dp_dtype out_type,
                                                      float *mean, float *rstd, float *x,
                                                      const float *add, dp_pref weight,
                                                      dp_pref bias, size_t N, size_t C);

/*
 * Linear layer with a bfloat16 output: out(N,OC) = bf16(inp(N,C) @
 * weight(OC,C)^T + bias(OC)), the products in dev's matmul precision,
 * the bias added in float32 before the one rounding: the float32 layer of
 * dp/nn.h (bias broadcast, then the GEMM with beta = 1) followed by
 * dp_convert. inp is float32 or bfloat16 (inp_type DP_DTYPE_F32 or
 * DP_DTYPE_BF16); bias.p may be NULL (no bias).
 *
 * Where the backend has a fused entry (dp_backend_ops.gemm_bias_out, for
 * bfloat16 operands in BF16 matmul precision: on CUDA devices cuBLASLt's
 * bias epilogue writing bfloat16, on CPU devices oneDNN's matmul with its
 * bias and a bfloat16 destination) it writes out directly. Else, or
 * when it declines, the float32 layer runs into `scratch` (scratch_floats
 * >= OC floats, at least one row; the caller's, e.g. a workspace region
 * free at the time) and is converted: whole when the scratch holds N*OC
 * floats, else in blocks of scratch_floats / OC rows, each the float32
 * layer on its rows.
 * Bits: the whole fallback is the composition itself, bit for bit.
 * Blocks of rows are deterministic but not bitwise: a BLAS groups an
 * output's sums by the call's shape (OpenBLAS's edge kernels), so a few
 * outputs may round to the neighbouring bfloat16. cuBLASLt's kernel is
 * not the one cuBLAS picks for the float32 layer: its sums may be grouped
 * otherwise too. oneDNN's is the composition's kernel, and adds the bias
 * to the finished sums as the composition's beta = 1 does: the same bits
 * (tests/test_linear.c, tests/test_bf16_engine.c check it).
 *
 * Ownership: every pointer is a device pointer of dev owned by the caller;
 * out must not overlap inp or scratch, nor scratch inp. Errors:
 * DP_ERR_INVALID_ARGUMENT for a NULL pointer (bias.p excepted), a size of
 * 0 or past the GEMM's int sizes, an operand type other than F32 and
 * BF16, a scratch under one row, overlapping buffers; the backend's
 * errors as they come.
 */
DP_MODULE_API dp_status dp_linear_forward_out16(dp_device *dev, dp_bf16 *out, float *scratch,
                                                size_t scratch_floats, const void *inp,
                                                dp_dtype inp_type, dp_pref weight, dp_pref bias,
                                                size_t N, size_t C, size_t OC);

/*
 * The MLP's first linear layer and its GELU with bfloat16 outputs: pre(N,OC)
 * = bf16(inp @ weight^T + bias) and out(N,OC) = GELU(pre), both kept (the
 * GELU's backward reads pre; GPT-2's c_fc). Composed, it is
 * dp_linear_forward_out16 into pre (its arguments, scratch and bits) then
 * dp_gelu_forward_bf16 of pre: the GELU of the rounded pre-activation.
 * Where the backend has the GELU in its GEMM's epilogue
 * (dp_backend_ops.gemm_gelu: cuBLASLt's GELU_AUX_BIAS on CUDA devices with
 * DP_CUDA_LT_GELU=1, llm.c's gelu_fusion) one GEMM writes both, and out is
 * the library's GELU of the float32 sums: within one bfloat16 rounding of
 * pre times GELU' (at most 1.13) of the composition's, not its bits; a
 * recomputation of out from pre (DP_GPT_RECOMPUTE_GELU) would not repeat
 * it, so the GPT fuses only where it keeps out.
 * Ownership: device pointers of dev owned by the caller; out must not
 * overlap pre, inp or scratch (and pre as dp_linear_forward_out16's out).
 * Errors: as dp_linear_forward_out16, and DP_ERR_INVALID_ARGUMENT for a
 * NULL pre or out, or out overlapping.
 */
DP_MODULE_API dp_status dp_linear_gelu_forward_out16(dp_device *dev, dp_bf16 *out, dp_bf16 *pre,
                                                     float *scratch, size_t scratch_floats,
                                                     const void *inp, dp_dtype inp_type,
                                                     dp_pref weight, dp_pref bias, size_t N,
                                                     size_t C, size_t OC);

/*
 * The linear backward of dp/nn.h (dinp(N,C) = dout @ weight, overwritten,
 * dinp NULL: skipped; dweight(OC,C) += dout^T @ inp; dbias(OC) += column
 * sums of dout, dbias NULL: skipped) that, in BF16 matmul precision,
 * rounds the float32 dout(N,OC) to bfloat16 once into dout16 (N*OC
 * bfloat16, the caller's scratch) and gives both GEMMs that operand,
 * where each would round dout into the device's conversion scratch
 * itself. The bias gradient reads the float32 dout. In other precisions,
 * or with dout16 NULL, it is the backward of dp/nn.h and dout16 is
 * untouched. inp is float32 or bfloat16 (inp_type); weight either.
 *
 * Bits: the same rounding (kernels/bf16.h) of the same values feeds the
 * same GEMM calls, so the gradients are those of dp/nn.h's backward, bit
 * for bit - as long as the backend runs that GEMM whole. A GEMM whose
 * converted operands pass the device's conversion cap
 * (backend/gemm_pieces.h; 16 MiB by default) is cut into pieces, which
 * regroups its sums; a bfloat16 dout needs no conversion and so is not
 * cut where the float32 one was (only for a dout over 8M elements with
 * oneDNN or cuBLAS, e.g. an LM head's logits chunk). The tests' sizes
 * cut nothing.
 *
 * Ownership: device pointers of dev owned by the caller; dout16 must not
 * overlap dout, inp, weight, dinp or dweight. Errors: as
 * dp_linear_backward, and DP_ERR_INVALID_ARGUMENT for overlapping buffers
 * or an inp_type other than F32 and BF16.
 */
DP_MODULE_API dp_status dp_linear_backward_dout16(dp_device *dev, float *dinp, float *dweight,
                                                  float *dbias, const float *dout,
                                                  dp_bf16 *dout16, const void *inp,
                                                  dp_dtype inp_type, dp_pref weight, size_t N,
                                                  size_t C, size_t OC);

/*
 * The linear backward from a bfloat16 dout alone: dinp(N,C) = dout16 @
 * weight (overwritten; dinp NULL: skipped), dweight(OC,C) += dout16^T @
 * inp, both GEMMs reading dout16(N,OC) as a bfloat16 operand in any
 * matmul precision (widened where the math is float32), and dbias(OC) +=
 * the column sums of dout16 widened (float32 sums in kernels/colsum.h's
 * order; dbias NULL: skipped). An LM head's backward from the bfloat16
 * dlogits its criterion wrote in place (dp_model.head_backward_bf16,
 * no bias), and the GPT's c_fc from the bfloat16 GELU gradient. In BF16
 * math the same GEMM calls as dp_linear_backward_rounded given the same
 * dout16, so the same dinp and dweight bits; the bias gradient is of the
 * rounded values (dp_linear_backward_rounded's reads the float32 dout).
 * inp float32 or bfloat16 (inp_type); weight either.
 * Ownership: device pointers of dev owned by the caller; dout16 must not
 * overlap dinp, dweight or dbias. Errors: as dp_linear_backward_dout16, and
 * DP_ERR_INVALID_ARGUMENT for a NULL dout16.
 */
DP_MODULE_API dp_status dp_linear_backward_from16(dp_device *dev, float *dinp, float *dweight,
                                                  float *dbias, const dp_bf16 *dout16,
                                                  const void *inp, dp_dtype inp_type,
                                                  dp_pref weight, size_t N, size_t C, size_t OC);

/*
 * dp_linear_backward_dout16 with the input gradient kept as bfloat16:
 * dinp16(N,C) = bf16(dout @ weight), dweight(OC,C) += dout^T @ inp,
 * dbias(OC) += column sums of the float32 dout (NULL: skipped). In BF16
 * matmul precision dout is rounded once into dout16 (N*OC bfloat16, the
 * caller's scratch) for both GEMMs, and the input gradient's GEMM writes
 * bfloat16 directly where the backend has the entry
 * (dp_backend_ops.gemm_bias_out without a bias: cuBLASLt on CUDA devices,
 * oneDNN's matmul with a bfloat16 destination on CPU devices). Else (other
 * precisions, dout16 NULL, a declining backend, the test hook) the
 * float32 dinp of dp_linear_backward_dout16 is computed into scratch
 * (scratch_floats >= N*C) and converted once.
 * With dout NULL, dout16 is the gradient itself, already bfloat16 (the
 * GELU's, d(fch)): every GEMM and the bias read it as they are, in any
 * precision, as dp_linear_backward_from16 does.
 * Bits: dweight and dbias are dp_linear_backward_dout16's (or _from16's);
 * dinp16 is its dinp rounded once - bit for bit on CPU devices (oneDNN's
 * kernel is the composition's), within cuBLASLt's own grouping of the
 * sums on CUDA devices (see dp_linear_forward_out16).
 * Ownership: device pointers of dev owned by the caller; dinp16 and
 * scratch must not overlap each other, dout, dout16 or inp. Errors: as
 * dp_linear_backward_dout16, and DP_ERR_INVALID_ARGUMENT for a NULL dinp16
 * or scratch, or a scratch under N*C floats.
 */
DP_MODULE_API dp_status dp_linear_backward_to16(dp_device *dev, dp_bf16 *dinp16, float *scratch,
                                                size_t scratch_floats, float *dweight,
                                                float *dbias, const float *dout,
                                                dp_bf16 *dout16, const void *inp,
                                                dp_dtype inp_type, dp_pref weight, size_t N,
                                                size_t C, size_t OC);

/*
 * dp_linear_backward_to16 followed by the GELU backward of its input's
 * pre-activation: dinp16(N,C) = bf16(dout @ weight) then dinp16 =
 * dp_gelu_backward_bf16(pre, dinp16) in place, pre(N,C) bfloat16 (the
 * kept c_fc output whose GELU was this layer's input; GPT-2's MLP c_proj).
 * Where the backend has the GELU's gradient in its GEMM's epilogue
 * (dp_backend_ops.gemm_gelu: cuBLASLt's DGELU, DP_CUDA_LT_GELU=1) the
 * input gradient's GEMM writes bf16(sums * GELU'(pre)) with the sums not
 * rounded first: within two bfloat16 roundings of the composition's, not
 * its bits. Else, and on CPU devices, the composition bit for bit.
 * Arguments, ownership and errors as dp_linear_backward_to16, and
 * DP_ERR_INVALID_ARGUMENT for a NULL pre or pre overlapping dinp16 or
 * scratch.
 */
DP_MODULE_API dp_status dp_linear_backward_to16_dgelu(dp_device *dev, dp_bf16 *dinp16,
                                                      float *scratch, size_t scratch_floats,
                                                      float *dweight, float *dbias,
                                                      const float *dout, dp_bf16 *dout16,
                                                      const void *inp, dp_dtype inp_type,
                                                      dp_pref weight, const dp_bf16 *pre,
                                                      size_t N, size_t C, size_t OC);

/*
 * The GELU backward with its gradients kept as bfloat16 too (the MLP's
 * activation gradients of the GPT's bf16 activations): dinp(n) =
 * bf16(dout * gelu'(inp)), inp, dout and dinp bfloat16, the product in
 * float32 on the widened values (kernels/gelu.h). The same bits as
 * widening dout, dp_gelu_backward_bf16_inp, then dp_convert; dinp may be
 * dout (in place). Device pointers of dev owned by the caller; dinp must
 * not overlap inp. Errors: DP_ERR_INVALID_ARGUMENT for a NULL pointer, n
 * of 0, dinp overlapping inp.
 */
DP_MODULE_API dp_status dp_gelu_backward_bf16(dp_device *dev, dp_bf16 *dinp, const dp_bf16 *inp,
                                              const dp_bf16 *dout, size_t n);

/*
 * dp_attention_forward_fused (dp/nn.h) from a bfloat16 qkv(B,T,3C), read
 * in place, into a bfloat16 out(B,T,C), lse(B,NH,T) float32: the GPT's
 * bf16 activations, c_attn's output written and kept as bfloat16 by its
 * GEMM and the attention's output kept as bfloat16, with no float32 copy
 * or permute of either. Each out element is the float32 call's value on
 * the same qkv rounded once (the kernels accumulate in float32 and round
 * as they store; cuDNN's, where a CUDA device runs it, writes its own bfloat16
 * out), lse the float32 call's. Arguments, ownership and errors as
 * dp_attention_forward_fused, and DP_ERR_INVALID_ARGUMENT for a head size
 * past DP_FLASH_HS_MAX16 (256, kernels/flash.h).
 */
DP_MODULE_API dp_status dp_attention_forward_fused16(dp_device *dev, dp_bf16 *out, float *lse,
                                                     const dp_bf16 *qkv, size_t B, size_t T,
                                                     size_t C, size_t NH);

/*
 * dp_attention_backward_fused (dp/nn.h) with dqkv(B,T,3C) written as
 * bfloat16 and dout(B,T,C) float32 or bfloat16 (dout_dtype): each dqkv
 * element the float32 call's value, given dout's (widened) values,
 * rounded once (the kernels accumulate in float32 and round as they
 * store; cuDNN's, where a CUDA device runs it, reads and writes bfloat16
 * directly). The GPT's bf16 activation gradients: dout is c_proj's
 * bfloat16 input gradient, and c_attn's backward reads dqkv as it is
 * (dp_linear_backward_from16). Arguments, ownership and errors as
 * dp_attention_backward_fused, and DP_ERR_INVALID_ARGUMENT for a
 * dout_dtype other than F32 and BF16 or a head size past
 * DP_FLASH_HS_MAX16 (256, kernels/flash.h).
 */
DP_MODULE_API dp_status dp_attention_backward_fused16(dp_device *dev, dp_bf16 *dqkv, float *delta,
                                                      const void *dout, dp_dtype dout_dtype,
                                                      const void *qkv, dp_dtype qkv_dtype,
                                                      const float *lse, const void *out,
                                                      dp_dtype out_dtype, size_t B, size_t T,
                                                      size_t C, size_t NH);

/*
 * The fused softmax cross-entropy over bfloat16 logits (llm.c's fused
 * classifier): logits(N,V) bfloat16, the LM head's output; targets(N)
 * int32 class ids in [0, V), -1 = ignored. Writes losses(N) float32, each
 * row's loss (0 for an ignored row), on the device: nothing is read back.
 * Unless dlogits is NULL (evaluation), also dlogits(N,V) bfloat16: dscale
 * * (softmax - onehot) rounded once, a zero row where the target is -1.
 * dlogits may be logits (in place, the engine's chunks) or a separate
 * buffer. Bits: on CPU devices each loss is dp_crossentropy_forward_backward's
 * row loss on the widened logits and each dlogits element its float32
 * value rounded to bfloat16 (kernels/crossentropy.h); on CUDA devices
 * float sums (backend/cuda/cuda_rows.cuh derives the bound: the loss
 * within (16 + 6G) * 2^-24 + 2^-23 |loss| of the CPU's, G = 7 at V =
 * 50304) and dlogits within 1 bfloat16 ulp. A target >= V is not
 * checked (the engine validates targets). Ownership: device pointers of
 * dev owned by the caller. Errors: DP_ERR_INVALID_ARGUMENT for a NULL dev,
 * losses, logits or targets, N or V of 0, N * V overflowing, V past
 * INT32_MAX, a non-finite dscale; a backend's error as is.
 */
DP_MODULE_API dp_status dp_crossentropy_bf16(dp_device *dev, float *losses, uint16_t *dlogits,
                                             const uint16_t *logits, const int32_t *targets,
                                             size_t N, size_t V, float dscale);

/*
 * dp_zero_ignored_rows (dp/ops.h) for a bfloat16 x(rows, cols): each row
 * whose target elements are all ignored set to bfloat16 +0, the others
 * untouched (the engine's rule on bfloat16 dlogits). Ownership: device
 * pointers of dev owned by the caller. Errors: as dp_zero_ignored_rows.
 */
DP_MODULE_API dp_status dp_zero_ignored_rows_bf16(dp_device *dev, uint16_t *x,
                                                  const void *targets,
                                                  dp_target_type target_type,
                                                  size_t target_size, size_t rows, size_t cols);

/*
 * dp_fill_columns (dp/ops.h) for a bfloat16 x(rows, ld): x[r * ld + c0 +
 * c] = value rounded to bfloat16 once for r < rows, c < cols, the other
 * columns untouched (-INFINITY gives 0xFF80: a padded vocabulary's
 * bfloat16 logits). rows or cols 0 does nothing. Ownership: a device
 * pointer of dev owned by the caller. Errors: as dp_fill_columns.
 */
DP_MODULE_API dp_status dp_fill_columns_bf16(dp_device *dev, uint16_t *x, float value,
                                             size_t rows, size_t ld, size_t c0, size_t cols);

#endif /* DP_NN_ACT16_H */
