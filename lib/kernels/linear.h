/*
 * kernels/linear.h - the bias parts of a linear layer; the matrix product
 * itself goes through the backend's GEMM.
 */
#ifndef DP_KERNELS_LINEAR_H
#define DP_KERNELS_LINEAR_H

#include <stddef.h>

#include "kernels/bf16.h"
#include "kernels/colsum.h"
#include "kernels/dp_hd.h"

/* out(N,OC)[i] = bias[i % OC] for flat index i in [0, N*OC): every row of
 * out starts as the bias (float32 or bfloat16), then a beta = 1 GEMM adds
 * inp @ weight^T. */
static inline DP_HD void dp_bias_broadcast_elem(float *out, dp_pref bias, size_t OC, size_t i)
{
    out[i] = dp_pref_at(bias, i % OC);
}

/* Row r of out(N,OC) = bias: the CPU's loop (contiguous writes, no
 * per-element division); same result as dp_bias_broadcast_elem. */
static inline DP_HD void dp_bias_broadcast_row(float *out, dp_pref bias, size_t OC, size_t r)
{
    float *o = out + r * OC;
    for (size_t c = 0; c < OC; c++) o[c] = dp_pref_at(bias, c);
}

/* dbias(OC) += column sums of dout(N,OC) in the two-stage order of
 * kernels/colsum.h; dout is float32 or bfloat16 (a gradient kept as
 * bfloat16, widened exactly), the sums float32 either way. With dout16
 * (not NULL; dout float32) the same pass also stores every element of
 * dout rounded to bfloat16 there (dp_bf16_round, dp_convert's bits):
 * a linear layer's backward in BF16 math, whose GEMMs read dout rounded
 * while its bias gradient sums the float32 values, reads dout once.
 * The GPU's stage 1 is cuda/cuda_colsum.cuh's; the CPU's loop follows. */

/* part[j] += dout row's element o0 + j for j < w (and, with dst16, the
 * element rounded into dst16 at the same index): one row of the CPU's
 * loop below, a loop per type so each vectorises. */
static inline DP_HD DP_HD_ALWAYS_INLINE void dp_bias_backward_row_add(float *part,
                                                                      uint16_t *dst16,
                                                                      dp_pref dout, size_t at,
                                                                      size_t w)
{
    if (dout.bf16) {
        const uint16_t *row = (const uint16_t *)dout.p + at;
        for (size_t j = 0; j < w; j++) part[j] += dp_bf16_widen(row[j]);
    } else {
        const float *row = (const float *)dout.p + at;
        for (size_t j = 0; j < w; j++) part[j] += row[j];
        if (dst16)
            for (size_t j = 0; j < w; j++) dst16[at + j] = dp_bf16_round(row[j]);
    }
}

/* Both stages for the columns o in [o0, o1), o1 - o0 <= DP_COL_TILE: the
 * CPU's loop, which reads dout row by row instead of with a stride of OC;
 * the same sums in the same order as the two stages above (and dout16 as
 * they store it). */
static inline DP_HD DP_HD_ALWAYS_INLINE void dp_bias_backward_cols(float *dbias, uint16_t *dout16,
                                                                   dp_pref dout, size_t N,
                                                                   size_t OC, size_t o0,
                                                                   size_t o1)
{
    float part[DP_COL_TILE], total[DP_COL_TILE];
    size_t w = o1 - o0;
    for (size_t j = 0; j < w; j++) total[j] = 0.0f;
    for (size_t n0 = 0; n0 < N; n0 += DP_COL_CHUNK) {
        size_t n1 = N - n0 < DP_COL_CHUNK ? N : n0 + DP_COL_CHUNK;
        for (size_t j = 0; j < w; j++) part[j] = 0.0f;
        for (size_t n = n0; n < n1; n++)
            dp_bias_backward_row_add(part, dout16, dout, n * OC + o0, w);
        for (size_t j = 0; j < w; j++) total[j] += part[j];
    }
    for (size_t j = 0; j < w; j++) dbias[o0 + j] += total[j];
}

#endif /* DP_KERNELS_LINEAR_H */
