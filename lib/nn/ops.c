/*
 * nn/ops.c - the vector ops of dp/ops.h.
 *
 * The first group checks its arguments and calls the backend's kernel
 * (with the bfloat16 twins of two of them, declared in nn/nn_act16.h).
 * Each op of the second group is one host loop over chunks. On a device whose pointers are
 * host addresses (CPU) the loop reads and writes the buffers in place; on
 * another device (CUDA) each chunk is copied to stack buffers, processed
 * and copied back, so no backend kernel and no host allocation is needed.
 * The same loop body runs in both cases, so the results (and the double
 * sums, taken in index order) do not depend on the device kind.
 */
#include <limits.h>
#include <math.h>
#include <string.h>

#include "backend/device_graph.h"
#include "dp/checked.h"
#include "nn/nn_act16.h"
#include "nn/nn_check.h"
#include "nn/ops_internal.h"

#include "dp/nn.h"
#include "dp/ops.h"
#include "dp/optim.h"

// --- on the device's kernels ---------------------------------------------------------

dp_status dp_add(dp_device *dev, float *out, const float *a, const float *b, size_t n)
{
    DP_NN_REQUIRE_DEV(dev);
    DP_NN_REQUIRE_PTR(dev, out);
    DP_NN_REQUIRE_PTR(dev, a);
    DP_NN_REQUIRE_PTR(dev, b);
    DP_NN_CHECK_DIMS1(dev, n);
    return dev->ops->add(dev, out, a, b, n);
}

dp_status dp_accumulate(dp_device *dev, float *dst, const float *src, size_t n)
{
    DP_NN_REQUIRE_DEV(dev);
    DP_NN_REQUIRE_PTR(dev, dst);
    DP_NN_REQUIRE_PTR(dev, src);
    DP_NN_CHECK_DIMS1(dev, n);
    return dev->ops->accumulate(dev, dst, src, n);
}

dp_status dp_scale(dp_device *dev, float *x, float s, size_t n)
{
    if (!dev) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "dev must not be NULL");
    if (!x) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: x must not be NULL", dev->name);
    if (n == 0) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: n must be > 0", dev->name);
    return dev->ops->scale(dev, x, s, n);
}

dp_status dp_sum_squares(dp_device *dev, double *out_host, const float *x, size_t n)
{
    if (!dev) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "dev must not be NULL");
    if (!out_host || !x)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: out_host and x must not be NULL",
                       dev->name);
    if (n == 0) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: n must be > 0", dev->name);
    DP_TRY(dp_device_refuse_recording(dev, "a sum read on the host"));
    return dev->ops->sum_squares(dev, out_host, x, n);
}

/* The checks of dp_zero_ignored_rows and its bfloat16 twin, expanded in
 * each (so its name heads the message). */
