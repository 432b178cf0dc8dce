/*
 * backend/cuda/cuda_optim.cuh - the device code of the optimizer's one
 * launch per slice (dp_backend_ops.adamw_segments; the launcher is
 * cuda_optim.cu): AdamW with the clipping factor and the bf16 replica's
 * refresh over every tensor of up to DP_ADAMW_SEGS of them
 * (kernels/optim.h). Device code only, so that
 * tests/test_cuda_optim_emu.cpp also compiles it with the host's C++
 * compiler against tests/cuda_emu.hpp.
 *
 * Each element is dp_adamw_clip_element's arithmetic, so both kernels
 * give its bits; they differ in how threads take elements:
 *   k_adamw_segments      a thread per element (grid-stride), each
 *                         finding its segment in the table passed by
 *                         value (the constant bank: a warp's lookups are
 *                         broadcasts) and skipping the gaps;
 *   k_adamw_segments_vec  a thread per ADAMW_VEC elements at a multiple
 *                         of ADAMW_VEC, one lookup for them, and where
 *                         all lie in one segment 16-byte loads and stores
 *                         of p, g, m, v (8 bytes of the replica); groups
 *                         that hold a segment's end or a gap go element
 *                         by element. It needs those pointers aligned so
 *                         (the launcher checks). AdamW moves ~30 bytes an
 *                         element, and 4-byte accesses kept too few in
 *                         flight: GPT-2 small's update took 1.69 ms on an
 *                         H200 for ~0.8 ms of traffic.
 */
#ifndef DP_CUDA_OPTIM_CUH
#define DP_CUDA_OPTIM_CUH

#include <stddef.h>
#include <stdint.h>

#include "kernels/optim.h"

const unsigned OPTIM_THREADS = 256;
const unsigned ADAMW_VEC = 4;

/* The hyper-parameters of one launch, by value. */
struct adamw_args {
    float lr, beta1, beta2, eps, bias_corr1, bias_corr2, clip;
};

__global__ void k_adamw_segments(float *params, float *grads, float *m, float *v,
                                 uint16_t *replica, dp_adamw_segs segs, adamw_args a, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t s = dp_adamw_seg_of(&segs, i);
        if (i >= segs.end[s]) continue; /* a gap between tensors */
        dp_adamw_clip_element(params, grads, m, v, replica, i, a.lr, a.beta1, a.beta2, a.eps,
                              segs.weight_decay[s], a.bias_corr1, a.bias_corr2, a.clip);
    }
}

__global__ void k_adamw_segments_vec(float *params, float *grads, float *m, float *v,
                                     uint16_t *replica, dp_adamw_segs segs, adamw_args a,
                                     size_t n)
{
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * ADAMW_VEC; i < n;
         i += (size_t)gridDim.x * blockDim.x * ADAMW_VEC) {
        uint32_t s = dp_adamw_seg_of(&segs, i);
        if (i + ADAMW_VEC > segs.end[s]) { /* a segment's end or a gap: one at a time */
            for (size_t j = i; j < i + ADAMW_VEC && j < n; j++) {
                uint32_t sj = dp_adamw_seg_of(&segs, j);
                if (j < segs.end[sj])
                    dp_adamw_clip_element(params, grads, m, v, replica, j, a.lr, a.beta1,
                                          a.beta2, a.eps, segs.weight_decay[sj], a.bias_corr1,
                                          a.bias_corr2, a.clip);
            }
            continue;
        }
        float4 g4 = *(const float4 *)(grads + i), p4 = *(const float4 *)(params + i),
               m4 = *(const float4 *)(m + i), v4 = *(const float4 *)(v + i);
        float g[4] = {g4.x, g4.y, g4.z, g4.w}, p[4] = {p4.x, p4.y, p4.z, p4.w},
              mm[4] = {m4.x, m4.y, m4.z, m4.w}, vv[4] = {v4.x, v4.y, v4.z, v4.w};
        uint16_t r[4];
        DP_UNROLL
        for (unsigned k = 0; k < ADAMW_VEC; k++) {
            dp_adamw_clip_value(&p[k], &g[k], &mm[k], &vv[k], a.lr, a.beta1, a.beta2, a.eps,
                                segs.weight_decay[s], a.bias_corr1, a.bias_corr2, a.clip);
            r[k] = dp_bf16_round(p[k]);
        }
        if (a.clip != 1.0f) *(float4 *)(grads + i) = make_float4(g[0], g[1], g[2], g[3]);
        *(float4 *)(params + i) = make_float4(p[0], p[1], p[2], p[3]);
        *(float4 *)(m + i) = make_float4(mm[0], mm[1], mm[2], mm[3]);
        *(float4 *)(v + i) = make_float4(vv[0], vv[1], vv[2], vv[3]);
        if (replica)
            *(uint2 *)(replica + i) = make_uint2((uint32_t)r[0] | (uint32_t)r[1] << 16,
                                                 (uint32_t)r[2] | (uint32_t)r[3] << 16);
    }
}

#endif /* DP_CUDA_OPTIM_CUH */
