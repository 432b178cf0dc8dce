/*
 * backend/cuda/cuda_vec.cuh - the device code of the VEC ops of
 * kernels/ops.h: element-wise ops on the bf16 step's largest tensors
 * (the casts of the linears' float32 gradients, the GELU and its
 * backward over the MLP's 4C-wide activations), with 16-byte loads and
 * stores. The ELEM kernel moves one 2- or 4-byte element per thread and
 * loop turn, and cannot batch the next turn's loads ahead of this turn's
 * stores (they might alias), so it keeps too few bytes in flight to fill
 * HBM: on an H200 GPT-2 small's casts, GELU and GELU backward ran at
 * about half its bandwidth.
 *
 * A thread takes VEC_ITEMS consecutive items from a multiple of
 * VEC_ITEMS, loads all their inputs in 16-byte (or 8-byte) pieces, runs
 * the op's DP_HD element function of kernels/ on each (the ELEM op's
 * arithmetic, so its bits), and stores the results likewise; the last
 * n % VEC_ITEMS items go one at a time through the ELEM item function.
 * The pointers must be 16-byte aligned (the launcher in cuda_kernels.cu
 * checks, and runs the ELEM kernel otherwise). In place (an output that
 * is also an input, as the GELU backward's dinp and dout) is safe: a
 * thread writes only the items it read.
 *
 * Device code only, so that tests/test_cuda_vec_emu.cpp also compiles it
 * with the host's C++ compiler against tests/cuda_emu.hpp.
 */
#ifndef DP_CUDA_VEC_CUH
#define DP_CUDA_VEC_CUH

#include <stddef.h>
#include <stdint.h>

#include "kernels/bf16.h"
#include "kernels/gelu.h"

const unsigned VEC_THREADS = 256;
const unsigned VEC_ITEMS = 8;

/* The threads' first group and stride, in items. */
#define VEC_GROUPS(i, n)                                                                     \
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC_ITEMS;              \
         i + VEC_ITEMS <= (n); i += (size_t)gridDim.x * blockDim.x * VEC_ITEMS)
/* The tail, one item a thread. */
#define VEC_TAIL(i, n)                                                                       \
    for (size_t i = (n) / VEC_ITEMS * VEC_ITEMS + (size_t)blockIdx.x * blockDim.x + threadIdx.x; \
         i < (n); i += (size_t)gridDim.x * blockDim.x)

/* Eight float32 from p (16-byte aligned), and eight bfloat16 from or to q. */
__device__ __forceinline__ void vec_load8(float v[8], const float *p)
{
    const float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z,
    v[7] = b.w;
}
__device__ __forceinline__ void vec_store8(float *p, const float v[8])
{
    ((float4 *)p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    ((float4 *)p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}
__device__ __forceinline__ void vec_load8(uint16_t h[8], const uint16_t *q)
{
    const uint4 w = *(const uint4 *)q;
    const uint32_t u[4] = {w.x, w.y, w.z, w.w};
    for (unsigned k = 0; k < 4; k++) {
        h[2 * k] = (uint16_t)(u[k] & 0xffffu);
        h[2 * k + 1] = (uint16_t)(u[k] >> 16);
    }
}
__device__ __forceinline__ void vec_store8(uint16_t *q, const uint16_t h[8])
{
    uint32_t u[4];
    for (unsigned k = 0; k < 4; k++) u[k] = (uint32_t)h[2 * k] | (uint32_t)h[2 * k + 1] << 16;
    *(uint4 *)q = make_uint4(u[0], u[1], u[2], u[3]);
}

/* dst = bf16(src) (dp_cast_f32_bf16_elem). */
__global__ void k_cast_f32_bf16_vec(uint16_t *dst, const float *src, size_t n)
{
    VEC_GROUPS(i, n)
    {
        float x[8];
        uint16_t y[8];
        vec_load8(x, src + i);
        DP_UNROLL
        for (unsigned k = 0; k < 8; k++) y[k] = dp_bf16_round(x[k]);
        vec_store8(dst + i, y);
    }
    VEC_TAIL(i, n) dp_cast_f32_bf16_elem(dst, src, i);
}

/* out = bf16(gelu(inp)), both bfloat16 (dp_gelu_forward_bf16_elem). */
__global__ void k_gelu_forward_bf16_vec(uint16_t *out, const uint16_t *inp, size_t n)
{
    VEC_GROUPS(i, n)
    {
        uint16_t x[8], y[8];
        vec_load8(x, inp + i);
        DP_UNROLL
        for (unsigned k = 0; k < 8; k++) y[k] = dp_gelu_bf16(x[k]);
        vec_store8(out + i, y);
    }
    VEC_TAIL(i, n) dp_gelu_forward_bf16_elem(out, inp, i);
}

/* dinp = bf16(dout gelu'(inp)), all bfloat16 (dp_gelu_backward_bf16_elem);
 * dinp may be dout. */
__global__ void k_gelu_backward_bf16_vec(uint16_t *dinp, const uint16_t *inp,
                                         const uint16_t *dout, size_t n)
{
    VEC_GROUPS(i, n)
    {
        uint16_t g[8], x[8];
        vec_load8(g, dout + i);
        vec_load8(x, inp + i);
        DP_UNROLL
        for (unsigned k = 0; k < 8; k++)
            g[k] = dp_bf16_round(dp_gelu_backward_bf16_value(dp_bf16_widen(g[k]), x[k]));
        vec_store8(dinp + i, g);
    }
    VEC_TAIL(i, n) dp_gelu_backward_bf16_elem(dinp, inp, dout, i);
}

#endif /* DP_CUDA_VEC_CUH */