#define ZERO_IGNORED_CHECKS(dev, x, targets, target_type, target_size, rows, cols)          \
    do {                                                                                  \
        size_t zi_count_;                                                                 \
        DP_NN_REQUIRE_DEV(dev);                                                           \
        DP_NN_REQUIRE_PTR(dev, x);                                                        \
        DP_NN_REQUIRE_PTR(dev, targets);                                                  \
        DP_NN_CHECK_DIMS2(dev, rows, cols, &zi_count_);                                   \
        if ((unsigned)(target_type) >= DP_TARGET_TYPE_COUNT || (target_size) == 0)        \
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: target_type %s with target_size " \
                           "%zu; use DP_TARGET_CLASS or DP_TARGET_F32 and target_size >= 1", \
                           (dev)->name, dp_target_type_name(target_type), (target_size));  \
    } while (0)

dp_status dp_zero_ignored_rows(dp_device *dev, float *x, const void *targets,
                               dp_target_type target_type, size_t target_size, size_t rows,
                               size_t cols)
{
    ZERO_IGNORED_CHECKS(dev, x, targets, target_type, target_size, rows, cols);
    return dev->ops->zero_ignored_rows(dev, x, targets, target_type == DP_TARGET_F32,
                                       target_size, cols, rows);
}

dp_status dp_zero_ignored_rows_bf16(dp_device *dev, uint16_t *x, const void *targets,
                                    dp_target_type target_type, size_t target_size, size_t rows,
                                    size_t cols)
{
    ZERO_IGNORED_CHECKS(dev, x, targets, target_type, target_size, rows, cols);
    return dev->ops->zero_ignored_rows_bf16(dev, x, targets, target_type == DP_TARGET_F32,
                                            target_size, cols, rows);
}

/* The checks of dp_fill_columns and its bfloat16 twin, expanded in each:
 * returns DP_OK at once for an empty block (rows or cols 0). The rows'
 * bytes are checked as floats, which also bounds the bfloat16 ones. */
#define FILL_COLUMNS_CHECKS(dev, x, rows, ld, c0, cols)                                   \
    do {                                                                                  \
        size_t fc_total_;                                                                 \
        DP_NN_REQUIRE_DEV(dev);                                                           \
        if (!(rows) || !(cols)) return DP_OK;                                             \
        DP_NN_REQUIRE_PTR(dev, x);                                                        \
        if ((c0) > (ld) || (cols) > (ld) - (c0))                                          \
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: columns [%zu, %zu + %zu) pass "   \
                           "the row length ld = %zu; fill columns inside the rows",       \
                           (dev)->name, (c0), (c0), (cols), (ld));                        \
        DP_NN_CHECK_DIMS2(dev, rows, ld, &fc_total_);                                     \
    } while (0)

dp_status dp_fill_columns(dp_device *dev, float *x, float value, size_t rows, size_t ld,
                          size_t c0, size_t cols)
{
    FILL_COLUMNS_CHECKS(dev, x, rows, ld, c0, cols);
    /* rows * cols <= rows * ld, which the checks bounded */
    return dev->ops->fill_columns(dev, x, ld, c0, cols, value, rows * cols);
}

dp_status dp_fill_columns_bf16(dp_device *dev, uint16_t *x, float value, size_t rows, size_t ld,
                               size_t c0, size_t cols)
{
    FILL_COLUMNS_CHECKS(dev, x, rows, ld, c0, cols);
    return dev->ops->fill_columns_bf16(dev, x, ld, c0, cols, value, rows * cols);
}

// --- host loops -----------------------------------------------------------------------

/* Floats per staged chunk and array (three arrays: 12 KiB of stack). */
#define OPS_CHUNK 1024

dp_status dp_ops_foreach(dp_device *dev, float *out, const float *a, const float *b, size_t n,
                         dp_ops_chunk_fn fn, void *ctx)
{
    if (!n) return DP_OK;
    if (dp_device_is_host_memory(dev)) return fn(ctx, out, a, b, n, 0);
    float sa[OPS_CHUNK], sb[OPS_CHUNK], so[OPS_CHUNK];
    for (size_t i0 = 0; i0 < n; i0 += OPS_CHUNK) {
        size_t len = n - i0 < OPS_CHUNK ? n - i0 : OPS_CHUNK, bytes = len * sizeof(float);
        if (a) DP_TRY(dev->ops->copy_d2h(dev, sa, a + i0, bytes));
        if (b) DP_TRY(dev->ops->copy_d2h(dev, sb, b + i0, bytes));
        /* out may alias a (in place): then it reads and writes a's staging. */
        float *o = out == a ? sa : so;
        if (out && out != a) DP_TRY(dev->ops->copy_d2h(dev, so, out + i0, bytes));
        DP_TRY(fn(ctx, out ? o : NULL, a ? sa : NULL, b ? sb : NULL, len, i0));
        if (out) DP_TRY(dev->ops->copy_h2d(dev, out + i0, o, bytes));
    }
    return DP_OK;
}

// --- axpy -------------------------------------------------------------------------------

static dp_status axpy_chunk(void *ctx, float *y, const float *x, const float *unused, size_t n,
                            size_t first)
{
    (void)unused;
    (void)first;
    float alpha = *(const float *)ctx;
    for (size_t i = 0; i < n; i++) y[i] += alpha * x[i];
    return DP_OK;
}

dp_status dp_axpy(dp_device *dev, float *y, float alpha, const float *x, size_t n)
{
    DP_NN_REQUIRE_DEV(dev);
    if (!n) return DP_OK;
    DP_NN_REQUIRE_PTR(dev, y);
    DP_NN_REQUIRE_PTR(dev, x);
    if (n > SIZE_MAX / sizeof(float))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: n=%zu floats overflows size_t", dev->name, n);
    if (x == y) return dp_scale(dev, y, 1.0f + alpha, n);
    /* out == y is read through the "out" staging, x through "a". */
    return dp_ops_foreach(dev, y, x, NULL, n, axpy_chunk, &alpha);
}

// --- bias add ----------------------------------------------------------------------------

typedef struct bias_ctx {
    const float *bias_host; /* cols floats on the host */
    size_t cols, ld;
} bias_ctx;

static dp_status bias_chunk(void *ctx, float *out, const float *unused_a, const float *unused_b,
                            size_t n, size_t first)
{
    (void)unused_a;
    (void)unused_b;
    const bias_ctx *c = ctx;
    for (size_t i = 0; i < n; i++) {
        size_t col = (first + i) % c->ld;
        if (col < c->cols) out[i] += c->bias_host[col];
    }
    return DP_OK;
}

dp_status dp_bias_add(dp_device *dev, float *out, const float *bias, size_t rows, size_t cols,
                      size_t ld)
{
    DP_NN_REQUIRE_DEV(dev);
    if (!rows || !cols) return DP_OK;
    DP_NN_REQUIRE_PTR(dev, out);
    DP_NN_REQUIRE_PTR(dev, bias);
    if (ld < cols)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: ld=%zu is smaller than cols=%zu; rows must "
                       "not overlap (ld == cols for contiguous rows)", dev->name, ld, cols);
    size_t span = cols;
    if (!dp_size_mad(&span, rows - 1, ld) || span > SIZE_MAX / sizeof(float))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: %zu rows of ld %zu overflow size_t",
                       dev->name, rows, ld);
    if (dp_device_is_host_memory(dev)) {
        bias_ctx c = {bias, cols, ld};
        return bias_chunk(&c, out, NULL, NULL, span, 0);
    }
    /* The bias row goes to the host once, in chunks of the stack buffer. */
    float bh[OPS_CHUNK];
    for (size_t c0 = 0; c0 < cols; c0 += OPS_CHUNK) {
        size_t len = cols - c0 < OPS_CHUNK ? cols - c0 : OPS_CHUNK;
        DP_TRY(dev->ops->copy_d2h(dev, bh, bias + c0, len * sizeof(float)));
        for (size_t r = 0; r < rows; r++) {
            bias_ctx c = {bh, len, len};
            DP_TRY(dp_ops_foreach(dev, out + r * ld + c0, NULL, NULL, len, bias_chunk, &c));
        }
    }
    return DP_OK;
}

