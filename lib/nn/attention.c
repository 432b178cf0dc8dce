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
 * Every variant runs over chunks of query rows (qchunk): chunk c holds
 * queries q0..q0+nq-1, which see keys 0..nk-1 (nk = q0 + nq), so its
 * pieces are (nq,nk) blocks and the masked keys after nk are skipped. The
 * whole-matrix calls are the single chunk q0 = 0, nq = nk = T; the
 * _chunked calls use smaller ones and recompute each chunk's
 * probabilities in the backward instead of keeping them. In the backward
 * dk and dv gather contributions from every chunk: the last chunk (which
 * sees all keys) writes them, the earlier ones add, in a fixed order.
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
#include "nn/nn_check.h"

// --- argument checks -------------------------------------------------------------------

/* Dimensions shared by forward and backward; fn names the public call. */
static dp_status check_dims(const char *fn, dp_device *dev, size_t B, size_t T, size_t C,
                            size_t NH)
{
    DP_TRY(dp_nn_check_heads(fn, dev, B, T, C, NH));
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
    if (!o->gemm || !o->attention_permute || !o->attention_permute_bf16 ||
        !o->attention_permute_backward ||
        !o->attention_unpermute || !o->attention_unpermute_backward ||
        !o->softmax_causal_forward || !o->softmax_causal_backward)
        return DP_FAIL(DP_ERR_UNSUPPORTED, "%s on %s: the %s backend has no attention kernels",
                       fn, dev->name, o->name);
    return DP_OK;
}


// --- the pieces, per chunk of queries --------------------------------------------------

/* One batched product of the attention; A and B float32, or bfloat16 where
 * a16 / b16 (q, k and v of a bf16 qkvr). */
static dp_status bgemm(dp_device *dev, dp_op ta, dp_op tb, int m, int n, int k, const void *A,
                       int a16, int lda, long long sa, const void *B, int b16, int ldb,
                       long long sb, float beta, float *C, int ldc, long long sc, int batch)
{
    dp_gemm_arg a = {A, a16, lda, sa}, b = {B, b16, ldb, sb};
    return dev->ops->gemm(dev, ta, tb, m, n, k, 1.0f, &a, &b, beta, C, ldc, sc, batch);
}

/* The operands of one call: q, k and v of qkvr (bfloat16 when q16), per
 * (batch, head) pair a row-major (T,hs) block, sTh elements apart. */
typedef struct attn {
    dp_device *dev;
    size_t T, hs, BNH;
    const char *q, *k, *v; /* bytes: element e of q is q + e * es */
    size_t es;
    int q16;
    float scale; /* 1/sqrt(hs) */
    /* NULL, or in BF16 precision the (BNH,nq,nk) bfloat16 scratch where the
     * softmax puts the rounded probabilities and its backward the rounded
     * score gradients, which the GEMMs then read as they are */
    uint16_t *p16;
} attn;

/* att16 is used only in BF16 precision: in FP32 or TF32 the GEMMs read
 * the float32 probabilities themselves. */
static attn attn_of(dp_device *dev, const void *qkvr, int q16, dp_bf16 *att16, size_t B,
                    size_t T, size_t C, size_t NH)
{
    attn a = {dev, T, C / NH, B * NH, NULL, NULL, NULL, q16 ? 2 : 4, q16, 0.0f, NULL};
    if (att16 && dev->matmul == DP_MATMUL_BF16) a.p16 = (uint16_t *)att16;
    size_t part = a.BNH * T * a.hs * a.es;
    a.q = qkvr;
    a.k = a.q + part;
    a.v = a.k + part;
    a.scale = 1.0f / sqrtf((float)a.hs);
    return a;
}

/* Queries q0..q0+nq-1 of every pair; by causality they see keys
 * 0..nk-1 only, nk = q0 + nq. */
typedef struct qchunk {
    size_t q0, nq, nk;
} qchunk;

/* Chunk i of chunks of `rows` queries (the last may be shorter). */
static qchunk chunk_at(const attn *a, size_t rows, size_t i)
{
    qchunk c = {i * rows, rows, 0};
    if (c.q0 + c.nq > a->T) c.nq = a->T - c.q0;
    c.nk = c.q0 + c.nq;
    return c;
}

/* att(BNH,nq,nk) = causal_softmax(q_c k^T / sqrt(hs)) for chunk c: the
 * forward's probabilities, and their recomputation by the very same calls.
 * The whole matrix is the chunk q0 = 0, nq = nk = T. */
