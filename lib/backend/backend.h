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
 * around the same functions. Shapes are as in dp/nn.h.
 */
#ifndef DP_BACKEND_H
#define DP_BACKEND_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "dp/device.h"

typedef struct dp_alloc_map {
    void **keys;  /* open addressing, NULL = empty, DP_ALLOC_TOMB = deleted */
    size_t *sizes;
    size_t cap;   /* power of two */
    size_t count; /* live entries */
    size_t used;  /* live + tombstones */
} dp_alloc_map;

typedef struct dp_backend_ops dp_backend_ops;

struct dp_device {
    const dp_backend_ops *ops;
    dp_device_kind kind;
    int index; /* backend index (cuda ordinal, cpu virtual index) */
    char name[32];
    void *ctx; /* backend state: stream, cuBLAS handle, staging buffers */

    pthread_mutex_t mu; /* guards the accounting below */
    size_t in_use, peak, peak_since_reset, limit;
    dp_alloc_map allocs;
};

struct dp_backend_ops {
    const char *name;
    /* 1: device pointers are host addresses any thread may read (CPU), so a
     * collective can read a peer's buffer directly instead of staging it. */
    int host_memory;

    /* lifecycle: open sets dev->ctx; close frees it */
    dp_status (*open)(dp_device *dev);
    void (*close)(dp_device *dev);
    dp_status (*bind_thread)(dp_device *dev);

    /* raw memory (accounting is done by the caller) */
    dp_status (*alloc)(dp_device *dev, size_t bytes, void **out);
    void (*free)(dp_device *dev, void *ptr);
    /* optional (NULL on CPU): driver free/total bytes */
    dp_status (*mem_info)(dp_device *dev, size_t *free_bytes, size_t *total_bytes);

    dp_status (*copy_h2d)(dp_device *dev, void *dst, const void *src, size_t bytes);
    dp_status (*copy_d2h)(dp_device *dev, void *dst, const void *src, size_t bytes);
    dp_status (*copy_d2d)(dp_device *dev, void *dst, const void *src, size_t bytes);
    dp_status (*copy_peer)(dp_device *dst_dev, void *dst, dp_device *src_dev, const void *src,
                           size_t bytes);
    dp_status (*memset)(dp_device *dev, void *dst, int value, size_t bytes);
    dp_status (*synchronize)(dp_device *dev);

    dp_status (*gemm_strided_batched)(dp_device *dev, dp_op transa, dp_op transb, int m, int n,
                                      int k, float alpha, const float *A, int lda,
                                      long long strideA, const float *B, int ldb,
                                      long long strideB, float beta, float *C, int ldc,
                                      long long strideC, int batch);

    /* ---- kernels (see dp/nn.h and lib/kernels/ (*.h)) ---- */
    dp_status (*encoder_forward)(dp_device *dev, float *out, const int32_t *inp,
                                 const float *wte, const float *wpe, size_t B, size_t T,
                                 size_t C);
    dp_status (*encoder_backward)(dp_device *dev, float *dwte, float *dwpe, const float *dout,
                                  const int32_t *inp, size_t B, size_t T, size_t C);
    /* out(N,OC)[i,:] = bias (broadcast rows; used before a beta=1 gemm) */
    dp_status (*bias_broadcast)(dp_device *dev, float *out, const float *bias, size_t N,
                                size_t OC);
    /* dbias(OC) += column sums of dout(N,OC), rows added in order */
    dp_status (*bias_backward)(dp_device *dev, float *dbias, const float *dout, size_t N,
                               size_t OC);
    dp_status (*layernorm_forward)(dp_device *dev, float *out, float *mean, float *rstd,
                                   const float *inp, const float *weight, const float *bias,
                                   size_t N, size_t C);
    dp_status (*layernorm_backward)(dp_device *dev, float *dinp, float *dweight, float *dbias,
                                    const float *dout, const float *inp, const float *weight,
                                    const float *mean, const float *rstd, size_t N, size_t C);
    dp_status (*gelu_forward)(dp_device *dev, float *out, const float *inp, size_t n);
    dp_status (*gelu_backward)(dp_device *dev, float *dinp, const float *inp,
                               const float *dout, size_t n);
    /* out = a + b */
    dp_status (*add)(dp_device *dev, float *out, const float *a, const float *b, size_t n);
    /* dst += src */
    dp_status (*accumulate)(dp_device *dev, float *dst, const float *src, size_t n);
    /* x *= s */
    dp_status (*scale)(dp_device *dev, float *x, float s, size_t n);
    /* *out_host = sum x^2 in double */
    dp_status (*sum_squares)(dp_device *dev, double *out_host, const float *x, size_t n);

    /* attention pieces: qkv(B,T,3C) <-> qkvr(3,B,NH,T,hs); y(B,NH,T,hs) <-> out(B,T,C) */
    dp_status (*attention_permute)(dp_device *dev, float *qkvr, const float *qkv, size_t B,
                                   size_t T, size_t NH, size_t hs);
    dp_status (*attention_permute_backward)(dp_device *dev, float *dqkv, const float *dqkvr,
                                            size_t B, size_t T, size_t NH, size_t hs);
    dp_status (*attention_unpermute)(dp_device *dev, float *out, const float *y, size_t B,
                                     size_t T, size_t NH, size_t hs);
    dp_status (*attention_unpermute_backward)(dp_device *dev, float *dy, const float *dout,
                                              size_t B, size_t T, size_t NH, size_t hs);
    /* att(BNH,T,T): in place, row t: softmax(scale * att[t, 0..t]), zeros after t */
    dp_status (*softmax_causal_forward)(dp_device *dev, float *att, float scale, size_t BNH,
                                        size_t T);
    /* datt(BNH,T,T) in place: from d(att) to d(pre-softmax scores) incl. scale */
    dp_status (*softmax_causal_backward)(dp_device *dev, float *datt, const float *att,
                                         float scale, size_t BNH, size_t T);

    /* losses(N) per row (0 for ignored), dlogits as dp_crossentropy_forward_backward */
    dp_status (*crossentropy)(dp_device *dev, float *losses, float *dlogits,
                              const float *logits, const int32_t *targets, size_t N, size_t V,
                              float dscale);

    dp_status (*adamw)(dp_device *dev, float *params, const float *grads, float *m, float *v,
                       size_t n, float lr, float beta1, float beta2, float eps,
                       float weight_decay, float bias_corr1, float bias_corr2);
    dp_status (*sgd)(dp_device *dev, float *params, const float *grads, float *momentum_buf,
                     size_t n, float lr, float momentum, float weight_decay, int first_step);
};

/* Backend tables. cuda is NULL in builds without CUDA. */
const dp_backend_ops *dp_backend_cpu(void);
const dp_backend_ops *dp_backend_cuda(void);

/* Visible CUDA devices through the CUDA backend (0 without). */
int dp_backend_cuda_count(void);

/* 1: the device's pointers are host addresses any thread may read (CPU), so
 * a collective can read a peer's buffer directly and nothing runs
 * asynchronously; 0 otherwise (and for NULL). */
int dp_device_is_host_memory(const dp_device *dev);

#endif /* DP_BACKEND_H */
