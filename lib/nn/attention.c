/*
 * nn/attention.c - causal multi-head self-attention (dp_attention_forward,
 * dp_attention_backward): argument checks, then the composition of the
 * backend's permutes, causal softmax and batched GEMMs.
 *
 * Per (batch, head) pair, with q, k, v, y row-major (T,hs) blocks of qkvr
 * and the scratch, and att a row-major (T,T) block:
 *   forward   att = causal_softmax(q k^T / sqrt(hs)),  y = att v
 *   backward  datt = dy v^T,  dv = att^T dy,  ds = softmax'(datt),
 *             dq = ds k,  dk = ds^T q
 * The GEMMs run on all B*NH pairs in one strided-batched call.
 * dp_attention_probs recomputes att from qkvr with the forward's own calls,
 * for callers that do not keep att between forward and backward.
 *
 * GEMM mapping: the backend's gemm is column-major (cuBLAS). A row-major
 * (r,c) matrix X is the column-major (c,r) matrix X^T with leading
 * dimension c, so a row-major product X = P Q is computed as the
 * column-major X^T = Q^T P^T: swap the operands and read each transpose
 * flag as seen from the column-major side.
 *
 * The GEMMs fill the whole (T,T) block including the masked upper triangle;
 * the softmax rows (kernels/attention.h) overwrite it with exact zeros in
 * att and in ds, so masked entries have zero weight and zero gradient.
 */
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "backend/backend.h"
#include "core/error.h"
#include "dp/checked.h"
#include "dp/nn.h"

// --- argument checks -------------------------------------------------------------------

/* Dimensions shared by forward and backward; fn names the public call. */
static dp_status check_dims(const char *fn, dp_device *dev, size_t B, size_t T, size_t C,
                            size_t NH)
{
    if (!B || !T || !C || !NH)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "%s on %s: B=%zu, T=%zu, C=%zu and NH=%zu must all be > 0", fn,
                       dev->name, B, T, C, NH);
    if (C % NH)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "%s on %s: C=%zu is not a multiple of NH=%zu (C %% NH != 0); the head "
                       "size is C/NH, so choose C divisible by the number of heads",
                       fn, dev->name, C, NH);
    size_t hs = C / NH, n;
    /* Every buffer's float count and byte size must fit in size_t:
     * qkv(B,T,3C) and qkvr are the largest besides att(B,NH,T,T). */
    int ok = dp_size_mul(B, T, &n) && dp_size_mul(n, C, &n) && dp_size_mul(n, 3, &n) &&
             dp_size_mul(n, sizeof(float), &n);
    ok = ok && dp_size_mul(B, NH, &n) && dp_size_mul(n, T, &n) && dp_size_mul(n, T, &n) &&
         dp_size_mul(n, sizeof(float), &n);
    if (!ok)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "%s on %s: B=%zu, T=%zu, C=%zu, NH=%zu overflow the buffer sizes "
                       "(B*T*3C and B*NH*T*T floats must fit in size_t bytes)",
                       fn, dev->name, B, T, C, NH);
    /* The batched GEMM takes int sizes and long long strides. */
    if (T > INT_MAX || hs > INT_MAX || B * NH > INT_MAX || T * T > (size_t)LLONG_MAX)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "%s on %s: T=%zu, head size %zu and B*NH=%zu must each be <= %d "
                       "(GEMM int sizes); split the batch into smaller micro-batches",
                       fn, dev->name, T, hs, B * NH, INT_MAX);
    const dp_backend_ops *o = dev->ops;
    if (!o->gemm || !o->attention_permute || !o->attention_permute_backward ||
        !o->attention_unpermute || !o->attention_unpermute_backward ||
        !o->softmax_causal_forward || !o->softmax_causal_backward)
        return DP_FAIL(DP_ERR_UNSUPPORTED, "%s on %s: the %s backend has no attention kernels",
                       fn, dev->name, o->name);
    return DP_OK;
}

/* Buffers a call writes (or reads while another is written) must be
 * separate: the permutes and GEMMs are not in place. Only identical start
 * pointers are detected. */
