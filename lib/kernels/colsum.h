/*
 * kernels/colsum.h - the row chunking of column reductions (sums over the
 * N rows of an (N,C) tensor: bias gradients, LayerNorm parameter
 * gradients).
 *
 * One summation order for every backend, in two stages:
 *   1. rows are cut into chunks of DP_COL_CHUNK (the last one shorter); the
 *      partial of chunk k and column c is the float sum, from 0, of its
 *      rows' terms in row order;
 *   2. column c's total is the float sum, from 0, of its partials in chunk
 *      order, and is then added to the gradient (which accumulates).
 * The GPU runs stage 1 with a block per (chunk, 32 columns): its warps
 * stage the chunk's rows in shared memory 64 at a time, many loads in
 * flight, then one thread per column adds the staged terms in row order
 * (cuda/cuda_colsum.cuh), and stage 2 in the same launch: the block that
 * finishes a column tile's last chunk adds the tile's partials. The CPU
 * computes the same partials tile by tile. With no FMA contraction in the
 * sums, both give the same bits; a term that is a product (LayerNorm's
 * dout * xhat) is contracted by nvcc into the sum's fma, which bounds the
 * difference by a few ulp per term.
 */
#ifndef DP_KERNELS_COLSUM_H
#define DP_KERNELS_COLSUM_H

#include <stddef.h>

#include "kernels/dp_hd.h"

/* Rows per chunk. */
#define DP_COL_CHUNK 256

/* Widest column tile of the CPU loops (their partials live on the stack). */
#define DP_COL_TILE 64

/* Number of chunks of N rows (>= 1 for N >= 1). */
static inline DP_HD size_t dp_col_chunks(size_t N) { return (N + DP_COL_CHUNK - 1) / DP_COL_CHUNK; }

#endif /* DP_KERNELS_COLSUM_H */
