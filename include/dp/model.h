/*
 * dp/model.h - what a model must provide to be trained by the engine, and
 * the criterion (loss) interface.
 *
 * A model is a plain description plus stateless callbacks. The engine owns
 * every replica's state: a flat parameter buffer (n_params elements of
 * param_dtype, the tensors pointed into it at the offsets the model
 * gives), a float32 gradient buffer with the identical layout, and a
 * workspace for activations sized by workspace_bytes(rows) before the
 * step starts (llm.c's layout). The callbacks may be called concurrently
 * from several worker threads, each with its own device and buffers, so
 * they must not write to ctx.
 */
#ifndef DP_MODEL_H
#define DP_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "dp/device.h"
#include "dp/dtype.h"
#include "dp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Alignment of every tensor in the flat buffer, in elements (256 bytes of
 * float32, 128 of bfloat16). */
#define DP_PARAM_ALIGN 64

/* The largest step count a run records: the optimizer's t
 * (dp_engine_set_optimizer_state) and a checkpoint's step and
 * optimizer_step. 2^62 leaves a long room to count on without wrapping;
 * larger counts are refused where they enter. */
#define DP_MAX_STEP (1L << 62)

/* A replica's flat parameter buffer as the callbacks receive it: read the
 * member of the model's param_dtype, f32 (DP_DTYPE_F32) or bf16
 * (DP_DTYPE_BF16). Device memory, like every buffer the callbacks get. */
typedef union dp_params {
    const float *f32;
    const dp_bf16 *bf16;
} dp_params;

/* One parameter tensor inside the flat buffer. */
typedef struct dp_param_tensor {
    const char *name;  /* e.g. "transformer.h.0.attn.c_attn.weight"; owned by the model */
    size_t offset;     /* in elements from the start of the buffer, multiple of DP_PARAM_ALIGN */
    size_t numel;      /* elements */
    int ndim;          /* 1..4 */
    size_t shape[4];   /* row-major, product == numel */
    int weight_decay;  /* 1: AdamW/SGD weight decay applies to this tensor */
} dp_param_tensor;

/*
 * Targets. Each output row (outputs_per_row per input row) has target_size
 * target elements of one type:
 *   DP_TARGET_CLASS  int32 class ids in [0, n_classes), -1 = ignored;
 *                    target_size is 1 (cross-entropy). The default: a
 *                    zero-initialised model has class targets.
 *   DP_TARGET_F32    float values, NaN = ignored (e.g. regression with
 *                    dp_criterion_mse, soft labels); target_size defaults
 *                    to n_classes (one target per logit). +-Inf is refused.
 * A target row (per input row) is outputs_per_row * target_size elements,
 * dp_model_target_row_bytes(model) bytes, the same layout on host and
 * device. N, the count the loss is averaged over, is the number of VALID
 * target elements of the global batch: valid class ids for cross-entropy,
 * non-NaN values for MSE (PyTorch's MSELoss mean over elements). N always
 * counts target elements, never rows or logits: a loss averaged per row
 * has one target element per output row (target_size 1).
 */
typedef enum dp_target_type {
    DP_TARGET_CLASS = 0, /* int32 class ids, -1 = ignored */
    DP_TARGET_F32,       /* float32 values, NaN = ignored */
    DP_TARGET_TYPE_COUNT
} dp_target_type;

/* "DP_TARGET_CLASS" or "DP_TARGET_F32" (the names a program sets
 * dp_model.target_type with); "invalid target type" outside the enum. */
DP_API const char *dp_target_type_name(dp_target_type type);

/* A chunk of a batch on one device (device pointers; on a CPU device they
 * are host addresses the host may dereference, on a CUDA device they may
 * not be dereferenced by the host: use dp_copy_d2h or dp/ops.h). */
