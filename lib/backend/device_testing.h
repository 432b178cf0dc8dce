/*
 * backend/device_testing.h - test-only hooks of the devices (not
 * installed). Defined in device_testing.c, which only the test-only
 * library dp_testing holds: tests include "backend/device_testing.h" and
 * link dp_testing.
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
void dp_device_set_gemm_convert_cap(dp_device *dev, size_t bytes);

/* allowed 0: dev's bf16 math runs on OpenBLAS (operands rounded to
 * bfloat16 values held as floats) even on a CPU where oneDNN has a bf16
 * matmul, so that path is tested everywhere; 1 (the default): oneDNN
 * where it can. CPU devices only; call it while no GEMM runs on dev. */
void dp_device_set_gemm_dnnl(dp_device *dev, int allowed);

/* allowed 0: the bfloat16 producers of nn/nn_act16.h run as the
 * compositions they replace - the float32 LayerNorm or linear layer, then
 * dp_convert; the linear backward with each GEMM rounding its float32
 * dout itself - so one binary can train both ways and compare them bit for
 * bit; 1 (the default): the producers. Any device; call it while nothing
 * runs on dev. */
void dp_device_set_fused_producers(dp_device *dev, int allowed);

#ifdef __cplusplus
}
#endif

#endif /* DP_BACKEND_DEVICE_TESTING_H */
