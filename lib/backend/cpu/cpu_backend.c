/*
 * backend/cpu/cpu_backend.c - virtual CPU devices: host memory, memcpy
 * copies, GEMM through OpenBLAS, and the backend table (the element-wise
 * and row-wise ops of kernels/ops.h are generated here; the other kernels
 * are in cpu_nn.c and cpu_attention.c).
 *
 * A virtual device is host memory plus the thread that drives it; the
 * engine gives each device its own thread, so OpenBLAS is made
 * single-threaded once (openblas_set_num_threads(1)) and the devices run
 * their GEMMs concurrently instead of fighting over BLAS threads.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "backend/cpu/cpu_kernels.h"
#include "core/error.h"

/* Declared by OpenBLAS's cblas.h; repeated so a different cblas.h still builds. */
void openblas_set_num_threads(int num_threads);

#define DP_CPU_ALIGN 256

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;

static void blas_single_thread(void) { openblas_set_num_threads(1); }

static dp_status cpu_open(dp_device *dev)
{
    pthread_once(&blas_once, blas_single_thread);
    dev->ctx = NULL;
    return DP_OK;
}

static void cpu_close(dp_device *dev) { (void)dev; }

static dp_status cpu_alloc(dp_device *dev, size_t bytes, void **out)
{
    /* aligned_alloc wants a multiple of the alignment. */
    size_t rounded = (bytes + DP_CPU_ALIGN - 1) / DP_CPU_ALIGN * DP_CPU_ALIGN;
    if (rounded < bytes) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "%s: %zu bytes overflow", dev->name, bytes);
    void *p = aligned_alloc(DP_CPU_ALIGN, rounded);
    if (!p)
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "%s: host allocation of %zu bytes failed",
                       dev->name, bytes);
    *out = p;
    return DP_OK;
}

static void cpu_free(dp_device *dev, void *ptr)
{
    (void)dev;
    free(ptr);
}

static dp_status cpu_copy(dp_device *dev, void *dst, const void *src, size_t bytes)
{
    (void)dev;
    memmove(dst, src, bytes);
    return DP_OK;
}

static dp_status cpu_copy_peer(dp_device *dst_dev, void *dst, dp_device *src_dev,
                               const void *src, size_t bytes)
{
    (void)dst_dev;
    (void)src_dev;
    memmove(dst, src, bytes);
    return DP_OK;
}

static dp_status cpu_memset(dp_device *dev, void *dst, int value, size_t bytes)
{
    (void)dev;
    memset(dst, value, bytes);
    return DP_OK;
}

static dp_status cpu_synchronize(dp_device *dev)
{
    (void)dev;
    return DP_OK;
}

static dp_status cpu_gemm_strided_batched(dp_device *dev, dp_op transa, dp_op transb, int m,
                                          int n, int k, float alpha, const float *A, int lda,
                                          long long strideA, const float *B, int ldb,
                                          long long strideB, float beta, float *C, int ldc,
                                          long long strideC, int batch)
{
    (void)dev;
    for (int i = 0; i < batch; i++) {
        float *Ci = C + (size_t)i * (size_t)strideC;
        if (k == 0) {
            /* C = beta C; beta == 0 overwrites (NaNs in C are not kept). */
            for (int col = 0; col < n; col++) {
                float *c = Ci + (size_t)col * (size_t)ldc;
                for (int row = 0; row < m; row++) c[row] = beta == 0.0f ? 0.0f : beta * c[row];
            }
            continue;
        }
        cblas_sgemm(CblasColMajor, transa == DP_OP_T ? CblasTrans : CblasNoTrans,
                    transb == DP_OP_T ? CblasTrans : CblasNoTrans, m, n, k, alpha,
                    A + (size_t)i * (size_t)strideA, lda, B + (size_t)i * (size_t)strideB, ldb,
                    beta, Ci, ldc);
    }
    return DP_OK;
}

// --- the element-wise and row-wise ops of kernels/ops.h --------------------------------

/* One function per list entry: items i = 0..n-1 in order on the calling thread. */
#define CPU_OP(name, shape, fn, params, args)                                    \
    static DP_CPU_SIMD dp_status cpu_##name(dp_device *dev, DP_UNPAREN params, size_t n) \
    {                                                                            \
        (void)dev;                                                               \
        for (size_t i = 0; i < n; i++) fn(DP_UNPAREN args, i);                   \
        return DP_OK;                                                            \
    }
DP_KERNEL_OPS(CPU_OP)
#undef CPU_OP

#define CPU_OP_ENTRY(name, shape, fn, params, args) .name = cpu_##name,

static const dp_backend_ops cpu_ops = {
    .name = "cpu",
    .host_memory = 1,
    .open = cpu_open,
    .close = cpu_close,
    .bind_thread = NULL,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .mem_info = NULL,
    .copy_h2d = cpu_copy,
    .copy_d2h = cpu_copy,
    .copy_d2d = cpu_copy,
    .copy_peer = cpu_copy_peer,
    .memset = cpu_memset,
    .synchronize = cpu_synchronize,
    .gemm_strided_batched = cpu_gemm_strided_batched,
    .set_allow_tf32 = NULL,
    DP_KERNEL_OPS(CPU_OP_ENTRY)
    .encoder_backward = dp_cpu_encoder_backward,
    .bias_broadcast = dp_cpu_bias_broadcast,
    .bias_backward = dp_cpu_bias_backward,
    .layernorm_backward_params = dp_cpu_layernorm_backward_params,
    .sum_squares = dp_cpu_sum_squares,
    .attention_permute = dp_cpu_attention_permute,
    .attention_permute_backward = dp_cpu_attention_permute_backward,
    .attention_unpermute = dp_cpu_attention_unpermute,
    .attention_unpermute_backward = dp_cpu_attention_unpermute_backward,
};

const dp_backend_ops *dp_backend_cpu(void) { return &cpu_ops; }
