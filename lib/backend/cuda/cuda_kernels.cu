/*
 * backend/cuda/cuda_kernels.cu - the CUDA backend's kernels: thin
 * __global__ wrappers around the DP_HD functions of lib/kernels/ (*.h),
 * the same functions the CPU backend loops over, so the CPU tests check
 * the math the GPU runs (docs/design.md section 3, Devices).
 *
 * Launch shapes:
 *   - element kernels: one thread per output element, 256-thread blocks;
 *   - row kernels (LayerNorm, causal softmax, log-softmax and cross-entropy
 *     rows, forward and backward, and the zeroing of ignored rows): one
 *     block per row, coalesced reads, reductions by a fixed warp-shuffle
 *     tree (below);
 *   - block copies (the bfloat16 packs of a GEMM's operand blocks): one warp
 *     per segment of a column of the block, lanes along its contiguous rows;
 *   - column reductions (bias and LayerNorm parameter gradients): two
 *     stages, one thread per (row chunk, column) then one per column, in
 *     the fixed order of kernels/colsum.h;
 *   - the fused attention's rows (the TILED ops): cuda_flash.cu.
 * Grids are capped at DP_MAX_BLOCKS blocks and every kernel is a
 * grid-stride loop with size_t indices, so any n fits in the 2^31 - 1
 * limit of grid.x and no index overflows 32 bits.
 *
 * Determinism: no kernel adds to an element another thread writes (the
 * kernels/ headers are written so that each call owns its outputs) and no
 * float atomics are used; every reduction (the rows' block trees, the
 * column sums' two stages, the sum of squares' two passes) runs in an
 * order fixed by the sizes alone. Results are therefore bitwise
 * reproducible from run to run on one GPU model.
 */
#include <cuda_runtime.h>

#include "backend/cuda/cuda_kernels.h" /* and kernels/ops.h with the kernel headers */
#include "kernels/linear.h"

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

// --- the element-wise and row-wise ops of kernels/ops.h ------------------------------

/* One grid-stride kernel and its launcher per ELEM entry; the launchers of
 * the ROW_BLOCK and COLUMNS entries are written out below, those of the
 * TILED entries (the fused attention) in cuda_flash.cu. */
#define CUDA_OP(name, shape, fn, params, args) CUDA_OP_##shape(name, fn, params, args)
#define CUDA_OP_ROW_BLOCK(name, fn, params, args)
#define CUDA_OP_COLUMNS(name, fn, params, args)
#define CUDA_OP_TILED(name, fn, params, args) /* cuda_flash.cu */
#define CUDA_OP_ELEM(name, fn, params, args) CUDA_OP_GRID(name, ELEM_THREADS, fn, params, args)
#define CUDA_OP_GRID(name, threads, fn, params, args)                                   \
    __global__ void k_##name(DP_UNPAREN params, size_t n)                                \
    {                                                                                   \
        GRID_LOOP(i, n) fn(DP_UNPAREN args, i);                                         \
    }                                                                                   \
    extern "C" cudaError_t dp_cuda_launch_##name(cudaStream_t stream, DP_UNPAREN params, \
                                                 size_t n)                              \
    {                                                                                   \
        LAUNCH(k_##name, n, threads, stream, DP_UNPAREN args, n);                       \
    }
DP_KERNEL_OPS(CUDA_OP)
#undef CUDA_OP

// --- block-per-row kernels (the ROW_BLOCK ops of kernels/ops.h) ---------------------------
/*
 * One block of THREADS threads per row (grid-stride over rows): thread j
 * handles the row's elements j, j + THREADS, ... (adjacent threads read
 * adjacent addresses), and every row-wide sum or maximum is a fixed tree:
 * each thread's partial in element order, then __shfl_down within each
 * warp (offsets 16, 8, 4, 2, 1), then the warps' results in warp order by
 * warp 0, broadcast through shared memory. THREADS is BLOCK_THREADS, or
 * CE_THREADS for long cross-entropy rows (more loads in flight when a chunk
 * of logits is only a few hundred rows). The tree depends only on the row
 * length and THREADS (itself a function of the row length), so results are
 * bitwise reproducible run to run. They are not bitwise equal to the CPU's loops over the kernels/
 * functions, which sum in another order: sums of C terms differ by about
 * C * 2^-24 relative at worst (float sums: LayerNorm's mean and variance,
 * softmax's denominator) and far less for the double sums of
 * cross-entropy; the exp differs by the expf implementations (2 ulp each).
 * tests/test_cuda_ops.c states the resulting bounds per op.
 */

const unsigned BLOCK_THREADS = 256;
const unsigned CE_THREADS = 1024;
/* Cross-entropy rows at least this long get CE_THREADS threads. */
const size_t CE_LONG_ROW = 4096;

/* Shared memory of a block reduction: one slot per warp and the result. */
template <unsigned THREADS, typename Tv> struct block_scratch {
    Tv slot[THREADS / 32 + 1];
};

/* Row-wide reduction of each thread's v by op (fixed tree); every thread
 * gets the result. */
template <unsigned THREADS, typename Tv, typename Op>
__device__ Tv block_reduce(Tv v, Tv identity, block_scratch<THREADS, Tv> &sh, Op op)
{
    const unsigned warps = THREADS / 32;
    for (int off = 16; off > 0; off /= 2) v = op(v, __shfl_down_sync(0xffffffffu, v, off));
    unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) sh.slot[warp] = v;
    __syncthreads();
    if (warp == 0) {
        Tv w = lane < warps ? sh.slot[lane] : identity;
        for (int off = 16; off > 0; off /= 2) w = op(w, __shfl_down_sync(0xffffffffu, w, off));
        if (lane == 0) sh.slot[warps] = w;
    }
    __syncthreads();
    Tv total = sh.slot[warps];
    __syncthreads(); /* the scratch may be reused by the next reduction */
    return total;
}