typedef struct dp_chunk {
    size_t rows;         /* examples (sequences) in the chunk, >= 1 */
    const void *inputs;  /* rows * input_row_bytes */
    const void *targets; /* rows * dp_model_target_row_bytes(model): int32 class ids for
                            DP_TARGET_CLASS (cast to const int32_t *), floats for DP_TARGET_F32;
                            NULL in dp_engine_predict of a batch without targets */
    /* Where and when the chunk runs, for layers whose result must not
     * depend on the split (dropout's mask, dp_dropout_forward in dp/nn.h:
     * pass row_begin times the output rows per example as its row0, step
     * and seed): */
    size_t row_begin; /* the index of the chunk's first row in the global batch (over every
                         device, micro-batch and rank) */
    uint64_t step;    /* optimizer steps taken before this one (dp_step_stats.step of the
                         previous step; 0 at the first) */
    uint64_t seed;    /* dp_engine_config.seed */
    int training;     /* 1 in dp_engine_step, 0 in dp_engine_evaluate and dp_engine_predict
                         (as PyTorch's model.train() / model.eval(): no dropout) */
    /* The engine's, for dp_grads_ready (below): set in the backward of a
     * training step, NULL elsewhere (and in a chunk made by hand). */
    struct dp_grads_signal *ready;
} dp_chunk;

/*
 * The gradient-ready signal (optional): a backward may tell the engine,
 * as it goes, that elements [begin, end) of the flat gradient buffer
 * (offsets in elements, as dp_param_tensor.offset) are final for this
 * call: it will not write them again. The engine may then reduce them
 * while the backward goes on (DDP's buckets, llm.c's per-layer
 * reduce-scatter); the results are bitwise what they are without the
 * signal, since every element's sum keeps its order. Ranges come back to
 * front, each once and contiguous: the first ends at n_params, each
 * later one ends where the previous began, as a backward that walks the
 * layers from the last one finishes them (the GPT signals its final
 * LayerNorm, then each block, then the embeddings). Whatever a backward
 * leaves unsignalled is final when it returns; a model that never calls
 * this is reduced after its backward, as before.
 * Only the call's own writes count: the engine orders the reads after
 * them (on a GPU, behind the work queued on the device so far).
 * With chunk->ready NULL (a backward called outside the engine, or in
 * dp_gpt_backward's way) it does nothing and returns DP_OK.
 * Errors: DP_ERR_INVALID_ARGUMENT for a NULL chunk, a copy of a chunk
 * used after its backward returned, a call from another thread than the
 * backward's (the sums run on the device bound to it; not recorded as a
 * refusal), or a range that is reversed, past
 * n_params, or does not end where the previous one began (out of order,
 * twice, overlapping); return it from backward: the engine fails the
 * step with it even when a backward does not, and nothing of the refused
 * range is reduced early.
 */
DP_API dp_status dp_grads_ready(const dp_chunk *chunk, size_t begin, size_t end);

