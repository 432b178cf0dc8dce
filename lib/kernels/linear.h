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

/* dbias(OC)[o] += sum over rows n = 0..N-1 (in order) of dout(N,OC)[n,o].
 * The column sum is formed first and then added (as a gradient accumulated
 * over micro-batches would be), one call per column o. */
static inline DP_HD void dp_bias_backward_col(float *dbias, const float *dout, size_t N,
                                              size_t OC, size_t o)
{
    float acc = 0.0f;
    for (size_t n = 0; n < N; n++) acc += dout[n * OC + o];
    dbias[o] += acc;
}

#endif /* DP_KERNELS_LINEAR_H */
