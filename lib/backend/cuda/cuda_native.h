/*
 * backend/cuda/cuda_native.h - a CUDA device's own stream and ordinal, for
 * code inside dp that enqueues work of another library on the device's
 * stream (NCCL, lib/transport/nccl.c), so it is ordered with dp's kernels.
 * Only in builds with the CUDA backend; not installed.
 */
#ifndef DP_BACKEND_CUDA_NATIVE_H
#define DP_BACKEND_CUDA_NATIVE_H

#include <cuda_runtime.h>

#include "backend/backend.h"

/* The stream dp enqueues dev's work on (dev must be a CUDA device). */
cudaStream_t dp_cuda_native_stream(dp_device *dev);
/* The device's CUDA ordinal (after CUDA_VISIBLE_DEVICES). */
int dp_cuda_native_ordinal(dp_device *dev);

#endif /* DP_BACKEND_CUDA_NATIVE_H */
