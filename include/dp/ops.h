/*
 * dp/ops.h - small element-wise helpers on device buffers, for custom
 * models and criteria that must run on every device kind.
 *
 * Pointers are device pointers of dev. On a CPU device they are host
 * addresses, which the host may also dereference directly; on a CUDA
 * device the host must not dereference them (use dp_copy_d2h/h2d or these
 * helpers). The helpers give the same results on every device kind: they
 * run as host loops on CPU devices and, on other devices, stage the data
 * through host memory in chunks (correct but bound by the copy bandwidth:
 * fine for small tensors such as a regression's outputs; a model's hot
 * path on GPUs should use the dp/nn.h layers). Sums are taken in double,
 * in element order, so they do not depend on the device. dp_accumulate
 * (dp/nn.h), dp_scale and dp_sum_squares (dp/optim.h) complete the set.
 *
 * Errors (all): DP_ERR_INVALID_ARGUMENT for a NULL device, a NULL
 * required pointer or a size that overflows, DP_ERR_DEVICE from the copies.
 * n == 0 (or rows == 0) does nothing.
 */
#ifndef DP_OPS_H
#define DP_OPS_H

#include <stddef.h>

#include "dp/device.h"
#include "dp/export.h"
#include "dp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y(n) += alpha * x(n) (BLAS axpy). x may equal y. */
DP_API dp_status dp_axpy(dp_device *dev, float *y, float alpha, const float *x, size_t n);

/* out[r * ld + c] += bias[c] for r < rows, c < cols: adds a bias row to
 * each of `rows` rows that start ld floats apart (ld >= cols; ld == cols
 * for contiguous rows). */
DP_API dp_status dp_bias_add(dp_device *dev, float *out, const float *bias, size_t rows,
                             size_t cols, size_t ld);

/* *sum_host = sum of x[i] over the i where mask[i] is not NaN (all i when
 * mask is NULL), in double and in index order; *count_host (may be NULL)
 * = how many were summed. A float target array (NaN = ignored) is its own
 * mask. An x[i] at a masked-out position is never read into the sum, so a
 * NaN there does not propagate. */
DP_API dp_status dp_masked_sum(dp_device *dev, double *sum_host, size_t *count_host,
                               const float *x, const float *mask, size_t n);

/* out[i] = alpha * (x[i] - targets[i]) where targets[i] is not NaN, and 0
 * where it is NaN (an ignored target). out may equal x (in place, e.g.
 * dlogits aliasing logits). With alpha = 2 * dscale this is the gradient of
 * a squared error; with alpha = 1, dp_sum_squares of out is its loss sum. */
DP_API dp_status dp_masked_diff(dp_device *dev, float *out, float alpha, const float *x,
                                const float *targets, size_t n);

/* ---- linear with strided input rows ---------------------------------------
 * dp_linear_forward/_backward (dp/nn.h) for an input whose rows start
 * ld_inp floats apart (ld_inp >= C), e.g. the first C columns of a row
 * [x | y] without copying them out: row r of the input is
 * inp[r * ld_inp .. r * ld_inp + C). Same math, shapes and errors
 * otherwise (plus DP_ERR_INVALID_ARGUMENT for ld_inp < C or > INT_MAX).
 * Runs on the device's GEMM (no staging): as fast as the contiguous calls.
 *   forward:  out(N,OC) = inp @ weight(OC,C)^T + bias(OC) (bias may be NULL)
 *   backward: dinp (rows ld_inp apart, first C columns overwritten; NULL
 *             skips it) = dout @ weight, dweight(OC,C) += dout^T @ inp,
 *             dbias(OC) += column sums of dout (NULL skips it). */
DP_API dp_status dp_linear_forward_ld(dp_device *dev, float *out, const float *inp,
                                      size_t ld_inp, const float *weight, const float *bias,
                                      size_t N, size_t C, size_t OC);
DP_API dp_status dp_linear_backward_ld(dp_device *dev, float *dinp, float *dweight, float *dbias,
                                       const float *dout, const float *inp, size_t ld_inp,
                                       const float *weight, size_t N, size_t C, size_t OC);

#ifdef __cplusplus
}
#endif

#endif /* DP_OPS_H */