struct add_op {
    template <typename Tv> __device__ Tv operator()(Tv a, Tv b) const { return a + b; }
};
struct max_op {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <unsigned THREADS, typename Tv>
__device__ Tv block_sum(Tv v, block_scratch<THREADS, Tv> &sh)
{
    return block_reduce<THREADS>(v, (Tv)0, sh, add_op());
}

/* Row-wide maximum (NaN-free inputs give the true maximum in any order). */
template <unsigned THREADS> __device__ float block_max(float v, block_scratch<THREADS, float> &sh)
{
    return block_reduce<THREADS>(v, -INFINITY, sh, max_op());
}

#define BLOCK_ROW_LOOP(r, rows) for (size_t r = blockIdx.x; r < (rows); r += gridDim.x)
#define ROW_ELEMS(j, len) for (size_t j = threadIdx.x; j < (len); j += blockDim.x)

/* One LayerNorm output element: float32, or rounded to bfloat16 once
 * (the float32 value's rounding, so both outputs agree bit for bit). */
__device__ __forceinline__ void ln_store(float *out, size_t i, float v) { out[i] = v; }
__device__ __forceinline__ void ln_store(uint16_t *out, size_t i, float v)
{
    out[i] = dp_bf16_round(v);
}

/* dp_layernorm_forward_item (To = float) and _bf16_out_item (To =
 * uint16_t), one block per row: mean, then the centred sum of squares
 * (two passes, as the CPU), then the output; the same instructions up to
 * the store. With add (dp_residual_layernorm_item) the row of xw (the
 * same memory as inp) first becomes inp + add, each element by the thread
 * that reads it below, and the barrier makes the row whole for all. */
template <typename To>
__global__ void k_layernorm_forward_block(To *out, float *mean, float *rstd, const float *inp,
                                          dp_pref weight, dp_pref bias, size_t C, float eps,
                                          size_t N, float *xw, const float *add)
{
    __shared__ block_scratch<BLOCK_THREADS, float> sh;
    BLOCK_ROW_LOOP(r, N)
    {
        const float *x = inp + r * C;
        if (add) {
            ROW_ELEMS(c, C) xw[r * C + c] += add[r * C + c];
            __syncthreads();
        }
        float a = 0.0f;
        ROW_ELEMS(c, C) a += x[c];
        float m = block_sum<BLOCK_THREADS>(a, sh) / (float)C;
        float q = 0.0f;
        ROW_ELEMS(c, C)
        {
            float d = x[c] - m;
            q += d * d;
        }
        float s = 1.0f / sqrtf(block_sum<BLOCK_THREADS>(q, sh) / (float)C + eps);
        ROW_ELEMS(c, C) ln_store(out, r * C + c, dp_layernorm_out(x[c], m, s, weight, bias, c));
        if (threadIdx.x == 0) {
            mean[r] = m;
            rstd[r] = s;
        }
    }
}

/* dp_softmax_causal_forward_item, one block per row r (query t = q0 + r % nq,
 * ld keys); with att16 the row rounded to bfloat16 there too. */
__global__ void k_softmax_causal_forward_block(float *att, uint16_t *att16, float scale,
                                               size_t ld, size_t q0, size_t nq, size_t rows)
{
    __shared__ block_scratch<BLOCK_THREADS, float> sh;
    BLOCK_ROW_LOOP(r, rows)
    {
        float *row = att + r * ld;
        size_t t = q0 + r % nq;
        float mx = -INFINITY;
        ROW_ELEMS(j, t + 1) mx = fmaxf(mx, scale * row[j]);
        mx = block_max<BLOCK_THREADS>(mx, sh);
        float a = 0.0f;
        ROW_ELEMS(j, t + 1)
        {
            float e = expf(scale * row[j] - mx);
            row[j] = e;
            a += e;
        }
        float inv = 1.0f / block_sum<BLOCK_THREADS>(a, sh); /* >= 1: the maximum's term is exp(0) */
        uint16_t *row16 = att16 ? att16 + r * ld : NULL;
        ROW_ELEMS(j, ld)
        {
            float p = j <= t ? row[j] * inv : 0.0f;
            row[j] = p;
            if (row16) row16[j] = dp_bf16_round(p);
        }
    }
}

/* dp_layernorm_backward_inp_item, one block per row: the two row means
 * (of g = dout * weight and of g * xhat), then dinp += the gradient. */
__global__ void k_layernorm_backward_inp_block(float *dinp, const float *dout, const float *inp,
                                               dp_pref weight, const float *mean,
                                               const float *rstd, size_t C, size_t N)
{
    __shared__ block_scratch<BLOCK_THREADS, float> sh;
    BLOCK_ROW_LOOP(r, N)
    {
        const float *g = dout + r * C, *x = inp + r * C;
        float m = mean[r], s = rstd[r], a = 0.0f, b = 0.0f;
        ROW_ELEMS(c, C)
        {
            float gw = g[c] * dp_pref_at(weight, c);
            a += gw;
            b += gw * (x[c] - m) * s;
        }
        float g_mean = block_sum<BLOCK_THREADS>(a, sh) / (float)C;
        float gx_mean = block_sum<BLOCK_THREADS>(b, sh) / (float)C;
        ROW_ELEMS(c, C)
        {
            float xhat = (x[c] - m) * s, gw = g[c] * dp_pref_at(weight, c);
            dinp[r * C + c] += s * (gw - g_mean - xhat * gx_mean);
        }
    }
}

/* dp_softmax_causal_backward_item, one block per row r (query t = q0 + r %
 * nq, ld keys): the dot of att and datt over keys 0..t, then datt in
 * place, or with ds16 rounded to bfloat16 into ds16 only; keys after t
 * become 0 whatever they held. */
__global__ void k_softmax_causal_backward_block(float *datt, uint16_t *ds16, const float *att,
                                                float scale, size_t ld, size_t q0, size_t nq,
                                                size_t rows)
{
    __shared__ block_scratch<BLOCK_THREADS, float> sh;
    BLOCK_ROW_LOOP(r, rows)
    {
        float *drow = datt + r * ld;
        const float *arow = att + r * ld;
        size_t t = q0 + r % nq;
        float dot = 0.0f;
        ROW_ELEMS(j, t + 1) dot += arow[j] * drow[j];
        dot = block_sum<BLOCK_THREADS>(dot, sh);
        if (ds16) {
            uint16_t *row16 = ds16 + r * ld;
            ROW_ELEMS(j, ld) row16[j] = j <= t ? dp_bf16_round(scale * arow[j] * (drow[j] - dot)) : 0;
        } else {
            ROW_ELEMS(j, ld) drow[j] = j <= t ? scale * arow[j] * (drow[j] - dot) : 0.0f;
        }
    }
}

/* dp_crossentropy_item, one block per row, in two sweeps over the row
 * instead of three: first each thread's running maximum m_t and its sum
 * s_t of exp(x - m_t) in double, rescaled by exp(m_old - m_new) when the
 * maximum grows (the online softmax normaliser of Milakov & Gimelshein,
 * "Online normalizer calculation for softmax", 2018); the block's maximum
 * M, and the sum of the s_t exp(m_t - M), in fixed trees; then the loss
 * and, in a second sweep, dlogits = dscale (exp(x - M) / S - onehot). The
 * terms are the CPU's exp(x - M) up to the rescale's double rounding, so
 * the loss matches the CPU to its double sum's rounding. With dlogits ==
 * logits (in place) every element is read by the thread that writes it,
 * and x[target] is read by all before any write (the reductions' barriers
 * come between). The first sweep is the same with or without dlogits, so
 * the loss does not depend on whether dlogits is asked for. */
template <unsigned THREADS>
__global__ void k_crossentropy_block(float *losses, float *dlogits, const float *logits,
                                     const int32_t *targets, size_t V, float dscale, size_t N)
{
    __shared__ block_scratch<THREADS, float> shf;
    __shared__ block_scratch<THREADS, double> shd;
    BLOCK_ROW_LOOP(r, N)
    {
        const float *x = logits + r * V;
        float *dl = dlogits ? dlogits + r * V : NULL;
        int32_t target = targets[r];
        if (target < 0) {
            if (threadIdx.x == 0) losses[r] = 0.0f;
            if (dl) ROW_ELEMS(v, V) dl[v] = 0.0f;
            continue;
        }
        float xy = x[target];
        float mt = -INFINITY;
        double st = 0.0;
        ROW_ELEMS(v, V)
        {
            float xv = x[v];
            if (xv > mt) {
                st *= exp((double)mt - (double)xv); /* 0 on the first element */
                mt = xv;
            }
            /* mt is -inf only while every element so far is -inf (or NaN):
             * a -inf then adds 0, a NaN adds NaN, as on the CPU */
            if (mt != -INFINITY || xv != -INFINITY) st += (double)expf(xv - mt);
        }
        float mx = block_max<THREADS>(mt, shf); /* its barriers order the read of xy before any write */
        /* a thread with only -inf (0) or NaN (NaN) terms passes st as it is */
        double s =
            block_sum<THREADS>(mt == -INFINITY ? st : st * exp((double)mt - (double)mx), shd);
        if (threadIdx.x == 0) losses[r] = (float)(((double)mx - (double)xy) + log(s));
        if (!dl) continue;
        double inv_s = 1.0 / s;
        ROW_ELEMS(v, V)
        {
            float p = (float)((double)expf(x[v] - mx) * inv_s);
            dl[v] = dscale * ((size_t)target == v ? p - 1.0f : p);
        }
    }
}

/* dp_log_softmax_forward_item, one block per row: the maximum, the sum
 * of exp(x - m) in double (fixed trees), then out = (x - m) - log(s) in
 * double, rounded once. In place is safe: each thread writes only the
 * elements it read, after both reductions. */
__global__ void k_log_softmax_forward_block(float *out, const float *inp, size_t C, size_t N)
{
    __shared__ block_scratch<BLOCK_THREADS, float> shf;
    __shared__ block_scratch<BLOCK_THREADS, double> shd;
    BLOCK_ROW_LOOP(r, N)
    {
        const float *x = inp + r * C;
        float mt = -INFINITY;
        ROW_ELEMS(j, C) mt = fmaxf(mt, x[j]);
        float m = block_max<BLOCK_THREADS>(mt, shf);
        double a = 0.0;
        ROW_ELEMS(j, C) a += (double)expf(x[j] - m);
        double ls = log(block_sum<BLOCK_THREADS>(a, shd));
        ROW_ELEMS(j, C) out[r * C + j] = (float)(((double)x[j] - (double)m) - ls);
    }
}

/* dp_log_softmax_backward_item, one block per row: the row sum of dout in
 * double (fixed tree), then dinp = dout - exp(out) * sum. */
__global__ void k_log_softmax_backward_block(float *dinp, const float *out, const float *dout,
                                             size_t C, size_t N)
{
    __shared__ block_scratch<BLOCK_THREADS, double> shd;
    BLOCK_ROW_LOOP(r, N)
    {
        const float *g = dout + r * C, *o = out + r * C;
        double a = 0.0;
        ROW_ELEMS(j, C) a += (double)g[j];
        double sum = block_sum<BLOCK_THREADS>(a, shd);
        ROW_ELEMS(j, C) dinp[r * C + j] = (float)((double)g[j] - (double)expf(o[j]) * sum);
    }
}

/* dp_zero_ignored_rows_item, one block per row: the row's valid target
 * elements counted (a fixed tree), then the row zeroed when there are none. */
__global__ void k_zero_ignored_rows_block(float *x, const void *targets, int f32, size_t per,
                                          size_t cols, size_t N)
{
    __shared__ block_scratch<BLOCK_THREADS, unsigned> sh;
    BLOCK_ROW_LOOP(r, N)
    {
        unsigned valid = 0;
        ROW_ELEMS(t, per) valid += dp_target_is_valid(targets, f32, r * per + t) ? 1u : 0u;
        if (block_sum<BLOCK_THREADS>(valid, sh)) continue;
        ROW_ELEMS(c, cols) x[r * cols + c] = 0.0f;
    }
}

/* Rows per launch are capped like every grid; blocks loop over the rest. */
static unsigned row_blocks(size_t rows)
{
    return (unsigned)(rows < DP_MAX_BLOCKS ? rows : DP_MAX_BLOCKS);
}

extern "C" cudaError_t dp_cuda_launch_layernorm_forward(cudaStream_t stream, float *out,
                                                        float *mean, float *rstd,
                                                        const float *inp, dp_pref weight,
                                                        dp_pref bias, size_t C, float eps,
                                                        size_t n)
{
    if (n == 0 || C == 0) return cudaSuccess;
    k_layernorm_forward_block<float><<<row_blocks(n), BLOCK_THREADS, 0, stream>>>(
        out, mean, rstd, inp, weight, bias, C, eps, n, NULL, NULL);
    return cudaGetLastError();
}

extern "C" cudaError_t dp_cuda_launch_residual_layernorm_forward(
    cudaStream_t stream, float *out, uint16_t *out16, float *mean, float *rstd, float *x,
    const float *add, dp_pref weight, dp_pref bias, size_t C, float eps, size_t n)
{
    if (n == 0 || C == 0) return cudaSuccess;
    if (out16)
        k_layernorm_forward_block<uint16_t><<<row_blocks(n), BLOCK_THREADS, 0, stream>>>(
            out16, mean, rstd, x, weight, bias, C, eps, n, x, add);
    else
        k_layernorm_forward_block<float><<<row_blocks(n), BLOCK_THREADS, 0, stream>>>(
            out, mean, rstd, x, weight, bias, C, eps, n, x, add);
    return cudaGetLastError();
}

extern "C" cudaError_t dp_cuda_launch_layernorm_forward_bf16_out(cudaStream_t stream,
                                                                 uint16_t *out, float *mean,
                                                                 float *rstd, const float *inp,
                                                                 dp_pref weight, dp_pref bias,
                                                                 size_t C, float eps, size_t n)
{
    if (n == 0 || C == 0) return cudaSuccess;
    k_layernorm_forward_block<uint16_t><<<row_blocks(n), BLOCK_THREADS, 0, stream>>>(
        out, mean, rstd, inp, weight, bias, C, eps, n, NULL, NULL);
    return cudaGetLastError();
}

extern "C" cudaError_t dp_cuda_launch_layernorm_backward_inp(cudaStream_t stream, float *dinp,
                                                             const float *dout, const float *inp,
                                                             dp_pref weight, const float *mean,
                                                             const float *rstd, size_t C,
                                                             size_t n)
{
    if (n == 0 || C == 0) return cudaSuccess;
    k_layernorm_backward_inp_block<<<row_blocks(n), BLOCK_THREADS, 0, stream>>>(
        dinp, dout, inp, weight, mean, rstd, C, n);
    return cudaGetLastError();
}

extern "C" cudaError_t dp_cuda_launch_softmax_causal_backward(cudaStream_t stream, float *datt,
                                                              uint16_t *ds16, const float *att,
                                                              float scale, size_t ld, size_t q0,
                                                              size_t nq, size_t n)
{
    if (n == 0 || ld == 0 || nq == 0) return cudaSuccess;
    k_softmax_causal_backward_block<<<row_blocks(n), BLOCK_THREADS, 0, stream>>>(
        datt, ds16, att, scale, ld, q0, nq, n);
    return cudaGetLastError();
}

extern "C" cudaError_t dp_cuda_launch_softmax_causal_forward(cudaStream_t stream, float *att,
                                                             uint16_t *att16, float scale,
                                                             size_t ld, size_t q0, size_t nq,
                                                             size_t n)
{
    if (n == 0 || ld == 0 || nq == 0) return cudaSuccess;
    k_softmax_causal_forward_block<<<row_blocks(n), BLOCK_THREADS, 0, stream>>>(
        att, att16, scale, ld, q0, nq, n);
    return cudaGetLastError();
}

extern "C" cudaError_t dp_cuda_launch_crossentropy(cudaStream_t stream, float *losses,
                                                   float *dlogits, const float *logits,
                                                   const int32_t *targets, size_t V,
                                                   float dscale, size_t n)
{
    if (n == 0 || V == 0) return cudaSuccess;
    if (V >= CE_LONG_ROW)
        k_crossentropy_block<CE_THREADS>
            <<<row_blocks(n), CE_THREADS, 0, stream>>>(losses, dlogits, logits, targets, V, dscale, n);
    else
        k_crossentropy_block<BLOCK_THREADS><<<row_blocks(n), BLOCK_THREADS, 0, stream>>>(
            losses, dlogits, logits, targets, V, dscale, n);
    return cudaGetLastError();
}

extern "C" cudaError_t dp_cuda_launch_log_softmax_forward(cudaStream_t stream, float *out,
                                                          const float *inp, size_t C, size_t n)
{
    if (n == 0 || C == 0) return cudaSuccess;
    k_log_softmax_forward_block<<<row_blocks(n), BLOCK_THREADS, 0, stream>>>(out, inp, C, n);
    return cudaGetLastError();
}

extern "C" cudaError_t dp_cuda_launch_log_softmax_backward(cudaStream_t stream, float *dinp,
                                                           const float *out, const float *dout,
                                                           size_t C, size_t n)
{
    if (n == 0 || C == 0) return cudaSuccess;
    k_log_softmax_backward_block<<<row_blocks(n), BLOCK_THREADS, 0, stream>>>(dinp, out, dout,
                                                                              C, n);
    return cudaGetLastError();
}

extern "C" cudaError_t dp_cuda_launch_zero_ignored_rows(cudaStream_t stream, float *x,
                                                        const void *targets, int f32, size_t per,
                                                        size_t cols, size_t n)
{
    if (n == 0 || cols == 0 || per == 0) return cudaSuccess;
    k_zero_ignored_rows_block<<<row_blocks(n), BLOCK_THREADS, 0, stream>>>(x, targets, f32, per,
                                                                           cols, n);
    return cudaGetLastError();
}

// --- block copies (the COLUMNS ops of kernels/ops.h) --------------------------------------------
/*
 * dp_pack_*_elem item i is element (row, col) of matrix mat of the block,
 * i = (mat * cols + col) * rows + row, read at off + mat * stride + col *
 * ld + row. One warp per segment of PACK_SEG rows of a column q = mat *
 * cols + col (grid-stride over segments), its lanes along the rows: both
 * sides are contiguous, the divisions that locate a segment run once per
 * PACK_SEG elements, and a block of a few long columns (a chunk of logits
 * seen as V x rows) still spreads over every SM. The conversions are the
 * DP_HD functions of kernels/bf16.h, so the bits equal the CPU's.
 */
const size_t PACK_SEG = 1024;

__device__ __forceinline__ void convert_to(uint16_t *d, float x) { *d = dp_bf16_round(x); }
__device__ __forceinline__ void convert_to(float *d, uint16_t x) { *d = dp_bf16_widen(x); }

/* Four elements, aligned as one load or store. */
template <typename T> struct alignas(4 * sizeof(T)) vec4 {
    T v[4];
};

/* d[0..len) = the conversion of s[0..len) by the 32 lanes of a warp: a
 * scalar head up to s's vec4 alignment, then vec4 loads and stores when d
 * is aligned there too (a column's start in the operand and in the dense
 * copy decide; a multiple-of-4 row count and leading dimension make every
 * column aligned), then a scalar tail. Same conversions, same bits. */
template <typename Td, typename Ts>
__device__ void convert_run(Td *d, const Ts *s, size_t len, size_t lane)
{
    size_t mis = (size_t)((uintptr_t)s % sizeof(vec4<Ts>)) / sizeof(Ts);
    size_t head = mis ? 4 - mis : 0;
    if (head > len) head = len;
    if (lane < head) convert_to(d + lane, s[lane]);
    d += head, s += head, len -= head;
    size_t nv = (uintptr_t)d % sizeof(vec4<Td>) == 0 ? len / 4 : 0;
    const vec4<Ts> *sv = (const vec4<Ts> *)s;
    vec4<Td> *dv = (vec4<Td> *)d;
    for (size_t i = lane; i < nv; i += 32) {
        vec4<Ts> in = sv[i];
        vec4<Td> out;
        for (int k = 0; k < 4; k++) convert_to(&out.v[k], in.v[k]);
        dv[i] = out;
    }
    for (size_t r = nv * 4 + lane; r < len; r += 32) convert_to(d + r, s[r]);
}

template <typename Td, typename Ts>
__global__ void k_pack_columns(Td *dst, const Ts *src, dp_block b, size_t nseg, size_t segs)
{
    size_t lane = threadIdx.x % 32, warps = grid_stride() / 32;
    for (size_t w = first_index() / 32; w < segs; w += warps) {
        size_t q = w / nseg, r0 = (w - q * nseg) * PACK_SEG;
        size_t mat = q / b.cols, col = q - mat * b.cols;
        size_t r1 = r0 + PACK_SEG < b.rows ? r0 + PACK_SEG : b.rows;
        const Ts *s = src + b.off + mat * b.stride + col * b.ld;
        convert_run(dst + q * b.rows + r0, s + r0, r1 - r0, lane);
    }
}

template <typename Td, typename Ts>
static cudaError_t launch_pack(cudaStream_t stream, Td *dst, const Ts *src, dp_block b, size_t n)
{
    if (n == 0 || b.rows == 0) return cudaSuccess;
    size_t nseg = (b.rows + PACK_SEG - 1) / PACK_SEG, segs = n / b.rows * nseg;
    k_pack_columns<<<blocks_for(segs * 32, ELEM_THREADS), ELEM_THREADS, 0, stream>>>(dst, src, b,
                                                                                    nseg, segs);
    return cudaGetLastError();
}

extern "C" cudaError_t dp_cuda_launch_pack_f32_bf16(cudaStream_t stream, uint16_t *dst,
                                                    const float *src, dp_block blk, size_t n)
{
    return launch_pack(stream, dst, src, blk, n);
}

extern "C" cudaError_t dp_cuda_launch_pack_bf16_f32(cudaStream_t stream, float *dst,
                                                    const uint16_t *src, dp_block blk, size_t n)
{
    return launch_pack(stream, dst, src, blk, n);
}

// --- encoder -------------------------------------------------------------------------

__global__ void k_encoder_backward_wpe(float *dwpe, const float *dout, size_t B, size_t T,
                                       size_t C)
{
    GRID_LOOP(i, T * C) dp_encoder_backward_wpe_elem(dwpe, dout, B, T, C, i);
}

__global__ void k_encoder_backward_wte(float *dwte, const float *dout, const int32_t *inp,
                                       const uint32_t *order, const uint32_t *seg, size_t C,
                                       size_t n)
{
    GRID_LOOP(i, n) dp_encoder_backward_wte_elem(dwte, dout, inp, order, seg, C, i);
}

extern "C" cudaError_t dp_cuda_launch_encoder_backward(cudaStream_t s, float *dwte,
                                                       float *dwpe, const float *dout,
                                                       const int32_t *inp,
                                                       const uint32_t *order,
                                                       const uint32_t *seg, size_t ngroups,
                                                       size_t B, size_t T, size_t C)
{
    if (B * T * C == 0) return cudaSuccess;
    k_encoder_backward_wpe<<<blocks_for(T * C, ELEM_THREADS), ELEM_THREADS, 0, s>>>(dwpe, dout,
                                                                                   B, T, C);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    size_t n = ngroups * C;
    LAUNCH(k_encoder_backward_wte, n, ELEM_THREADS, s, dwte, dout, inp, order, seg, C, n);
}

// --- linear (bias parts) -----------------------------------------------------------------

__global__ void k_bias_broadcast(float *out, dp_pref bias, size_t OC, size_t n)
{
    GRID_LOOP(i, n) dp_bias_broadcast_elem(out, bias, OC, i);
}

/* The two stages of a column reduction (kernels/colsum.h). */
__global__ void k_bias_backward_partial(float *partial, const float *dout, size_t N, size_t OC,
                                        size_t n)
{
    GRID_LOOP(i, n) dp_bias_backward_partial_elem(partial, dout, N, OC, i);
}

__global__ void k_col_combine(float *dst, const float *partial, size_t K, size_t C)
{
    GRID_LOOP(c, C) dp_col_combine(dst, partial, K, C, c);
}

extern "C" cudaError_t dp_cuda_launch_bias_broadcast(cudaStream_t s, float *out, dp_pref bias,
                                                     size_t N, size_t OC)
{
    size_t n = N * OC;
    LAUNCH(k_bias_broadcast, n, ELEM_THREADS, s, out, bias, OC, n);
}

extern "C" cudaError_t dp_cuda_launch_bias_backward(cudaStream_t s, float *dbias,
                                                    float *partial, const float *dout,
                                                    size_t N, size_t OC)
{
    if (N == 0 || OC == 0) return cudaSuccess;
    size_t K = dp_col_chunks(N), n = K * OC;
    k_bias_backward_partial<<<blocks_for(n, ELEM_THREADS), ELEM_THREADS, 0, s>>>(partial, dout, N,
                                                                                 OC, n);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    LAUNCH(k_col_combine, OC, ELEM_THREADS, s, dbias, partial, K, OC);
}

// --- LayerNorm ---------------------------------------------------------------------------

__global__ void k_layernorm_param_partial(float *pdw, float *pdb, const float *dout,
                                          const float *inp, const float *mean,
                                          const float *rstd, size_t N, size_t C, size_t n)
{
    GRID_LOOP(i, n) dp_layernorm_param_partial_elem(pdw, pdb, dout, inp, mean, rstd, N, C, i);
}

extern "C" cudaError_t dp_cuda_launch_layernorm_backward_params(
    cudaStream_t s, float *dweight, float *dbias, float *partial, const float *dout,
    const float *inp, const float *mean, const float *rstd, size_t N, size_t C)
{
    if (N == 0 || C == 0) return cudaSuccess;
    size_t K = dp_col_chunks(N), n = K * C;
    float *pdw = partial, *pdb = partial + n;
    k_layernorm_param_partial<<<blocks_for(n, ELEM_THREADS), ELEM_THREADS, 0, s>>>(
        pdw, pdb, dout, inp, mean, rstd, N, C, n);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    k_col_combine<<<blocks_for(C, ELEM_THREADS), ELEM_THREADS, 0, s>>>(dweight, pdw, K, C);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    LAUNCH(k_col_combine, C, ELEM_THREADS, s, dbias, pdb, K, C);
}

// --- sum of squares (gradient norm) ----------------------------------------------------------

/* Sums x[i]^2 (in double) over the grid-stride set of each thread, then
 * over the block by a fixed tree; one partial per block. Called with
 * DP_CUDA_SUMSQ_THREADS threads, a power of two. */
__global__ void k_sum_squares_partial(double *partials, const float *x, size_t n)
{
    __shared__ double acc[DP_CUDA_SUMSQ_THREADS];
    double a = 0.0;
    GRID_LOOP(i, n) a += dp_square_element(x[i]);
    acc[threadIdx.x] = a;
    __syncthreads();
    for (unsigned w = DP_CUDA_SUMSQ_THREADS / 2; w > 0; w /= 2) {
        if (threadIdx.x < w) acc[threadIdx.x] += acc[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) partials[blockIdx.x] = acc[0];
}

/* One block: result = the sum of the nb partials, in the same fixed order. */
__global__ void k_sum_partials(double *result, const double *partials, unsigned nb)
{
    __shared__ double acc[DP_CUDA_SUMSQ_THREADS];
    double a = 0.0;
    for (unsigned i = threadIdx.x; i < nb; i += DP_CUDA_SUMSQ_THREADS) a += partials[i];
    acc[threadIdx.x] = a;
    __syncthreads();
    for (unsigned w = DP_CUDA_SUMSQ_THREADS / 2; w > 0; w /= 2) {
        if (threadIdx.x < w) acc[threadIdx.x] += acc[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) *result = acc[0];
}

extern "C" cudaError_t dp_cuda_launch_sum_squares(cudaStream_t s, double *result,
                                                  double *partials, const float *x, size_t n)
{
    /* The number of blocks depends on n only (not on the GPU), so the
     * summation order, and the result, is the same on every device. */
    size_t nb = (n + DP_CUDA_SUMSQ_THREADS - 1) / DP_CUDA_SUMSQ_THREADS;
    if (nb > DP_CUDA_SUMSQ_BLOCKS) nb = DP_CUDA_SUMSQ_BLOCKS;
    if (nb == 0) nb = 1; /* n == 0: one block writes a zero partial */
    k_sum_squares_partial<<<(unsigned)nb, DP_CUDA_SUMSQ_THREADS, 0, s>>>(partials, x, n);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    k_sum_partials<<<1, DP_CUDA_SUMSQ_THREADS, 0, s>>>(result, partials, (unsigned)nb);
    return cudaGetLastError();
}

// --- attention -------------------------------------------------------------------------------

__global__ void k_attention_permute(float *qkvr, const float *qkv, size_t B, size_t T,
                                    size_t NH, size_t hs, size_t n)
{
    GRID_LOOP(i, n) dp_attention_permute_elem(qkvr, qkv, i, B, T, NH, hs);
}

__global__ void k_attention_permute_backward(float *dqkv, const float *dqkvr, size_t B,
                                             size_t T, size_t NH, size_t hs, size_t n)
{
    GRID_LOOP(j, n) dp_attention_permute_backward_elem(dqkv, dqkvr, j, B, T, NH, hs);
}

__global__ void k_attention_unpermute(float *out, const float *y, size_t T, size_t NH,
                                      size_t hs, size_t n)
{
    GRID_LOOP(j, n) dp_attention_unpermute_elem(out, y, j, T, NH, hs);
}

__global__ void k_attention_unpermute_backward(float *dy, const float *dout, size_t T,
                                               size_t NH, size_t hs, size_t n)
{
    GRID_LOOP(i, n) dp_attention_unpermute_backward_elem(dy, dout, i, T, NH, hs);
}

extern "C" cudaError_t dp_cuda_launch_attention_permute(cudaStream_t s, float *qkvr,
                                                        const float *qkv, size_t B, size_t T,
                                                        size_t NH, size_t hs)
{
    size_t n = 3 * B * NH * T * hs;
    LAUNCH(k_attention_permute, n, ELEM_THREADS, s, qkvr, qkv, B, T, NH, hs, n);
}

extern "C" cudaError_t dp_cuda_launch_attention_permute_backward(cudaStream_t s, float *dqkv,
                                                                 const float *dqkvr, size_t B,
                                                                 size_t T, size_t NH,
                                                                 size_t hs)
{
    size_t n = B * T * 3 * NH * hs;
    LAUNCH(k_attention_permute_backward, n, ELEM_THREADS, s, dqkv, dqkvr, B, T, NH, hs, n);
}

extern "C" cudaError_t dp_cuda_launch_attention_unpermute(cudaStream_t s, float *out,
                                                          const float *y, size_t B, size_t T,
                                                          size_t NH, size_t hs)
{
    size_t n = B * T * NH * hs;
    LAUNCH(k_attention_unpermute, n, ELEM_THREADS, s, out, y, T, NH, hs, n);
}

extern "C" cudaError_t dp_cuda_launch_attention_unpermute_backward(cudaStream_t s, float *dy,
                                                                   const float *dout, size_t B,
                                                                   size_t T, size_t NH,
                                                                   size_t hs)
{
    size_t n = B * NH * T * hs;
    LAUNCH(k_attention_unpermute_backward, n, ELEM_THREADS, s, dy, dout, T, NH, hs, n);
}

// --- GEMM with k == 0 ---------------------------------------------------------------------------

__global__ void k_gemm_scale_c(float *C, size_t m, size_t n, size_t ldc, long long strideC,
                               size_t total, float beta)
{
    GRID_LOOP(i, total) {
        size_t row = i % m, col = (i / m) % n, b = i / (m * n);
        float *c = C + (ptrdiff_t)b * (ptrdiff_t)strideC + col * ldc + row;
        *c = beta == 0.0f ? 0.0f : beta * *c;
    }
}

extern "C" cudaError_t dp_cuda_launch_gemm_scale_c(cudaStream_t s, float *C, int m, int n,
                                                   int ldc, long long strideC, int batch,
                                                   float beta)
{
    if (m <= 0 || n <= 0 || batch <= 0) return cudaSuccess;
    size_t total = (size_t)m * (size_t)n * (size_t)batch;
    LAUNCH(k_gemm_scale_c, total, ELEM_THREADS, s, C, (size_t)m, (size_t)n, (size_t)ldc,
           strideC, total, beta);
}
