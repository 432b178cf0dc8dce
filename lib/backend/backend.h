/*
 * backend/backend.h - the device vtable (ggml-style) and struct dp_device.
 *
 * A backend fills a dp_backend_ops table. The public wrappers in
 * backend/device.c and lib/nn, lib/optim validate arguments, do the memory
 * accounting and then call these entries, so a backend entry may assume
 * valid, non-empty arguments and device pointers of dev.
 *
 * Kernel entries mirror the DP_HD functions in lib/kernels/ (*.h): the CPU
 * backend loops over them, the CUDA backend launches __global__ wrappers
 * around the same functions. The element-wise and row-wise entries come
 * from the one list in kernels/ops.h; the others (reductions, scatters,
 * permutes) are written out below. Shapes are as in dp/nn.h.
 */
#ifndef DP_BACKEND_H
#define DP_BACKEND_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "core/module.h"
#include "dp/device.h"
#include "kernels/ops.h"

typedef struct dp_alloc_map {
    void **keys;  /* open addressing, NULL = empty, DP_ALLOC_TOMB = deleted */
    size_t *sizes;
    size_t cap;   /* power of two */
    size_t count; /* live entries */
    size_t used;  /* live + tombstones */
} dp_alloc_map;

typedef struct dp_backend_ops dp_backend_ops;

/* The dp_backend_ops field of one kernels/ops.h entry. */
#define DP_BACKEND_OP_ENTRY(name, shape, fn, params, args) \
    dp_status (*name)(dp_device * dev, DP_UNPAREN params, size_t n);

struct dp_device {
    const dp_backend_ops *ops;
    dp_device_kind kind;
    int index; /* backend index (cuda ordinal, cpu virtual index) */
    char name[32];
    void *ctx; /* backend state: stream, cuBLAS handle, staging buffers */

    pthread_mutex_t mu; /* guards the accounting below */
    size_t in_use, peak, peak_since_reset, limit;
    size_t reserved; /* set by ops->open: the backend's own buffers (dp_memory_stats) */
    dp_alloc_map allocs;

    /* dp_device_set_matmul_precision; read by the backend's gemm */
    dp_matmul_precision matmul;
    /* the most bytes the gemm converts operands into at a time; 0 =
     * DP_GEMM_CONVERT_CAP (backend/gemm_pieces.h; tests set it lower) */
    size_t gemm_convert_cap;
    /* bf16 math on OpenBLAS even where oneDNN has a bf16 matmul (a test
     * hook, device_testing.h: so the emulation is tested on every CPU) */
    int gemm_no_dnnl;
    /* the bf16 producers of nn/nn_act16.h run as the compositions they
     * replace (a test hook, device_testing.h: so one binary compares both
     * bit for bit) */
    int no_fused_producers;
    /* device_graph.c: dev's queue is being recorded as a graph, not run
     * (set and read by the one thread that records it) */
    int graph_recording;
};

/* One operand of the backend's gemm: batch column-major matrices (before
 * op) at p, p + stride, ..., of float32 or bfloat16 elements (ld and
 * stride in elements; stride >= 0). */
typedef struct dp_gemm_arg {
    const void *p;
    int bf16; /* 0: floats; 1: bfloat16 bits */
    int ld;
    long long stride;
} dp_gemm_arg;

/* Elements an operand spans, from its first to one past its last: rows x
 * cols matrices (rows = m or k, as stored) with leading dimension ld,
 * batch of them stride apart. 0 when any size is 0. */
static inline size_t dp_gemm_arg_span(const dp_gemm_arg *a, int rows, int cols, int batch)
{
    if (rows <= 0 || cols <= 0 || batch <= 0) return 0;
    return (size_t)(batch - 1) * (size_t)a->stride + (size_t)(cols - 1) * (size_t)a->ld +
           (size_t)rows;
}

struct dp_backend_ops {
    const char *name;
    /* 1: device pointers are host addresses any thread may read (CPU), so a
     * collective can read a peer's buffer directly instead of staging it. */
    int host_memory;

    /* lifecycle: open sets dev->ctx; close frees it */
    dp_status (*open)(dp_device *dev);
    void (*close)(dp_device *dev);
    dp_status (*bind_thread)(dp_device *dev);

    /* raw memory (accounting is done by the caller); free gets the bytes
     * that alloc was asked for */
    dp_status (*alloc)(dp_device *dev, size_t bytes, void **out);
    void (*free)(dp_device *dev, void *ptr, size_t bytes);
    /* optional (NULL on CPU): driver free/total bytes */
    dp_status (*mem_info)(dp_device *dev, size_t *free_bytes, size_t *total_bytes);

