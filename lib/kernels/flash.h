/*
 * kernels/flash.h - fused causal attention: the math of FlashAttention-2
 * (Dao 2023, "FlashAttention-2: Faster Attention with Better Parallelism
 * and Work Partitioning") written once, DP_HD, for both backends.
 *
 * Per (batch, head) pair p = b*NH + h, with q, k, v the (T,hs) rows of
 * head h of batch b in qkv(B,T,3C) (c_attn's output, read in place: no
 * permute, as cuDNN's SDPA reads it by strides) and scale = 1/sqrt(hs),
 * query row i sees keys j <= i:
 *
 *   forward   s_ij = scale * q_i.k_j; online softmax over j = 0..i
 *             (Milakov & Gimelshein 2018, "Online normalizer calculation
 *             for softmax"): a running maximum m and sum l, and the
 *             accumulator acc = sum_j exp(s_ij - m) v_j, multiplied by
 *             exp(m_old - m_new) whenever the maximum grows; then
 *             o_i = acc / l and lse_i = m + log(l), the natural log of the
 *             row's normaliser sum_j exp(s_ij).
 *   backward  D_i = dO_i.O_i; p_ij = exp(s_ij - lse_i), dp_ij = dO_i.v_j,
 *             ds_ij = p_ij (dp_ij - D_i);
 *             dq_i = scale sum_{j<=i} ds_ij k_j        (query-major pass)
 *             dv_j = sum_{i>=j} p_ij dO_i,
 *             dk_j = scale sum_{i>=j} ds_ij q_i        (key-major pass)
 *
 * No probability is ever stored: the forward keeps lse (B,NH,T) and the
 * backward recomputes p_ij from it. The backward is FlashAttention-2's
 * deterministic one: two passes instead of atomics, so every output row
 * is written by one item, its sum over keys (or queries) in ascending
 * order. Masked pairs (j > i) are never visited: no score, no gradient.
 *
 * The rescale is lazy: a key whose score does not pass the running
 * maximum adds exp(s - m) with the accumulator left as it is (alpha = 1);
 * one that does becomes the new maximum with weight exp(0) = 1 and the
 * accumulator is multiplied by exp(m_old - s). So each key costs one exp
 * either way, and the tiles of FlashAttention-2 (one rescale per block of
 * keys) give the same values up to float32 rounding.
 *
 * Items: an op of kernels/ops.h computes item r = p*T + t of n = B*NH*T,
 * one query row (forward, dq) or key row (dk, dv) of one pair. The CPU
 * loops the items; the CUDA backend (cuda/cuda_flash.cu) runs the items
 * for head sizes 64 and 128 as tiled kernels that call the pieces below
 * on registers and shared memory in the same order (keys, or queries,
 * ascending; one online step per key), and for other head sizes loops
 * the items themselves. Accumulators of the items live in their output
 * rows when those are float32, so an item needs no scratch for any hs; a
 * bfloat16 out or dqkv (dp_pout: the GPT's bf16 activations and their
 * gradients) is accumulated in a local row of at most DP_FLASH_HS_MAX16
 * floats and rounded once as it is stored: the float32 row's values,
 * rounded.
 *
 * Operands are read through dp_pref (kernels/bf16.h): qkv and out may
 * be float32 or bfloat16, widened exactly on read; every sum is float32.
 * Layouts: out, dout (B,T,C), qkv and dqkv (B,T,3C), C = NH*hs, row r of
 * a pair's head at dp_flash_tok_row; lse and delta (B,NH,T), index r. out
 * and dqkv are written float32 or bfloat16 (dp_pout), dout is read as
 * either (dp_pref).
 */
#ifndef DP_KERNELS_FLASH_H
#define DP_KERNELS_FLASH_H

#include <math.h>
#include <stddef.h>

#include "kernels/bf16.h"
#include "kernels/dp_hd.h"
#include "kernels/expf.h"

// --- layouts ---------------------------------------------------------------------------

/* First element of head h at token (b, t), r = (b*NH + h)*T + t, in a
 * (B,T,parts*C) tensor: part 0 of out or dout (parts = 1), part 0, 1, 2
 * (q, k, v; dq, dk, dv) of qkv or dqkv (parts = 3). */
static inline DP_HD size_t dp_flash_tok_row(size_t r, size_t T, size_t NH, size_t hs,
                                            size_t parts, size_t part)
{
    size_t t = r % T, pair = r / T, h = pair % NH, b = pair / NH;
    return ((b * T + t) * parts + part) * NH * hs + h * hs;
}

