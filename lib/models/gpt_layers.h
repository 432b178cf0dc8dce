/*
 * models/gpt_layers.h - the layers the GPT's passes call (gpt_pass.c,
 * gpt_head.c) over a tensor of either type: each picks the dp/nn.h (or
 * nn/nn_act16.h) call for a float32 or a bfloat16 replica (a bf16 one
 * computes as the float32 layer on the widened values) and a float32 or
 * bfloat16 input (xin).
 */
#ifndef DP_MODELS_GPT_LAYERS_H
#define DP_MODELS_GPT_LAYERS_H

#include "models/gpt_internal.h"
#include "nn/nn_act16.h"

/* The layers over a tensor of either type: the _bf16 variant for a bf16
 * replica (dp/nn.h), which computes as the float32 layer on the widened
 * values. */
static inline dp_status enc_fwd(dp_device *dev, float *out, const int32_t *tok, dp_pref wte,
                                dp_pref wpe, size_t B, size_t T, size_t C)
{
    return wte.bf16 ? dp_encoder_forward_bf16(dev, out, tok, wte.p, wpe.p, B, T, C)
                    : dp_encoder_forward(dev, out, tok, wte.p, wpe.p, B, T, C);
}

static inline dp_status ln_fwd(dp_device *dev, float *out, float *mean, float *rstd,
                               const float *inp, dp_pref w, dp_pref b, size_t N, size_t C)
{
    return w.bf16 ? dp_layernorm_forward_bf16(dev, out, mean, rstd, inp, w.p, b.p, N, C)
                  : dp_layernorm_forward(dev, out, mean, rstd, inp, w.p, b.p, N, C);
}

/* A LayerNorm of the residual stream x into out: with out16 (a block's
 * kept slot with act16) written once as bfloat16, the float32 LayerNorm's
 * rounding; with add, after x += add, the stream's pending update made in
 * the same pass (the same bits as dp_accumulate first; nn/nn_act16.h). */
static inline dp_status ln_fwd_res(dp_device *dev, int out16, float *out, float *mean,
                                   float *rstd, float *x, const float *add, dp_pref w, dp_pref b,
                                   size_t N, size_t C)
{
    if (add)
        return dp_residual_layernorm_forward(dev, out, out16 ? DP_DTYPE_BF16 : DP_DTYPE_F32, mean,
                                             rstd, x, add, w, b, N, C);
    if (out16) return dp_layernorm_forward_out16(dev, (dp_bf16 *)out, mean, rstd, x, w, b, N, C);
    return ln_fwd(dev, out, mean, rstd, x, w, b, N, C);
}

static inline dp_status ln_bwd(dp_device *dev, float *dinp, float *dw, float *db,
                               const float *dout, const float *inp, dp_pref w, const float *mean,
                               const float *rstd, size_t N, size_t C)
{
    return w.bf16 ? dp_layernorm_backward_bf16(dev, dinp, dw, db, dout, inp, w.p, mean, rstd, N, C)
                  : dp_layernorm_backward(dev, dinp, dw, db, dout, inp, w.p, mean, rstd, N, C);
}

/* b.p may be NULL (no bias). */
static inline dp_status lin_fwd(dp_device *dev, float *out, xin inp, dp_pref w, dp_pref b,
                                size_t N, size_t C, size_t OC)
{
    if (inp.x16) return dp_linear_forward_bf16_inp(dev, out, inp.p, w.p, b.p, N, C, OC);
    return w.bf16 ? dp_linear_forward_bf16(dev, out, inp.p, w.p, b.p, N, C, OC)
                  : dp_linear_forward(dev, out, inp.p, w.p, b.p, N, C, OC);
}

/* d16 (NULL: none) is scratch for dout rounded once to bfloat16 for both
 * GEMMs, N*OC elements (nn/nn_act16.h): used in BF16 math. */
static inline dp_status lin_bwd(dp_device *dev, float *dinp, float *dw, float *db,
                                const float *dout, float *d16, xin inp, dp_pref w, size_t N,
                                size_t C, size_t OC)
{
    if (d16)
        return dp_linear_backward_dout16(dev, dinp, dw, db, dout, (dp_bf16 *)d16, inp.p,
                                         inp.x16 ? DP_DTYPE_BF16 : DP_DTYPE_F32, w, N, C, OC);
    if (inp.x16) return dp_linear_backward_bf16_inp(dev, dinp, dw, db, dout, inp.p, w.p, N, C, OC);
    return w.bf16 ? dp_linear_backward_bf16(dev, dinp, dw, db, dout, inp.p, w.p, N, C, OC)
                  : dp_linear_backward(dev, dinp, dw, db, dout, inp.p, w.p, N, C, OC);
}

#endif /* DP_MODELS_GPT_LAYERS_H */