    dp_status (*copy_h2d)(dp_device *dev, void *dst, const void *src, size_t bytes);
    dp_status (*copy_d2h)(dp_device *dev, void *dst, const void *src, size_t bytes);
    dp_status (*copy_d2d)(dp_device *dev, void *dst, const void *src, size_t bytes);
    dp_status (*copy_peer)(dp_device *dst_dev, void *dst, dp_device *src_dev, const void *src,
                           size_t bytes);
    dp_status (*memset)(dp_device *dev, void *dst, int value, size_t bytes);
    dp_status (*synchronize)(dp_device *dev);

    /* optional (NULL: none): a communication queue of dev
     * (dp_device_open_comm): sets comm->ctx, or *declined = 1 and leaves
     * it NULL; close_comm frees it */
    dp_status (*open_comm)(dp_device *dev, dp_device *comm, int *declined);
    void (*close_comm)(dp_device *comm);
    /* optional (NULL: every entry completes before it returns, so nothing
     * needs ordering): work queued on `then` from now on waits for all
     * work queued on `first` so far (devices of this backend) */
    dp_status (*order)(dp_device *first, dp_device *then);

    /* events (dp/device.h): *out is the backend's handle */
    dp_status (*event_create)(dp_device *dev, void **out);
    void (*event_destroy)(dp_device *dev, void *ev);
    dp_status (*event_record)(dp_device *dev, void *ev);
    /* dev's later work waits for ev, recorded on ev_dev (same kind) */
    dp_status (*event_wait)(dp_device *dev, dp_device *ev_dev, void *ev);
    dp_status (*event_synchronize)(dp_device *dev, void *ev);
    dp_status (*event_elapsed)(dp_device *dev, void *start, void *end, double *seconds);

    /* optional (NULL: none): the device's queued work recorded once and
     * replayed (CUDA graphs; backend/device_graph.h says how they are
     * used). graph_begin starts recording dev's queue instead of running it
     * (DP_ERR_UNSUPPORTED where the backend has them off); graph_end stops
     * and gives the replayable graph in *out, or fails (*out NULL) where
     * the recording broke; graph_launch queues one replay; graph_destroy
     * frees a graph. graph_epoch counts the reallocations of the backend's
     * own scratch: a graph recorded at another epoch may name freed memory. */
    dp_status (*graph_begin)(dp_device *dev);
    dp_status (*graph_end)(dp_device *dev, void **out);
    dp_status (*graph_launch)(dp_device *dev, void *graph);
    void (*graph_destroy)(dp_device *dev, void *graph);
    uint64_t (*graph_epoch)(dp_device *dev);

    /* C = alpha op(A) op(B) + beta C (dp_gemm_ex): batch float32 matrices
     * C (ldc, strideC), operands as dp_gemm_arg, in dev->matmul's
     * precision. Sizes are valid and m, n, batch > 0; k may be 0. */
    dp_status (*gemm)(dp_device *dev, dp_op transa, dp_op transb, int m, int n, int k,
                      float alpha, const dp_gemm_arg *A, const dp_gemm_arg *B, float beta,
                      float *C, int ldc, long long strideC, int batch);

    /* optional (NULL: the engine updates tensor by tensor): AdamW with
     * clipping and the bf16 replica's refresh over the segments of segs
     * in one call (kernels/optim.h: dp_adamw_clip_element on every element
     * of every segment, nothing between them); params, grads, m, v and
     * replica (NULL: none) point at the call's element 0 */
    dp_status (*adamw_segments)(dp_device *dev, float *params, float *grads, float *m, float *v,
                                uint16_t *replica, const dp_adamw_segs *segs, float lr,
                                float beta1, float beta2, float eps, float bias_corr1,
                                float bias_corr2, float clip);

    /* optional (NULL: nothing to set): called by
     * dp_device_set_matmul_precision before dev->matmul changes (CUDA sets
     * cuBLAS's math mode for TF32) */
    dp_status (*set_matmul_precision)(dp_device *dev, dp_matmul_precision p);
    /* optional (NULL: FP32 alone is native): dp_device_matmul_native,
     * *native set to 1 or 0 (p is valid) */
    dp_status (*matmul_native)(dp_device *dev, dp_matmul_precision p, int *native);

    /* ---- kernels (see dp/nn.h and lib/kernels/ (*.h)) ---- */

    /* The element-wise and row-wise ops of kernels/ops.h, one entry each:
     * dp_status (*name)(dp_device *dev, params..., size_t n), n items > 0. */
    DP_KERNEL_OPS(DP_BACKEND_OP_ENTRY)

