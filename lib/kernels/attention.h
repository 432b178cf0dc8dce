/*
 * kernels/attention.h - the non-GEMM pieces of causal multi-head
 * self-attention (Vaswani et al. 2017, GPT-2's masked variant):
 *
 *   permute     qkv(B,T,3C)    <-> qkvr(3,B,NH,T,hs)  (q, k, v split per head)
 *   unpermute   y(B,NH,T,hs)   <-> out(B,T,C)         (heads concatenated)
 *   softmax     one row t of a (T,T) score matrix, over keys 0..t only
 *               (or of a chunk of query rows, see the item functions)
 *
 * with C = NH * hs. Every permute writes its own output's elements, each
 * from the matching element of its input (a gather), so no two writers
 * of a run collide. The permutes are bijections; their backwards are the
 * inverse gathers.
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

// --- permutes, one hs-long run each ------------------------------------------------
/* The hs elements of one head's q, k, v or y vector are contiguous in both
 * layouts, so a run of hs elements maps to a run: the index map is
 * evaluated once per run instead of once per element. Each function
 * copies the run's elements d = d0, d0 + step, ... < hs: the CPU's loops
 * pass (0, 1), a GPU warp per run passes (lane, 32), so that its reads and
 * writes are coalesced and its 64-bit divisions are one set per run. */

/* Run r of qkvr (r < 3*B*NH*T): qkvr[i] = the qkv element it comes from. */
static inline DP_HD void dp_attention_permute_run(float *qkvr, const float *qkv, size_t r,
                                                  size_t B, size_t T, size_t NH, size_t hs,
                                                  size_t d0, size_t step)
{
    size_t dst = r * hs, src = dp_attention_qkvr_to_qkv(dst, B, T, NH, hs);
    for (size_t d = d0; d < hs; d += step) qkvr[dst + d] = qkv[src + d];
}

/* Run r of a bfloat16 qkvr: dp_attention_permute_run with each element
 * rounded to bfloat16 (dp_bf16_round, dp_convert's rounding), so the
 * bits of the permute followed by the conversion, in one pass without
 * the float32 copy. */
static inline DP_HD void dp_attention_permute_bf16_run(uint16_t *qkvr, const float *qkv, size_t r,
                                                       size_t B, size_t T, size_t NH,
                                                       size_t hs, size_t d0, size_t step)
{
    size_t dst = r * hs, src = dp_attention_qkvr_to_qkv(dst, B, T, NH, hs);
    for (size_t d = d0; d < hs; d += step) qkvr[dst + d] = dp_bf16_round(qkv[src + d]);
}

/* Run r of dqkv (r < B*T*3*NH): dqkv[j] = the dqkvr element of the same q/k/v
 * entry (overwrite). */
static inline DP_HD void dp_attention_permute_backward_run(float *dqkv, const float *dqkvr,
                                                           size_t r, size_t B, size_t T,
                                                           size_t NH, size_t hs, size_t d0,
                                                           size_t step)
{
    size_t dst = r * hs, src = dp_attention_qkv_to_qkvr(dst, B, T, NH, hs);
    for (size_t d = d0; d < hs; d += step) dqkv[dst + d] = dqkvr[src + d];
}

/* Run r of out (r < B*T*NH): out[j] = the y element of the same (b, t, head, d). */
static inline DP_HD void dp_attention_unpermute_run(float *out, const float *y, size_t r,
                                                    size_t T, size_t NH, size_t hs, size_t d0,
                                                    size_t step)
{
    size_t dst = r * hs, src = dp_attention_out_to_y(dst, T, NH, hs);
    for (size_t d = d0; d < hs; d += step) out[dst + d] = y[src + d];
}

/* Run r of dy (r < B*NH*T): dy[i] = the dout element y[i] was copied to
 * (overwrite). */
static inline DP_HD void dp_attention_unpermute_backward_run(float *dy, const float *dout,
                                                             size_t r, size_t T, size_t NH,
                                                             size_t hs, size_t d0, size_t step)
{
    size_t dst = r * hs, src = dp_attention_y_to_out(dst, T, NH, hs);
    for (size_t d = d0; d < hs; d += step) dy[dst + d] = dout[src + d];
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
