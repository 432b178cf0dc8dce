/*
 * dp/model.h - what a model must provide to be trained by the engine, and
 * the criterion (loss) interface.
 *
 * A model is a plain description plus stateless callbacks. The engine owns
 * every replica's state: a flat parameter buffer (n_params floats, the
 * tensors pointed into it at the offsets the model gives), a gradient
 * buffer with the identical layout, and a workspace for activations sized
 * by workspace_bytes(rows) before the step starts (llm.c's layout). The
 * callbacks may be called concurrently from several worker threads, each
 * with its own device and buffers, so they must not write to ctx.
 */
#ifndef DP_MODEL_H
#define DP_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "dp/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Alignment of every tensor in the flat buffer, in floats (256 bytes). */
#define DP_PARAM_ALIGN 64

/* One parameter tensor inside the flat buffer. */
typedef struct dp_param_tensor {
    const char *name;  /* e.g. "transformer.h.0.attn.c_attn.weight"; owned by the model */
    size_t offset;     /* in floats from the start of the buffer, multiple of DP_PARAM_ALIGN */
    size_t numel;      /* floats */
    int ndim;          /* 1..4 */
    size_t shape[4];   /* row-major, product == numel */
    int weight_decay;  /* 1: AdamW/SGD weight decay applies to this tensor */
} dp_param_tensor;

/* A chunk of a batch on one device (device pointers). */
typedef struct dp_chunk {
    size_t rows;            /* examples (sequences) in the chunk, >= 1 */
    const void *inputs;     /* rows * input_row_bytes */
    const int32_t *targets; /* rows * outputs_per_row; -1 = ignored */
} dp_chunk;

typedef struct dp_model {
    void *ctx;              /* the model's configuration; read-only during training */
    size_t input_row_bytes; /* bytes of one input row (same layout on host and device) */
    size_t outputs_per_row; /* logit rows (and targets) per input row: T for an LM, 1 for a classifier */
    size_t n_classes;       /* logits per output row (vocabulary size V) */
    size_t n_params;        /* floats in the flat parameter buffer (incl. alignment padding) */
    size_t n_tensors;
    const dp_param_tensor *tensors; /* n_tensors entries, owned by the model */

    /* Writes initial parameters for a seed into host memory (n_params floats;
     * padding must be zero). Deterministic in the seed. */
    dp_status (*init)(void *ctx, float *params_host, uint64_t seed);

    /* Optional (may be NULL): checks rows of host inputs before any device work
     * (e.g. token ids < V). Returns DP_ERR_INVALID_ARGUMENT with a message. */
    dp_status (*validate_inputs)(void *ctx, const void *inputs_host, size_t rows);

    /* Bytes of activation workspace for a chunk of `rows` rows. */
    size_t (*workspace_bytes)(void *ctx, size_t rows);

    /* logits(rows * outputs_per_row, n_classes) = model(chunk). Activations
     * needed by backward stay in workspace. */
    dp_status (*forward)(void *ctx, dp_device *dev, const float *params, const dp_chunk *chunk,
                         void *workspace, float *logits);

    /* grads += d loss / d params given dlogits (same shape as logits), after
     * forward on the same chunk and workspace. May clobber dlogits. */
    dp_status (*backward)(void *ctx, dp_device *dev, const float *params, float *grads,
                          const dp_chunk *chunk, void *workspace, float *dlogits);
} dp_model;

/*
 * The loss. forward_backward computes, for logits(n, V) and targets(n)
 * (-1 = ignored) on dev, *loss_sum_host = sum of per-row losses over valid
 * targets, and when dlogits is not NULL, dlogits = dscale * d(loss sum) /
 * d(logits) (dlogits may alias logits). scratch holds scratch_bytes(n, V)
 * bytes of device memory.
 */
typedef struct dp_criterion {
    void *ctx;
    size_t (*scratch_bytes)(void *ctx, size_t n, size_t V);
    dp_status (*forward_backward)(void *ctx, dp_device *dev, double *loss_sum_host,
                                  float *dlogits, const float *logits, const int32_t *targets,
                                  size_t n, size_t V, float dscale, void *scratch);
} dp_criterion;

/* The bundled softmax cross-entropy criterion (dp_crossentropy_forward_backward). */
DP_API dp_criterion dp_criterion_cross_entropy(void);

/* Checks a model description: non-zero sizes, callbacks present, tensors
 * aligned, inside n_params, not overlapping, shapes matching numel.
 * Errors: DP_ERR_INVALID_ARGUMENT naming the first bad tensor. */
DP_API dp_status dp_model_validate(const dp_model *model);

#ifdef __cplusplus
}
#endif

#endif /* DP_MODEL_H */
