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
 *     tree (cuda_rows.cu);
 *   - block copies (the bfloat16 packs of a GEMM's operand blocks): one warp
 *     per segment of a column of the block, lanes along its contiguous rows;
 *   - column reductions (bias and LayerNorm parameter gradients): two
 *     stages in the fixed order of kernels/colsum.h (cuda_colsum.cu);
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
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_kernels.h" /* and kernels/ops.h with the kernel headers */
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_vec.cuh"
#include "kernels/linear.h"

// --- the element-wise and row-wise ops of kernels/ops.h ------------------------------

/* DP_CUDA_VEC=0 turns the element-wise kernels' 16-byte paths off (the VEC
 * ops' kernels, the fused AdamW's four elements a thread, D's vector
 * loads) for comparison; read once (racing first callers read the same). */
extern "C" int dp_cuda_vec_on(void)
{
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("DP_CUDA_VEC");
        on = !(e && strcmp(e, "0") == 0);
    }
    return on;
}

/* Whether every pointer among a VEC op's arguments is 16-byte aligned (the
 * other arguments pass). */
template <typename T> bool vec_ok(T *p) { return (uintptr_t)p % 16 == 0; }
template <typename T> bool vec_ok(const T &) { return true; }
bool all_vec_ok() { return true; }
template <typename A, typename... R> bool all_vec_ok(A a, R... r)
{
    return vec_ok(a) && all_vec_ok(r...);
}

unsigned vec_blocks(size_t n)
{
    return blocks_for((n + VEC_ITEMS - 1) / VEC_ITEMS, VEC_THREADS);
}

/* One grid-stride kernel and its launcher per ELEM entry, and per VEC
 * entry a launcher that takes its cuda_vec.cuh kernel where the pointers
 * are aligned and the grid-stride one otherwise; the launchers of the
 * COLUMNS entries are written out below, those of the ROW_BLOCK entries
 * in cuda_rows.cu and of the TILED ones (the fused attention) in
 * cuda_flash.cu. */
