/*
 * backend/cuda/cuda_launch.cuh - the launch shapes the CUDA backend's
 * kernel files share (cuda_kernels.cu, cuda_rows.cu): block counts capped
 * at DP_MAX_BLOCKS, grid-stride loops with size_t indices, and LAUNCH.
 * Internal to those files (an anonymous namespace each).
 */
#ifndef DP_CUDA_LAUNCH_CUH
#define DP_CUDA_LAUNCH_CUH

#include <cuda_runtime.h>

// --- launch shapes -------------------------------------------------------------------

namespace {

const unsigned ELEM_THREADS = 256;
/* Enough blocks to fill any current GPU several times over; the
 * grid-stride loops cover the rest. */
const size_t DP_MAX_BLOCKS = 4096;

unsigned blocks_for(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b < DP_MAX_BLOCKS ? b : DP_MAX_BLOCKS);
}

__device__ __forceinline__ size_t first_index()
{
    return (size_t)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ size_t grid_stride() { return (size_t)gridDim.x * blockDim.x; }

} // namespace

#define GRID_LOOP(i, n) for (size_t i = first_index(); i < (n); i += grid_stride())

/* Launches kernel over n items (elements, rows or columns) with `threads`
 * per block and returns the launch status. */
#define LAUNCH(kernel, n, threads, stream, ...)                                     \
    do {                                                                            \
        if ((n) == 0) return cudaSuccess;                                           \
        kernel<<<blocks_for((n), (threads)), (threads), 0, (stream)>>>(__VA_ARGS__); \
        return cudaGetLastError();                                                  \
    } while (0)

#endif /* DP_CUDA_LAUNCH_CUH */
