/*
 * backend/cuda/cuda_vec8.cuh - eight float32 or bfloat16 values moved in
 * 16-byte pieces (one uint4 or two float4): the loads and stores of the
 * VEC kernels (cuda_vec.cuh) and of the bfloat16 cross-entropy
 * (cuda_rows.cuh). The pointers must be 16-byte aligned. Device code
 * only, as the headers that include it.
 */
#ifndef DP_CUDA_VEC8_CUH
#define DP_CUDA_VEC8_CUH

#include <stdint.h>

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

#endif /* DP_CUDA_VEC8_CUH */