static dp_status probs_chunk(const attn *a, float *att, qchunk c)
{
    int nq = (int)c.nq, nk = (int)c.nk, ihs = (int)a->hs, batch = (int)a->BNH;
    long long sTh = (long long)(a->T * a->hs), sP = (long long)(c.nq * c.nk);
    const char *q = a->q + c.q0 * a->hs * a->es;
    /* att = q_c k^T (row-major nq x nk) is column-major att^T = k q_c^T:
     * k read column-major is (hs,nk), so op(A) = k^T with lda = hs. */
    DP_TRY(bgemm(a->dev, DP_OP_T, DP_OP_N, nk, nq, ihs, a->k, a->q16, ihs, sTh, q, a->q16, ihs,
                 sTh, 0.0f, att, nk, sP, batch));
    return a->dev->ops->softmax_causal_forward(a->dev, att, a->p16, a->scale, c.nk, c.q0, c.nq,
                                               a->BNH * c.nq);
}

/* The probabilities of chunk c as a GEMM reads them: their bfloat16 copy
 * (from probs_chunk) where there is one, else the float32 att. */
static const void *probs_operand(const attn *a, const float *att, int *p16)
{
    *p16 = a->p16 != NULL;
    return a->p16 ? (const void *)a->p16 : (const void *)att;
}

/* y_c = att v for chunk c (rows q0.. of y(BNH,T,hs)). */
static dp_status y_chunk(const attn *a, float *y, const float *att, qchunk c)
{
    int nq = (int)c.nq, nk = (int)c.nk, ihs = (int)a->hs, batch = (int)a->BNH, p16;
    long long sTh = (long long)(a->T * a->hs), sP = (long long)(c.nq * c.nk);
    const void *p = probs_operand(a, att, &p16);
    /* column-major y_c^T(hs,nq) = v^T(hs,nk) att^T(nk,nq) */
    return bgemm(a->dev, DP_OP_N, DP_OP_N, ihs, nq, nk, a->v, a->q16, ihs, sTh, p, p16, nk, sP,
                 0.0f, y + c.q0 * a->hs, ihs, sTh, batch);
}

/* The backward of chunk c from its probabilities att(BNH,nq,nk) (and, with
 * a->p16, their bfloat16 copy from probs_chunk, which the score gradients
 * then overwrite once dv has read it): dq for its queries (overwritten),
 * dk and dv for keys 0..nk-1 (overwritten when first, else added to).
 * datt(BNH,nq,nk) is scratch. */
static dp_status backward_chunk(const attn *a, float *dq, float *dk, float *dv, float *datt,
                                const float *dy, const float *att, qchunk c, int first)
{
    dp_device *dev = a->dev;
    int nq = (int)c.nq, nk = (int)c.nk, ihs = (int)a->hs, batch = (int)a->BNH, p16;
    long long sTh = (long long)(a->T * a->hs), sP = (long long)(c.nq * c.nk);
    size_t off = c.q0 * a->hs;
    const char *q = a->q + off * a->es;
    float beta = first ? 0.0f : 1.0f;
    const void *p = probs_operand(a, att, &p16);
    /* datt = dy_c v^T: the same shape of product as the scores. */
    DP_TRY(bgemm(dev, DP_OP_T, DP_OP_N, nk, nq, ihs, a->v, a->q16, ihs, sTh, dy + off, 0, ihs,
                 sTh, 0.0f, datt, nk, sP, batch));
    /* dv (+)= att^T dy_c is column-major dv^T(hs,nk) = dy_c^T(hs,nq) att(nq,nk),
     * and the column-major view of row-major att is att^T, hence op(B) = T. */
    DP_TRY(bgemm(dev, DP_OP_N, DP_OP_T, ihs, nk, nq, dy + off, 0, ihs, sTh, p, p16, nk, sP, beta,
                 dv, ihs, sTh, batch));
    /* d(scores), 1/sqrt(hs) included, zero above the diagonal: in place in
     * datt, or rounded into the probabilities' bfloat16 copy, which dv has
     * read (the device's work is in order). */
    DP_TRY(dev->ops->softmax_causal_backward(dev, datt, a->p16, att, a->scale, c.nk, c.q0, c.nq,
                                             a->BNH * c.nq));
    const void *ds = a->p16 ? (const void *)a->p16 : (const void *)datt;
    /* dq_c = ds k, as the forward's y = att v. */
    DP_TRY(bgemm(dev, DP_OP_N, DP_OP_N, ihs, nq, nk, a->k, a->q16, ihs, sTh, ds, p16, nk, sP,
                 0.0f, dq + off, ihs, sTh, batch));
    /* dk (+)= ds^T q_c, as dv = att^T dy. */
    return bgemm(dev, DP_OP_N, DP_OP_T, ihs, nk, nq, q, a->q16, ihs, sTh, ds, p16, nk, sP, beta,
                 dk, ihs, sTh, batch);
}

// --- forward ---------------------------------------------------------------------------

/* The forward after the permute, chunks of `rows` queries at a time (rows
 * >= T: the whole matrix, kept in att). */