#define CUDA_OP(name, shape, fn, params, args) CUDA_OP_##shape(name, fn, params, args)
#define CUDA_OP_ROW_BLOCK(name, fn, params, args)
#define CUDA_OP_COLUMNS(name, fn, params, args)
#define CUDA_OP_TILED(name, fn, params, args) /* cuda_flash.cu */
#define CUDA_OP_ELEM(name, fn, params, args)                                            \
    CUDA_OP_GRID_KERNEL(name, fn, params, args)                                         \
    extern "C" cudaError_t dp_cuda_launch_##name(cudaStream_t stream, DP_UNPAREN params, \
                                                 size_t n)                              \
    {                                                                                   \
        LAUNCH(k_##name, n, ELEM_THREADS, stream, DP_UNPAREN args, n);                  \
    }
#define CUDA_OP_VEC(name, fn, params, args)                                             \
    CUDA_OP_GRID_KERNEL(name, fn, params, args)                                         \
    extern "C" cudaError_t dp_cuda_launch_##name(cudaStream_t stream, DP_UNPAREN params, \
                                                 size_t n)                              \
    {                                                                                   \
        if (n && dp_cuda_vec_on() && all_vec_ok(DP_UNPAREN args)) {                     \
            k_##name##_vec<<<vec_blocks(n), VEC_THREADS, 0, stream>>>(DP_UNPAREN args, n); \
            return cudaGetLastError();                                                  \
        }                                                                               \
        LAUNCH(k_##name, n, ELEM_THREADS, stream, DP_UNPAREN args, n);                  \
    }
#define CUDA_OP_GRID_KERNEL(name, fn, params, args)                                     \
    __global__ void k_##name(DP_UNPAREN params, size_t n)                                \
    {                                                                                   \
        GRID_LOOP(i, n) fn(DP_UNPAREN args, i);                                         \
    }
DP_KERNEL_OPS(CUDA_OP)
#undef CUDA_OP


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

__global__ void k_encoder_backward_wte(float *dwte, const float *dout, const uint32_t *keys,
                                       const uint32_t *order, size_t BT, size_t C)
{
    GRID_LOOP(i, BT * C) dp_encoder_backward_wte_sorted_elem(dwte, dout, keys, order, BT, C, i);
}

extern "C" cudaError_t dp_cuda_launch_encoder_backward(cudaStream_t s, float *dwte,
                                                       float *dwpe, const float *dout,
                                                       const uint32_t *keys,
                                                       const uint32_t *order, size_t B,
                                                       size_t T, size_t C)
{
    if (B * T * C == 0) return cudaSuccess;
    k_encoder_backward_wpe<<<blocks_for(T * C, ELEM_THREADS), ELEM_THREADS, 0, s>>>(dwpe, dout,
                                                                                   B, T, C);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    size_t BT = B * T;
    LAUNCH(k_encoder_backward_wte, BT * C, ELEM_THREADS, s, dwte, dout, keys, order, BT, C);
}

// --- linear (bias parts) -----------------------------------------------------------------

__global__ void k_bias_broadcast(float *out, dp_pref bias, size_t OC, size_t n)
{
    GRID_LOOP(i, n) dp_bias_broadcast_elem(out, bias, OC, i);
}

extern "C" cudaError_t dp_cuda_launch_bias_broadcast(cudaStream_t s, float *out, dp_pref bias,
                                                     size_t N, size_t OC)
{
    size_t n = N * OC;
    LAUNCH(k_bias_broadcast, n, ELEM_THREADS, s, out, bias, OC, n);
}

// --- sum of squares (gradient norm) ----------------------------------------------------------

/* Elements of its grid-stride set a sum-of-squares thread loads before it
 * adds any (in the set's order, so the same sum): one 4-byte load at a
 * time, used before the next, kept about 8 KiB in flight per SM, and the
 * gradient's norm over GPT-2 small's 124M parameters took 0.20 ms on an
 * H200 for 0.10 ms of traffic. */
const unsigned SUMSQ_BATCH = 8;

/* Sums x[i]^2 (in double) over the grid-stride set of each thread, then
 * over the block by a fixed tree; one partial per block. Called with
 * DP_CUDA_SUMSQ_THREADS threads, a power of two. */
__global__ void k_sum_squares_partial(double *partials, const float *x, size_t n)
{
    __shared__ double acc[DP_CUDA_SUMSQ_THREADS];
    double a = 0.0;
    const size_t stride = grid_stride();
    for (size_t i0 = first_index(); i0 < n; i0 += SUMSQ_BATCH * stride) {
        float v[SUMSQ_BATCH];
        DP_UNROLL
        for (unsigned k = 0; k < SUMSQ_BATCH; k++)
            v[k] = i0 + k * stride < n ? x[i0 + k * stride] : 0.0f;
        DP_UNROLL
        for (unsigned k = 0; k < SUMSQ_BATCH; k++)
            if (i0 + k * stride < n) a += dp_square_element(v[k]);
    }
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

/* The permutes, a warp per hs-long run (kernels/attention.h): lane j
 * copies the run's elements j, j + 32, ..., so a warp reads and writes
 * contiguous memory and evaluates the index map (four 64-bit divisions)
 * once per run. One thread per element spent most of its time in those
 * divisions: GPT-2 small's permutes took 1.36 ms of a 34.8 ms step on an
 * H200 for 0.3 ms of traffic. */
__device__ __forceinline__ size_t first_warp()
{
    return ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
}
__device__ __forceinline__ size_t warp_stride() { return (size_t)gridDim.x * blockDim.x / 32; }
#define WARP_RUNS(r, runs) for (size_t r = first_warp(); r < (runs); r += warp_stride())
#define LANE ((size_t)threadIdx.x % 32)

__global__ void k_attention_permute(float *qkvr, const float *qkv, size_t B, size_t T,
                                    size_t NH, size_t hs, size_t runs)
{
    WARP_RUNS(r, runs) dp_attention_permute_run(qkvr, qkv, r, B, T, NH, hs, LANE, 32);
}

__global__ void k_attention_permute_bf16(uint16_t *qkvr, const float *qkv, size_t B, size_t T,
                                         size_t NH, size_t hs, size_t runs)
{
    WARP_RUNS(r, runs) dp_attention_permute_bf16_run(qkvr, qkv, r, B, T, NH, hs, LANE, 32);
}

__global__ void k_attention_permute_backward(float *dqkv, const float *dqkvr, size_t B,
                                             size_t T, size_t NH, size_t hs, size_t runs)
{
    WARP_RUNS(r, runs) dp_attention_permute_backward_run(dqkv, dqkvr, r, B, T, NH, hs, LANE, 32);
}

__global__ void k_attention_unpermute(float *out, const float *y, size_t T, size_t NH,
                                      size_t hs, size_t runs)
{
    WARP_RUNS(r, runs) dp_attention_unpermute_run(out, y, r, T, NH, hs, LANE, 32);
}

__global__ void k_attention_unpermute_backward(float *dy, const float *dout, size_t T,
                                               size_t NH, size_t hs, size_t runs)
{
    WARP_RUNS(r, runs) dp_attention_unpermute_backward_run(dy, dout, r, T, NH, hs, LANE, 32);
}

/* A launch of `runs` warps' worth of threads (the grid-stride loop takes
 * the rest). */
#define LAUNCH_RUNS(kernel, runs, s, ...) LAUNCH(kernel, (runs) * 32, ELEM_THREADS, s, __VA_ARGS__)

extern "C" cudaError_t dp_cuda_launch_attention_permute(cudaStream_t s, float *qkvr,
                                                        const float *qkv, size_t B, size_t T,
                                                        size_t NH, size_t hs)
{
    size_t runs = 3 * B * NH * T;
    LAUNCH_RUNS(k_attention_permute, runs, s, qkvr, qkv, B, T, NH, hs, runs);
}

extern "C" cudaError_t dp_cuda_launch_attention_permute_bf16(cudaStream_t s, uint16_t *qkvr,
                                                             const float *qkv, size_t B,
                                                             size_t T, size_t NH, size_t hs)
{
    size_t runs = 3 * B * NH * T;
    LAUNCH_RUNS(k_attention_permute_bf16, runs, s, qkvr, qkv, B, T, NH, hs, runs);
}

extern "C" cudaError_t dp_cuda_launch_attention_permute_backward(cudaStream_t s, float *dqkv,
                                                                 const float *dqkvr, size_t B,
                                                                 size_t T, size_t NH,
                                                                 size_t hs)
{
    size_t runs = B * T * 3 * NH;
    LAUNCH_RUNS(k_attention_permute_backward, runs, s, dqkv, dqkvr, B, T, NH, hs, runs);
}

extern "C" cudaError_t dp_cuda_launch_attention_unpermute(cudaStream_t s, float *out,
                                                          const float *y, size_t B, size_t T,
                                                          size_t NH, size_t hs)
{
    size_t runs = B * T * NH;
    LAUNCH_RUNS(k_attention_unpermute, runs, s, out, y, T, NH, hs, runs);
}

extern "C" cudaError_t dp_cuda_launch_attention_unpermute_backward(cudaStream_t s, float *dy,
                                                                   const float *dout, size_t B,
                                                                   size_t T, size_t NH,
                                                                   size_t hs)
{
    size_t runs = B * NH * T;
    LAUNCH_RUNS(k_attention_unpermute_backward, runs, s, dy, dout, T, NH, hs, runs);
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
