/*
 * kernels/attention.h - the non-GEMM pieces of causal multi-head
 * self-attention (Vaswani et al. 2017, GPT-2's masked variant):
 *
 *   permute     qkv(B,T,3C)    <-> qkvr(3,B,NH,T,hs)  (q, k, v split per head)
 *   unpermute   y(B,NH,T,hs)   <-> out(B,T,C)         (heads concatenated)
 *   softmax     one row t of a (T,T) score matrix, over keys 0..t only
 *               (or of a chunk of query rows, see the item functions)
 *
 * with C = NH * hs. Every element function writes element i of its own
 * output and reads the matching element of its input (a gather), so one
 * GPU thread per output element never collides with another. The permutes
 * are bijections; their backwards are the inverse gathers.
 *
 * Softmax row (scale = 1/sqrt(hs)), p = att[t,:]:
 *   p[j] = exp(scale*s[j] - m) / sum_{i<=t} exp(scale*s[i] - m)  for j <= t
 *   p[j] = 0                                                     for j > t
 * with m the row maximum (so exp never overflows). Its backward, from
 * g = d(att)[t,:] to d(scores)[t,:]:
 *   ds[j] = scale * p[j] * (g[j] - sum_{i<=t} p[i] g[i])  for j <= t, 0 after.
 */
#ifndef DP_KERNELS_ATTENTION_H
#define DP_KERNELS_ATTENTION_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/bf16.h"
#include "kernels/dp_hd.h"
#include "kernels/expf.h"

// --- index maps -----------------------------------------------------------------

/* Index in qkv(B,T,3C) of element i of qkvr(3,B,NH,T,hs). */
static inline DP_HD size_t dp_attention_qkvr_to_qkv(size_t i, size_t B, size_t T, size_t NH,
                                                    size_t hs)
{
    size_t d = i % hs;
    i /= hs;
    size_t t = i % T;
    i /= T;
    size_t h = i % NH;
    i /= NH;
    size_t b = i % B;
    size_t part = i / B; /* 0 = q, 1 = k, 2 = v */
    size_t C = NH * hs;
    return (b * T + t) * 3 * C + part * C + h * hs + d;
}

/* Index in qkvr(3,B,NH,T,hs) of element j of qkv(B,T,3C). */
static inline DP_HD size_t dp_attention_qkv_to_qkvr(size_t j, size_t B, size_t T, size_t NH,
                                                    size_t hs)
{
    size_t C = NH * hs;
    size_t c3 = j % (3 * C);
    size_t bt = j / (3 * C);
    size_t t = bt % T, b = bt / T;
    size_t part = c3 / C, c = c3 % C;
    size_t h = c / hs, d = c % hs;
    return (((part * B + b) * NH + h) * T + t) * hs + d;
}

/* Index in out(B,T,C) of element i of y(B,NH,T,hs). */
static inline DP_HD size_t dp_attention_y_to_out(size_t i, size_t T, size_t NH, size_t hs)
{
    size_t d = i % hs;
    i /= hs;
    size_t t = i % T;
    i /= T;
    size_t h = i % NH;
    size_t b = i / NH;
    return (b * T + t) * (NH * hs) + h * hs + d;
}

/* Index in y(B,NH,T,hs) of element j of out(B,T,C). */
static inline DP_HD size_t dp_attention_out_to_y(size_t j, size_t T, size_t NH, size_t hs)
{
    size_t C = NH * hs;
    size_t c = j % C, bt = j / C;
    size_t t = bt % T, b = bt / T;
    size_t h = c / hs, d = c % hs;
    return ((b * NH + h) * T + t) * hs + d;
}

// --- permutes, one output element each -----------------------------------------------

/* qkvr[i] = the qkv element it comes from; i < 3*B*NH*T*hs. */
static inline DP_HD void dp_attention_permute_elem(float *qkvr, const float *qkv, size_t i,
                                                   size_t B, size_t T, size_t NH, size_t hs)
{
    qkvr[i] = qkv[dp_attention_qkvr_to_qkv(i, B, T, NH, hs)];
}

/* dqkv[j] = the dqkvr element of the same q/k/v entry (overwrite); j < B*T*3C. */
static inline DP_HD void dp_attention_permute_backward_elem(float *dqkv, const float *dqkvr,
                                                            size_t j, size_t B, size_t T,
                                                            size_t NH, size_t hs)
{
    dqkv[j] = dqkvr[dp_attention_qkv_to_qkvr(j, B, T, NH, hs)];
}

/* out[j] = the y element of the same (b, t, head, d); j < B*T*C. */
static inline DP_HD void dp_attention_unpermute_elem(float *out, const float *y, size_t j,
                                                     size_t T, size_t NH, size_t hs)
{
    out[j] = y[dp_attention_out_to_y(j, T, NH, hs)];
}

/* dy[i] = the dout element y[i] was copied to (overwrite); i < B*NH*T*hs. */
static inline DP_HD void dp_attention_unpermute_backward_elem(float *dy, const float *dout,
                                                              size_t i, size_t T, size_t NH,
                                                              size_t hs)
{
    dy[i] = dout[dp_attention_y_to_out(i, T, NH, hs)];
}

// --- permutes, one hs-long run each ------------------------------------------------
/* The hs elements of one head's q, k, v or y vector are contiguous in both
 * layouts, so a run of hs elements maps to a run: the index map is
 * evaluated once per run instead of once per element (the CPU's loops). */