    /* dwte(V,C) += scatter of dout(B,T,C) by token id; dwpe(maxT,C)[t] +=
     * sum over b of dout[b,t] (deterministic order) */
    dp_status (*encoder_backward)(dp_device *dev, float *dwte, float *dwpe, const float *dout,
                                  const int32_t *inp, size_t B, size_t T, size_t C);
    /* out(N,OC)[i,:] = bias (broadcast rows; used before a beta=1 gemm) */
    dp_status (*bias_broadcast)(dp_device *dev, float *out, dp_pref bias, size_t N, size_t OC);
    /* dbias(OC) += column sums of dout(N,OC) (float32 or bfloat16), in a
     * fixed order; with dout16 (not NULL, dout float32) the same pass
     * stores dout rounded to bfloat16 there, cast_f32_bf16's bits
     * (kernels/linear.h) */
    dp_status (*bias_backward)(dp_device *dev, float *dbias, uint16_t *dout16, dp_pref dout,
                               size_t N, size_t OC);
    /* dweight(C) += sum over rows of dout * xhat, dbias(C) += column sums of
     * dout(N,C) (float32 or bfloat16), in a fixed order (the input gradient
     * is layernorm_backward_inp) */
    dp_status (*layernorm_backward_params)(dp_device *dev, float *dweight, float *dbias,
                                           dp_pref dout, const float *inp,
                                           const float *mean, const float *rstd, size_t N,
                                           size_t C);
    /* *out_host = sum x^2 in double (waits for the result) */
    dp_status (*sum_squares)(dp_device *dev, double *out_host, const float *x, size_t n);

    /* attention pieces: qkv(B,T,3C) <-> qkvr(3,B,NH,T,hs); y(B,NH,T,hs) <-> out(B,T,C) */
    dp_status (*attention_permute)(dp_device *dev, float *qkvr, const float *qkv, size_t B,
                                   size_t T, size_t NH, size_t hs);
    /* ... the same into a bfloat16 qkvr, each element rounded once */
    dp_status (*attention_permute_bf16)(dp_device *dev, uint16_t *qkvr, const float *qkv,
                                        size_t B, size_t T, size_t NH, size_t hs);
    dp_status (*attention_permute_backward)(dp_device *dev, float *dqkv, const float *dqkvr,
                                            size_t B, size_t T, size_t NH, size_t hs);
    dp_status (*attention_unpermute)(dp_device *dev, float *out, const float *y, size_t B,
                                     size_t T, size_t NH, size_t hs);
    dp_status (*attention_unpermute_backward)(dp_device *dev, float *dy, const float *dout,
                                              size_t B, size_t T, size_t NH, size_t hs);

    /* optional (NULL: none): C = op(A) op(B) + bias for one column-major
     * (m,n) matrix C (ldc in elements), alpha 1: the GEMM's float32 sums
     * in dev->matmul's precision, plus bias(m) (bias.p NULL: none) added
     * to every column in float32 by the GEMM's epilogue, then stored as
     * float32 or, with c_bf16, rounded to bfloat16 once (kernels/bf16.h's
     * rounding) - what bias_broadcast, gemm with beta = 1 (and
     * cast_f32_bf16) compute, without writing the broadcast bias (nor the
     * float32 matrix of a bfloat16 output): a linear layer's forward
     * (nn/linear.c, nn/nn_act16.h; m, n, k > 0). A backend may decline a
     * case its library cannot take (operand types, precision, no kernel):
     * it then returns DP_OK with *done = 0 and writes nothing, and the
     * caller composes; *done = 1 otherwise. */
    dp_status (*gemm_bias_out)(dp_device *dev, dp_op transa, dp_op transb, int m, int n, int k,
                               const dp_gemm_arg *A, const dp_gemm_arg *B, dp_pref bias, void *C,
                               int c_bf16, int ldc, int *done);

    /* optional (NULL: none): the GELU (kernels/gelu.h's tanh form) in the
     * GEMM's epilogue, bfloat16 operands and outputs in BF16 math; pre and
     * C are column-major (m,n) bfloat16 with the same ldc. Forward (dgelu
     * 0): pre = bf16(op(A) op(B) + bias) and C = bf16(GELU(op(A) op(B) +
     * bias)), both from the float32 sums (C is not the GELU of the rounded
     * pre); bias.p may be NULL. Backward (dgelu 1, bias.p NULL): C =
     * bf16(op(A) op(B) * GELU'(pre)), pre read, the float32 sums not
     * rounded before the product. The library's evaluation of the GELU, so
     * not the bits of the composition (gemm_bias_out, then the GELU and
     * its backward of kernels/gelu.h), only within its roundings
     * (tests/test_cuda_ops.c). Declines as gemm_bias_out (*done = 0,
     * nothing written); CUDA devices only with DP_CUDA_LT_GELU=1. */
    dp_status (*gemm_gelu)(dp_device *dev, dp_op transa, dp_op transb, int m, int n, int k,
                           const dp_gemm_arg *A, const dp_gemm_arg *B, dp_pref bias, int dgelu,
                           uint16_t *pre, uint16_t *C, int ldc, int *done);