static dp_status check_distinct(const char *fn, dp_device *dev, const void *const *p,
                                const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (p[i] == p[j])
                return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                               "%s on %s: %s and %s are the same buffer; pass separate "
                               "buffers",
                               fn, dev->name, names[i], names[j]);
    return DP_OK;
}

// --- forward ---------------------------------------------------------------------------

/* One batched product of the attention; A and B float32, or bfloat16 where
 * a16 / b16 (q, k and v of a bf16 qkvr). */
static dp_status bgemm(dp_device *dev, dp_op ta, dp_op tb, int m, int n, int k, const void *A,
                       int a16, int lda, long long sa, const void *B, int b16, int ldb,
                       long long sb, float *C, int ldc, long long sc, int batch)
{
    dp_gemm_arg a = {A, a16, lda, sa}, b = {B, b16, ldb, sb};
    return dev->ops->gemm(dev, ta, tb, m, n, k, 1.0f, &a, &b, 0.0f, C, ldc, sc, batch);
}

/* att = causal_softmax(q k^T / sqrt(hs)), q and k read from qkvr
 * (bfloat16 when q16): the forward's probabilities, and their
 * recomputation (dp_attention_probs) by the very same calls. */
static dp_status probs_from(dp_device *dev, float *att, const void *qkvr, int q16, size_t B,
                            size_t T, size_t C, size_t NH)
{
    size_t hs = C / NH, BNH = B * NH, es = q16 ? 2 : 4;
    int iT = (int)T, ihs = (int)hs, batch = (int)BNH;
    long long sTh = (long long)(T * hs), sTT = (long long)(T * T);
    const char *base = qkvr;
    const void *q = base, *k = base + BNH * T * hs * es;
    /* att = q k^T (row-major T x T) is column-major att^T = k q^T: k read
     * column-major is (hs,T), so op(A) = k^T with lda = hs. */
    DP_TRY(bgemm(dev, DP_OP_T, DP_OP_N, iT, iT, ihs, k, q16, ihs, sTh, q, q16, ihs, sTh, att, iT,
                 sTT, batch));
    return dev->ops->softmax_causal_forward(dev, att, 1.0f / sqrtf((float)hs), T, BNH * T);
}

/* The forward after the permute: q, k, v read from qkvr (bfloat16 when q16). */
static dp_status forward_from(dp_device *dev, float *out, const void *qkvr, int q16, float *att,
                              float *scratch, size_t B, size_t T, size_t C, size_t NH)
{
    const dp_backend_ops *o = dev->ops;
    size_t hs = C / NH, BNH = B * NH, es = q16 ? 2 : 4;
    int iT = (int)T, ihs = (int)hs, batch = (int)BNH;
    long long sTh = (long long)(T * hs), sTT = (long long)(T * T);
    const char *base = qkvr;
    const void *v = base + 2 * BNH * T * hs * es;
    float *y = scratch; // (B,NH,T,hs)
    DP_TRY(probs_from(dev, att, qkvr, q16, B, T, C, NH));
    /* y = att v is column-major y^T(hs,T) = v^T(hs,T) att^T(T,T). */
    DP_TRY(bgemm(dev, DP_OP_N, DP_OP_N, ihs, iT, iT, v, q16, ihs, sTh, att, 0, iT, sTT, y, ihs,
                 sTh, batch));
    DP_TRY(o->attention_unpermute(dev, out, y, B, T, NH, hs));
    return DP_OK;
}

/* The checks and the forward of both public variants (q16: qkvr is
 * bfloat16, permuted first into qkvr_f32). */
