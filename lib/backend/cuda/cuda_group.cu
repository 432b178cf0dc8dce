/*
 * backend/cuda/cuda_group.cu - the embedding backward's rows grouped by
 * token on the device: a stable radix sort of (token id, row) pairs by
 * CUB (the CUDA toolkit's), so the rows of a token keep increasing order,
 * the order dp_encoder_group_rows gives on the host (kernels/encoder.h).
 * The token ids never come to the host, so the backward queues its last
 * kernels without waiting for the ones before it (the host grouping
 * waited for the whole backward, then left the GPU idle while it sorted).
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include <cub/device/device_radix_sort.cuh>

#include "backend/cuda/cuda_kernels.h"

namespace {

/* Token ids are in [0, 2^31): the sort reads their 31 low bits as
 * unsigned keys (the same order). */
const int KEY_BITS = 31;
const size_t ALIGN = 256;

size_t up(size_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

__global__ void k_iota(uint32_t *x, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = (uint32_t)i;
}

/* CUB's scratch for BT pairs. */
cudaError_t sort_bytes(size_t BT, size_t *bytes)
{
    *bytes = 0;
    return cub::DeviceRadixSort::SortPairs(NULL, *bytes, (const uint32_t *)NULL,
                                           (uint32_t *)NULL, (const uint32_t *)NULL,
                                           (uint32_t *)NULL, BT, 0, KEY_BITS);
}

} // namespace

extern "C" cudaError_t dp_cuda_encoder_group_bytes(size_t BT, size_t *bytes)
{
    size_t sort = 0;
    cudaError_t e = sort_bytes(BT, &sort);
    if (e != cudaSuccess) return e;
    *bytes = 3 * up(BT * sizeof(uint32_t)) + up(sort);
    return cudaSuccess;
}

extern "C" cudaError_t dp_cuda_launch_encoder_group(cudaStream_t s, void *scratch,
                                                    size_t bytes, const int32_t *inp,
                                                    size_t BT, uint32_t **keys,
                                                    uint32_t **order)
{
    char *p = (char *)scratch;
    size_t words = up(BT * sizeof(uint32_t)), sort = bytes - 3 * words;
    uint32_t *k = (uint32_t *)p, *rows = (uint32_t *)(p + words),
             *o = (uint32_t *)(p + 2 * words);
    void *temp = p + 3 * words;
    size_t threads = 256, blocks = (BT + threads - 1) / threads;
    k_iota<<<(unsigned)(blocks < 4096 ? blocks : 4096), (unsigned)threads, 0, s>>>(rows, BT);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    e = cub::DeviceRadixSort::SortPairs(temp, sort, (const uint32_t *)inp, k,
                                        (const uint32_t *)rows, o, BT, 0, KEY_BITS, s);
    if (e != cudaSuccess) return e;
    *keys = k;
    *order = o;
    return cudaSuccess;
}
