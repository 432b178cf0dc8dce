/*
 * kernels/linear.h - the bias parts of a linear layer; the matrix product
 * itself goes through the backend's GEMM.
 */
#ifndef DP_KERNELS_LINEAR_H
#define DP_KERNELS_LINEAR_H

#include <stddef.h>

#include "kernels/dp_hd.h"

/* out(N,OC)[i] = bias[i % OC] for flat index i in [0, N*OC): every row of
 * out starts as the bias, then a beta = 1 GEMM adds inp @ weight^T. */
static inline DP_HD void dp_bias_broadcast_elem(float *out, const float *bias, size_t OC,
                                                size_t i)
{
    out[i] = bias[i % OC];
}

/* Row r of out(N,OC) = bias: the CPU's loop (contiguous writes, no
 * per-element division); same result as dp_bias_broadcast_elem. */
static inline DP_HD void dp_bias_broadcast_row(float *out, const float *bias, size_t OC, size_t r)
{
    float *o = out + r * OC;
    for (size_t c = 0; c < OC; c++) o[c] = bias[c];
}

/* Widest column range one dp_bias_backward_cols call may take. */
#define DP_BIAS_BACKWARD_TILE 64

/* dbias(OC)[o] += sum over rows n = 0..N-1 (in order) of dout(N,OC)[n,o],
 * for the columns o in [o0, o1), o1 - o0 <= DP_BIAS_BACKWARD_TILE. Each
 * column's sum is formed from 0 and then added (as a gradient accumulated
 * over micro-batches would be). The result does not depend on the range
 * width: a GPU thread may take one column, while the CPU takes a tile so
 * that it reads dout row by row instead of with a stride of OC. */
static inline DP_HD void dp_bias_backward_cols(float *dbias, const float *dout, size_t N,
                                               size_t OC, size_t o0, size_t o1)
{
    float acc[DP_BIAS_BACKWARD_TILE];
    size_t w = o1 - o0;
    for (size_t j = 0; j < w; j++) acc[j] = 0.0f;
    for (size_t n = 0; n < N; n++) {
        const float *row = dout + n * OC + o0;
        for (size_t j = 0; j < w; j++) acc[j] += row[j];
    }
    for (size_t j = 0; j < w; j++) dbias[o0 + j] += acc[j];
}

#endif /* DP_KERNELS_LINEAR_H */
