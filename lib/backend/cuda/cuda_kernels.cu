/*
 * backend/cuda/cuda_kernels.cu - the CUDA backend's kernels: thin
 * __global__ wrappers around the DP_HD functions of lib/kernels/ (*.h),
 * the same functions the CPU backend loops over, so the CPU tests check
 * the math the GPU runs (DESIGN.md section 3).
 *
 * Launch shapes:
 *   - element kernels: one thread per output element, 256-thread blocks;
 *   - row and column kernels (one DP_HD call per LayerNorm row, softmax
 *     row, cross-entropy row, bias or embedding channel): one thread per
 *     row or column, 64-thread blocks so that a few thousand rows still
 *     spread over every SM.
 * Grids are capped at DP_MAX_BLOCKS blocks and every kernel is a
 * grid-stride loop with size_t indices, so any n fits in the 2^31 - 1
 * limit of grid.x and no index overflows 32 bits.
 *
 * Determinism: no kernel adds to an element another thread writes (the
 * kernels/ headers are written so that each call owns its outputs) and no
 * float atomics are used; the one reduction here, the sum of squares,
 * is a fixed two-pass tree. Results are therefore bitwise reproducible
 * from run to run on one GPU model.
 */
#include <cuda_runtime.h>

#include "backend/cuda/cuda_kernels.h"
#include "dp/nn.h" /* DP_LAYERNORM_EPS */
#include "kernels/attention.h"
#include "kernels/crossentropy.h"
#include "kernels/elementwise.h"
#include "kernels/encoder.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/linear.h"
#include "kernels/optim.h"

// --- launch shapes -------------------------------------------------------------------

namespace {

const unsigned ELEM_THREADS = 256;
const unsigned ROW_THREADS = 64;
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

// --- encoder -------------------------------------------------------------------------

__global__ void k_encoder_forward(float *out, const int32_t *inp, const float *wte,
                                  const float *wpe, size_t T, size_t C, size_t n)
{
    GRID_LOOP(i, n) dp_encoder_forward_elem(out, inp, wte, wpe, T, C, i);
}

__global__ void k_encoder_backward_wpe(float *dwpe, const float *dout, size_t B, size_t T,
                                       size_t C)
{
    GRID_LOOP(i, T * C) dp_encoder_backward_wpe_elem(dwpe, dout, B, T, C, i);
}

__global__ void k_encoder_backward_wte(float *dwte, const float *dout, const int32_t *inp,
                                       size_t BT, size_t C)
{
    GRID_LOOP(c, C) dp_encoder_backward_wte_channel(dwte, dout, inp, BT, C, c);
}

extern "C" cudaError_t dp_cuda_launch_encoder_forward(cudaStream_t s, float *out,
                                                      const int32_t *inp, const float *wte,
                                                      const float *wpe, size_t B, size_t T,
                                                      size_t C)
{
    size_t n = B * T * C;
    LAUNCH(k_encoder_forward, n, ELEM_THREADS, s, out, inp, wte, wpe, T, C, n);
}

extern "C" cudaError_t dp_cuda_launch_encoder_backward(cudaStream_t s, float *dwte,
                                                       float *dwpe, const float *dout,
                                                       const int32_t *inp, size_t B, size_t T,
                                                       size_t C)
{
    if (B * T * C == 0) return cudaSuccess;
    k_encoder_backward_wpe<<<blocks_for(T * C, ELEM_THREADS), ELEM_THREADS, 0, s>>>(dwpe, dout,
                                                                                   B, T, C);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    LAUNCH(k_encoder_backward_wte, C, ROW_THREADS, s, dwte, dout, inp, B * T, C);
}

// --- linear (bias parts) -----------------------------------------------------------------

__global__ void k_bias_broadcast(float *out, const float *bias, size_t OC, size_t n)
{
    GRID_LOOP(i, n) dp_bias_broadcast_elem(out, bias, OC, i);
}

__global__ void k_bias_backward(float *dbias, const float *dout, size_t N, size_t OC)
{
    /* One column per thread: the tile width does not change the sums. */
    GRID_LOOP(o, OC) dp_bias_backward_cols(dbias, dout, N, OC, o, o + 1);
}

extern "C" cudaError_t dp_cuda_launch_bias_broadcast(cudaStream_t s, float *out,
                                                     const float *bias, size_t N, size_t OC)
{
    size_t n = N * OC;
    LAUNCH(k_bias_broadcast, n, ELEM_THREADS, s, out, bias, OC, n);
}

extern "C" cudaError_t dp_cuda_launch_bias_backward(cudaStream_t s, float *dbias,
                                                    const float *dout, size_t N, size_t OC)
{
    if (N == 0) return cudaSuccess;
    LAUNCH(k_bias_backward, OC, ROW_THREADS, s, dbias, dout, N, OC);
}

// --- LayerNorm ---------------------------------------------------------------------------

__global__ void k_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                    const float *weight, const float *bias, size_t N, size_t C)
{
    GRID_LOOP(r, N)
    dp_layernorm_forward_row(out + r * C, mean + r, rstd + r, inp + r * C, weight, bias, C,
                             DP_LAYERNORM_EPS);
}

