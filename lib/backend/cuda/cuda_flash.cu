/*
 * backend/cuda/cuda_flash.cu - the launchers of the fused causal
 * attention on the GPU (the TILED ops of kernels/ops.h: attention_fused_
 * forward, _delta, _dq, _dkdv; the math is kernels/flash.h): the tensor core
 * kernels of cuda_flash_tc.cuh for bfloat16 q, k, v at head size 64 on
 * sm_80 and later (DP_CUDA_FLASH_TC=0 turns them off), else the float32
 * kernels of cuda_flash_f32.cuh (tiled for head sizes 64 and 128, one
 * thread per item otherwise). Both headers are device code only, so the
 * tests also run them on a CUDA emulator (tests/cuda_emu.hpp).
 */
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_flash_f32.cuh"
#include "backend/cuda/cuda_flash_tc.cuh"
#include "backend/cuda/cuda_kernels.h" /* and kernels/ops.h with kernels/flash.h */

namespace {

size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

} // namespace

// --- launchers -------------------------------------------------------------------------------
/* n = B*NH*T items; the public wrapper (nn/attention_fused.c) keeps it
 * below 2^31, so a grid of one block per (pair, tile) fits grid.x. */

namespace {

/* The grid below counts tiles of ROWS (cuda_flash_f32.cuh) rows for both
 * kernel families. */
static_assert(ROWS == dp_tc::BR && dp_tc::BR == dp_tc::BC, "one tile height for both kernels");

unsigned tiled_blocks(size_t B, size_t T, size_t NH)
{
    return (unsigned)((T + ROWS - 1) / ROWS * B * NH);
}

unsigned item_blocks(size_t n)
{
    return (unsigned)min_sz((n + ROW_THREADS - 1) / ROW_THREADS, MAX_BLOCKS);
}

/* kernel<cap>, the bfloat16 items' kernel for head size hs (items16_cap),
 * launched with the items' shape. */
#define LAUNCH_ITEMS16(kernel, hs, s, n, ...)                                                \
    do {                                                                                     \
        switch (items16_cap(hs)) {                                                           \
        case 32: kernel<32><<<item_blocks(n), ROW_THREADS, 0, s>>>(__VA_ARGS__); break;      \
        case 64: kernel<64><<<item_blocks(n), ROW_THREADS, 0, s>>>(__VA_ARGS__); break;      \
        case 128: kernel<128><<<item_blocks(n), ROW_THREADS, 0, s>>>(__VA_ARGS__); break;    \
        default:                                                                             \
            kernel<DP_FLASH_HS_MAX16><<<item_blocks(n), ROW_THREADS, 0, s>>>(__VA_ARGS__);   \
        }                                                                                    \
    } while (0)

/* Per device ordinal (up to TC_DEVICES): 0 not yet looked at, 1 the
 * tensor core kernels run there (compute capability 8.0 or later, each
 * kernel's shared memory limit raised), -1 they do not. Looked at once
 * per device, not on every launch; two threads racing on the first call
 * both set the same limits, which is harmless. */
const int TC_DEVICES = 64;
int tc_state[TC_DEVICES];

cudaError_t tc_device_ready(int dev, bool *ready)
{
    *ready = false;
    if (dev < 0 || dev >= TC_DEVICES) return cudaSuccess;
    if (tc_state[dev]) {
        *ready = tc_state[dev] > 0;
        return cudaSuccess;
    }
    int major = 0;
    cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (e != cudaSuccess) return e;
    /* The kernels' bodies exist only in code compiled for sm_80 or later
     * (cuda_flash_tc.cuh): a build whose only code for this GPU is older
     * PTX, JIT-compiled, would run them empty and write nothing. */
    cudaFuncAttributes fa = {};
    if (major >= 8 && (e = cudaFuncGetAttributes(&fa, k_flash_tc_forward)) != cudaSuccess)
        return e;
    if (fa.ptxVersion < 80) { /* also every GPU before sm_80 (fa untouched) */
        tc_state[dev] = -1;
        return cudaSuccess;
    }
    const cudaFuncAttribute smem = cudaFuncAttributeMaxDynamicSharedMemorySize;
    e = cudaFuncSetAttribute(k_flash_tc_forward, smem, (int)dp_tc::SMEM_QUERY);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(k_flash_tc_dq, smem, (int)dp_tc::SMEM_QUERY);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(k_flash_tc_dkdv, smem, (int)dp_tc::SMEM_KEY);
    if (e != cudaSuccess) { /* a device without the shared memory: the float32 kernels */
        (void)cudaGetLastError();
        tc_state[dev] = -1;
        return cudaSuccess;
    }
    tc_state[dev] = 1;
    *ready = true;
    return cudaSuccess;
}

/* Whether the tensor core kernels (cuda_flash_tc.cuh) take this call:
 * bfloat16 q, k, v of head size 64, 16-byte aligned rows (their loads
 * move 8 and 16 bytes: qkv and dout, either type), an 8-byte aligned output (out or
 * dqkv: they store float or bfloat16 pairs), DP_CUDA_FLASH_TC not "0" (read once),
 * and the current device ready for them (tc_device_ready). */
cudaError_t tc_takes(dp_pref qkv, size_t hs, const void *dout, const void *dst, bool *takes)
{
    static int off = -1;
    *takes = false;
    if (off < 0) {
        const char *e = getenv("DP_CUDA_FLASH_TC");
        off = e && strcmp(e, "0") == 0;
    }
    if (off || !qkv.bf16 || hs != dp_tc::HS || (uintptr_t)qkv.p % 16 ||
        (dout && (uintptr_t)dout % 16) || (uintptr_t)dst % 8)
        return cudaSuccess;
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    return e == cudaSuccess ? tc_device_ready(dev, takes) : e;
}

} // namespace