/* Row r of part 0 (q), 1 (k) or 2 (v) in qkv(B,T,3C), read in place:
 * the rows of one head are dp_flash_qkv_ld elements apart. */
static inline DP_HD size_t dp_flash_qkv_row(size_t part, size_t r, size_t T, size_t NH, size_t hs)
{
    return dp_flash_tok_row(r, T, NH, hs, 3, part);
}
static inline DP_HD size_t dp_flash_qkv_ld(size_t NH, size_t hs) { return 3 * NH * hs; }

/* The largest head size whose dqkv may be bfloat16 (an item's local
 * accumulator rows). */
#define DP_FLASH_HS_MAX16 256

// --- the pieces --------------------------------------------------------------------------

/* sum over d = 0..n-1 of a[ao + d] * b[bo + d], in four running sums
 * (element d into sum d % 4, in order), then (s0 + s1) + (s2 + s3): four
 * independent chains instead of one, so a GPU thread is not held by the
 * latency of n dependent adds and the CPU loop becomes one SIMD vector of
 * four. The order is fixed by n alone. */
static inline DP_HD float dp_flash_dot(dp_pref a, size_t ao, dp_pref b, size_t bo, size_t n)
{
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    size_t d = 0;
    for (; d + 4 <= n; d += 4) {
        s0 += dp_pref_at(a, ao + d) * dp_pref_at(b, bo + d);
        s1 += dp_pref_at(a, ao + d + 1) * dp_pref_at(b, bo + d + 1);
        s2 += dp_pref_at(a, ao + d + 2) * dp_pref_at(b, bo + d + 2);
        s3 += dp_pref_at(a, ao + d + 3) * dp_pref_at(b, bo + d + 3);
    }
    if (d < n) s0 += dp_pref_at(a, ao + d) * dp_pref_at(b, bo + d);
    if (d + 1 < n) s1 += dp_pref_at(a, ao + d + 1) * dp_pref_at(b, bo + d + 1);
    if (d + 2 < n) s2 += dp_pref_at(a, ao + d + 2) * dp_pref_at(b, bo + d + 2);
    return (s0 + s1) + (s2 + s3);
}

/* One key of the online softmax: the running maximum *m and sum *l take
 * score s; returns the key's weight exp(s - m_new) and sets *alpha to
 * exp(m_old - m_new), the factor the accumulator takes first (1 exactly
 * when the maximum stays). The first key (m = -inf) gets alpha =
 * exp(-inf) = 0 and weight 1. A NaN score makes l NaN (never silently
 * dropped). */
static inline DP_HD float dp_flash_online_step(float *m, float *l, float s, float *alpha)
{
    if (s > *m) {
        float a = dp_expf(*m - s);
        *l = *l * a + 1.0f;
        *m = s;
        *alpha = a;
        return 1.0f;
    }
    float p = dp_expf(s - *m);
    *l += p;
    *alpha = 1.0f;
    return p;
}

/* acc[0..n) = acc * alpha + w * v[vo..vo+n) (the rescale only when alpha
 * is not 1: a multiplication by 1 is exact, so skipping it changes
 * nothing but the work). */
static inline DP_HD void dp_flash_rescale_add(float *acc, float alpha, float w, dp_pref v,
                                              size_t vo, size_t n)
{
    if (alpha != 1.0f)
        for (size_t d = 0; d < n; d++) acc[d] *= alpha;
    for (size_t d = 0; d < n; d++) acc[d] += w * dp_pref_at(v, vo + d);
}

/* acc[0..n) += w * x[xo..xo+n). */
static inline DP_HD void dp_flash_axpy(float *acc, float w, dp_pref x, size_t xo, size_t n)
{
    for (size_t d = 0; d < n; d++) acc[d] += w * dp_pref_at(x, xo + d);
}

/* o[0..n) = acc * (1/l) (o may be acc). l >= 1: the maximum's own term. */
static inline DP_HD void dp_flash_normalise(float *o, const float *acc, float l, size_t n)
{
    float inv = 1.0f / l;
    for (size_t d = 0; d < n; d++) o[d] = acc[d] * inv;
}

/* x[0..n) *= s. */
static inline DP_HD void dp_flash_scale(float *x, float s, size_t n)
{
    for (size_t d = 0; d < n; d++) x[d] *= s;
}

