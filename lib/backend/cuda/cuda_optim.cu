/*
 * backend/cuda/cuda_optim.cu - the optimizer's one launch per slice
 * (dp_backend_ops.adamw_segments): AdamW with the clipping factor and the
 * bf16 replica's refresh over every tensor of up to DP_ADAMW_SEGS of them
 * (kernels/optim.h), where the engine launched three kernels per tensor
 * (scale, AdamW, convert). A GPT-2 step updates ~150 tensors: ~450
 * launches become ~3, and the gradient and parameters are read once.
 *
 * One thread per element over the call's span, a grid-stride loop; each
 * finds its segment in the table passed by value (kernel parameters live
 * in the constant bank, so a warp's lookups are broadcasts) and skips the
 * gaps between segments.
 */
#include <cuda_runtime.h>

#include "backend/cuda/cuda_kernels.h" /* and kernels/ops.h with kernels/optim.h */

namespace {

const unsigned OPTIM_THREADS = 256;
const size_t OPTIM_MAX_BLOCKS = 4096;

__global__ void k_adamw_segments(float *params, float *grads, float *m, float *v,
                                 uint16_t *replica, dp_adamw_segs segs, float lr, float beta1,
                                 float beta2, float eps, float bias_corr1, float bias_corr2,
                                 float clip, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t s = dp_adamw_seg_of(&segs, i);
        if (i >= segs.end[s]) continue; /* a gap between tensors */
        dp_adamw_clip_element(params, grads, m, v, replica, i, lr, beta1, beta2, eps,
                              segs.weight_decay[s], bias_corr1, bias_corr2, clip);
    }
}

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
    size_t b = (n + OPTIM_THREADS - 1) / OPTIM_THREADS;
    unsigned blocks = (unsigned)(b < OPTIM_MAX_BLOCKS ? b : OPTIM_MAX_BLOCKS);
    k_adamw_segments<<<blocks, OPTIM_THREADS, 0, stream>>>(params, grads, m, v, replica, *segs, lr,
                                                          beta1, beta2, eps, bias_corr1,
                                                          bias_corr2, clip, n);
    return cudaGetLastError();
}