extern "C" cudaError_t dp_cuda_launch_attention_fused_forward(cudaStream_t s, dp_pout out,
                                                              float *lse, dp_pref qkv, size_t B,
                                                              size_t T, size_t NH, size_t hs,
                                                              float scale, size_t n)
{
    if (n == 0) return cudaSuccess;
    size_t nt = (T + ROWS - 1) / ROWS;
    bool tc;
    cudaError_t e = tc_takes(qkv, hs, NULL, out.p, &tc);
    if (e != cudaSuccess) return e;
    if (tc)
        k_flash_tc_forward<<<tiled_blocks(B, T, NH), dp_tc::THREADS, dp_tc::SMEM_QUERY, s>>>(
            out, lse, (const uint16_t *)qkv.p, B, T, NH, scale, nt);
    else if (hs == 64)
        k_flash_forward<64, 1><<<tiled_blocks(B, T, NH), ROWS * 1, 0, s>>>(out, lse, qkv, B, T,
                                                                          NH, scale, nt);
    else if (hs == 128)
        k_flash_forward<128, 2><<<tiled_blocks(B, T, NH), ROWS * 2, 0, s>>>(out, lse, qkv, B, T,
                                                                           NH, scale, nt);
    else if (!out.bf16)
        k_flash_forward_items_f32<<<item_blocks(n), ROW_THREADS, 0, s>>>(
            (float *)out.p, lse, qkv, B, T, NH, hs, scale, n);
    else
        LAUNCH_ITEMS16(k_flash_forward_items16, hs, s, n, (uint16_t *)out.p, lse, qkv, T, NH, hs,
                       scale, n);
    return cudaGetLastError();
}

extern "C" cudaError_t dp_cuda_launch_attention_fused_delta(cudaStream_t s, float *delta,
                                                            dp_pref dout, dp_pref out,
                                                            size_t T, size_t NH, size_t hs,
                                                            size_t n)
{
    if (n == 0) return cudaSuccess;
    const bool vec = dp_cuda_vec_on() && hs % 4 == 0 &&
                     (uintptr_t)dout.p % (dout.bf16 ? 8 : 16) == 0 &&
                     (uintptr_t)out.p % (out.bf16 ? 8 : 16) == 0; /* C = NH hs: rows too */
    if (vec)
        k_flash_delta_vec<<<item_blocks(n), ROW_THREADS, 0, s>>>(delta, dout, out, T, NH, hs, n);
    else
        k_flash_delta_items<<<item_blocks(n), ROW_THREADS, 0, s>>>(delta, dout, out, T, NH, hs,
                                                                  n);
    return cudaGetLastError();
}