/* The row's log-normaliser log(sum_j exp(s_ij)) = m + log(l). */
static inline DP_HD float dp_flash_lse(float m, float l) { return m + logf(l); }

/* p_ij from the score and the forward's lse_i: <= 1 up to rounding. */
static inline DP_HD float dp_flash_prob(float s, float lse) { return dp_expf(s - lse); }

/* ds_ij (without the scale, applied once per row at the end). */
static inline DP_HD float dp_flash_dscore(float p, float dp, float delta)
{
    return p * (dp - delta);
}

// --- items: one row each -------------------------------------------------------------------

/* delta[r] = D of row r = dO.O over the head's hs elements (dout and out
 * in (B,T,C); each float32 or bfloat16). */
static inline DP_HD void dp_flash_delta_item(float *delta, dp_pref dout, dp_pref out, size_t T,
                                             size_t NH, size_t hs, size_t r)
{
    size_t o = dp_flash_tok_row(r, T, NH, hs, 1, 0);
    delta[r] = dp_flash_dot(dout, o, out, o, hs);
}

/* acc[0..n) stored at o's elements at..at+n: as they are into a float32
 * o (where acc already is, in place), rounded into a bfloat16 one. */
static inline DP_HD void dp_flash_store_row(dp_pout o, size_t at, const float *acc, size_t n)
{
    if (!o.bf16) return; /* the items accumulated in the row itself */
    for (size_t d = 0; d < n; d++) dp_pout_set(o, at + d, acc[d]);
}

/* Forward of query row r = p*T + i into o (hs floats, overwritten,
 * accumulated in place then normalised): the float32 row
 * dp_flash_forward_item stores; and lse[r]. */
static inline DP_HD DP_HD_ALWAYS_INLINE void dp_flash_forward_acc(float *o, float *lse,
                                                                  dp_pref qkv, size_t T,
                                                                  size_t NH, size_t hs,
                                                                  float scale, size_t r)
{
    size_t i = r % T, r0 = r - i, ld = dp_flash_qkv_ld(NH, hs);
    size_t q = dp_flash_qkv_row(0, r, T, NH, hs), k = dp_flash_qkv_row(1, r0, T, NH, hs),
           v = dp_flash_qkv_row(2, r0, T, NH, hs);
    float m = -INFINITY, l = 0.0f;
    for (size_t d = 0; d < hs; d++) o[d] = 0.0f;
    for (size_t j = 0; j <= i; j++) {
        float s = scale * dp_flash_dot(qkv, q, qkv, k + j * ld, hs), alpha;
        float w = dp_flash_online_step(&m, &l, s, &alpha);
        dp_flash_rescale_add(o, alpha, w, qkv, v + j * ld, hs);
    }
    dp_flash_normalise(o, o, l, hs);
    lse[r] = dp_flash_lse(m, l);
}

/* Forward of query row r: out's row and lse[r], the row accumulated in
 * out itself (float32) or in a local array then rounded once as it is
 * stored (bfloat16, hs <= DP_FLASH_HS_MAX16: the float32 row's values,
 * rounded). */
static inline DP_HD void dp_flash_forward_item(dp_pout out, float *lse, dp_pref qkv, size_t B,
                                               size_t T, size_t NH, size_t hs, float scale,
                                               size_t r)
{
    size_t at = dp_flash_tok_row(r, T, NH, hs, 1, 0);
    float local[DP_FLASH_HS_MAX16];
    float *o = out.bf16 ? local : (float *)out.p + at;
    (void)B; /* the op's shape: a row's place needs T and NH only */
    dp_flash_forward_acc(o, lse, qkv, T, NH, hs, scale, r);
    dp_flash_store_row(out, at, o, hs);
}

/* dq of query row r = p*T + i, keys 0..i, into dq (hs floats,
 * overwritten): the float32 sums dp_flash_dq_item stores. */
