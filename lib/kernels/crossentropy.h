/*
 * kernels/crossentropy.h - fused softmax + cross-entropy, one row at a time.
 *
 * For a row x(V) with target y:
 *   m = max_v x[v],  s = sum_v exp(x[v] - m)
 *   loss = (m - x[y]) + log(s)                   (= logsumexp(x) - x[y])
 *   dlogits[v] = dscale * (exp(x[v] - m) / s - [v == y])
 * Subtracting the max keeps every exp in (0, 1], so |x| ~ 1e4 neither
 * overflows nor loses the loss: s is summed in double (it can hold V terms
 * of very different size) and m - x[y], a difference of two floats, is exact
 * in double, so the only rounding left is the final cast to float.
 */
#ifndef DP_KERNELS_CROSSENTROPY_H
#define DP_KERNELS_CROSSENTROPY_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/bf16.h"
#include "kernels/dp_hd.h"
#include "kernels/expf.h"

/* Elements per block of the row loops below (local arrays of this many
 * floats). */
#define DP_CE_BLOCK 256

/* acc[i] = max(acc[i], w[i]) over a block of DP_CE_BLOCK floats, with
 * the comparison of the maxima below (a NaN w[i] is skipped): a loop GCC
 * vectorises, where the 8 interleaved maxima stayed scalar (a fifth to a
 * quarter of a cross-entropy's time). The maximum does not depend on the
 * order, so per-position maxima give the same value. */
static inline DP_HD DP_HD_ALWAYS_INLINE void dp_max_block(float *acc, const float *w)
{
    for (size_t i = 0; i < DP_CE_BLOCK; i++) acc[i] = w[i] > acc[i] ? w[i] : acc[i];
}

/* max(m, acc[0..DP_CE_BLOCK)) in the same comparison. */
static inline DP_HD DP_HD_ALWAYS_INLINE float dp_max_block_reduce(const float *acc, float m)
{
    for (size_t i = 0; i < DP_CE_BLOCK; i++) m = acc[i] > m ? acc[i] : m;
    return m;
}

/* Rows from this many elements take the block maxima on the host (below
 * it the block's setup costs more than it saves). */
#define DP_MAX_BLOCK_ROWS (8 * DP_CE_BLOCK)

/* max_v x[v] (n >= 1); the maximum does not depend on the order. NaN
 * entries are skipped unless x[0] is NaN; either way a NaN row gives a
 * NaN loss through its exp. Host code takes long rows in blocks
 * (dp_max_block); the rest runs 8 interleaved running maxima. */
static inline DP_HD DP_HD_ALWAYS_INLINE float dp_max8(const float *x, size_t n)
{
    float m = x[0];
    size_t v = 0;
#if !defined(__CUDA_ARCH__)
    if (n >= DP_MAX_BLOCK_ROWS) {
        float acc[DP_CE_BLOCK];
        for (size_t i = 0; i < DP_CE_BLOCK; i++) acc[i] = m;
        for (; v + DP_CE_BLOCK <= n; v += DP_CE_BLOCK) dp_max_block(acc, x + v);
        m = dp_max_block_reduce(acc, m);
    }
#endif
    float acc[8];
    for (int j = 0; j < 8; j++) acc[j] = m;
    for (; v + 8 <= n; v += 8)
        for (int j = 0; j < 8; j++) {
            float y = x[v + (size_t)j];
            acc[j] = y > acc[j] ? y : acc[j];
        }
    for (; v < n; v++) acc[0] = x[v] > acc[0] ? x[v] : acc[0];
    m = acc[0];
    for (int j = 1; j < 8; j++) m = acc[j] > m ? acc[j] : m;
    return m;
}

/* sum_v (double)x[v] with 8 interleaved partial sums combined in a fixed
 * order: the same bits every run, and a chain the compiler can vectorise
 * (one sequential double sum costs an add latency per element). Term v
 * goes to partial v % 8, in the full blocks as in the tail. */
