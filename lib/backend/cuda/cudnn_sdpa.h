/*
 * backend/cuda/cudnn_sdpa.h - the cuDNN attention module (libdp-cudnn,
 * core/module.h): cuDNN's fused scaled-dot-product attention, forward and
 * backward, for the CUDA backend's fused attention (cuda_sdpa.c).
 *
 * The module is C++ (cuDNN's frontend, NVIDIA's header-only C++ layer
 * over cuDNN's C graph API, cudnn_backend.h) behind this C table, so
 * libdp-cuda runs without cuDNN: it loads the module on first use and
 * falls back to its own kernels where the module or libcudnn.so.9 is
 * missing or a shape is declined.
 *
 * Layouts (row-major, bfloat16 unless said; C = NH * hs):
 *   qkv   (B, T, 3C)         q, k, v: c_attn's output, read in place
 *   o, do (B, T, C)          the attention's output and its gradient
 *   dqkv  (B, T, 3C)         the gradients of q, k, v at qkv's places
 *   lse   (B, NH, T) float32 per query row, max + log(sum exp) of the
 *                            scaled scores (natural log: cuDNN's "Stats",
 *                            kernels/flash.h's lse)
 * The mask is causal (query t sees keys 0..t), the scale is desc->scale,
 * and the backward is cuDNN's deterministic algorithm (the same bits on
 * every run).
 *
 * Every entry returns DP_SDPA_DONE, DP_SDPA_DECLINED (this cuDNN or GPU
 * cannot take the shape: nothing was queued, err says why) or
 * DP_SDPA_FAILED (err says what failed). No entry throws, prints or exits.
 * A context belongs to one device and stream and is used by one thread
 * at a time (the device's mutex).
 */
#ifndef DP_BACKEND_CUDA_CUDNN_SDPA_H
#define DP_BACKEND_CUDA_CUDNN_SDPA_H

#include <stddef.h>
#include <stdint.h>

#include "core/module.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { DP_SDPA_DONE = 0, DP_SDPA_DECLINED = 1, DP_SDPA_FAILED = -1 };

/* One attention call's shape: B sequences of T tokens, NH heads of hs. */
typedef struct dp_sdpa_desc {
    int64_t B, T, NH, hs;
    float scale; /* applied to q.k before the softmax (1/sqrt(hs)) */
} dp_sdpa_desc;

typedef struct dp_cudnn_module {
    dp_module_header hdr;
    /* A context on the calling thread's current device, whose work goes
     * to stream (a cudaStream_t). */
    int (*open)(void **ctx, void *stream, char *err, size_t n);
    void (*close)(void *ctx);
    /* The workspace bytes the forward (backward = 0) or backward (1) of
     * this shape needs; builds and keeps its plan. */
    int (*workspace)(void *ctx, const dp_sdpa_desc *d, int backward, size_t *bytes, char *err,
                     size_t n);
    /* o and lse from qkv. ws: workspace() bytes of device memory. */
    int (*forward)(void *ctx, const dp_sdpa_desc *d, const uint16_t *qkv, uint16_t *o,
                   float *lse, void *ws, char *err, size_t n);
    /* dqkv from qkv, o, do and the forward's lse. */
    int (*backward)(void *ctx, const dp_sdpa_desc *d, const uint16_t *qkv, const uint16_t *o,
                    const uint16_t *dout, const float *lse, uint16_t *dqkv, void *ws, char *err,
                    size_t n);
} dp_cudnn_module;

#ifdef __cplusplus
}
#endif

#endif /* DP_BACKEND_CUDA_CUDNN_SDPA_H */