static dp_status forward_checked(const char *fn, dp_device *dev, float *out, void *qkvr, int q16,
                                 float *qkvr_f32, float *att, float *scratch, const float *qkv,
                                 size_t B, size_t T, size_t C, size_t NH)
{
    if (!dev) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: dev must not be NULL", fn);
    if (!out || !qkvr || (q16 && !qkvr_f32) || !att || !scratch || !qkv)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "%s on %s: out, qkvr,%s att, scratch and qkv must not be NULL "
                       "(out=%p qkvr=%p att=%p scratch=%p qkv=%p)",
                       fn, dev->name, q16 ? " qkvr_f32," : "", (void *)out, qkvr, (void *)att,
                       (void *)scratch, (const void *)qkv);
    DP_TRY(check_dims(fn, dev, B, T, C, NH));
    const void *bufs[] = {out, qkvr, att, scratch, qkv, qkvr_f32};
    const char *names[] = {"out", "qkvr", "att", "scratch", "qkv", "qkvr_f32"};
    DP_TRY(check_distinct(fn, dev, bufs, names, q16 ? 6 : 5));
    float *permuted = q16 ? qkvr_f32 : qkvr;
    DP_TRY(dev->ops->attention_permute(dev, permuted, qkv, B, T, NH, C / NH));
    if (q16) DP_TRY(dp_convert(dev, qkvr, DP_DTYPE_BF16, permuted, DP_DTYPE_F32, 3 * B * T * C));
    return forward_from(dev, out, qkvr, q16, att, scratch, B, T, C, NH);
}

dp_status dp_attention_forward(dp_device *dev, float *out, float *qkvr, float *att,
                               float *scratch, const float *qkv, size_t B, size_t T, size_t C,
                               size_t NH)
{
    return forward_checked("dp_attention_forward", dev, out, qkvr, 0, NULL, att, scratch, qkv, B,
                           T, C, NH);
}

dp_status dp_attention_forward_bf16_qkv(dp_device *dev, float *out, dp_bf16 *qkvr,
                                        float *qkvr_f32, float *att, float *scratch,
                                        const float *qkv, size_t B, size_t T, size_t C,
                                        size_t NH)
{
    return forward_checked("dp_attention_forward_bf16_qkv", dev, out, qkvr, 1, qkvr_f32, att,
                           scratch, qkv, B, T, C, NH);
}

// --- recomputed probabilities ----------------------------------------------------------

static dp_status probs_checked(const char *fn, dp_device *dev, float *att, const void *qkvr,
                               int q16, size_t B, size_t T, size_t C, size_t NH)
{
    if (!dev) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: dev must not be NULL", fn);
    if (!att || !qkvr)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "%s on %s: att and qkvr must not be NULL (att=%p qkvr=%p)", fn,
                       dev->name, (void *)att, qkvr);
    DP_TRY(check_dims(fn, dev, B, T, C, NH));
    const void *bufs[] = {att, qkvr};
    const char *names[] = {"att", "qkvr"};
    DP_TRY(check_distinct(fn, dev, bufs, names, 2));
    return probs_from(dev, att, qkvr, q16, B, T, C, NH);
}

dp_status dp_attention_probs(dp_device *dev, float *att, const float *qkvr, size_t B, size_t T,
                             size_t C, size_t NH)
{
    return probs_checked("dp_attention_probs", dev, att, qkvr, 0, B, T, C, NH);
}

dp_status dp_attention_probs_bf16_qkv(dp_device *dev, float *att, const dp_bf16 *qkvr, size_t B,
                                      size_t T, size_t C, size_t NH)
{
    return probs_checked("dp_attention_probs_bf16_qkv", dev, att, qkvr, 1, B, T, C, NH);
}

// --- backward --------------------------------------------------------------------------