typedef struct dp_model {
    void *ctx;              /* the model's configuration; read-only during training */
    size_t input_row_bytes; /* bytes of one input row (same layout on host and device) */
    size_t outputs_per_row; /* logit rows (and target rows) per input row: T for an LM, 1 for a
                               classifier or a regression */
    size_t n_classes;       /* logits per output row (vocabulary size V; outputs of a regression) */
    size_t n_params;        /* elements of the flat parameter buffer (incl. alignment padding) */
    size_t n_tensors;
    const dp_param_tensor *tensors; /* n_tensors entries, owned by the model */

    /* Writes initial parameters for a seed into host memory (n_params
     * floats). The buffer is zeroed before the call, so a model only writes
     * what is not zero (e.g. weights, not biases); padding must stay zero.
     * Deterministic in the seed. */
    dp_status (*init)(void *ctx, float *params_host, uint64_t seed);

    /* Optional (may be NULL): checks rows of host inputs before any device work
     * (e.g. token ids < V). Returns DP_ERR_INVALID_ARGUMENT with a message set
     * by dp_set_error (dp/status.h); the step fails with "validate_inputs:
     * <that message>". */
    dp_status (*validate_inputs)(void *ctx, const void *inputs_host, size_t rows);

    /* Bytes of activation workspace for a chunk of `rows` rows; may return 0
     * (a model that keeps no activations, e.g. a linear model): workspace may
     * then be NULL. */
    size_t (*workspace_bytes)(void *ctx, size_t rows);

    /* logits(rows * outputs_per_row, n_classes) = model(chunk), or the
     * head's input features for a model with a head (below). Activations
     * needed by backward stay in workspace. A failing callback returns a
     * dp_status and describes the problem with dp_set_error; the step then
     * fails with "<device> forward: <that message>". */
    dp_status (*forward)(void *ctx, dp_device *dev, dp_params params, const dp_chunk *chunk,
                         void *workspace, float *logits);

    /* grads += d loss / d params given dlogits (same shape as logits; the
     * features' gradient for a model with a head), after forward on the
     * same chunk and workspace. May clobber dlogits. */
    dp_status (*backward)(void *ctx, dp_device *dev, dp_params params, float *grads,
                          const dp_chunk *chunk, void *workspace, float *dlogits);

    /* Targets (see above). Zero-initialised: int32 class ids, one per output row. */
    dp_target_type target_type;
    size_t target_size; /* target elements per output row; 0 = the type's default */

    /*
     * Optional: the output head, split off so that the engine never holds a
     * device's whole logits (chunked cross-entropy, as Liger Kernel's fused
     * linear cross-entropy). Set head_features and both callbacks, or none.
     * With a head:
     *   forward        writes the head's input, features (n, head_features)
     *                  floats, n = rows * outputs_per_row, where it would
     *                  write logits;
     *   head_forward   logits(m, n_classes) = head(features(m, head_features))
     *                  for any m >= 1 consecutive output rows; keeps nothing
     *                  (no workspace);
     *   head_backward  grads += d loss / d (head parameters), and writes
     *                  (overwrites) dfeatures(m, head_features), from
     *                  dlogits(m, n_classes) and the same features; may
     *                  clobber dlogits;
     *   backward       receives dfeatures (n, head_features) where it would
     *                  receive dlogits.
     * In balanced mode and in evaluation the engine then runs head,
     * criterion and head backward over chunks of output rows
     * (dp_engine_config.logits_chunk_rows), in row order, so a device holds
     * one chunk's logits (written over by their gradient) plus the features
     * and their gradient, instead of (n, n_classes) logits. Gather mode
     * gathers whole logits on the root, as nn.DataParallel does.
     * Errors: as forward ("<device> criterion: <message>").
     */
    size_t head_features; /* features per output row, the head's input width (C) */
    dp_status (*head_forward)(void *ctx, dp_device *dev, dp_params params,
                              const float *features, size_t m, float *logits);
    dp_status (*head_backward)(void *ctx, dp_device *dev, dp_params params, float *grads,
                               const float *features, size_t m, float *dlogits,
                               float *dfeatures);

    /*
     * The replicas' parameter type (mixed precision, as Megatron's
     * distributed optimizer and llm.c keep it): DP_DTYPE_F32 (the
     * zero-initialised default; the callbacks read params.f32) or
     * DP_DTYPE_BF16 (they read params.bf16, n_params bfloat16 values).
     * With BF16 every replica holds its parameters as bfloat16, half the
     * bytes, and the all-gather moves half as much; the gradients stay
     * float32, and so does the optimizer: each slice's owner keeps a
     * float32 master copy of its slice with its moments, updates it, and
     * rounds the result into the replicas (dp_bf16_from_float). init, the
     * host side of dp_engine_get/set_params and checkpoints see the
     * float32 master weights, so a run saved in one type resumes in the
     * other.
     */
    dp_dtype param_dtype;

    /*
     * Class targets only: the class ids a target may take, [0,
     * target_classes); 0 (the zero-initialised default) = n_classes. A
     * model whose logits are wider than its classes sets it: the GPT with
     * a padded vocabulary (dp_gpt_config.vocab_pad) has n_classes = Vp
     * logits per row, of which the last Vp - V are -inf and never a
     * target. The engine refuses a target in [target_classes, n_classes)
     * as it refuses one past n_classes, before any device work; such a
     * target would otherwise give an infinite loss. At most n_classes.
     */
    size_t target_classes;

    /*
     * Optional, with a head: the head with bfloat16 logits (llm.c's fused
     * classifier). head_forward_bf16 is head_forward writing logits(m,
     * n_classes) as bfloat16 (uint16_t bits, rounded once); scratch is the
     * engine's device memory for values on their way (scratch_floats
     * floats, at least n_classes + m * head_features; contents
     * unspecified).
     * head_backward_bf16 is head_backward reading bfloat16 dlogits(m,
     * n_classes). The engine calls them instead of head_forward and
     * head_backward in balanced mode and evaluation when the criterion
     * takes bfloat16 logits (dp_criterion.bf16_logits): every logits
     * chunk then crosses the criterion and the head's backward GEMMs in
     * half the bytes. Gather mode and predictions keep the float32 head.
     * Set both or neither. Errors: as head_forward.
     */
    dp_status (*head_forward_bf16)(void *ctx, dp_device *dev, dp_params params,
                                   const float *features, size_t m, uint16_t *logits,
                                   float *scratch, size_t scratch_floats);
    dp_status (*head_backward_bf16)(void *ctx, dp_device *dev, dp_params params, float *grads,
                                    const float *features, size_t m, const uint16_t *dlogits,
                                    float *dfeatures);

    /*
     * 1: for chunks of the same rows, the callbacks' device work is the
     * same every step, whatever the batch holds: the same kernels with the
     * same arguments on the same buffers (the engine's params, grads,
     * workspace, chunk inputs and targets, logits, features). They read
     * neither dp_chunk.step nor dp_chunk.seed, and none waits for the
     * device, reads a result on the host, copies host memory or
     * allocates. The engine may then record a device's compute phase once
     * and replay it (CUDA graphs, DP_CUDA_GRAPHS=1; with a criterion that
     * says the same, dp_criterion.replayable). A call that breaks the rule
     * while recorded fails the recording, and the step runs as it would
     * without graphs. Zero-initialised: never recorded.
     */
    int replayable;
} dp_model;

