/*
 * backend/device_testing.c - the devices' test hooks (device_testing.h),
 * built into the test-only library dp_testing, never into libdp.
 */
#include "backend/backend.h"
#include "backend/device_testing.h"

void dp_device_set_gemm_convert_cap(dp_device *dev, size_t bytes)
{
    if (dev) dev->gemm_convert_cap = bytes;
}

void dp_device_set_gemm_dnnl(dp_device *dev, int allowed)
{
    if (dev) dev->gemm_no_dnnl = !allowed;
}

void dp_device_set_fused_producers(dp_device *dev, int allowed)
{
    if (dev) dev->no_fused_producers = !allowed;
}
