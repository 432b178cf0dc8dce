/*
 * backend/cuda/cuda_internal.h - what the CUDA backend's files share (not
 * installed): a device's context, the error reporting of runtime and
 * cuBLAS calls, the current-device guard, and the table's entries that
 * cuda_copy.c (copies), cuda_compute.c (GEMM and kernels) and cuda_lt.c
 * (the GEMM with a bfloat16 output) define for
 * cuda_backend.c (devices, memory, events, the table and the module).
 */
#ifndef DP_BACKEND_CUDA_INTERNAL_H
#define DP_BACKEND_CUDA_INTERNAL_H

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/device_graph.h"
#include "backend/gemm_pieces.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_native.h"
#include "core/error.h"
#include "transport/transport.h"

/* Bytes of each of the two pinned staging buffers: host<->device copies
 * move in chunks of this size, the host memcpy of one chunk overlapping
 * the DMA of the other. */
#define STAGE_BYTES ((size_t)4 << 20)

/* cuBLAS workspace per handle (cuBLAS's own defaults for these GPUs). */
#define BLAS_WS_BYTES ((size_t)4 << 20)
#define BLAS_WS_BYTES_SM90 ((size_t)32 << 20)

/* DP_CUDA_CUDNN (read as a device opens): 0 dp's own attention kernels;
 * 1 cuDNN's, an error where it cannot run; unset or empty, cuDNN's where
 * the module loads and takes the shape, for the first
 * DP_CUDA_SDPA_AUTO_SHAPES shapes (cuda_sdpa.c), else dp's. */
enum { CUDA_CUDNN_OFF = 0, CUDA_CUDNN_REQUIRED = 1, CUDA_CUDNN_AUTO = 2 };
#define DP_CUDA_SDPA_AUTO_SHAPES 8

typedef struct cuda_ctx {
    int ordinal; /* physical device, after CUDA_VISIBLE_DEVICES */
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_ws;                /* device: the cuBLAS workspace dp gives the handle */
    size_t blas_ws_bytes;         /* its size; cuBLASLt's calls share it (same stream) */
    cublasLtHandle_t lt;          /* cuBLASLt: the GEMMs with the bias epilogue (cuda_lt.c) */
    int lt_off;                   /* DP_CUDA_LT=0: those decline (cuda_backend.c) */
    int lt_gelu;                  /* DP_CUDA_LT_GELU=1: the GELU in cuBLASLt's epilogue */
    int graphs;                   /* DP_CUDA_GRAPHS=1: graph_begin records (cuda_graph.c) */
    uint64_t epoch;               /* reallocations of col, tickets, grp, cvt (under mu) */
    int cudnn;                    /* the fused attention through cuDNN: CUDA_CUDNN_* */
    int sdpa_absent;              /* CUDA_CUDNN_AUTO found no module, cuDNN or start (mu) */
    const struct dp_cudnn_module *sdpa_mod; /* the cuDNN module (cuda_sdpa.c), loaded and */
    void *sdpa;                   /* its context opened on first use, under mu */
    struct cuda_sdpa_shape {      /* CUDA_CUDNN_AUTO: the shapes given to cuDNN (under mu) */
        size_t B, T, NH, hs;
        signed char way[2];       /* forward, backward: 1 cuDNN's, -1 declined, 0 not yet */
    } sdpa_shapes[DP_CUDA_SDPA_AUTO_SHAPES];
    int sdpa_n_shapes;

    pthread_mutex_t mu;           /* guards stage, stage_done, sumsq, result_host, col, tickets,
                                     grp */
    unsigned char *stage[2];      /* pinned host, STAGE_BYTES each */
    cudaEvent_t stage_done[2];    /* last GPU use of stage[b] */
    double *sumsq;                /* device: DP_CUDA_SUMSQ_BLOCKS partials + 1 result */
    double *result_host;          /* pinned: the result copied back */
    float *col;                   /* device: partials of the column reductions; a widened bias */
    size_t col_bytes;             /* its size (grown on demand, part of dev->reserved) */
    void *tickets;                /* device: the column reductions' tickets, 0 between calls */
    size_t tickets_bytes;         /* its size (likewise) */
    void *grp;                    /* device: the embedding backward's token groups */
    size_t grp_bytes;             /* its size (likewise) */
    void *cvt;                    /* device: GEMM operands converted to the math's type */
    size_t cvt_bytes;             /* its size (likewise) */

    pthread_mutex_t ev_mu;        /* guards order_ev between its record and wait */
    cudaEvent_t order_ev;         /* marks this stream's work for another stream */
    int mu_ok, ev_mu_ok;          /* mutexes initialised (for cleanup after a failed open) */
    int comm;                     /* a communication queue (dp_device_open_comm): its stream,
                                     order_ev and mutexes only; nothing else is made */
} cuda_ctx;