    /* optional (NULL: none): the fused causal attention through a library
     * (cuDNN on CUDA devices, backend/cuda/cuda_sdpa.c) for a bfloat16
     * qkv(B,T,3C), read in place: what attention_fused_forward computes - out(B,T,C)
     * and lse(B,NH,T) with kernels/flash.h's meaning - with out's values
     * rounded to bfloat16 (the library's output type) and stored as they
     * are into a bfloat16 out, widened into a float32 one. The backward: what attention_fused_delta, _dq and _dkdv
     * write into dqkv(B,T,3C), rounded to bfloat16 likewise (and stored as
     * float32, or as they are into a bfloat16 dqkv), from dout and the
     * forward's lse and out (dout and out float32 or bfloat16). Either may
     * decline (DP_OK, *done = 0, nothing written): the caller runs the
     * kernels. */
    dp_status (*attention_lib_forward)(dp_device *dev, dp_pout out, float *lse,
                                       const uint16_t *qkv, size_t B, size_t T, size_t NH,
                                       size_t hs, float scale, int *done);
    dp_status (*attention_lib_backward)(dp_device *dev, dp_pout dqkv, dp_pref dout,
                                        const uint16_t *qkv, const float *lse, dp_pref out,
                                        size_t B, size_t T, size_t NH, size_t hs, float scale,
                                        int *done);
};

/* ops->gemm with float32 operands (dp_gemm_strided_batched's arguments). */
static inline dp_status dp_backend_sgemm(dp_device *dev, dp_op ta, dp_op tb, int m, int n, int k,
                                         float alpha, const float *A, int lda, long long sA,
                                         const float *B, int ldb, long long sB, float beta,
                                         float *C, int ldc, long long sC, int batch)
{
    dp_gemm_arg a = {A, 0, lda, sA}, b = {B, 0, ldb, sB};
    return dev->ops->gemm(dev, ta, tb, m, n, k, alpha, &a, &b, beta, C, ldc, sC, batch);
}

/* The CPU backend's table. */
const dp_backend_ops *dp_backend_cpu(void);

/* The CUDA backend is the CUDA module (libdp-cuda, core/module.h). */
struct dp_transport_ops;
typedef struct dp_cuda_module {
    dp_module_header hdr;
    const dp_backend_ops *ops;
    /* visible CUDA devices (0 without a GPU or driver), counted once */
    int (*count)(void);
    /* the NCCL transport (transport.h); NULL in builds without NCCL */
    const struct dp_transport_ops *nccl;
} dp_cuda_module;

/* The CUDA module, loaded on the first call (devlist.c): DP_OK, or
 * DP_ERR_NO_DEVICE with a message that names the build without CUDA or
 * the library that could not be loaded, and the fix. */
dp_status dp_backend_cuda(const dp_cuda_module **out);
/* Visible CUDA devices through the CUDA module; 0 when it is not built
 * or cannot be loaded. */
int dp_backend_cuda_count(void);

/* 1: the device's pointers are host addresses any thread may read (CPU), so
 * a collective can read a peer's buffer directly and nothing runs
 * asynchronously; 0 otherwise (and for NULL). */
int dp_device_is_host_memory(const dp_device *dev);

/*
 * A communication queue of dev: a second stream of work on dev's hardware,
 * beside the one dev's own entries queue on (PyTorch DDP's and llm.c's
 * communication stream), so the reduce-scatter's copies and sums can run
 * while dev's backward still computes. *out is a dp_device of dev's kind
 * and index named "<dev> comm" that takes copies (d2d, peer), memset and
 * the element-wise entries on dev's memory; it allocates nothing and
 * runs no GEMM, nor host copies. Its work is ordered with dev's only
 * through dp_device_order and the peer copies' events: a copy from
 * another device onto it waits for the source's queued work, but the
 * source's later work does not wait for the copy, so the caller must not
 * write a source again before dp_device_synchronize(*out). Close it with
 * dp_device_close_comm before dev.
 * *out is NULL (DP_OK) where the backend has no such queue: CPU devices,
 * whose entries complete as they are called; CUDA devices unless
 * DP_CUDA_OVERLAP=1 in the environment (the overlap on GPUs is new and
 * off until a GPU session has shown it bitwise and faster).
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL), DP_ERR_OUT_OF_MEMORY,
 * DP_ERR_DEVICE (the stream or event could not be made).
 */
DP_MODULE_API dp_status dp_device_open_comm(dp_device *dev, dp_device **out);
DP_MODULE_API void dp_device_close_comm(dp_device *comm);

/* Work queued on `then` from now on waits for all the work queued on
 * `first` so far (one kind; no-op where entries complete as called). */
DP_MODULE_API dp_status dp_device_order(dp_device *first, dp_device *then);

#endif /* DP_BACKEND_H */