static dp_status forward_from(dp_device *dev, float *out, const void *qkvr, int q16, float *att,
                              dp_bf16 *att16, float *scratch, size_t B, size_t T, size_t C,
                              size_t NH, size_t rows)
{
    attn a = attn_of(dev, qkvr, q16, att16, B, T, C, NH);
    float *y = scratch; // (B,NH,T,hs)
    for (size_t i = 0; i * rows < T; i++) {
        qchunk c = chunk_at(&a, rows, i);
        DP_TRY(probs_chunk(&a, att, c));
        DP_TRY(y_chunk(&a, y, att, c));
    }
    return dev->ops->attention_unpermute(dev, out, y, B, T, NH, a.hs);
}

/* The checks and the forward of every public variant (q16: qkvr is
 * bfloat16, each element rounded as the permute writes it; att16: NULL
 * or the chunked calls' bfloat16 probabilities; rows: queries per
 * chunk). */
static dp_status forward_checked(const char *fn, dp_device *dev, float *out, void *qkvr, int q16,
                                 float *att, dp_bf16 *att16, float *scratch,
                                 const float *qkv, size_t B, size_t T, size_t C, size_t NH,
                                 size_t rows)
{
    if (!dev) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: dev must not be NULL", fn);
    if (!out || !qkvr || !att || !scratch || !qkv)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "%s on %s: out, qkvr, att, scratch and qkv must not be NULL "
                       "(out=%p qkvr=%p att=%p scratch=%p qkv=%p)",
                       fn, dev->name, (void *)out, qkvr, (void *)att, (void *)scratch,
                       (const void *)qkv);
    DP_TRY(check_dims(fn, dev, B, T, C, NH));
    const void *bufs[6] = {out, qkvr, att, scratch, qkv};
    const char *names[6] = {"out", "qkvr", "att", "scratch", "qkv"};
    int n = 5;
    if (att16) bufs[n] = att16, names[n++] = "att16";
    DP_TRY(dp_nn_check_distinct(fn, dev, bufs, names, n));
    DP_TRY(q16 ? dev->ops->attention_permute_bf16(dev, qkvr, qkv, B, T, NH, C / NH)
               : dev->ops->attention_permute(dev, qkvr, qkv, B, T, NH, C / NH));
    return forward_from(dev, out, qkvr, q16, att, att16, scratch, B, T, C, NH, rows);
}

dp_status dp_attention_forward(dp_device *dev, float *out, float *qkvr, float *att,
                               float *scratch, const float *qkv, size_t B, size_t T, size_t C,
                               size_t NH)
{
    return forward_checked("dp_attention_forward", dev, out, qkvr, 0, att, NULL, scratch, qkv, B,
                           T, C, NH, T);
}

dp_status dp_attention_forward_bf16_qkv(dp_device *dev, float *out, dp_bf16 *qkvr,
                                        float *att, float *scratch, const float *qkv,
                                        size_t B, size_t T, size_t C, size_t NH)
{
    return forward_checked("dp_attention_forward_bf16_qkv", dev, out, qkvr, 1, att, NULL,
                           scratch, qkv, B, T, C, NH, T);
}

static dp_status check_chunk(const char *fn, dp_device *dev, size_t chunk)
{
    if (chunk) return DP_OK;
    return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                   "%s on %s: chunk must be >= 1 query row (chunk >= T forms the whole "
                   "(T,T) matrix at once)",
                   fn, dev ? dev->name : "(null)");
}