#define CTX(dev) ((cuda_ctx *)(dev)->ctx)

// --- errors (cuda_backend.c) -----------------------------------------------------------------

/* Records "dev: call failed: reason (name)" with the caller's function,
 * file and line; `call` is the source text of the call (only its name, up
 * to the first '(', is printed). Clears the runtime's last error so a
 * recoverable failure (out of memory) does not resurface later. */
dp_status dp_cuda_fail(const dp_device *dev, cudaError_t e, const char *call, const char *func,
                       const char *file, int line);
dp_status dp_cuda_blas_fail(const dp_device *dev, cublasStatus_t st, const char *call,
                            const char *func, const char *file, int line);

/* Runs a CUDA runtime call (or a kernel launcher); on failure returns the
 * dp_status naming the call, the device, and this file and line. */
#define CU_TRY(dev, call)                                                            \
    do {                                                                             \
        cudaError_t cu_e_ = (call);                                                  \
        if (cu_e_ != cudaSuccess)                                                    \
            return dp_cuda_fail((dev), cu_e_, #call, __func__, __FILE__, __LINE__);     \
    } while (0)

#define BLAS_TRY(dev, call)                                                          \
    do {                                                                             \
        cublasStatus_t blas_s_ = (call);                                             \
        if (blas_s_ != CUBLAS_STATUS_SUCCESS)                                        \
            return dp_cuda_blas_fail((dev), blas_s_, #call, __func__, __FILE__, __LINE__);   \
    } while (0)

// --- devices and threads (cuda_backend.c) -------------------------------------------------

/* The calling thread's current device belongs to the application: every
 * entry that switches it switches it back before returning (except
 * bind_thread, whose purpose is to set it). An entry declares
 * DEVICE_GUARD, which remembers the device current before dp's first
 * switch (-1: not switched) and restores it when the entry returns, on
 * every path (GCC/Clang's cleanup attribute runs at scope exit, after the
 * return value has been computed). */
static inline void restore_device(int *prev)
{
    if (*prev >= 0 && cudaSetDevice(*prev) != cudaSuccess) (void)cudaGetLastError();
}

#define DEVICE_GUARD int dp_prev_device_ __attribute__((cleanup(restore_device))) = -1

/* Thread's current device, or -1 when the runtime cannot say. */
static inline int current_device(void)
{
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess) {
        (void)cudaGetLastError();
        cur = -1;
    }
    return cur;
}

/* Makes ordinal the calling thread's current device (kernels and cuBLAS
 * calls need it; cudaGetDevice is a thread-local read). On the first switch
 * *prev (a DEVICE_GUARD's, or NULL to keep the switch) gets the device to
 * restore. */
dp_status dp_cuda_use_device(const dp_device *dev, int ordinal, int *prev);

/* First statement of an entry: switch to dev's GPU until it returns. */
#define ENTER(dev)  \
    DEVICE_GUARD;   \
    DP_TRY(dp_cuda_use_device((dev), CTX(dev)->ordinal, &dp_prev_device_))

/* Device scratch *buf of *cap bytes grown to at least `bytes` (c->mu
 * held): the column reductions' partials, the embedding backward's token
 * groups, the GEMM's converted operands. Its bytes are reserved memory,
 * so growing it respects the device's limit (cuda_compute.c). */
dp_status dp_cuda_grow_scratch(dp_device *dev, cuda_ctx *c, void **buf, size_t *cap,
                               size_t bytes);

// --- the staging copies (cuda_copy.c; c->mu held) --------------------------------------------

/* Host -> device through the pinned buffers: returns once src has been
 * read (the DMA finishes on the stream); device -> host waits for it. */
dp_status dp_cuda_h2d_locked(dp_device *dev, cuda_ctx *c, void *dst, const void *src,
                             size_t bytes);
dp_status dp_cuda_d2h_locked(dp_device *dev, cuda_ctx *c, void *dst, const void *src,
                             size_t bytes);

// --- the table's entries in cuda_copy.c and cuda_compute.c -----------------------------------

dp_status dp_cuda_copy_h2d(dp_device *dev, void *dst, const void *src, size_t bytes);
dp_status dp_cuda_copy_d2h(dp_device *dev, void *dst, const void *src, size_t bytes);
dp_status dp_cuda_copy_d2d(dp_device *dev, void *dst, const void *src, size_t bytes);
dp_status dp_cuda_copy_peer(dp_device *dst_dev, void *dst, dp_device *src_dev, const void *src,
                            size_t bytes);
dp_status dp_cuda_memset(dp_device *dev, void *dst, int value, size_t bytes);
dp_status dp_cuda_synchronize(dp_device *dev);

/* Graphs (cuda_graph.c): the table's graph entries (backend.h). */
dp_status dp_cuda_graph_begin(dp_device *dev);
dp_status dp_cuda_graph_end(dp_device *dev, void **out);
dp_status dp_cuda_graph_launch(dp_device *dev, void *graph);
void dp_cuda_graph_destroy(dp_device *dev, void *graph);
uint64_t dp_cuda_graph_epoch(dp_device *dev);
/* ops->order: `then`'s later work waits for the work queued on `first`. */
dp_status dp_cuda_order(dp_device *first, dp_device *then);
dp_status dp_cuda_gemm(dp_device *dev, dp_op transa, dp_op transb, int m, int n, int k, float alpha,
                       const dp_gemm_arg *A, const dp_gemm_arg *B, float beta, float *C, int ldc,
                       long long strideC, int batch);
#define DP_CUDA_OP_DECL(name, shape, fn, params, args)                                             \
    dp_status dp_cuda_##name(dp_device *dev, DP_UNPAREN params, size_t n);
DP_KERNEL_OPS(DP_CUDA_OP_DECL)
#undef DP_CUDA_OP_DECL
dp_status dp_cuda_encoder_backward(dp_device *dev, float *dwte, float *dwpe, const float *dout,
                                   const int32_t *inp, size_t B, size_t T, size_t C);
dp_status dp_cuda_bias_broadcast(dp_device *dev, float *out, dp_pref bias, size_t N, size_t OC);
dp_status dp_cuda_bias_backward(dp_device *dev, float *dbias, uint16_t *dout16, dp_pref dout,
                                size_t N, size_t OC);
dp_status dp_cuda_layernorm_backward_params(dp_device *dev, float *dweight, float *dbias,
                                            dp_pref dout, const float *inp, const float *mean,
                                            const float *rstd, size_t N, size_t C);
dp_status dp_cuda_sum_squares(dp_device *dev, double *out_host, const float *x, size_t n);
dp_status dp_cuda_adamw_segments(dp_device *dev, float *params, float *grads, float *m, float *v,
                                 uint16_t *replica, const dp_adamw_segs *segs, float lr,
                                 float beta1, float beta2, float eps, float bias_corr1,
                                 float bias_corr2, float clip);
dp_status dp_cuda_attention_permute_backward(dp_device *dev, float *dqkv, const float *dqkvr,
                                             size_t B, size_t T, size_t NH, size_t hs);
dp_status dp_cuda_attention_permute(dp_device *dev, float *qkvr, const float *qkv, size_t B,
                                    size_t T, size_t NH, size_t hs);
dp_status dp_cuda_attention_permute_bf16(dp_device *dev, uint16_t *qkvr, const float *qkv,
                                         size_t B, size_t T, size_t NH, size_t hs);
dp_status dp_cuda_attention_unpermute_backward(dp_device *dev, float *dy, const float *dout,
                                               size_t B, size_t T, size_t NH, size_t hs);
dp_status dp_cuda_attention_unpermute(dp_device *dev, float *out, const float *y, size_t B,
                                      size_t T, size_t NH, size_t hs);
/* cuda_sdpa.c */
dp_status dp_cuda_attention_lib_forward(dp_device *dev, dp_pout out, float *lse,
                                        const uint16_t *qkv, size_t B, size_t T, size_t NH,
                                        size_t hs, float scale, int *done);
dp_status dp_cuda_attention_lib_backward(dp_device *dev, dp_pout dqkv, dp_pref dout,
                                         const uint16_t *qkv, const float *lse, dp_pref out,
                                         size_t B, size_t T, size_t NH, size_t hs, float scale,
                                         int *done);
/* Closes c's cuDNN context, if any (the device's close, after its stream is idle). */
void dp_cuda_sdpa_close(cuda_ctx *c);
/* cuda_lt.c */
dp_status dp_cuda_gemm_bias_out(dp_device *dev, dp_op transa, dp_op transb, int m, int n, int k,
                                const dp_gemm_arg *A, const dp_gemm_arg *B, dp_pref bias, void *C,
                                int c_bf16, int ldc, int *done);
dp_status dp_cuda_gemm_gelu(dp_device *dev, dp_op transa, dp_op transb, int m, int n, int k,
                            const dp_gemm_arg *A, const dp_gemm_arg *B, dp_pref bias, int dgelu,
                            uint16_t *pre, uint16_t *C, int ldc, int *done);

#endif /* DP_BACKEND_CUDA_INTERNAL_H */