/* Run r of qkvr (r < 3*B*NH*T), as dp_attention_permute_elem does per element. */
static inline DP_HD void dp_attention_permute_run(float *qkvr, const float *qkv, size_t r,
                                                  size_t B, size_t T, size_t NH, size_t hs)
{
    size_t dst = r * hs, src = dp_attention_qkvr_to_qkv(dst, B, T, NH, hs);
    for (size_t d = 0; d < hs; d++) qkvr[dst + d] = qkv[src + d];
}

/* Run r of dqkv (r < B*T*3*NH), as dp_attention_permute_backward_elem. */
static inline DP_HD void dp_attention_permute_backward_run(float *dqkv, const float *dqkvr,
                                                           size_t r, size_t B, size_t T,
                                                           size_t NH, size_t hs)
{
    size_t dst = r * hs, src = dp_attention_qkv_to_qkvr(dst, B, T, NH, hs);
    for (size_t d = 0; d < hs; d++) dqkv[dst + d] = dqkvr[src + d];
}

/* Run r of out (r < B*T*NH), as dp_attention_unpermute_elem. */
static inline DP_HD void dp_attention_unpermute_run(float *out, const float *y, size_t r,
                                                    size_t T, size_t NH, size_t hs)
{
    size_t dst = r * hs, src = dp_attention_out_to_y(dst, T, NH, hs);
    for (size_t d = 0; d < hs; d++) out[dst + d] = y[src + d];
}

/* Run r of dy (r < B*NH*T), as dp_attention_unpermute_backward_elem. */
static inline DP_HD void dp_attention_unpermute_backward_run(float *dy, const float *dout,
                                                             size_t r, size_t T, size_t NH,
                                                             size_t hs)
{
    size_t dst = r * hs, src = dp_attention_y_to_out(dst, T, NH, hs);
    for (size_t d = 0; d < hs; d++) dy[dst + d] = dout[src + d];
}

// --- causal softmax, one row each ---------------------------------------------------

/* Row t of a (T,T) matrix, in place: row[0..t] = softmax(scale * row[0..t]),
 * row[t+1..T-1] = 0 exactly. Entries after t are never read, so whatever
 * the score GEMM left there (or NaN) cannot leak into the result. With
 * row16 (else NULL) the row is also written there rounded to bfloat16, the
 * operand a BF16-precision GEMM would round it to: one pass instead of a
 * separate conversion per GEMM that reads it. */
static inline DP_HD void dp_softmax_causal_forward_row(float *row, uint16_t *row16, float scale,
                                                       size_t t, size_t T)
{
    float maxv = scale * row[0];
    for (size_t j = 1; j <= t; j++) {
        float v = scale * row[j];
        maxv = v > maxv ? v : maxv; /* inline, unlike a call to fmaxf */
    }
    /* exp in its own loop so that it vectorises (the float sum would not) */
    for (size_t j = 0; j <= t; j++) row[j] = dp_expf(scale * row[j] - maxv);
    float sum = 0.0f;
    for (size_t j = 0; j <= t; j++) sum += row[j];
    /* sum >= 1: the maximum's own term is exp(0). */
    float inv = 1.0f / sum;
    for (size_t j = 0; j <= t; j++) row[j] *= inv;
    for (size_t j = t + 1; j < T; j++) row[j] = 0.0f;
    if (row16)
        for (size_t j = 0; j < T; j++) row16[j] = dp_bf16_round(row[j]);
}

/* Row t: drow holds d(att)[t,:] on entry; d(scores)[t,:] (scale included,
 * see the file comment) goes in place into drow, or with ds16 (else NULL)
 * rounded to bfloat16 into ds16 only, drow left as it was (the GEMMs that
 * read d(scores) in BF16 precision round it so anyway). att_row is the
 * forward's softmax row. Entries after t become 0 exactly whatever they
 * held, so masked positions pass no gradient back to q or k. */
static inline DP_HD void dp_softmax_causal_backward_row(float *drow, uint16_t *ds16,
                                                        const float *att_row, float scale,
                                                        size_t t, size_t T)
{
    float dot = 0.0f;
    for (size_t j = 0; j <= t; j++) dot += att_row[j] * drow[j];
    if (ds16) {
        for (size_t j = 0; j <= t; j++) ds16[j] = dp_bf16_round(scale * att_row[j] * (drow[j] - dot));
        for (size_t j = t + 1; j < T; j++) ds16[j] = 0;
        return;
    }
    for (size_t j = 0; j <= t; j++) drow[j] = scale * att_row[j] * (drow[j] - dot);
    for (size_t j = t + 1; j < T; j++) drow[j] = 0.0f;
}

/* Row r of a stack of score blocks, each nq rows of ld keys: row r is at
 * att + r * ld and holds query t = q0 + r % nq (keys 0..ld-1; the caller
 * ensures q0 + nq <= ld). The whole (BNH,T,T) matrix is q0 = 0, nq = ld
 * = T; a chunk of queries q0..q0+nq-1 needs only keys 0..q0+nq-1, so
 * ld = q0 + nq (query-chunked attention, nn/attention.c). */
static inline DP_HD void dp_softmax_causal_forward_item(float *att, uint16_t *att16,
                                                        float scale, size_t ld, size_t q0,
                                                        size_t nq, size_t r)
{
    dp_softmax_causal_forward_row(att + r * ld, att16 ? att16 + r * ld : NULL, scale,
                                  q0 + r % nq, ld);
}

static inline DP_HD void dp_softmax_causal_backward_item(float *datt, uint16_t *ds16,
                                                         const float *att, float scale,
                                                         size_t ld, size_t q0, size_t nq,
                                                         size_t r)
{
    dp_softmax_causal_backward_row(datt + r * ld, ds16 ? ds16 + r * ld : NULL, att + r * ld,
                                   scale, q0 + r % nq, ld);
}

#endif /* DP_KERNELS_ATTENTION_H */
