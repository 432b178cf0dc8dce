/*
 * backend/device_testing.h - test-only hooks of the devices (not
 * installed). Exported from libdp so the test programs can link them, but
 * declared only here: tests include "backend/device_testing.h".
 */
#ifndef DP_BACKEND_DEVICE_TESTING_H
#define DP_BACKEND_DEVICE_TESTING_H

#include <stddef.h>

#include "dp/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bounds the bytes dev's GEMM converts operands into at a time (0: the
 * default, DP_GEMM_CONVERT_CAP), so small GEMMs run in pieces. Call it
 * while no GEMM runs on dev. */
DP_API void dp_device_set_gemm_convert_cap(dp_device *dev, size_t bytes);

#ifdef __cplusplus
}
#endif

#endif /* DP_BACKEND_DEVICE_TESTING_H */