__global__ void k_layernorm_backward_inp(float *dinp, const float *dout, const float *inp,
                                         const float *weight, const float *mean,
                                         const float *rstd, size_t N, size_t C)
{
    GRID_LOOP(r, N)
    dp_layernorm_backward_inp_row(dinp + r * C, dout + r * C, inp + r * C, weight, mean[r],
                                  rstd[r], C);
}

__global__ void k_layernorm_backward_param(float *dweight, float *dbias, const float *dout,
                                           const float *inp, const float *mean,
                                           const float *rstd, size_t N, size_t C)
{
    GRID_LOOP(c, C) dp_layernorm_backward_param_channel(dweight, dbias, dout, inp, mean, rstd, N, C, c);
}

extern "C" cudaError_t dp_cuda_launch_layernorm_forward(cudaStream_t s, float *out,
                                                        float *mean, float *rstd,
                                                        const float *inp, const float *weight,
                                                        const float *bias, size_t N, size_t C)
{
    if (C == 0) return cudaSuccess;
    LAUNCH(k_layernorm_forward, N, ROW_THREADS, s, out, mean, rstd, inp, weight, bias, N, C);
}

extern "C" cudaError_t dp_cuda_launch_layernorm_backward(
    cudaStream_t s, float *dinp, float *dweight, float *dbias, const float *dout,
    const float *inp, const float *weight, const float *mean, const float *rstd, size_t N,
    size_t C)
{
    if (N * C == 0) return cudaSuccess;
    k_layernorm_backward_inp<<<blocks_for(N, ROW_THREADS), ROW_THREADS, 0, s>>>(
        dinp, dout, inp, weight, mean, rstd, N, C);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    LAUNCH(k_layernorm_backward_param, C, ROW_THREADS, s, dweight, dbias, dout, inp, mean, rstd,
           N, C);
}

// --- GELU and element-wise -------------------------------------------------------------------

__global__ void k_gelu_forward(float *out, const float *inp, size_t n)
{
    GRID_LOOP(i, n) dp_gelu_forward_elem(out, inp, i);
}

__global__ void k_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
    GRID_LOOP(i, n) dp_gelu_backward_elem(dinp, inp, dout, i);
}

__global__ void k_add(float *out, const float *a, const float *b, size_t n)
{
    GRID_LOOP(i, n) dp_add_elem(out, a, b, i);
}

__global__ void k_accumulate(float *dst, const float *src, size_t n)
{
    GRID_LOOP(i, n) dp_accumulate_elem(dst, src, i);
}

__global__ void k_scale(float *x, float scale, size_t n)
{
    GRID_LOOP(i, n) x[i] = dp_scale_element(x[i], scale);
}

extern "C" cudaError_t dp_cuda_launch_gelu_forward(cudaStream_t s, float *out,
                                                   const float *inp, size_t n)
{
    LAUNCH(k_gelu_forward, n, ELEM_THREADS, s, out, inp, n);
}

extern "C" cudaError_t dp_cuda_launch_gelu_backward(cudaStream_t s, float *dinp,
                                                    const float *inp, const float *dout,
                                                    size_t n)
{
    LAUNCH(k_gelu_backward, n, ELEM_THREADS, s, dinp, inp, dout, n);
}

extern "C" cudaError_t dp_cuda_launch_add(cudaStream_t s, float *out, const float *a,
                                          const float *b, size_t n)
{
    LAUNCH(k_add, n, ELEM_THREADS, s, out, a, b, n);
}

