/*
 * backend/device_gemm.c - GEMM and element type conversion on a device
 * (dp/device.h): the arguments checked once here, then the backend's.
 */
#include <stdint.h>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/error.h"

// --- GEMM -----------------------------------------------------------------------

static int typed(dp_dtype t) { return t == DP_DTYPE_F32 || t == DP_DTYPE_BF16; }

static dp_status check_gemm(dp_device *dev, dp_op ta, dp_op tb, int m, int n, int k,
                            const void *A, int lda, long long sA, const void *B, int ldb,
                            long long sB, const float *C, int ldc, long long sC, int batch)
{
    if (!dev) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "dev must not be NULL");
    if (m < 0 || n < 0 || k < 0 || batch < 0)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: gemm sizes must be >= 0 (m=%d n=%d k=%d "
                       "batch=%d)", dev->name, m, n, k, batch);
    if ((ta != DP_OP_N && ta != DP_OP_T) || (tb != DP_OP_N && tb != DP_OP_T))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: transpose flags must be DP_OP_N or "
                       "DP_OP_T", dev->name);
    int rows_a = ta == DP_OP_N ? m : k, rows_b = tb == DP_OP_N ? k : n;
    if (lda < (rows_a > 1 ? rows_a : 1) || ldb < (rows_b > 1 ? rows_b : 1) ||
        ldc < (m > 1 ? m : 1))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: leading dimensions too small (lda=%d "
                       "needs >= %d, ldb=%d needs >= %d, ldc=%d needs >= %d)", dev->name, lda,
                       rows_a, ldb, rows_b, ldc, m);
    if (sA < 0 || sB < 0 || sC < 0)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: gemm strides must be >= 0 (strideA=%lld "
                       "strideB=%lld strideC=%lld)", dev->name, sA, sB, sC);
    if (m && n && batch && (!C || (k && (!A || !B))))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: gemm with a NULL matrix", dev->name);
    return DP_OK;
}

static dp_status run_gemm(dp_device *dev, dp_op ta, dp_op tb, int m, int n, int k, float alpha,
                          const void *A, int a_bf16, int lda, long long sA, const void *B,
                          int b_bf16, int ldb, long long sB, float beta, float *C, int ldc,
                          long long sC, int batch)
{
    DP_TRY(check_gemm(dev, ta, tb, m, n, k, A, lda, sA, B, ldb, sB, C, ldc, sC, batch));
    if (!m || !n || !batch) return DP_OK;
    dp_gemm_arg a = {A, a_bf16, lda, sA}, b = {B, b_bf16, ldb, sB};
    return dev->ops->gemm(dev, ta, tb, m, n, k, alpha, &a, &b, beta, C, ldc, sC, batch);
}

dp_status dp_gemm(dp_device *dev, dp_op transa, dp_op transb, int m, int n, int k, float alpha,
                  const float *A, int lda, const float *B, int ldb, float beta, float *C,
                  int ldc)
{
    return run_gemm(dev, transa, transb, m, n, k, alpha, A, 0, lda, 0, B, 0, ldb, 0, beta, C,
                    ldc, 0, 1);
}

dp_status dp_gemm_strided_batched(dp_device *dev, dp_op transa, dp_op transb, int m, int n,
                                  int k, float alpha, const float *A, int lda, long long strideA,
                                  const float *B, int ldb, long long strideB, float beta,
                                  float *C, int ldc, long long strideC, int batch)
{
    return run_gemm(dev, transa, transb, m, n, k, alpha, A, 0, lda, strideA, B, 0, ldb, strideB,
                    beta, C, ldc, strideC, batch);
}

dp_status dp_gemm_ex(dp_device *dev, dp_op transa, dp_op transb, int m, int n, int k,
                     float alpha, const void *A, dp_dtype a_type, int lda, long long strideA,
                     const void *B, dp_dtype b_type, int ldb, long long strideB, float beta,
                     float *C, int ldc, long long strideC, int batch)
{
    if (!typed(a_type) || !typed(b_type))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: gemm operand types %s and %s; use "
                       "DP_DTYPE_F32 or DP_DTYPE_BF16", dp_device_name(dev),
                       dp_dtype_name(a_type), dp_dtype_name(b_type));
    return run_gemm(dev, transa, transb, m, n, k, alpha, A, a_type == DP_DTYPE_BF16, lda, strideA,
                    B, b_type == DP_DTYPE_BF16, ldb, strideB, beta, C, ldc, strideC, batch);
}

// --- conversion ---------------------------------------------------------------------

dp_status dp_convert(dp_device *dev, void *dst, dp_dtype dst_type, const void *src,
                     dp_dtype src_type, size_t n)
{
    if (!dev || !dst || !src)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "dev, dst and src must not be NULL");
    if (!typed(dst_type) || !typed(src_type))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: conversion from %s to %s; dp converts "
                       "between DP_DTYPE_F32 and DP_DTYPE_BF16", dev->name,
                       dp_dtype_name(src_type), dp_dtype_name(dst_type));
    if (n == 0 || n > SIZE_MAX / sizeof(float))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: conversion of %zu elements; use 1 to %zu",
                       dev->name, n, SIZE_MAX / sizeof(float));
    if (dst_type == src_type) {
        if (dst == src) return DP_OK;
        return dev->ops->copy_d2d(dev, dst, src, n * dp_dtype_size(dst_type));
    }
    if (dst_type == DP_DTYPE_BF16) return dev->ops->cast_f32_bf16(dev, dst, src, n);
    return dev->ops->cast_bf16_f32(dev, dst, src, n);
}
