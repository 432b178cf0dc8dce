/*
 * backend/cuda/cuda_colsum.cuh - the device code of the column reductions
 * (kernels/colsum.h): the bias gradients (with dout rounded to bfloat16 in
 * the same pass) and the LayerNorm parameter gradients; their launchers
 * are cuda_colsum.cu. Device code only, so that
 * tests/test_cuda_colsum_emu.cpp also compiles it with the host's C++
 * compiler against tests/cuda_emu.hpp.
 *
 * Stage 1: a block of COL_THREADS threads per (chunk k, tile of COL_W
 * columns), grid-stride over the tiles. For every COL_ROWS rows of the
 * chunk, warp w loads rows w, w + COL_WARPS, ... of the tile (lanes along
 * the columns: coalesced), all of a thread's rows before it stores any, and
 * stages their terms in shared memory. The loads are unconditional (a row
 * or column past the end reads the last one's address, and is not
 * staged), so the compiler issues them together instead of one per
 * branch; after a barrier one thread per
 * column adds the staged terms in row order to its running sum, which
 * starts from 0: the partials of kernels/colsum.h, bit for bit, with
 * K * ceil(C / COL_W) * COL_THREADS threads loading. Why: one thread per
 * (chunk, column), each adding its 256 rows as it loaded them, was K * C
 * threads (24,576 for GPT-2 small at batch 8: 96 blocks for an H200's 132
 * SMs), and the H200's profile had the LayerNorm's at about 90 us a call
 * for 40 MB, a tenth of HBM's bandwidth.
 *
 * Stage 2, in the same launch: the block that finishes a column tile's
 * last chunk adds the tile's K partials per column in chunk order (stage
 * 2 of kernels/colsum.h) into the gradient. Which block that is, a
 * ticket per column tile decides: every block of the tile writes its
 * partials, fences them (__threadfence) and takes a ticket (atomicAdd);
 * the one that draws K - 1 combines, reading the partials through L2
 * (__ldcg: a line of them may sit stale in its SM's L1), and puts the
 * ticket back to 0 for the next launch. The atomic only picks the block;
 * the sums' order is fixed, so the bits are those of a separate stage-2
 * kernel, which cost a launch of about 4 us per gradient (98 a GPT-2
 * small step, 0.39 ms on the H200). tickets must be 0 at the first
 * launch (the launcher zeroes them when it allocates them).
 */
#ifndef DP_CUDA_COLSUM_CUH
#define DP_CUDA_COLSUM_CUH

#include <stddef.h>
#include <stdint.h>

#include "kernels/layernorm.h" /* and kernels/colsum.h, kernels/bf16.h */

const unsigned COL_THREADS = 256;
const unsigned COL_W = 32; /* columns per tile: one warp's lanes */
const unsigned COL_WARPS = COL_THREADS / COL_W;
const unsigned COL_ROWS = 64; /* rows staged per pass */
const unsigned COL_PER_THREAD = COL_ROWS / COL_WARPS;

/* Blocks of stage 1 for (N, C): chunks times column tiles. */
__host__ __device__ inline size_t col_tiles(size_t N, size_t C)
{
    return dp_col_chunks(N) * ((C + COL_W - 1) / COL_W);
}

/* Tile b's chunk k (of K), column tile ct, rows [n0, n1), and the calling
 * thread's column c: in the tensor (in), or past its end, when the thread
 * loads the last column's addresses (lc) and stages nothing. */
struct col_tile {
    size_t k, K, ct, n0, n1, c, lc;
    bool in;
};

__device__ inline col_tile col_tile_at(size_t b, size_t N, size_t C)
{
    size_t per_chunk = (C + COL_W - 1) / COL_W;
    col_tile t;
    t.k = b / per_chunk;
    t.K = dp_col_chunks(N);
    t.ct = b % per_chunk;
    t.c = t.ct * COL_W + threadIdx.x % COL_W;
    t.n0 = t.k * DP_COL_CHUNK;
    t.n1 = N - t.n0 < DP_COL_CHUNK ? N : t.n0 + DP_COL_CHUNK;
    t.in = t.c < C;
    t.lc = t.in ? t.c : C - 1;
    return t;
}

