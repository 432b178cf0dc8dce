/*
 * nn/attention_fused.c - fused causal multi-head self-attention
 * (dp_attention_forward_fused, dp_attention_backward_fused, and their
 * bfloat16 variants of nn/nn_act16.h): argument checks, then the fused
 * ops of kernels/ops.h, whose math is kernels/flash.h (FlashAttention-2,
 * Dao 2023), or cuDNN's (the backend's attention_lib_*). Both read q, k,
 * v in place in qkv(B,T,3C): no permute, no copy.
 *
 *   forward   one item per query row: out(B,T,C) (float32, or bfloat16
 *             rounded as stored) and lse(B,NH,T), with the online softmax
 *             of Milakov & Gimelshein (2018) over keys 0..t;
 *   backward  delta(B,NH,T) = rowwise dout.out, then the query-major pass
 *             (dq) and the key-major pass (dk, dv), each writing its part
 *             of dqkv(B,T,3C) directly (no permute back, no dqkvr), as
 *             float32 or (dp_attention_backward_fused16) bfloat16.
 *
 * Unlike the chunked calls (nn/attention.c) nothing of size T*T, or of a
 * chunk times T, is written: the probabilities exist one at a time in a
 * thread's registers, and the backward recomputes them from lse.
 */
#include <limits.h>
#include <math.h>

#include "backend/backend.h"
#include "core/error.h"
#include "dp/checked.h"
#include "dp/nn.h"
#include "nn/nn_act16.h"
#include "nn/nn_check.h"

// --- argument checks -------------------------------------------------------------------

static dp_status check_dims(const char *fn, dp_device *dev, size_t B, size_t T, size_t C,
                            size_t NH)
{
    DP_TRY(dp_nn_check_heads(fn, dev, B, T, C, NH));
    /* qkv and dqkv (B,T,3C) are the largest buffers: their bytes must fit. */
    size_t n;
    if (!dp_size_mul(B, T, &n) || !dp_size_mul(n, C, &n) || !dp_size_mul(n, 3, &n) ||
        !dp_size_mul(n, sizeof(float), &n))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "%s on %s: B=%zu, T=%zu, C=%zu overflow the buffer sizes (B*T*3C "
                       "floats must fit in size_t bytes)",
                       fn, dev->name, B, T, C);
    /* One item per (batch, head, token); a GPU runs a block per 64 of them,
     * and grid.x holds at most 2^31 - 1 blocks: keep the items below it. */
    if (B * NH > INT_MAX / T)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "%s on %s: B*NH*T = %zu*%zu*%zu rows; the fused attention takes at "
                       "most %d; split the batch into smaller micro-batches",
                       fn, dev->name, B, NH, T, INT_MAX);
    const dp_backend_ops *o = dev->ops;
    if (!o->attention_fused_forward || !o->attention_fused_delta || !o->attention_fused_dq || !o->attention_fused_dkdv)
        return DP_FAIL(DP_ERR_UNSUPPORTED,
                       "%s on %s: the %s backend has no fused attention kernels; use "
                       "dp_attention_forward_chunked",
                       fn, dev->name, o->name);
    return DP_OK;
}


static dp_pref pref_of(const void *p, int bf16)
{
    return bf16 ? dp_pref_bf16((const uint16_t *)p) : dp_pref_f32((const float *)p);
}

/* 1/sqrt(hs): the scale of the chunked calls (nn/attention.c), bit for bit. */
static float scale_of(size_t hs) { return 1.0f / sqrtf((float)hs); }

// --- forward ---------------------------------------------------------------------------

/* The forward into an out of either type (fn names the public call). */
static dp_status forward_fused(const char *fn, dp_device *dev, dp_pout out, float *lse,
                               const void *qkv, dp_dtype qkv_dtype, size_t B, size_t T, size_t C,
                               size_t NH)
{
    if (!dev) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: dev must not be NULL", fn);
    int q16;
    DP_TRY(dp_nn_check_dtype(fn, dev, "qkv_dtype", qkv_dtype, &q16));
    if (!out.p || !lse || !qkv)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "%s on %s: out, lse and qkv must not be NULL (out=%p lse=%p qkv=%p)", fn,
                       dev->name, out.p, (void *)lse, qkv);
    DP_TRY(check_dims(fn, dev, B, T, C, NH));
    size_t hs = C / NH;
    if (out.bf16 && hs > DP_FLASH_HS_MAX16)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "%s on %s: head size %zu (C=%zu / NH=%zu); a bfloat16 out takes head "
                       "sizes up to %d; use the float32 dp_attention_forward_fused",
                       fn, dev->name, hs, C, NH, DP_FLASH_HS_MAX16);
    const void *bufs[] = {out.p, lse, qkv};
    const char *names[] = {"out", "lse", "qkv"};
    DP_TRY(dp_nn_check_distinct(fn, dev, bufs, names, 3));
    if (q16 && dev->ops->attention_lib_forward) { /* cuDNN, when the device runs it */
        int done = 0;
        DP_TRY(dev->ops->attention_lib_forward(dev, out, lse, qkv, B, T, NH, hs, scale_of(hs),
                                               &done));
        if (done) return DP_OK;
    }
    return dev->ops->attention_fused_forward(dev, out, lse, pref_of(qkv, q16), B, T, NH, hs,
                                             scale_of(hs), B * NH * T);
}

