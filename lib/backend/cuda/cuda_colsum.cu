/*
 * backend/cuda/cuda_colsum.cu - the launchers of the column reductions:
 * bias gradients and LayerNorm parameter gradients, both stages of
 * kernels/colsum.h in one launch (the kernels are cuda_colsum.cuh).
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "backend/cuda/cuda_kernels.h" /* and kernels/ops.h with the kernel headers */

namespace {

#include "backend/cuda/cuda_colsum.cuh"

/* Enough blocks to fill any current GPU several times over; the kernels'
 * grid-stride loops cover the rest. */
const size_t COL_MAX_BLOCKS = 4096;

/* Blocks of a launch over (N, C): one per tile, at most COL_MAX_BLOCKS. */
unsigned col_blocks(size_t N, size_t C)
{
    size_t b = col_tiles(N, C);
    return (unsigned)(b < COL_MAX_BLOCKS ? b : COL_MAX_BLOCKS);
}

} // namespace

extern "C" cudaError_t dp_cuda_launch_bias_backward(cudaStream_t s, float *dbias,
                                                    float *partial, unsigned *tickets,
                                                    uint16_t *dout16, dp_pref dout, size_t N,
                                                    size_t OC)
{
    if (N == 0 || OC == 0) return cudaSuccess;
    unsigned blocks = col_blocks(N, OC);
    if (dout.bf16)
        k_bias_backward<1><<<blocks, COL_THREADS, 0, s>>>(dbias, partial, tickets, dout16, dout.p,
                                                          N, OC);
    else
        k_bias_backward<0><<<blocks, COL_THREADS, 0, s>>>(dbias, partial, tickets, dout16, dout.p,
                                                          N, OC);
    return cudaGetLastError();
}

extern "C" cudaError_t dp_cuda_launch_layernorm_backward_params(
    cudaStream_t s, float *dweight, float *dbias, float *partial, unsigned *tickets,
    dp_pref dout, const float *inp, const float *mean, const float *rstd, size_t N, size_t C)
{
    if (N == 0 || C == 0) return cudaSuccess;
    size_t K = dp_col_chunks(N);
    float *pdw = partial, *pdb = partial + K * C;
    unsigned blocks = col_blocks(N, C);
    if (dout.bf16)
        k_layernorm_backward_params<1><<<blocks, COL_THREADS, 0, s>>>(
            dweight, dbias, pdw, pdb, tickets, dout.p, inp, mean, rstd, N, C);
    else
        k_layernorm_backward_params<0><<<blocks, COL_THREADS, 0, s>>>(
            dweight, dbias, pdw, pdb, tickets, dout.p, inp, mean, rstd, N, C);
    return cudaGetLastError();
}

extern "C" size_t dp_cuda_col_tiles(size_t C) { return (C + COL_W - 1) / COL_W; }