/* Rows of the pass from row base, and the row a thread's j-th load reads
 * (the pass's last for a row past it, which is not staged). */
__device__ inline size_t col_pass_rows(const col_tile &t, size_t base)
{
    return t.n1 - base < COL_ROWS ? t.n1 - base : COL_ROWS;
}

__device__ inline size_t col_load_row(size_t base, size_t r, size_t rows)
{
    return base + (r < rows ? r : rows - 1);
}

/* Stage 2 of column c: dst[c] += the sum, from 0, of partial(K,C)[k,c]
 * for k = 0..K-1 in order; the partials read through L2, COL_BATCH of
 * them loaded before any is added (the last block's tail is on the
 * kernel's critical path). */
const unsigned COL_BATCH = 8;

__device__ inline void col_combine_l2(float *dst, const float *partial, size_t K, size_t C,
                                      size_t c)
{
    float total = 0.0f;
    size_t k = 0;
    for (; k + COL_BATCH <= K; k += COL_BATCH) {
        float v[COL_BATCH];
        DP_UNROLL
        for (unsigned j = 0; j < COL_BATCH; j++) v[j] = __ldcg(&partial[(k + j) * C + c]);
        DP_UNROLL
        for (unsigned j = 0; j < COL_BATCH; j++) total += v[j];
    }
    for (; k < K; k++) total += __ldcg(&partial[k * C + c]);
    dst[c] += total;
}

/* After the block wrote tile t's partials: whether it is the last of the
 * tile's K blocks to finish (every thread gets the answer). */
__device__ inline bool col_last_block(unsigned *tickets, size_t tile, size_t K)
{
    __shared__ unsigned last;
    __threadfence(); /* this thread's partial, before the ticket */
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&tickets[tile], 1u) == (unsigned)(K - 1);
    __syncthreads();
    return last != 0;
}

/* Element i of dout, float32 or (G16) bfloat16 widened exactly. */
template <int G16> __device__ inline float col_load(const void *dout, size_t i)
{
    return G16 ? dp_bf16_widen(((const uint16_t *)dout)[i]) : ((const float *)dout)[i];
}

/* Both stages over this block's tiles (grid-stride), for the kernels
 * below. For each COL_ROWS rows of a tile's chunk, stage(t, base, rows)
 * loads and stages them; after a barrier add(t, rows, acc) returns the
 * calling thread's running sum with the staged rows added (warp w adds
 * sum w); after another barrier the next pass. Then warp w's sum is its
 * partial in part(w) and, in the tile's last block, is combined into
 * dst(w) (part and dst return NULL for a warp without a sum). */
template <class Stage, class Add, class Part, class Dst>
__device__ inline void col_reduce(size_t N, size_t C, unsigned *tickets, Stage stage, Add add,
                                  Part part, Dst dst)
{
    const unsigned warp = threadIdx.x / COL_W;
    for (size_t b = blockIdx.x; b < col_tiles(N, C); b += gridDim.x) {
        col_tile t = col_tile_at(b, N, C);
        float acc = 0.0f;
        for (size_t base = t.n0; base < t.n1; base += COL_ROWS) {
            size_t rows = col_pass_rows(t, base);
            stage(t, base, rows);
            __syncthreads();
            acc = add(t, rows, acc);
            __syncthreads();
        }
        float *p = t.in ? part(warp) : NULL;
        if (p) p[t.k * C + t.c] = acc;
        if (col_last_block(tickets, t.ct, t.K)) {
            if (p) col_combine_l2(dst(warp), p, t.K, C, t.c);
            if (threadIdx.x == 0) tickets[t.ct] = 0;
        }
    }
}

/* The bias gradient: dbias(OC) += the column sums of dout(N,OC), through
 * partial(K,OC)[k,o] = the sum of dout[n,o] over chunk k's rows (warp 0);
 * with dout16, every element of dout (float32) also stored there rounded
 * (dp_bf16_round), by the thread that loads it. */