dp_status dp_attention_forward_fused(dp_device *dev, float *out, float *lse, const void *qkv,
                                     dp_dtype qkv_dtype, size_t B, size_t T, size_t C, size_t NH)
{
    return forward_fused("dp_attention_forward_fused", dev, dp_pout_f32(out), lse, qkv,
                         qkv_dtype, B, T, C, NH);
}

dp_status dp_attention_forward_fused16(dp_device *dev, dp_bf16 *out, float *lse,
                                       const dp_bf16 *qkv, size_t B, size_t T, size_t C,
                                       size_t NH)
{
    return forward_fused("dp_attention_forward_fused16", dev, dp_pout_bf16((uint16_t *)out), lse,
                         qkv, DP_DTYPE_BF16, B, T, C, NH);
}

// --- backward --------------------------------------------------------------------------

/* The backward into dqkv of either type (fn names the public call). */
static dp_status backward_fused(const char *fn, dp_device *dev, dp_pout dqkv, float *delta,
                                const void *dout, dp_dtype dout_dtype, const void *qkv,
                                dp_dtype qkv_dtype,
                                const float *lse, const void *out, dp_dtype out_dtype, size_t B,
                                size_t T, size_t C, size_t NH)
{
    if (!dev) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: dev must not be NULL", fn);
    int q16, o16, g16;
    DP_TRY(dp_nn_check_dtype(fn, dev, "qkv_dtype", qkv_dtype, &q16));
    DP_TRY(dp_nn_check_dtype(fn, dev, "out_dtype", out_dtype, &o16));
    DP_TRY(dp_nn_check_dtype(fn, dev, "dout_dtype", dout_dtype, &g16));
    if (!dqkv.p || !delta || !dout || !qkv || !lse || !out)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "%s on %s: dqkv, delta, dout, qkv, lse and out must not be NULL "
                       "(dqkv=%p delta=%p dout=%p qkv=%p lse=%p out=%p)",
                       fn, dev->name, dqkv.p, (void *)delta, dout, qkv,
                       (const void *)lse, out);
    DP_TRY(check_dims(fn, dev, B, T, C, NH));
    size_t hs = C / NH, n = B * NH * T;
    if (dqkv.bf16 && hs > DP_FLASH_HS_MAX16)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "%s on %s: head size %zu (C=%zu / NH=%zu); a bfloat16 dqkv takes head "
                       "sizes up to %d; use the float32 dp_attention_backward_fused",
                       fn, dev->name, hs, C, NH, DP_FLASH_HS_MAX16);
    const void *bufs[] = {dqkv.p, delta, dout, qkv, lse, out};
    const char *names[] = {"dqkv", "delta", "dout", "qkv", "lse", "out"};
    DP_TRY(dp_nn_check_distinct(fn, dev, bufs, names, 6));
    float scale = scale_of(hs);
    dp_pref q = pref_of(qkv, q16), g = pref_of(dout, g16);
    const dp_backend_ops *o = dev->ops;
    if (q16 && o->attention_lib_backward) {
        int done = 0;
        DP_TRY(o->attention_lib_backward(dev, dqkv, g, qkv, lse, pref_of(out, o16), B, T, NH,
                                         hs, scale, &done));
        if (done) return DP_OK;
    }
    DP_TRY(o->attention_fused_delta(dev, delta, g, pref_of(out, o16), T, NH, hs, n));
    DP_TRY(o->attention_fused_dq(dev, dqkv, g, q, lse, delta, B, T, NH, hs, scale, n));
    return o->attention_fused_dkdv(dev, dqkv, g, q, lse, delta, B, T, NH, hs, scale, n);
}

dp_status dp_attention_backward_fused(dp_device *dev, float *dqkv, float *delta,
                                      const float *dout, const void *qkv, dp_dtype qkv_dtype,
                                      const float *lse, const void *out, dp_dtype out_dtype,
                                      size_t B, size_t T, size_t C, size_t NH)
{
    return backward_fused("dp_attention_backward_fused", dev, dp_pout_f32(dqkv), delta, dout,
                          DP_DTYPE_F32, qkv, qkv_dtype, lse, out, out_dtype, B, T, C, NH);
}

dp_status dp_attention_backward_fused16(dp_device *dev, dp_bf16 *dqkv, float *delta,
                                        const void *dout, dp_dtype dout_dtype, const void *qkv,
                                        dp_dtype qkv_dtype, const float *lse, const void *out,
                                        dp_dtype out_dtype, size_t B, size_t T, size_t C,
                                        size_t NH)
{
    return backward_fused("dp_attention_backward_fused16", dev, dp_pout_bf16(dqkv), delta, dout,
                          dout_dtype, qkv, qkv_dtype, lse, out, out_dtype, B, T, C, NH);
}
