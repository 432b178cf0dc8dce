/*
 * dp/nn.h - layer kernels: forward/backward pairs on a device.
 *
 * Conventions (as llm.c): arguments are ordered outputs, inputs,
 * parameters, cached values, dimensions. Every pointer is a device pointer
 * of dev; shapes are given as (dims) in row-major order. Gradient pointers
 * carry a d prefix. Parameter gradients ACCUMULATE (+=); activation
 * gradients OVERWRITE unless the docstring says they accumulate (residual
 * paths). Sizes are element counts, not bytes.
 *
 * Parameters are float32; a function with the suffix _bf16 takes them as
 * bfloat16 (dp_bf16, a bf16 replica: dp_model.param_dtype) and computes
 * exactly what its float32 twin computes on their widened values, in the
 * device's matmul precision (dp_device_set_matmul_precision) like any
 * GEMM. Activations and gradients are float32 in both.
 *
 * Every function returns DP_ERR_INVALID_ARGUMENT for NULL required
 * pointers or zero/inconsistent dimensions, DP_ERR_DEVICE for a backend
 * failure, and DP_OK otherwise.
 */
#ifndef DP_NN_H
#define DP_NN_H

#include <stddef.h>
#include <stdint.h>

#include "dp/device.h"
#include "dp/dtype.h"
#include "dp/ops.h" /* dp_accumulate, which the layers' callers use with them */