template <int G16>
__global__ __launch_bounds__(COL_THREADS) void k_bias_backward(float *dbias, float *partial,
                                                               unsigned *tickets,
                                                               uint16_t *dout16,
                                                               const void *dout, size_t N,
                                                               size_t OC)
{
    __shared__ float st[COL_ROWS * COL_W];
    const unsigned lane = threadIdx.x % COL_W, warp = threadIdx.x / COL_W;
    auto stage = [&](const col_tile &t, size_t base, size_t rows) {
        float v[COL_PER_THREAD];
        DP_UNROLL
        for (unsigned j = 0; j < COL_PER_THREAD; j++)
            v[j] = col_load<G16>(dout, col_load_row(base, warp + j * COL_WARPS, rows) * OC +
                                           t.lc);
        DP_UNROLL
        for (unsigned j = 0; j < COL_PER_THREAD; j++) {
            size_t r = warp + j * COL_WARPS;
            if (!t.in || r >= rows) continue;
            st[r * COL_W + lane] = v[j];
            if (dout16) dout16[(base + r) * OC + t.c] = dp_bf16_round(v[j]);
        }
    };
    auto add = [&](const col_tile &t, size_t rows, float acc) {
        if (warp == 0 && t.in)
            for (size_t r = 0; r < rows; r++) acc += st[r * COL_W + lane];
        return acc;
    };
    col_reduce(
        N, OC, tickets, stage, add, [&](unsigned w) { return w == 0 ? partial : NULL; },
        [&](unsigned) { return dbias; });
}

/* The LayerNorm parameter gradients: dweight(C) and dbias(C) += the
 * column sums of dp_layernorm_dweight_of(dout, xhat) and of dout, through
 * pdw(K,C)[k,c] and pdb(K,C)[k,c], their sums over chunk k's rows; warp
 * 0 adds the first, warp 1 the second. */
template <int G16>
__global__ __launch_bounds__(COL_THREADS) void k_layernorm_backward_params(
    float *dweight, float *dbias, float *pdw, float *pdb, unsigned *tickets, const void *dout,
    const float *inp, const float *mean, const float *rstd, size_t N, size_t C)
{
    __shared__ float sg[COL_ROWS * COL_W], sx[COL_ROWS * COL_W];
    const unsigned lane = threadIdx.x % COL_W, warp = threadIdx.x / COL_W;
    auto stage = [&](const col_tile &t, size_t base, size_t rows) {
        float g[COL_PER_THREAD], x[COL_PER_THREAD];
        DP_UNROLL
        for (unsigned j = 0; j < COL_PER_THREAD; j++) {
            size_t n = col_load_row(base, warp + j * COL_WARPS, rows);
            g[j] = col_load<G16>(dout, n * C + t.lc);
            x[j] = dp_layernorm_xhat(inp[n * C + t.lc], mean[n], rstd[n]);
        }
        DP_UNROLL
        for (unsigned j = 0; j < COL_PER_THREAD; j++) {
            size_t r = warp + j * COL_WARPS;
            if (!t.in || r >= rows) continue;
            sg[r * COL_W + lane] = g[j];
            sx[r * COL_W + lane] = x[j];
        }
    };
    auto add = [&](const col_tile &t, size_t rows, float acc) {
        if (warp == 0 && t.in)
            for (size_t r = 0; r < rows; r++)
                acc += dp_layernorm_dweight_of(sg[r * COL_W + lane], sx[r * COL_W + lane]);
        else if (warp == 1 && t.in)
            for (size_t r = 0; r < rows; r++) acc += sg[r * COL_W + lane];
        return acc;
    };
    col_reduce(
        N, C, tickets, stage, add,
        [&](unsigned w) { return w == 0 ? pdw : w == 1 ? pdb : (float *)NULL; },
        [&](unsigned w) { return w == 0 ? dweight : dbias; });
}

#endif /* DP_CUDA_COLSUM_CUH */
