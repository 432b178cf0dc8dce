/*
 * dp/ops.h - the vector ops: element-wise arithmetic and reductions on
 * device buffers, for the layers, the optimizer, the engine's collectives
 * and custom models and criteria that must run on every device kind.
 *
 * Pointers are device pointers of dev. On a CPU device they are host
 * addresses, which the host may also dereference directly; on a CUDA
 * device the host must not dereference them (use dp_copy_d2h/h2d or these
 * ops). Every op gives the same results on every device kind.
 *
 * Two kinds. The first group runs on the device's own kernels (the
 * backend's add, accumulate, scale and sum of squares), as fast as the
 * device allows. The second runs as host loops on CPU devices and, on
 * other devices, stages the data through host memory in chunks (correct
 * but bound by the copy bandwidth: fine for small tensors such as a
 * regression's outputs; a model's hot path on GPUs should use the first
 * group and the dp/nn.h layers); its sums are taken in double, in element
 * order, so they do not depend on the device.
 *
 * Errors (all): DP_ERR_INVALID_ARGUMENT for a NULL device, a NULL
 * required pointer or a size that overflows, DP_ERR_DEVICE from the
 * device. n == 0 (or rows == 0) does nothing, except where it says.
 */
#ifndef DP_OPS_H
#define DP_OPS_H

#include <stddef.h>

#include "dp/device.h"
#include "dp/export.h"
#include "dp/model.h" /* dp_target_type */
#include "dp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- on the device's kernels ---------------------------------------------- */

/* out = a + b (n elements; out may alias a or b). */
DP_API dp_status dp_add(dp_device *dev, float *out, const float *a, const float *b, size_t n);

/* dst += src (n elements). */
DP_API dp_status dp_accumulate(dp_device *dev, float *dst, const float *src, size_t n);

/* x *= s (n > 0 elements). Errors: DP_ERR_INVALID_ARGUMENT also for n == 0. */
DP_API dp_status dp_scale(dp_device *dev, float *x, float s, size_t n);

/* *out_host = the sum of x[i]^2 over n > 0 elements, accumulated in double
 * (out_host is a host pointer; the call waits for the result).
 * Deterministic: the summation order depends on n only. Errors:
 * DP_ERR_INVALID_ARGUMENT also for n == 0. */
DP_API dp_status dp_sum_squares(dp_device *dev, double *out_host, const float *x, size_t n);

/* Zeroes each row of x(rows, cols) whose target elements are all ignored:
 * targets holds rows * target_size elements of target_type as the engine
 * lays them out (dp/model.h: int32 class ids, -1 = ignored; or floats,
 * NaN = ignored); row r's are r * target_size .. (r + 1) * target_size - 1.
 * Rows with a valid target are left as they are. The engine runs this on
 * dlogits after every criterion call (the criterion contract), so a
 * custom criterion need not; it is public for criteria and models that
 * want the same rule. Errors also: target_size 0, an unknown target_type. */
DP_API dp_status dp_zero_ignored_rows(dp_device *dev, float *x, const void *targets,
                                      dp_target_type target_type, size_t target_size,
                                      size_t rows, size_t cols);

/* x[r * ld + c0 + c] = value for r < rows, c < cols: fills a block of
 * columns of x(rows, ld), the other columns untouched (a padded
 * vocabulary's logits set to -INFINITY, so the cross-entropy gives them
 * probability 0 and a zero gradient). rows or cols 0 does nothing.
 * Errors also: c0 + cols > ld, rows * ld floats overflowing size_t. */
DP_API dp_status dp_fill_columns(dp_device *dev, float *x, float value, size_t rows, size_t ld,
                                 size_t c0, size_t cols);

/* ---- host loops (staged through host memory on GPUs) ------------------------ */

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

#ifdef __cplusplus
}
#endif

#endif /* DP_OPS_H */