/* Target elements per output row: target_size, or its default (1 for
 * DP_TARGET_CLASS, n_classes for DP_TARGET_F32). */
DP_API size_t dp_model_target_size(const dp_model *model);

/* Bytes of one input row's targets: outputs_per_row * dp_model_target_size
 * * 4 (int32 or float32). 0 for a NULL model or when it overflows. */
DP_API size_t dp_model_target_row_bytes(const dp_model *model);

/*
 * The loss, as the engine calls it: once per micro-batch per device in
 * balanced mode (and in evaluation), once per micro-batch on the root over
 * every device's gathered rows in gather mode.
 *
 * What the criterion gets (dp_criterion_args, all pointers on a->dev):
 *   logits   (n, V) floats, n = output rows of the chunk (rows *
 *            outputs_per_row), V = n_classes.
 *   targets  n * target_size elements of target_type (the model's).
 *   dlogits  NULL in evaluation (loss only). Otherwise (n, V) floats the
 *            criterion must write in full: dscale * d(loss sum)/d(logits),
 *            0 where the target is ignored. In balanced mode dlogits ALIASES
 *            logits (same pointer: read a logit before writing its
 *            gradient); in gather mode it is a separate buffer, zeroed.
 *   dscale   1/N for the GLOBAL batch's N (valid target elements of the
 *            whole batch on all devices, all micro-batches and accumulation
 *            steps), in both modes: summing every call's gradients gives the
 *            gradient of the global mean loss.
 *   n_valid  the valid target elements in this call's targets, counted by
 *            the engine (-1 class ids and NaN values excluded).
 *   scratch  scratch_bytes(n, V) bytes of device memory, or NULL when that
 *            is 0 (or scratch_bytes is NULL). Contents unspecified.
 *   row_losses  NULL, or, for a criterion with writes_row_losses set and in
 *            balanced mode, n floats of device memory: the criterion writes
 *            each output row's loss there (0 for a row whose targets are all
 *            ignored) instead of *loss_sum_host, which the engine then does
 *            not read. The engine copies every row's loss back once, after
 *            the device's last micro-batch, and sums each call's rows in
 *            row order in double (so a criterion whose host sum is that
 *            same sum gives the same bits either way). Why: reading a sum
 *            on the host waits for the device, once per logits chunk; the
 *            rows let a GPU run the whole step ahead of its host thread.
 * What it returns (host memory):
 *   *loss_sum_host  the SUM (not the mean) of the per-element losses over
 *                   the valid targets; the engine divides the global sum by N
 *                   (not read when row_losses was given).
 *   *count_host     how many target elements it summed. The engine checks
 *                   it equals n_valid and fails the step with
 *                   DP_ERR_INVALID_ARGUMENT naming both counts otherwise
 *                   (e.g. a criterion that summed ignored targets), also
 *                   when the criterion leaves it unset.
 * Errors: return a dp_status with a message set by dp_set_error; the step
 * fails with "<device> criterion: <message>".
 * The callbacks may run concurrently on several worker threads (one per
 * device) and must not write to ctx.
 */