static inline DP_HD DP_HD_ALWAYS_INLINE double dp_sum_double8(const float *x, size_t n)
{
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t v = 0;
    for (; v + 8 <= n; v += 8)
        for (int j = 0; j < 8; j++) acc[j] += (double)x[v + (size_t)j];
    for (; v < n; v++) acc[v % 8] += (double)x[v];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* One row: *loss and, when dlogits is not NULL, dlogits(V). dlogits may be
 * the same row as logits (in place): x[y] is read before any write and each
 * x[v] is read before dlogits[v] is written. A negative target (-1) marks
 * an ignored row: loss 0 and a zero dlogits row. */
static inline DP_HD DP_HD_ALWAYS_INLINE void
dp_crossentropy_row(float *loss, float *dlogits, const float *logits, int32_t target, size_t V,
                    float dscale)
{
    if (target < 0) {
        *loss = 0.0f;
        if (dlogits)
            for (size_t v = 0; v < V; v++) dlogits[v] = 0.0f;
        return;
    }
    float m = dp_max8(logits, V);
    float xy = logits[target]; /* before dlogits (maybe logits) is written */
    double s;
    if (dlogits) {
        /* exp(x - m) once, into dlogits; then normalise in place */
        for (size_t v = 0; v < V; v++) dlogits[v] = dp_expf(logits[v] - m);
        s = dp_sum_double8(dlogits, V);
    } else {
        double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (size_t v = 0; v < V; v++) acc[v % 8] += (double)dp_expf(logits[v] - m);
        s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    }
    *loss = (float)(((double)m - (double)xy) + log(s));
    if (!dlogits) return;
    double inv_s = 1.0 / s;
    float et = dlogits[target];
    for (size_t v = 0; v < V; v++) dlogits[v] = dscale * (float)((double)dlogits[v] * inv_s);
    dlogits[target] = dscale * ((float)((double)et * inv_s) - 1.0f);
}

/* Row r of logits(N,V): losses[r] and, unless dlogits is NULL, its dlogits row. */
static inline DP_HD DP_HD_ALWAYS_INLINE void
dp_crossentropy_item(float *losses, float *dlogits, const float *logits, const int32_t *targets,
                     size_t V, float dscale, size_t r)
{
    dp_crossentropy_row(losses + r, dlogits ? dlogits + r * V : NULL, logits + r * V, targets[r],
                        V, dscale);
}

/* Rows up to this many classes keep their terms exp(x - m) between the
 * bfloat16 kernel's passes instead of computing them twice (the same
 * dp_expf of the same argument, so the same bits). */
#define DP_CE_KEEP 8192

/* dp_bf16_round without a branch (the same bits, NaN included), so the
 * loops that round vectorise. */
static inline DP_HD uint16_t dp_bf16_round_nb(float f)
{
    uint32_t u = dp_f32_bits(f);
    uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, q = (u >> 16) | 0x0040u;
    return (uint16_t)(nan ? q : r);
}

/* dp_max8 of the widened bfloat16 row x(n), n >= 1: the same value and
 * the same NaN rule; long rows on the host in blocks widened first. */
static inline DP_HD DP_HD_ALWAYS_INLINE float dp_max8_bf16(const uint16_t *x, size_t n)
{
    float m = dp_bf16_widen(x[0]);
    size_t v = 0;
#if !defined(__CUDA_ARCH__)
    if (n >= DP_MAX_BLOCK_ROWS) {
        float acc[DP_CE_BLOCK], w[DP_CE_BLOCK];
        for (size_t i = 0; i < DP_CE_BLOCK; i++) acc[i] = m;
        for (; v + DP_CE_BLOCK <= n; v += DP_CE_BLOCK) {
            for (size_t i = 0; i < DP_CE_BLOCK; i++) w[i] = dp_bf16_widen(x[v + i]);
            dp_max_block(acc, w);
        }
        m = dp_max_block_reduce(acc, m);
    }
#endif
    float acc[8];
    for (int j = 0; j < 8; j++) acc[j] = m;
    for (; v + 8 <= n; v += 8)
        for (int j = 0; j < 8; j++) {
            float y = dp_bf16_widen(x[v + (size_t)j]);
            acc[j] = y > acc[j] ? y : acc[j];
        }
    for (; v < n; v++) {
        float y = dp_bf16_widen(x[v]);
        acc[0] = y > acc[0] ? y : acc[0];
    }
    m = acc[0];
    for (int j = 1; j < 8; j++) m = acc[j] > m ? acc[j] : m;
    return m;
}

/*
 * dp_crossentropy_row on a bfloat16 row: logits(V) and dlogits(V) hold
 * bfloat16 bits (llm.c's fused classifier: the LM head writes bf16 logits,
 * the criterion overwrites them with bf16 dlogits, the head's backward
 * GEMMs read those). *loss is the float kernel's loss on the widened
 * logits, bit for bit; each dlogits[v], when dlogits is not NULL, the
 * float kernel's dlogits[v] rounded to bfloat16 once.
 *
 * The float kernel keeps the exponentials in dlogits between its passes; a
 * bfloat16 dlogits cannot hold them, so a row of up to DP_CE_KEEP classes
 * keeps them in a local array, and a longer one computes exp(x - m) twice
 * (the sum, then the write), the same dp_expf of the same argument both
 * times.
 * The sum takes the terms in dp_sum_double8's order (term v into partial
 * v % 8, combined alike), which is also the float kernel's loss-only
 * order: hence the same s, the same loss. dlogits may be logits (in
 * place): the loss and the target's term are computed before any write,
 * and the write pass reads each x[v] before it overwrites it. A negative
 * target (-1): loss 0 and a zero dlogits row.
 */
static inline DP_HD DP_HD_ALWAYS_INLINE void dp_crossentropy_bf16_row(float *loss, uint16_t *dlogits,
                                                  const uint16_t *logits, int32_t target,
                                                  size_t V, float dscale)
{
    if (target < 0) {
        *loss = 0.0f;
        if (dlogits)
            for (size_t v = 0; v < V; v++) dlogits[v] = 0; /* bfloat16 +0 */
        return;
    }
    float m = dp_max8_bf16(logits, V);
    float xy = dp_bf16_widen(logits[target]);
#if !defined(__CUDA_ARCH__)
    /* The row's terms kept for the write pass when they fit (host code:
     * 32 KiB of stack; GPUs run the block kernel of cuda_rows.cuh). */
    float keep[DP_CE_KEEP];
    const int kept = dlogits != NULL && V <= DP_CE_KEEP;
#else
    float *keep = NULL;
    const int kept = 0;
#endif
    /* element v into partial v % 8, in order: dp_sum_double8's grouping,
     * written in blocks of 8 so that the loop vectorises */
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t v = 0;
    for (; v + DP_CE_BLOCK <= V; v += DP_CE_BLOCK) {
        float blk[DP_CE_BLOCK]; /* a block's terms, 8 float lanes wide, then added in double */
        float *e = kept ? keep + v : blk;
        for (size_t i = 0; i < DP_CE_BLOCK; i++) e[i] = dp_expf(dp_bf16_widen(logits[v + i]) - m);
        for (size_t i = 0; i < DP_CE_BLOCK; i += 8)
            for (int j = 0; j < 8; j++) acc[j] += (double)e[i + (size_t)j];
    }
    for (; v < V; v++) {
        float t = dp_expf(dp_bf16_widen(logits[v]) - m);
        if (kept) keep[v] = t;
        acc[v % 8] += (double)t;
    }
    double s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    *loss = (float)(((double)m - (double)xy) + log(s));
    if (!dlogits) return;
    double inv_s = 1.0 / s;
    float et = dp_expf(xy - m); /* the target's term, before its logit is overwritten */
    /* In blocks through a local row piece: dlogits is usually logits (in
     * place), and a loop that reads and writes one buffer through two
     * pointers falls back to scalar code when its alias check sees them
     * overlap; each stage here reads or writes local memory only. */
    for (size_t v0 = 0; v0 < V; v0 += DP_CE_BLOCK) {
        size_t n = V - v0 < DP_CE_BLOCK ? V - v0 : DP_CE_BLOCK;
        /* a longer row's terms again, in their own loop: fused with the
         * rounding below, the loop stayed scalar (4x slower at V = 50304) */
        float blk[DP_CE_BLOCK];
        const float *e = blk;
        if (kept)
            e = keep + v0;
        else
            for (size_t i = 0; i < n; i++) blk[i] = dp_expf(dp_bf16_widen(logits[v0 + i]) - m);
        uint16_t out[DP_CE_BLOCK];
        for (size_t i = 0; i < n; i++)
            out[i] = dp_bf16_round_nb(dscale * (float)((double)e[i] * inv_s));
        for (size_t i = 0; i < n; i++) dlogits[v0 + i] = out[i];
    }
    dlogits[target] = dp_bf16_round(dscale * ((float)((double)et * inv_s) - 1.0f));
}

/* Row r of the bfloat16 logits(N,V): losses[r] and, unless dlogits is
 * NULL, its bfloat16 dlogits row. */
static inline DP_HD DP_HD_ALWAYS_INLINE void dp_crossentropy_bf16_item(float *losses, uint16_t *dlogits,
                                                   const uint16_t *logits,
                                                   const int32_t *targets, size_t V,
                                                   float dscale, size_t r)
{
    dp_crossentropy_bf16_row(losses + r, dlogits ? dlogits + r * V : NULL, logits + r * V,
                             targets[r], V, dscale);
}

#endif /* DP_KERNELS_CROSSENTROPY_H */