dp_status dp_attention_forward_chunked(dp_device *dev, float *out, void *qkvr,
                                       dp_dtype qkvr_dtype, float *att, dp_bf16 *att16,
                                       float *scratch, const float *qkv, size_t B, size_t T,
                                       size_t C, size_t NH, size_t chunk)
{
    static const char fn[] = "dp_attention_forward_chunked";
    int q16;
    DP_TRY(dp_nn_check_dtype(fn, dev, "qkvr_dtype", qkvr_dtype, &q16));
    DP_TRY(check_chunk(fn, dev, chunk));
    return forward_checked(fn, dev, out, qkvr, q16, att, att16, scratch, qkv, B, T, C, NH,
                           chunk < T ? chunk : T);
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
    DP_TRY(dp_nn_check_distinct(fn, dev, bufs, names, 2));
    attn a = attn_of(dev, qkvr, q16, NULL, B, T, C, NH);
    return probs_chunk(&a, att, chunk_at(&a, T, 0));
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

/* The backward over chunks of `rows` queries, last first: the last chunk
 * sees every key, so its dk and dv products overwrite the whole of dk and
 * dv and the earlier chunks add to their prefix, in a fixed order. With
 * kept (rows >= T) the whole matrix's probabilities are the forward's;
 * otherwise each chunk's are recomputed into att. */
static dp_status backward_from(dp_device *dev, float *dqkv, float *dqkvr, float *att,
                               dp_bf16 *att16, const float *kept, float *datt, float *scratch,
                               const float *dout, const void *qkvr, int q16, size_t B,
                               size_t T, size_t C, size_t NH, size_t rows)
{
    const dp_backend_ops *o = dev->ops;
    /* the bfloat16 copy exists only for recomputed probabilities */
    attn a = attn_of(dev, qkvr, q16, kept ? NULL : att16, B, T, C, NH);
    size_t part = a.BNH * T * a.hs;
    float *dq = dqkvr, *dk = dqkvr + part, *dv = dqkvr + 2 * part;
    float *dy = scratch; // (B,NH,T,hs)
    size_t n = (T + rows - 1) / rows;

    DP_TRY(o->attention_unpermute_backward(dev, dy, dout, B, T, NH, a.hs));
    for (size_t i = n; i-- > 0;) {
        qchunk c = chunk_at(&a, rows, i);
        const float *p = kept;
        if (!p) {
            DP_TRY(probs_chunk(&a, att, c));
            p = att;
        }
        DP_TRY(backward_chunk(&a, dq, dk, dv, datt, dy, p, c, i == n - 1));
    }
    return o->attention_permute_backward(dev, dqkv, dqkvr, B, T, NH, a.hs);
}

/* The checks of every public variant, then the backward: from the kept
 * probabilities (rows >= T), or recomputing each chunk's into att_scratch
 * (kept NULL) and, with att16, their bfloat16 copy. */
static dp_status backward_checked(const char *fn, dp_device *dev, float *dqkv, float *dqkvr,
                                  float *datt, float *scratch, const float *dout,
                                  const void *qkvr, int q16, const float *kept,
                                  float *att_scratch, dp_bf16 *att16, size_t B, size_t T,
                                  size_t C, size_t NH, size_t rows)
{
    const float *att = kept ? kept : att_scratch;
    if (!dev) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: dev must not be NULL", fn);
    if (!dqkv || !dqkvr || !datt || !scratch || !dout || !qkvr || !att)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "%s on %s: dqkv, dqkvr, datt, scratch, dout, qkvr and att must not be "
                       "NULL (dqkv=%p dqkvr=%p datt=%p scratch=%p dout=%p qkvr=%p att=%p)",
                       fn, dev->name, (void *)dqkv, (void *)dqkvr, (void *)datt,
                       (void *)scratch, (const void *)dout, qkvr, (const void *)att);
    DP_TRY(check_dims(fn, dev, B, T, C, NH));
    const void *bufs[] = {dqkv, dqkvr, datt, scratch, dout, qkvr, att, att16};
    const char *names[] = {"dqkv", "dqkvr", "datt", "scratch", "dout", "qkvr", "att", "att16"};
    DP_TRY(dp_nn_check_distinct(fn, dev, bufs, names, att16 ? 8 : 7));
    return backward_from(dev, dqkv, dqkvr, att_scratch, att16, kept, datt, scratch, dout, qkvr,
                         q16, B, T, C, NH, rows);
}

dp_status dp_attention_backward(dp_device *dev, float *dqkv, float *dqkvr, float *datt,
                                float *scratch, const float *dout, const float *qkvr,
                                const float *att, size_t B, size_t T, size_t C, size_t NH)
{
    return backward_checked("dp_attention_backward", dev, dqkv, dqkvr, datt, scratch, dout, qkvr,
                            0, att, NULL, NULL, B, T, C, NH, T);
}

dp_status dp_attention_backward_bf16_qkv(dp_device *dev, float *dqkv, float *dqkvr, float *datt,
                                         float *scratch, const float *dout,
                                         const dp_bf16 *qkvr, const float *att, size_t B,
                                         size_t T, size_t C, size_t NH)
{
    return backward_checked("dp_attention_backward_bf16_qkv", dev, dqkv, dqkvr, datt, scratch,
                            dout, qkvr, 1, att, NULL, NULL, B, T, C, NH, T);
}

dp_status dp_attention_backward_chunked(dp_device *dev, float *dqkv, float *dqkvr, float *att,
                                        dp_bf16 *att16, float *datt, float *scratch,
                                        const float *dout, const void *qkvr, dp_dtype qkvr_dtype,
                                        size_t B, size_t T, size_t C, size_t NH, size_t chunk)
{
    static const char fn[] = "dp_attention_backward_chunked";
    int q16;
    DP_TRY(dp_nn_check_dtype(fn, dev, "qkvr_dtype", qkvr_dtype, &q16));
    DP_TRY(check_chunk(fn, dev, chunk));
    return backward_checked(fn, dev, dqkv, dqkvr, datt, scratch, dout, qkvr, q16, NULL, att,
                            att16, B, T, C, NH, chunk < T ? chunk : T);
}