extern "C" cudaError_t dp_cuda_launch_accumulate(cudaStream_t s, float *dst, const float *src,
                                                 size_t n)
{
    LAUNCH(k_accumulate, n, ELEM_THREADS, s, dst, src, n);
}

extern "C" cudaError_t dp_cuda_launch_scale(cudaStream_t s, float *x, float scale, size_t n)
{
    LAUNCH(k_scale, n, ELEM_THREADS, s, x, scale, n);
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

__global__ void k_softmax_causal_forward(float *att, float scale, size_t T, size_t rows)
{
    GRID_LOOP(r, rows) dp_softmax_causal_forward_row(att + r * T, scale, r % T, T);
}

__global__ void k_softmax_causal_backward(float *datt, const float *att, float scale,
                                          size_t T, size_t rows)
{
    GRID_LOOP(r, rows) dp_softmax_causal_backward_row(datt + r * T, att + r * T, scale, r % T, T);
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

extern "C" cudaError_t dp_cuda_launch_softmax_causal_forward(cudaStream_t s, float *att,
                                                             float scale, size_t BNH, size_t T)
{
    size_t rows = BNH * T;
    LAUNCH(k_softmax_causal_forward, rows, ROW_THREADS, s, att, scale, T, rows);
}

extern "C" cudaError_t dp_cuda_launch_softmax_causal_backward(cudaStream_t s, float *datt,
                                                              const float *att, float scale,
                                                              size_t BNH, size_t T)
{
    size_t rows = BNH * T;
    LAUNCH(k_softmax_causal_backward, rows, ROW_THREADS, s, datt, att, scale, T, rows);
}

// --- cross-entropy -----------------------------------------------------------------------------

__global__ void k_crossentropy(float *losses, float *dlogits, const float *logits,
                               const int32_t *targets, size_t N, size_t V, float dscale)
{
    GRID_LOOP(r, N)
    dp_crossentropy_row(losses + r, dlogits ? dlogits + r * V : NULL, logits + r * V, targets[r],
                        V, dscale);
}

extern "C" cudaError_t dp_cuda_launch_crossentropy(cudaStream_t s, float *losses,
                                                   float *dlogits, const float *logits,
                                                   const int32_t *targets, size_t N, size_t V,
                                                   float dscale)
{
    if (V == 0) return cudaSuccess;
    LAUNCH(k_crossentropy, N, ROW_THREADS, s, losses, dlogits, logits, targets, N, V, dscale);
}

// --- optimizers --------------------------------------------------------------------------------

__global__ void k_adamw(float *params, const float *grads, float *m, float *v, size_t n,
                        float lr, float beta1, float beta2, float eps, float weight_decay,
                        float bias_corr1, float bias_corr2)
{
    GRID_LOOP(i, n)
    dp_adamw_element(&params[i], &m[i], &v[i], grads[i], lr, beta1, beta2, eps, weight_decay,
                     bias_corr1, bias_corr2);
}

__global__ void k_sgd(float *params, const float *grads, float *momentum_buf, size_t n,
                      float lr, float momentum, float weight_decay, int first_step)
{
    GRID_LOOP(i, n)
    dp_sgd_element(&params[i], momentum_buf ? &momentum_buf[i] : NULL, grads[i], lr, momentum,
                   weight_decay, first_step);
}

extern "C" cudaError_t dp_cuda_launch_adamw(cudaStream_t s, float *params, const float *grads,
                                            float *m, float *v, size_t n, float lr,
                                            float beta1, float beta2, float eps,
                                            float weight_decay, float bias_corr1,
                                            float bias_corr2)
{
    LAUNCH(k_adamw, n, ELEM_THREADS, s, params, grads, m, v, n, lr, beta1, beta2, eps,
           weight_decay, bias_corr1, bias_corr2);
}

extern "C" cudaError_t dp_cuda_launch_sgd(cudaStream_t s, float *params, const float *grads,
                                          float *momentum_buf, size_t n, float lr,
                                          float momentum, float weight_decay, int first_step)
{
    LAUNCH(k_sgd, n, ELEM_THREADS, s, params, grads, momentum_buf, n, lr, momentum,
           weight_decay, first_step);
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