// --- masked sum and difference -----------------------------------------------------------

typedef struct sum_ctx {
    double sum;
    size_t count;
} sum_ctx;

static dp_status sum_chunk(void *ctx, float *unused, const float *x, const float *mask, size_t n,
                           size_t first)
{
    (void)unused;
    (void)first;
    sum_ctx *c = ctx;
    for (size_t i = 0; i < n; i++)
        if (!mask || !isnan(mask[i])) {
            c->sum += (double)x[i];
            c->count++;
        }
    return DP_OK;
}

dp_status dp_masked_sum(dp_device *dev, double *sum_host, size_t *count_host, const float *x,
                        const float *mask, size_t n)
{
    DP_NN_REQUIRE_DEV(dev);
    if (!sum_host)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: sum_host must not be NULL; pass the address "
                       "of a host double", dev->name);
    *sum_host = 0.0;
    if (count_host) *count_host = 0;
    if (!n) return DP_OK;
    DP_NN_REQUIRE_PTR(dev, x);
    DP_TRY(dp_device_refuse_recording(dev, "a sum read on the host"));
    if (n > SIZE_MAX / sizeof(float))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: n=%zu floats overflows size_t", dev->name, n);
    sum_ctx c = {0.0, 0};
    DP_TRY(dp_ops_foreach(dev, NULL, x, mask, n, sum_chunk, &c));
    *sum_host = c.sum;
    if (count_host) *count_host = c.count;
    return DP_OK;
}

static dp_status diff_chunk(void *ctx, float *out, const float *x, const float *t, size_t n,
                            size_t first)
{
    (void)first;
    float alpha = *(const float *)ctx;
    for (size_t i = 0; i < n; i++) out[i] = isnan(t[i]) ? 0.0f : alpha * (x[i] - t[i]);
    return DP_OK;
}

dp_status dp_masked_diff(dp_device *dev, float *out, float alpha, const float *x,
                         const float *targets, size_t n)
{
    DP_NN_REQUIRE_DEV(dev);
    if (!n) return DP_OK;
    DP_NN_REQUIRE_PTR(dev, out);
    DP_NN_REQUIRE_PTR(dev, x);
    DP_NN_REQUIRE_PTR(dev, targets);
    if (n > SIZE_MAX / sizeof(float))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: n=%zu floats overflows size_t", dev->name, n);
    if (out != x && dp_device_is_host_memory(dev)) return diff_chunk(&alpha, out, x, targets, n, 0);
    if (out != x) DP_TRY(dp_copy_d2d(dev, out, x, n * sizeof(float)));
    return dp_ops_foreach(dev, out, out, targets, n, diff_chunk, &alpha);
}
