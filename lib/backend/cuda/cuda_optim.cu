/*
 * backend/cuda/cuda_optim.cu - the launcher of the optimizer's one launch
 * per slice (dp_backend_ops.adamw_segments; the kernels are
 * cuda_optim.cuh): AdamW with the clipping factor and the bf16 replica's
 * refresh over every tensor of up to DP_ADAMW_SEGS of them, where the
 * engine launched three kernels per tensor (scale, AdamW, convert). A
 * GPT-2 step updates ~150 tensors: ~450 launches become ~3, and the
 * gradient and parameters are read once.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "backend/cuda/cuda_kernels.h" /* and kernels/ops.h with kernels/optim.h */

namespace {

#include "backend/cuda/cuda_optim.cuh"

const size_t OPTIM_MAX_BLOCKS = 4096;

unsigned optim_blocks(size_t items)
{
    size_t b = (items + OPTIM_THREADS - 1) / OPTIM_THREADS;
    return (unsigned)(b < OPTIM_MAX_BLOCKS ? b : OPTIM_MAX_BLOCKS);
}

bool aligned(const void *p, uintptr_t bytes) { return (uintptr_t)p % bytes == 0; }

} // namespace

extern "C" cudaError_t dp_cuda_launch_adamw_segments(cudaStream_t stream, float *params,
                                                     float *grads, float *m, float *v,
                                                     uint16_t *replica,
                                                     const dp_adamw_segs *segs, float lr,
                                                     float beta1, float beta2, float eps,
                                                     float bias_corr1, float bias_corr2,
                                                     float clip)
{
    size_t n = segs->n ? (size_t)segs->end[segs->n - 1] : 0;
    if (n == 0) return cudaSuccess;
    adamw_args a = {lr, beta1, beta2, eps, bias_corr1, bias_corr2, clip};
    /* 16-byte groups of the four float arrays, 8-byte ones of the replica */
    if (dp_cuda_vec_on() && aligned(params, 16) && aligned(grads, 16) && aligned(m, 16) &&
        aligned(v, 16) && (!replica || aligned(replica, 8)))
        k_adamw_segments_vec<<<optim_blocks((n + ADAMW_VEC - 1) / ADAMW_VEC), OPTIM_THREADS, 0,
                               stream>>>(params, grads, m, v, replica, *segs, a, n);
    else
        k_adamw_segments<<<optim_blocks(n), OPTIM_THREADS, 0, stream>>>(params, grads, m, v,
                                                                        replica, *segs, a, n);
    return cudaGetLastError();
}
