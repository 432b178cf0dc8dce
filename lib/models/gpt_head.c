/*
 * models/gpt_head.c - the GPT's tied LM head (gpt_internal.h): logits =
 * ln_f's output @ wte_padded^T for any rows, float32 or bfloat16 (llm.c's
 * fused classifier), and its backward; the engine runs it chunk by chunk
 * (dp_model.head_*).
 */
#include "core/error.h"
#include "models/gpt_internal.h"
#include "models/gpt_layers.h"

/* The tied LM head: logits(N,Vp) = lnf(N,C) @ wte_padded(Vp,C)^T, for any
 * N rows. With a padded vocabulary (Vp > V) the GEMM's m is the aligned
 * Vp over wte's slot, whose padded rows are zero, and the padded columns
 * are then set to -inf: the cross-entropy gives them probability 0 and a
 * zero gradient, and no sampler picks them. */
dp_status gpt_pass_head_forward(const dp_gpt *gpt, dp_device *dev, wview params,
                                const float *lnf, size_t N, float *logits)
{
    const dp_gpt_config *g = &gpt->cfg;
    size_t V = g->vocab_size, Vp = gpt->models[0].n_classes;
    dp_pref none = {NULL, params.bf16};
    DP_TRY(lin_fwd(dev, logits, x32(lnf), pw(gpt, params, 0), none, N, g->n_embd, Vp));
    return dp_fill_columns(dev, logits, -INFINITY, N, Vp, V, Vp - V);
}

/* d(lnf)(N,C) = dlogits @ wte_padded (overwritten) and d(wte_padded) +=
 * dlogits^T @ lnf, with k (m) = Vp: the padded columns of dlogits are 0,
 * so they add exact zeros to d(lnf) and leave the padded rows' gradient
 * 0. */
dp_status gpt_pass_head_backward(const dp_gpt *gpt, dp_device *dev, wview params, float *grads,
                                 const float *lnf, size_t N, const float *dlogits, float *dlnf)
{
    const dp_gpt_config *g = &gpt->cfg;
    /* dlogits is rounded inside each GEMM: a chunk's bfloat16 copy would
     * need scratch the head is not given (dp_model.head_backward). */
    return lin_bwd(dev, dlnf, gw(gpt, grads, 0), NULL, dlogits, NULL, x32(lnf),
                   pw(gpt, params, 0), N, g->n_embd, gpt->models[0].n_classes);
}

/* The tied LM head in bfloat16 logits (dp_model.head_forward_bf16, llm.c's
 * fused classifier): the float32 head's values rounded once, then the
 * padded columns -inf. In BF16 math the features are rounded first into
 * the scratch (the GEMM would round them anyway: the same values), so
 * both operands are bfloat16 and cuBLASLt or oneDNN writes the bfloat16 logits
 * directly (dp_linear_forward_out16); otherwise, or where it declines,
 * the float32 GEMM runs into the rest of the scratch (in blocks of rows
 * when that is smaller than the chunk) and is rounded. */
dp_status gpt_pass_head_forward16(const dp_gpt *gpt, dp_device *dev, wview params,
                                  const float *lnf, size_t N, uint16_t *logits, float *scratch,
                                  size_t scratch_floats)
{
    const dp_gpt_config *g = &gpt->cfg;
    size_t V = g->vocab_size, Vp = gpt->models[0].n_classes, C = g->n_embd;
    dp_pref none = {NULL, params.bf16};
    const void *inp = lnf;
    dp_dtype inp_type = DP_DTYPE_F32;
    /* the bfloat16 features' floats, 256-byte aligned, when the rest still holds a row */
    size_t f16 = (N * C / 2 + 1 + 63) / 64 * 64;
    if (dp_device_matmul_precision(dev) == DP_MATMUL_BF16 && scratch_floats >= f16 + Vp) {
        DP_TRY(dp_convert(dev, scratch, DP_DTYPE_BF16, lnf, DP_DTYPE_F32, N * C));
        inp = scratch, inp_type = DP_DTYPE_BF16;
        scratch += f16, scratch_floats -= f16;
    }
    DP_TRY(dp_linear_forward_out16(dev, (dp_bf16 *)logits, scratch, scratch_floats, inp,
                                   inp_type, pw(gpt, params, 0), none, N, C, Vp));
    return dp_fill_columns_bf16(dev, logits, -INFINITY, N, Vp, V, Vp - V);
}

/* gpt_pass_head_backward from bfloat16 dlogits: both GEMMs read them as
 * they are (dp_linear_backward_from16). */
dp_status gpt_pass_head_backward16(const dp_gpt *gpt, dp_device *dev, wview params, float *grads,
                                   const float *lnf, size_t N, const uint16_t *dlogits,
                                   float *dlnf)
{
    return dp_linear_backward_from16(dev, dlnf, gw(gpt, grads, 0), NULL,
                                     (const dp_bf16 *)dlogits, lnf, DP_DTYPE_F32,
                                     pw(gpt, params, 0), N, gpt->cfg.n_embd,
                                     gpt->models[0].n_classes);
}
