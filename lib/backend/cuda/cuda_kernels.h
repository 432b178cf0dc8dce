/*
 * backend/cuda/cuda_kernels.h - launchers of the CUDA backend's kernels.
 *
 * Each dp_cuda_launch_* enqueues one or two __global__ wrappers around the
 * DP_HD functions of lib/kernels/ (*.h) on `stream` and returns
 * cudaGetLastError() right after the launch, so a bad launch configuration
 * is reported at its launch (errors inside a running kernel surface at the
 * next synchronizing call). Sizes are those of the matching
 * dp_backend_ops entries; a size of 0 launches nothing. The caller has
 * made the stream's device current. Declared extern "C": the host side
 * (cuda_backend.c) is C, the kernels (cuda_*.cu) are CUDA C++.
 */
#ifndef DP_CUDA_KERNELS_H
#define DP_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Blocks of the first sum-of-squares pass (so the partials buffer holds
 * DP_CUDA_SUMSQ_BLOCKS doubles) and its fixed block size. */
#define DP_CUDA_SUMSQ_BLOCKS 1024
#define DP_CUDA_SUMSQ_THREADS 256

/* The launcher of each element-wise or row-wise op of kernels/ops.h:
 * cudaError_t dp_cuda_launch_<name>(cudaStream_t s, params..., size_t n). */
#define DP_CUDA_LAUNCHER_DECL(name, shape, fn, params, args) \
    cudaError_t dp_cuda_launch_##name(cudaStream_t stream, DP_UNPAREN params, size_t n);
DP_KERNEL_OPS(DP_CUDA_LAUNCHER_DECL)
#undef DP_CUDA_LAUNCHER_DECL

/* Bytes of device scratch dp_cuda_launch_encoder_group needs for BT rows. */
cudaError_t dp_cuda_encoder_group_bytes(size_t BT, size_t *bytes);
/* The rows 0..BT-1 sorted stably by token (cuda_group.cu): *order(BT) the
 * rows, *keys(BT) their token ids in that order, both in scratch (bytes =
 * dp_cuda_encoder_group_bytes(BT) of it, 256-byte aligned). inp's ids
 * must be in [0, 2^31). */
cudaError_t dp_cuda_launch_encoder_group(cudaStream_t s, void *scratch, size_t bytes,
                                         const int32_t *inp, size_t BT, uint32_t **keys,
                                         uint32_t **order);
/* dwpe, and dwte by token group from dp_cuda_launch_encoder_group's keys
 * and order (kernels/encoder.h). */
cudaError_t dp_cuda_launch_encoder_backward(cudaStream_t s, float *dwte, float *dwpe,
                                            const float *dout, const uint32_t *keys,
                                            const uint32_t *order, size_t B, size_t T, size_t C);
cudaError_t dp_cuda_launch_bias_broadcast(cudaStream_t s, float *out, dp_pref bias, size_t N,
                                          size_t OC);
/* Column reductions, both stages of kernels/colsum.h in one launch;
 * partial is device scratch of dp_col_chunks(N) * OC floats (bias) or
 * twice dp_col_chunks(N) * C floats (LayerNorm: dweight's then dbias's),
 * tickets dp_cuda_col_tiles(C) (or OC) counters, all 0 before the first
 * launch; every launch leaves them 0 (cuda_colsum.cuh). */
size_t dp_cuda_col_tiles(size_t C);
cudaError_t dp_cuda_launch_bias_backward(cudaStream_t s, float *dbias, float *partial,
                                         unsigned *tickets, uint16_t *dout16, dp_pref dout,
                                         size_t N, size_t OC);
cudaError_t dp_cuda_launch_layernorm_backward_params(cudaStream_t s, float *dweight,
                                                     float *dbias, float *partial,
                                                     unsigned *tickets, dp_pref dout,
                                                     const float *inp, const float *mean,
                                                     const float *rstd, size_t N, size_t C);
/* Two passes: DP_CUDA_SUMSQ_BLOCKS (or fewer) partial sums into partials,
 * then their sum into *result (device memory). Deterministic: the split
 * depends on n only, and every sum runs in a fixed order. */
cudaError_t dp_cuda_launch_sum_squares(cudaStream_t s, double *result, double *partials,
                                       const float *x, size_t n);
cudaError_t dp_cuda_launch_attention_permute(cudaStream_t s, float *qkvr, const float *qkv,
                                             size_t B, size_t T, size_t NH, size_t hs);
/* 0 when DP_CUDA_VEC=0 turns the 16-byte element-wise paths off (cuda_kernels.cu). */
int dp_cuda_vec_on(void);
cudaError_t dp_cuda_launch_attention_permute_bf16(cudaStream_t s, uint16_t *qkvr,
                                                  const float *qkv, size_t B, size_t T,
                                                  size_t NH, size_t hs);
cudaError_t dp_cuda_launch_attention_permute_backward(cudaStream_t s, float *dqkv,
                                                      const float *dqkvr, size_t B, size_t T,
                                                      size_t NH, size_t hs);
cudaError_t dp_cuda_launch_attention_unpermute(cudaStream_t s, float *out, const float *y,
                                               size_t B, size_t T, size_t NH, size_t hs);
cudaError_t dp_cuda_launch_attention_unpermute_backward(cudaStream_t s, float *dy,
                                                        const float *dout, size_t B, size_t T,
                                                        size_t NH, size_t hs);
/* C = beta * C for batch column-major (m,n) matrices (ldc, strideC in
 * floats); beta == 0 writes zeros (NaNs in C are not kept). The k == 0
 * case of the GEMM, where cuBLAS's behaviour is not documented. */
cudaError_t dp_cuda_launch_gemm_scale_c(cudaStream_t s, float *C, int m, int n, int ldc,
                                        long long strideC, int batch, float beta);

/* backend/cuda/cuda_optim.cu: AdamW over a slice's segments (dp_backend_ops.adamw_segments). */
cudaError_t dp_cuda_launch_adamw_segments(cudaStream_t stream, float *params, float *grads,
                                          float *m, float *v, uint16_t *replica,
                                          const dp_adamw_segs *segs, float lr, float beta1,
                                          float beta2, float eps, float bias_corr1,
                                          float bias_corr2, float clip);

#ifdef __cplusplus
}
#endif

#endif /* DP_CUDA_KERNELS_H */