static dp_status backward_from(dp_device *dev, float *dqkv, float *dqkvr, float *datt,
                               float *scratch, const float *dout, const void *qkvr, int q16,
                               const float *att, size_t B, size_t T, size_t C, size_t NH)
{
    const dp_backend_ops *o = dev->ops;
    size_t hs = C / NH, BNH = B * NH, es = q16 ? 2 : 4;
    int iT = (int)T, ihs = (int)hs, batch = (int)BNH;
    long long sTh = (long long)(T * hs), sTT = (long long)(T * T);
    size_t part = BNH * T * hs;
    const char *base = qkvr;
    const void *q = base, *k = base + part * es, *v = base + 2 * part * es;
    float *dq = dqkvr, *dk = dqkvr + part, *dv = dqkvr + 2 * part;
    float *dy = scratch; // (B,NH,T,hs)

    DP_TRY(o->attention_unpermute_backward(dev, dy, dout, B, T, NH, hs));
    /* datt = dy v^T: the same shape of product as the forward's scores. */
    DP_TRY(bgemm(dev, DP_OP_T, DP_OP_N, iT, iT, ihs, v, q16, ihs, sTh, dy, 0, ihs, sTh, datt, iT,
                 sTT, batch));
    /* dv = att^T dy is column-major dv^T(hs,T) = dy^T(hs,T) att(T,T), and
     * the column-major view of row-major att is att^T, hence op(B) = T. */
    DP_TRY(bgemm(dev, DP_OP_N, DP_OP_T, ihs, iT, iT, dy, 0, ihs, sTh, att, 0, iT, sTT, dv, ihs,
                 sTh, batch));
    /* datt becomes d(scores), 1/sqrt(hs) included, zero above the diagonal. */
    DP_TRY(o->softmax_causal_backward(dev, datt, att, 1.0f / sqrtf((float)hs), T, BNH * T));
    /* dq = ds k, as the forward's y = att v. */
    DP_TRY(bgemm(dev, DP_OP_N, DP_OP_N, ihs, iT, iT, k, q16, ihs, sTh, datt, 0, iT, sTT, dq, ihs,
                 sTh, batch));
    /* dk = ds^T q, as dv = att^T dy. */
    DP_TRY(bgemm(dev, DP_OP_N, DP_OP_T, ihs, iT, iT, q, q16, ihs, sTh, datt, 0, iT, sTT, dk, ihs,
                 sTh, batch));
    DP_TRY(o->attention_permute_backward(dev, dqkv, dqkvr, B, T, NH, hs));
    return DP_OK;
}

/* The checks of both public variants, then the backward. */
static dp_status backward_checked(const char *fn, dp_device *dev, float *dqkv, float *dqkvr,
                                  float *datt, float *scratch, const float *dout,
                                  const void *qkvr, int q16, const float *att, size_t B, size_t T,
                                  size_t C, size_t NH)
{
    if (!dev) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: dev must not be NULL", fn);
    if (!dqkv || !dqkvr || !datt || !scratch || !dout || !qkvr || !att)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "%s on %s: dqkv, dqkvr, datt, scratch, dout, qkvr and att must not be "
                       "NULL (dqkv=%p dqkvr=%p datt=%p scratch=%p dout=%p qkvr=%p att=%p)",
                       fn, dev->name, (void *)dqkv, (void *)dqkvr, (void *)datt,
                       (void *)scratch, (const void *)dout, qkvr, (const void *)att);
    DP_TRY(check_dims(fn, dev, B, T, C, NH));
    const void *bufs[] = {dqkv, dqkvr, datt, scratch, dout, qkvr, att};
    const char *names[] = {"dqkv", "dqkvr", "datt", "scratch", "dout", "qkvr", "att"};
    DP_TRY(check_distinct(fn, dev, bufs, names, 7));
    return backward_from(dev, dqkv, dqkvr, datt, scratch, dout, qkvr, q16, att, B, T, C, NH);
}

dp_status dp_attention_backward(dp_device *dev, float *dqkv, float *dqkvr, float *datt,
                                float *scratch, const float *dout, const float *qkvr,
                                const float *att, size_t B, size_t T, size_t C, size_t NH)
{
    return backward_checked("dp_attention_backward", dev, dqkv, dqkvr, datt, scratch, dout, qkvr,
                            0, att, B, T, C, NH);
}

dp_status dp_attention_backward_bf16_qkv(dp_device *dev, float *dqkv, float *dqkvr, float *datt,
                                         float *scratch, const float *dout,
                                         const dp_bf16 *qkvr, const float *att, size_t B,
                                         size_t T, size_t C, size_t NH)
{
    return backward_checked("dp_attention_backward_bf16_qkv", dev, dqkv, dqkvr, datt, scratch,
                            dout, qkvr, 1, att, B, T, C, NH);
}