#ifdef __cplusplus
extern "C" {
#endif

/* ---- token + position embedding ----------------------------------------
 * out(B,T,C)[b,t,:] = wte(V,C)[inp[b,t],:] + wpe(maxT,C)[t,:], T <= maxT.
 * Token ids must lie in [0,V): the caller validates them on the host. */
DP_API dp_status dp_encoder_forward(dp_device *dev, float *out, const int32_t *inp,
                                    const float *wte, const float *wpe, size_t B, size_t T,
                                    size_t C);
DP_API dp_status dp_encoder_forward_bf16(dp_device *dev, float *out, const int32_t *inp,
                                         const dp_bf16 *wte, const dp_bf16 *wpe, size_t B,
                                         size_t T, size_t C);
/* dwte(V,C) += scatter of dout by token id; dwpe(maxT,C)[t] += sum_b dout[b,t].
 * Additions happen in a fixed order (deterministic). */
DP_API dp_status dp_encoder_backward(dp_device *dev, float *dwte, float *dwpe,
                                     const float *dout, const int32_t *inp, size_t B,
                                     size_t T, size_t C);

/* ---- linear -------------------------------------------------------------
 * out(N,OC) = inp(N,C) @ weight(OC,C)^T + bias(OC); bias may be NULL.
 * weight is stored [out, in] as PyTorch's nn.Linear. */
DP_API dp_status dp_linear_forward(dp_device *dev, float *out, const float *inp,
                                   const float *weight, const float *bias, size_t N, size_t C,
                                   size_t OC);
DP_API dp_status dp_linear_forward_bf16(dp_device *dev, float *out, const float *inp,
                                        const dp_bf16 *weight, const dp_bf16 *bias, size_t N,
                                        size_t C, size_t OC);
/* dinp(N,C) = dout @ weight (overwritten; NULL skips it),
 * dweight(OC,C) += dout^T @ inp, dbias(OC) += column sums of dout (NULL skips). */
DP_API dp_status dp_linear_backward(dp_device *dev, float *dinp, float *dweight, float *dbias,
                                    const float *dout, const float *inp, const float *weight,
                                    size_t N, size_t C, size_t OC);
DP_API dp_status dp_linear_backward_bf16(dp_device *dev, float *dinp, float *dweight,
                                         float *dbias, const float *dout, const float *inp,
                                         const dp_bf16 *weight, size_t N, size_t C, size_t OC);
/* The _bf16 layer with its input activation inp(N,C) stored as bfloat16
 * too (out, dout, dinp and the gradients stay float32). A GEMM in BF16
 * matmul precision rounds a float32 input to exactly these values, so
 * there the result equals dp_linear_*_bf16 on the float32 input, bit for
 * bit, while the input takes half the memory and is never converted; in
 * FP32 or TF32 precision the layer computes with the rounded input. */
DP_API dp_status dp_linear_forward_bf16_inp(dp_device *dev, float *out, const dp_bf16 *inp,
                                            const dp_bf16 *weight, const dp_bf16 *bias,
                                            size_t N, size_t C, size_t OC);
DP_API dp_status dp_linear_backward_bf16_inp(dp_device *dev, float *dinp, float *dweight,
                                             float *dbias, const float *dout,
                                             const dp_bf16 *inp, const dp_bf16 *weight,
                                             size_t N, size_t C, size_t OC);

/* Linear with strided input rows: dp_linear_forward/_backward for an
 * input whose rows start ld_inp floats apart (ld_inp >= C), e.g. the first
 * C columns of a row [x | y] without copying them out: row r of the input is
 * inp[r * ld_inp .. r * ld_inp + C). Same math, shapes and errors
 * otherwise (plus DP_ERR_INVALID_ARGUMENT for ld_inp < C or > INT_MAX).
 * Runs on the device's GEMM (no staging): as fast as the contiguous calls.
 *   forward:  out(N,OC) = inp @ weight(OC,C)^T + bias(OC) (bias may be NULL)
 *   backward: dinp (rows ld_inp apart, first C columns overwritten; NULL
 *             skips it) = dout @ weight, dweight(OC,C) += dout^T @ inp,
 *             dbias(OC) += column sums of dout (NULL skips it). */
DP_API dp_status dp_linear_forward_ld(dp_device *dev, float *out, const float *inp,
                                      size_t ld_inp, const float *weight, const float *bias,
                                      size_t N, size_t C, size_t OC);
DP_API dp_status dp_linear_backward_ld(dp_device *dev, float *dinp, float *dweight, float *dbias,
                                       const float *dout, const float *inp, size_t ld_inp,
                                       const float *weight, size_t N, size_t C, size_t OC);

/* ---- LayerNorm (eps = 1e-5, as torch.nn.LayerNorm) ----------------------
 * out(N,C) = (inp - mean) * rstd * weight + bias; caches mean(N), rstd(N)
 * with rstd = 1/sqrt(var + eps), var the biased variance. */
#define DP_LAYERNORM_EPS 1e-5f
DP_API dp_status dp_layernorm_forward(dp_device *dev, float *out, float *mean, float *rstd,
                                      const float *inp, const float *weight, const float *bias,
                                      size_t N, size_t C);
DP_API dp_status dp_layernorm_forward_bf16(dp_device *dev, float *out, float *mean,
                                           float *rstd, const float *inp, const dp_bf16 *weight,
                                           const dp_bf16 *bias, size_t N, size_t C);
/* dinp(N,C) += (ACCUMULATES: LayerNorm sits on the residual stream),
 * dweight(C) +=, dbias(C) +=. */
DP_API dp_status dp_layernorm_backward(dp_device *dev, float *dinp, float *dweight,
                                       float *dbias, const float *dout, const float *inp,
                                       const float *weight, const float *mean,
                                       const float *rstd, size_t N, size_t C);
DP_API dp_status dp_layernorm_backward_bf16(dp_device *dev, float *dinp, float *dweight,
                                            float *dbias, const float *dout, const float *inp,
                                            const dp_bf16 *weight, const float *mean,
                                            const float *rstd, size_t N, size_t C);

/* ---- GELU, tanh approximation (Hendrycks & Gimpel 2016; GPT-2) -----------
 * out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), n elements (out
 * may alias inp). */
DP_API dp_status dp_gelu_forward(dp_device *dev, float *out, const float *inp, size_t n);
/* The same over bfloat16 values, in and out (half the memory of each):
 * out = bf16(gelu(inp)), the float32 GELU of the widened input rounded
 * once, bit for bit (out may alias inp). */
DP_API dp_status dp_gelu_forward_bf16(dp_device *dev, dp_bf16 *out, const dp_bf16 *inp, size_t n);
/* dinp = dout * gelu'(inp) (overwritten; dinp may alias dout). */
DP_API dp_status dp_gelu_backward(dp_device *dev, float *dinp, const float *inp,
                                  const float *dout, size_t n);
/* The same with the pre-activation inp kept as bfloat16 (half its memory):
 * the float32 backward on the widened values, bit for bit. gelu' is then
 * taken at the rounded input, as llm.c's bf16 training does; the error is
 * at most about 2^-8 relative to |x gelu''(x)|. */
DP_API dp_status dp_gelu_backward_bf16_inp(dp_device *dev, float *dinp, const dp_bf16 *inp,
                                           const float *dout, size_t n);

/* ---- ReLU (Nair & Hinton 2010) ---------------------------------------------
 * out = max(x, 0), n elements (out may alias inp; a NaN stays NaN). */
DP_API dp_status dp_relu_forward(dp_device *dev, float *out, const float *inp, size_t n);
/* dinp = dout where inp > 0, else 0 (the gradient at 0 is 0, as PyTorch's;
 * overwritten; dinp may alias dout). */
DP_API dp_status dp_relu_backward(dp_device *dev, float *dinp, const float *inp,
                                  const float *dout, size_t n);

/* ---- SiLU (Elfwing et al. 2018; Swish with beta = 1) ------------------------
 * out = x sigmoid(x), n elements (out may alias inp). */
DP_API dp_status dp_silu_forward(dp_device *dev, float *out, const float *inp, size_t n);
/* dinp = dout * (s + x s (1 - s)), s = sigmoid(inp) (overwritten; dinp may
 * alias dout). */
DP_API dp_status dp_silu_backward(dp_device *dev, float *dinp, const float *inp,
                                  const float *dout, size_t n);

/* ---- softmax and log-softmax over rows ---------------------------------------
 * out(N,C)[r,:] = softmax(inp[r,:]) = exp(inp - m) / sum exp(inp - m), m
 * the row's maximum (so no exp overflows: stable for |x| ~ 1e4). out may
 * alias inp. A -inf entry (a masked class) gets probability 0; a row of
 * -inf only, or with a NaN, gives NaN (as torch.softmax). The sum is a
 * float32 sum in a fixed order: about C * 2^-24 relative error at worst. */
DP_API dp_status dp_softmax_forward(dp_device *dev, float *out, const float *inp, size_t N,
                                    size_t C);
/* dinp(N,C) = out * (dout - row sums of out * dout), from the forward's
 * out (overwritten; dinp may alias dout, not out). */
DP_API dp_status dp_softmax_backward(dp_device *dev, float *dinp, const float *out,
                                     const float *dout, size_t N, size_t C);
/* out(N,C)[r,:] = inp[r,:] - logsumexp(inp[r,:]) = (x - m) - log(sum exp(x - m)),
 * the sum in double, the result rounded once (out may alias inp). A -inf
 * entry gives -inf; a row of -inf only, or with a NaN, gives NaN (as
 * torch.log_softmax). A criterion's building block: log-probabilities
 * without the cancellation of log(softmax). */
DP_API dp_status dp_log_softmax_forward(dp_device *dev, float *out, const float *inp, size_t N,
                                        size_t C);
/* dinp(N,C) = dout - exp(out) * row sums of dout (sums in double), from
 * the forward's out (overwritten; dinp may alias dout, not out). */
DP_API dp_status dp_log_softmax_backward(dp_device *dev, float *dinp, const float *out,
                                         const float *dout, size_t N, size_t C);

/* ---- dropout (Srivastava et al. 2014), inverted as PyTorch's ------------------
 * out(rows,cols) = inp * mask / (1 - p): each element is dropped (0) with
 * probability p and the kept ones are scaled by 1 / (1 - p), so the
 * expectation is inp. The mask of element (r, c) is a pure function of
 * (seed, step, row0 + r, c) (a counter-based hash, kernels/dropout.h):
 * row0 is the block's first row in the GLOBAL batch (dp_chunk.row_begin
 * times the rows per example), so the mask of a row does not depend on
 * which device or micro-batch computes it (k devices mask as 1 device
 * does), and the backward recomputes it instead of storing it. step makes
 * each training step's masks new (dp_chunk.step). p in [0, 1] (1 drops
 * everything, 0 copies); out may alias inp. Dropout is for training: in
 * evaluation (dp_chunk.training == 0) skip it, as model.eval() does.
 * Errors also: p outside [0, 1] (or NaN), row0 + rows overflowing. */
DP_API dp_status dp_dropout_forward(dp_device *dev, float *out, const float *inp, float p,
                                    uint64_t seed, uint64_t step, size_t row0, size_t rows,
                                    size_t cols);
/* dinp = dout * mask / (1 - p), the forward's mask for the same (p, seed,
 * step, row0, rows, cols) (overwritten; dinp may alias dout). */
DP_API dp_status dp_dropout_backward(dp_device *dev, float *dinp, const float *dout, float p,
                                     uint64_t seed, uint64_t step, size_t row0, size_t rows,
                                     size_t cols);

/* ---- residual add ---------------------------------------------------------
 * out = a + b (n elements; out may alias a or b). */
DP_API dp_status dp_residual_forward(dp_device *dev, float *out, const float *a,
                                     const float *b, size_t n);
/* da += dout, db += dout (ACCUMULATE; either may be NULL). */
DP_API dp_status dp_residual_backward(dp_device *dev, float *da, float *db, const float *dout,
                                      size_t n);

/* ---- causal multi-head self-attention --------------------------------------
 * qkv(B,T,3C) holds q, k, v side by side along the last axis (nanoGPT's
 * fused c_attn output); NH heads of size hs = C/NH (C % NH == 0).
 * att = softmax(q k^T / sqrt(hs)) with the causal mask (key t2 > query t
 * gets zero weight); out(B,T,C) = att v with heads concatenated.
 * Cached for backward: qkvr(3,B,NH,T,hs) (q, k, v permuted per head) and
 * att(B,NH,T,T) (the softmax). scratch(B,T,C) is clobbered. */
DP_API dp_status dp_attention_forward(dp_device *dev, float *out, float *qkvr, float *att,
                                      float *scratch, const float *qkv, size_t B, size_t T,
                                      size_t C, size_t NH);
/* dqkv(B,T,3C) overwritten. dqkvr(3,B,NH,T,hs), datt(B,NH,T,T) and
 * scratch(B,T,C) are clobbered scratch. */
DP_API dp_status dp_attention_backward(dp_device *dev, float *dqkv, float *dqkvr, float *datt,
                                       float *scratch, const float *dout, const float *qkvr,
                                       const float *att, size_t B, size_t T, size_t C,
                                       size_t NH);
/* The same with qkvr(3,B,NH,T,hs) kept as bfloat16: only the GEMMs read
 * q, k and v, and a BF16-precision GEMM rounds them to exactly these
 * values, so there the results equal the float32 qkvr's bit for bit, with
 * half its memory. The forward's permute rounds each element as it
 * writes it (no float32 copy). In FP32 or TF32 precision the GEMMs
 * compute with the rounded q, k and v. */
DP_API dp_status dp_attention_forward_bf16_qkv(dp_device *dev, float *out, dp_bf16 *qkvr,
                                               float *att, float *scratch, const float *qkv,
                                               size_t B, size_t T, size_t C, size_t NH);
DP_API dp_status dp_attention_backward_bf16_qkv(dp_device *dev, float *dqkv, float *dqkvr,
                                                float *datt, float *scratch, const float *dout,
                                                const dp_bf16 *qkvr, const float *att, size_t B,
                                                size_t T, size_t C, size_t NH);
/* att(B,NH,T,T) = the probabilities the forward computed from qkvr
 * (float32, or bfloat16 for the _bf16_qkv variant), bit for bit: the same
 * GEMM and softmax on the same device and precision. A caller that keeps
 * only qkvr recomputes att here before the backward, trading one batched
 * (T,hs)x(hs,T) GEMM and a softmax for B*NH*T*T cached floats (activation
 * recomputation, as FlashAttention's backward does). att is overwritten. */
DP_API dp_status dp_attention_probs(dp_device *dev, float *att, const float *qkvr, size_t B,
                                    size_t T, size_t C, size_t NH);
DP_API dp_status dp_attention_probs_bf16_qkv(dp_device *dev, float *att, const dp_bf16 *qkvr,
                                             size_t B, size_t T, size_t C, size_t NH);

/* The same attention formed for at most `chunk` queries at a time (Rabe &
 * Staats 2021, "Self-attention does not need O(n^2) memory"; the query
 * blocks of FlashAttention without its online softmax): the probabilities
 * of queries q0..q0+n-1 over keys 0..q0+n-1 (later keys are masked, so
 * neither computed nor stored), then their share of the output. Nothing
 * (T,T) is formed or kept: the backward recomputes each chunk's
 * probabilities from qkvr with the forward's calls. Each softmax row is
 * exact (no running rescale); the products over keys are split at chunk
 * boundaries, so results match dp_attention_forward/backward to float32
 * rounding, not bit for bit (with chunk >= T they are its calls exactly).
 * About half the score FLOPs are skipped (the masked blocks).
 *   qkvr(3,B,NH,T,hs) of qkvr_dtype (DP_DTYPE_F32, or DP_DTYPE_BF16 as the
 *     _bf16_qkv variants), written by the forward and the only thing the
 *     backward needs besides dout;
 *   att, datt (B,NH,min(chunk,T),T) floats: scratch, clobbered;
 *   att16 NULL, or (B,NH,min(chunk,T),T) bfloat16 elements of scratch
 *     (half att's bytes), clobbered: on a device in BF16 matmul precision
 *     the softmax writes each chunk's probabilities there rounded to
 *     bfloat16 as it writes them, and the backward its score gradients,
 *     and the GEMMs read those, instead of each GEMM rounding the float32
 *     ones into its own scratch: the same operands, one pass instead of
 *     one per GEMM. The results are the same bits as with NULL except
 *     where a GEMM too large for the device's conversion scratch
 *     (backend/gemm_pieces.h) would have been cut along k. In FP32 and
 *     TF32 precision att16 is not touched;
 *   scratch (B,T,C): clobbered.
 * chunk >= 1 (queries per chunk; the last chunk may be shorter). Errors as
 * dp_attention_forward; DP_ERR_INVALID_ARGUMENT for chunk 0 or another
 * qkvr_dtype. dqkv(B,T,3C) is overwritten; dqkvr(3,B,NH,T,hs) is scratch. */
DP_API dp_status dp_attention_forward_chunked(dp_device *dev, float *out, void *qkvr,
                                              dp_dtype qkvr_dtype, float *att, dp_bf16 *att16,
                                              float *scratch, const float *qkv, size_t B,
                                              size_t T, size_t C, size_t NH, size_t chunk);
DP_API dp_status dp_attention_backward_chunked(dp_device *dev, float *dqkv, float *dqkvr,
                                               float *att, dp_bf16 *att16, float *datt,
                                               float *scratch, const float *dout,
                                               const void *qkvr, dp_dtype qkvr_dtype, size_t B,
                                               size_t T, size_t C, size_t NH, size_t chunk);

/* The same attention fused (FlashAttention-2: Dao 2023, "FlashAttention-2:
 * Faster Attention with Better Parallelism and Work Partitioning"): each
 * query row runs an online softmax over its keys 0..t (Milakov &
 * Gimelshein 2018, "Online normalizer calculation for softmax": a running
 * maximum m and sum l, the accumulated output rescaled by exp(m_old -
 * m_new) as the maximum grows), so no probability is written to memory,
 * not even a chunk's; the forward keeps lse, the log of each row's
 * normaliser, and the backward recomputes p = exp(s - lse) from it.
 * scale = 1/sqrt(hs), scores s = scale q.k; every sum is float32 (q, k,
 * v, O widened exactly from bfloat16 where stored so). Results match
 * dp_attention_forward/backward to float32 rounding, not bit for bit
 * (the key sums run in another order), and are the same bits run to run
 * on one device: the backward is FlashAttention-2's deterministic one, a
 * query-major pass for dq and a key-major pass for dk and dv, no atomics.
 * Any head size; CUDA devices run tiled kernels for hs 64 and 128 and a
 * thread per row otherwise (backend/cuda/cuda_flash.cu).
 *
 * Unlike the calls above, q, k and v are read in place, in qkv(B,T,3C)
 * (nanoGPT's c_attn output: token t's q, then its k, then its v, heads
 * concatenated in each), of qkv_dtype (DP_DTYPE_F32 or DP_DTYPE_BF16):
 * nothing is permuted or copied, and the caller keeps qkv for the
 * backward (a caller that keeps bfloat16 activations rounds it first).
 * Forward:
 *   qkv(B,T,3C) input, read only;
 *   out(B,T,C) float32 output, heads concatenated;
 *   lse(B,NH,T) float32 output: log sum_{j<=t} exp(s_tj), kept for the
 *     backward (4 bytes per head and token instead of T probabilities).
 * Backward (dout and the forward's qkv, lse and out; nothing else):
 *   dqkv(B,T,3C) float32, overwritten;
 *   delta(B,NH,T) floats of scratch, clobbered: D_t = dout_t . out_t per
 *     head, the row sums of p * dp (FlashAttention-2's D);
 *   out(B,T,C) the forward's output as out_dtype: float32, or bfloat16
 *     (a caller that keeps its activations so rounds it). A bfloat16 O
 *     gives D = dO . bf16(O), off by up to ~2^-9 |dO||O| per row, which
 *     moves each score gradient ds = p (dp - D) by p times that (dq and dk
 *     of the row by about scale * 2^-9 |dO||O| |k|; dv is not affected),
 *     as FlashAttention's backward does from its bfloat16 O.
 * Errors: DP_ERR_INVALID_ARGUMENT for NULL pointers, zero or inconsistent
 * dimensions (C % NH != 0), a qkv_dtype or out_dtype other than
 * DP_DTYPE_F32 and DP_DTYPE_BF16, the same buffer passed twice, B*T*3C
 * floats overflowing size_t, or more than 2^31 - 1 rows B*NH*T;
 * DP_ERR_UNSUPPORTED on a backend without the fused kernels;
 * DP_ERR_DEVICE. */
DP_API dp_status dp_attention_forward_fused(dp_device *dev, float *out, float *lse,
                                            const void *qkv, dp_dtype qkv_dtype, size_t B,
                                            size_t T, size_t C, size_t NH);
DP_API dp_status dp_attention_backward_fused(dp_device *dev, float *dqkv, float *delta,
                                             const float *dout, const void *qkv,
                                             dp_dtype qkv_dtype, const float *lse,
                                             const void *out, dp_dtype out_dtype, size_t B,
                                             size_t T, size_t C, size_t NH);

/* ---- fused softmax cross-entropy ------------------------------------------
 * For each row i of logits(N,V) with targets[i] in [0,V):
 *   loss_i = logsumexp(logits[i,:]) - logits[i,targets[i]]
 *   dlogits[i,:] = dscale * (softmax(logits[i,:]) - onehot(targets[i]))
 * Rows with targets[i] == -1 are ignored: no loss, dlogits row zero.
 * *loss_sum_host = sum of loss_i over valid rows, added in row order in
 * double. dscale is usually 1/N_global (N_global = valid targets in the
 * whole global batch), which makes the sum of per-device losses times
 * dscale the exact global mean. dlogits may alias logits (in place) or be
 * NULL (loss only). losses(N) is device scratch. Stable for |logits| ~ 1e4
 * (max subtraction). Logits of -inf (masked classes) get probability 0 and
 * a zero gradient, as long as the target's own logit is finite. Targets
 * outside [-1,V) are the caller's bug: the caller validates them on the
 * host. */
DP_API dp_status dp_crossentropy_forward_backward(dp_device *dev, double *loss_sum_host,
                                                  float *dlogits, float *losses,
                                                  const float *logits, const int32_t *targets,
                                                  size_t N, size_t V, float dscale);

#ifdef __cplusplus
}
#endif

#endif /* DP_NN_H */