typedef struct dp_criterion_args {
    dp_device *dev;
    const float *logits;        /* (n, V) */
    float *dlogits;             /* (n, V), NULL in evaluation; may alias logits */
    const void *targets;        /* n * target_size elements of target_type */
    dp_target_type target_type;
    size_t target_size;         /* target elements per output row */
    size_t n;                   /* output rows */
    size_t V;                   /* logits per output row */
    size_t n_valid;             /* valid target elements among the n * target_size */
    float dscale;               /* 1 / N of the global batch */
    void *scratch;              /* scratch_bytes(n, V) bytes, or NULL */
    float *row_losses;          /* (n), or NULL: see above */
    /* DP_DTYPE_F32 (zero-initialised), or DP_DTYPE_BF16 for a criterion
     * with bf16_logits set: logits and dlogits (in place, as above) then
     * hold bfloat16 bits; read and write them through (uint16_t *). */
    dp_dtype logits_dtype;
} dp_criterion_args;

typedef struct dp_criterion {
    void *ctx;
    /* Optional (may be NULL = no scratch): bytes of device scratch for n
     * output rows of V logits. */
    size_t (*scratch_bytes)(void *ctx, size_t n, size_t V);
    dp_status (*forward_backward)(void *ctx, const dp_criterion_args *a, double *loss_sum_host,
                                  size_t *count_host);
    /* The targets it accepts; dp_engine_create refuses a model whose
     * target_type differs. Zero-initialised: class ids. */
    dp_target_type target_type;
    /* 1: forward_backward writes per-row losses to args->row_losses when
     * the engine gives it (see above). Zero-initialised: it does not, and
     * the engine reads *loss_sum_host after each call. */
    int writes_row_losses;
    /* 1: forward_backward also takes bfloat16 logits and dlogits
     * (args->logits_dtype), so a model with head_forward_bf16 gives it
     * those. Zero-initialised: float32 logits only. */
    int bf16_logits;
    /* 1: with writes_row_losses, forward_backward's device work for the
     * same n, V and count of valid targets is the same every call, as
     * dp_model.replayable says of a model's (its *loss_sum_host is then
     * not read). Zero-initialised: never recorded. */
    int replayable;
} dp_criterion;

/* The bundled softmax cross-entropy criterion (dp_crossentropy_forward_backward):
 * DP_TARGET_CLASS targets, loss sum = sum over valid rows of
 * -log softmax(logits)[target]; it writes row losses (writes_row_losses). */
DP_API dp_criterion dp_criterion_cross_entropy(void);

/* The bundled mean-squared-error criterion (PyTorch's MSELoss, reduction
 * "mean"): DP_TARGET_F32 targets of the logits' shape (target_size ==
 * n_classes), loss sum = sum over the valid elements of (logit - target)^2,
 * summed in double in element order; the engine divides by N, the valid
 * elements of the batch. The model's target_size must be n_classes (its
 * default for float targets), else the step fails naming both. A NaN
 * target ignores its element (a row of NaNs ignores the row): it adds
 * nothing to the loss and its gradient is 0.
 * Works on every device kind (host loops on CPU devices; staged through the
 * host in chunks on others). */
DP_API dp_criterion dp_criterion_mse(void);

/* Checks a criterion against a model: forward_backward set and the target
 * types equal (dp_engine_create calls it). Errors: DP_ERR_INVALID_ARGUMENT
 * naming the mismatch. */
DP_API dp_status dp_criterion_validate(const dp_criterion *criterion, const dp_model *model);

/* Checks a model description: non-zero sizes, callbacks present, tensors
 * aligned, inside n_params, not overlapping, shapes matching numel, a
 * known target type (class targets: target_size 0 or 1), a head given
 * whole or not at all.
 * Errors: DP_ERR_INVALID_ARGUMENT naming the first bad tensor. */
DP_API dp_status dp_model_validate(const dp_model *model);

#ifdef __cplusplus
}
#endif

#endif /* DP_MODEL_H */
