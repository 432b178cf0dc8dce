/*
 * backend/cuda/cuda_backend.h - entry points of the CUDA backend beyond
 * its vtable (dp_backend_cuda, dp_backend_cuda_count in backend/backend.h).
 *
 * Defined by backend/cuda/cuda_backend.c in CUDA builds and by
 * backend/cuda_none.c otherwise. Plain C: no CUDA header is needed.
 */
#ifndef DP_CUDA_BACKEND_H
#define DP_CUDA_BACKEND_H

#include "backend/backend.h"

/* cuBLAS math mode of a CUDA device: TF32 tensor-op math when allow is
 * nonzero, CUBLAS_DEFAULT_MATH (full float32) otherwise. dev must be a
 * CUDA device (see dp_device_set_allow_tf32 in dp/device.h). */
dp_status dp_cuda_set_allow_tf32(dp_device *dev, int allow);

#endif /* DP_CUDA_BACKEND_H */