static inline DP_HD DP_HD_ALWAYS_INLINE void
dp_flash_dq_acc(float *dq, dp_pref dout, dp_pref qkv, const float *lse, const float *delta,
                size_t T, size_t NH, size_t hs, float scale, size_t r)
{
    size_t i = r % T, r0 = r - i, ld = dp_flash_qkv_ld(NH, hs);
    size_t q = dp_flash_qkv_row(0, r, T, NH, hs), k = dp_flash_qkv_row(1, r0, T, NH, hs),
           v = dp_flash_qkv_row(2, r0, T, NH, hs);
    dp_pref g = dout;
    size_t go = dp_flash_tok_row(r, T, NH, hs, 1, 0);
    float L = lse[r], D = delta[r];
    for (size_t d = 0; d < hs; d++) dq[d] = 0.0f;
    for (size_t j = 0; j <= i; j++) {
        float p = dp_flash_prob(scale * dp_flash_dot(qkv, q, qkv, k + j * ld, hs), L);
        float dp = dp_flash_dot(g, go, qkv, v + j * ld, hs);
        dp_flash_axpy(dq, dp_flash_dscore(p, dp, D), qkv, k + j * ld, hs);
    }
    dp_flash_scale(dq, scale, hs);
}

/* dq of query row r = p*T + i into dqkv (overwritten): keys 0..i,
 * accumulated in the row itself (float32) or in a local array then
 * rounded (bfloat16, hs <= DP_FLASH_HS_MAX16). */
static inline DP_HD void dp_flash_dq_item(dp_pout dqkv, dp_pref dout, dp_pref qkv,
                                          const float *lse, const float *delta, size_t B,
                                          size_t T, size_t NH, size_t hs, float scale, size_t r)
{
    size_t at = dp_flash_tok_row(r, T, NH, hs, 3, 0);
    float local[DP_FLASH_HS_MAX16];
    float *dq = dqkv.bf16 ? local : (float *)dqkv.p + at;
    (void)B;
    dp_flash_dq_acc(dq, dout, qkv, lse, delta, T, NH, hs, scale, r);
    dp_flash_store_row(dqkv, at, dq, hs);
}

/* dk and dv of key row r = p*T + j, queries j..T-1, into dk and dv (hs
 * floats each, overwritten): the float32 sums dp_flash_dkdv_item stores.
 * The dots are the dq pass's (q before k, dO before v, the same order),
 * so both passes see the same p_ij and dp_ij. */
static inline DP_HD DP_HD_ALWAYS_INLINE void
dp_flash_dkdv_acc(float *dk, float *dv, dp_pref dout, dp_pref qkv, const float *lse,
                  const float *delta, size_t T, size_t NH, size_t hs, float scale, size_t r)
{
    size_t j = r % T, r0 = r - j, ld = dp_flash_qkv_ld(NH, hs);
    size_t q = dp_flash_qkv_row(0, r0, T, NH, hs), k = dp_flash_qkv_row(1, r, T, NH, hs),
           v = dp_flash_qkv_row(2, r, T, NH, hs);
    dp_pref g = dout;
    for (size_t d = 0; d < hs; d++) dk[d] = dv[d] = 0.0f;
    for (size_t i = j; i < T; i++) {
        size_t go = dp_flash_tok_row(r0 + i, T, NH, hs, 1, 0);
        float p = dp_flash_prob(scale * dp_flash_dot(qkv, q + i * ld, qkv, k, hs), lse[r0 + i]);
        dp_flash_axpy(dv, p, g, go, hs);
        float dp = dp_flash_dot(g, go, qkv, v, hs);
        dp_flash_axpy(dk, dp_flash_dscore(p, dp, delta[r0 + i]), qkv, q + i * ld, hs);
    }
    dp_flash_scale(dk, scale, hs);
}

/* dk and dv of key row r = p*T + j into dqkv (overwritten), as
 * dp_flash_dq_item stores dq. */
static inline DP_HD void dp_flash_dkdv_item(dp_pout dqkv, dp_pref dout, dp_pref qkv,
                                            const float *lse, const float *delta, size_t B,
                                            size_t T, size_t NH, size_t hs, float scale,
                                            size_t r)
{
    size_t ak = dp_flash_tok_row(r, T, NH, hs, 3, 1), av = dp_flash_tok_row(r, T, NH, hs, 3, 2);
    float local_k[DP_FLASH_HS_MAX16], local_v[DP_FLASH_HS_MAX16];
    float *dk = dqkv.bf16 ? local_k : (float *)dqkv.p + ak;
    float *dv = dqkv.bf16 ? local_v : (float *)dqkv.p + av;
    (void)B;
    dp_flash_dkdv_acc(dk, dv, dout, qkv, lse, delta, T, NH, hs, scale, r);
    dp_flash_store_row(dqkv, ak, dk, hs);
    dp_flash_store_row(dqkv, av, dv, hs);
}

#endif /* DP_KERNELS_FLASH_H */
