/*
 * backend/cuda_none.c - the CUDA entry points in a build without the CUDA
 * backend: no devices, and cuda:i is a clear error at dp_device_open.
 */
#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"

const dp_backend_ops *dp_backend_cuda(void) { return NULL; }

int dp_backend_cuda_count(void) { return 0; }

/* Unreachable (no CUDA device can be opened), but defined for device.c. */
dp_status dp_cuda_set_allow_tf32(dp_device *dev, int allow)
{
    (void)allow;
    return DP_FAIL(DP_ERR_UNSUPPORTED, "%s: this build has no CUDA backend", dp_device_name(dev));
}