extern "C" cudaError_t dp_cuda_launch_attention_fused_dq(cudaStream_t s, dp_pout dqkv,
                                                         dp_pref dout, dp_pref qkv,
                                                         const float *lse, const float *delta,
                                                         size_t B, size_t T, size_t NH,
                                                         size_t hs, float scale, size_t n)
{
    if (n == 0) return cudaSuccess;
    size_t nt = (T + ROWS - 1) / ROWS;
    bool tc;
    cudaError_t e = tc_takes(qkv, hs, dout.p, dqkv.p, &tc);
    if (e != cudaSuccess) return e;
    if (tc)
        k_flash_tc_dq<<<tiled_blocks(B, T, NH), dp_tc::THREADS, dp_tc::SMEM_QUERY, s>>>(
            dqkv, dout, (const uint16_t *)qkv.p, lse, delta, B, T, NH, scale, nt);
    else if (hs == 64)
        k_flash_dq<64, 2><<<tiled_blocks(B, T, NH), ROWS * 2, 0, s>>>(dqkv, dout, qkv, lse,
                                                                      delta, B, T, NH, scale, nt);
    else if (hs == 128)
        k_flash_dq<128, 4><<<tiled_blocks(B, T, NH), ROWS * 4, 0, s>>>(dqkv, dout, qkv, lse,
                                                                       delta, B, T, NH, scale, nt);
    else if (!dqkv.bf16)
        k_flash_dq_items_f32<<<item_blocks(n), ROW_THREADS, 0, s>>>(
            (float *)dqkv.p, dout, qkv, lse, delta, B, T, NH, hs, scale, n);
    else
        LAUNCH_ITEMS16(k_flash_dq_items16, hs, s, n, (uint16_t *)dqkv.p, dout, qkv, lse, delta, T,
                       NH, hs, scale, n);
    return cudaGetLastError();
}

extern "C" cudaError_t dp_cuda_launch_attention_fused_dkdv(cudaStream_t s, dp_pout dqkv,
                                                           dp_pref dout, dp_pref qkv,
                                                           const float *lse, const float *delta,
                                                           size_t B, size_t T, size_t NH,
                                                           size_t hs, float scale, size_t n)
{
    if (n == 0) return cudaSuccess;
    bool tc;
    cudaError_t e = tc_takes(qkv, hs, dout.p, dqkv.p, &tc);
    if (e != cudaSuccess) return e;
    if (tc)
        k_flash_tc_dkdv<<<tiled_blocks(B, T, NH), dp_tc::THREADS, dp_tc::SMEM_KEY, s>>>(
            dqkv, dout, (const uint16_t *)qkv.p, lse, delta, B, T, NH, scale,
            (T + ROWS - 1) / ROWS);
    else if (hs == 64)
        k_flash_dkdv<64, 2><<<tiled_blocks(B, T, NH), ROWS * 2, 0, s>>>(dqkv, dout, qkv, lse,
                                                                        delta, B, T, NH, scale);
    else if (hs == 128)
        k_flash_dkdv<128, 4><<<tiled_blocks(B, T, NH), ROWS * 4, 0, s>>>(dqkv, dout, qkv, lse,
                                                                         delta, B, T, NH, scale);
    else if (!dqkv.bf16)
        k_flash_dkdv_items_f32<<<item_blocks(n), ROW_THREADS, 0, s>>>(
            (float *)dqkv.p, dout, qkv, lse, delta, B, T, NH, hs, scale, n);
    else
        LAUNCH_ITEMS16(k_flash_dkdv_items16, hs, s, n, (uint16_t *)dqkv.p, dout, qkv, lse, delta,
                       T, NH, hs, scale, n);
    return cudaGetLastError();
}
