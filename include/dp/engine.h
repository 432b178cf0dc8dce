/*
 * dp/engine.h - the DataParallel engine: one persistent thread per device.
 *
 * A step over a global batch (docs/design.md section 5, The step):
 *   plan      split rows over the k devices (contiguous, in order; see
 *             dp_engine_plan) and count N, the valid targets of the batch
 *   scatter   each worker copies its rows to its device
 *   forward   every replica runs the model on its chunk (micro-batches)
 *   criterion balanced: each device computes its loss sum and
 *             dlogits = d(loss sum)/d(logits) / N locally (the criterion
 *             contract: dp/model.h); gather: logits are
 *             copied to the root, which computes loss and dlogits for the
 *             whole batch and sends each device its slice (nn.DataParallel)
 *   backward  gradients accumulate into each replica's gradient buffer
 *   reduce    reduce-scatter: the flat gradient buffer is cut into k
 *             slices (see shard_optimizer) and each slice is summed on its
 *             owner in device order 0..k-1 (fixed order)
 *   optimizer the global norm is the sum, in slice order, of the owners'
 *             sums of squares; clipping and AdamW (or SGD) on each slice
 *             by its owner, with the owner's moments (and, for a model
 *             with bf16 replicas, dp_model.param_dtype, on the owner's
 *             float32 master weights, rounded into its replica)
 *   broadcast all-gather: each replica copies every slice it does not own
 *             from the slice's owner
 * Device 0 of the list is the root. By default it owns every slice (the
 * reduce-to-root design: all optimizer state on device 0); with
 * shard_optimizer each device owns one (ZeRO stage 1). The two modes give
 * bitwise identical losses, parameters and moments for a given k. Workers meet between phases at an
 * abortable barrier; a failing worker aborts it, every worker returns and
 * dp_engine_step reports the first failure by device index, naming device
 * and phase. The engine stays usable after a failed step.
 *
 * The loss is the global mean over valid targets for any split: on any
 * device count it is the same up to float rounding (~1e-7 relative, as the
 * per-device sums are added in a different grouping), and for the same
 * device count and split the whole run is bitwise reproducible.
 *
 * Threads: an engine serves one call at a time. Any thread may call it,
 * but calls on one engine must not overlap: a call made while another is
 * running on another thread (dp_engine_step, _evaluate, _predict,
 * _outputs, _outputs_to_host, _release_outputs, _set_lr,
 * _get/_set_params, _get/_set_optimizer_state) does nothing and returns
 * DP_ERR_BUSY at once; it never waits. dp_engine_plan, _num_devices,
 * _device and _model only read what create fixed and may be called at any
 * time. dp_engine_destroy must not overlap any other call on the engine.
 * Separate engines are independent. Error messages (dp_last_error) are
 * per thread.
 */
#ifndef DP_ENGINE_H
#define DP_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "dp/device.h"
#include "dp/dist.h"
#include "dp/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dp_mode {
    DP_MODE_BALANCED = 0, /* parallel criterion: logits and loss stay on their devices */
    DP_MODE_GATHER,       /* classic DataParallel: logits gathered on the root */
    DP_MODE_COUNT
} dp_mode;

typedef enum dp_optimizer {
    DP_OPTIMIZER_ADAMW = 0,
    DP_OPTIMIZER_SGD, /* with momentum (torch.optim.SGD semantics) */
    DP_OPTIMIZER_COUNT
} dp_optimizer;

typedef enum dp_phase {
    DP_PHASE_SCATTER = 0,
    DP_PHASE_FORWARD,
    DP_PHASE_CRITERION,
    DP_PHASE_BACKWARD,
    DP_PHASE_REDUCE,
    DP_PHASE_OPTIMIZER,
    DP_PHASE_BROADCAST,
    DP_PHASE_COUNT
} dp_phase;

/* "scatter", "forward", ...; "invalid phase" outside the enum. */
DP_API const char *dp_phase_name(dp_phase phase);
/* "balanced" or "gather"; "invalid mode" outside the enum. */
DP_API const char *dp_mode_name(dp_mode mode);

typedef struct dp_optim_config {
    dp_optimizer kind;
    float lr;           /* learning rate, finite and >= 0 (dp_engine_set_lr changes it) */
    float beta1, beta2; /* AdamW moments (0.9, 0.95 in nanoGPT) */
    float eps;          /* AdamW epsilon (1e-8) */
    float weight_decay; /* applied to tensors with weight_decay = 1; finite, >= 0 */
    float momentum;     /* SGD momentum */
    float grad_clip;    /* max global L2 norm (finite), 0 = no clipping */
} dp_optim_config;

/* Bounds of dp_engine_config.watchdog_seconds when it is not 0: a
 * millisecond (shorter cannot tell a hang from scheduling) to a million
 * seconds (11.6 days; longer is no watchdog at all). */
#define DP_WATCHDOG_MIN_SECONDS 1e-3
#define DP_WATCHDOG_MAX_SECONDS 1e6

typedef struct dp_engine_config {
    dp_mode mode;
    dp_optim_config optim;
    /* Relative share of rows per device (k floats >= 0, at least one > 0), or
     * NULL for equal shares. E.g. {0.5, 1, 1} gives the root half a chunk,
     * as Transformer-XL's gpu0_bsz. */
    const float *device_weights;
    /* 1: choose row boundaries so each device gets (by weight) about the same
     * number of VALID targets, for batches with ignored (-1) targets.
     * Anything but 0 or 1 is DP_ERR_INVALID_ARGUMENT. */
    int token_balanced;
    /* Micro-batching inside a device's chunk (0 = no limit): at most this many
     * rows, or rows * outputs_per_row tokens, per forward/backward. */
    size_t max_rows_per_micro;
    size_t max_tokens_per_micro;
    /* Gradient accumulation: each device processes its chunk in at least this
     * many micro-batches before the reduce (>= 1; 0 means 1). */
    int grad_accum;
    /* Per-device allocation limit in bytes (0 = none); see dp_device_set_limit. */
    size_t memory_limit;
    /* Seed for the model's initialisation. */
    uint64_t seed;
    /* Watchdog (0 = off): when no device enters a new phase for this many
     * seconds, the step fails with DP_ERR_TIMEOUT naming the device and
     * phase that made no progress, and every worker is called back. A
     * worker stuck inside a backend call that does not return within a
     * second watchdog period leaves the engine unusable (every later step,
     * evaluation and prediction fails with DP_ERR_TIMEOUT, as
     * dp_engine_usable does; dp_engine_destroy then waits for it).
     * With ranks it also bounds every wait for the other ranks, from the
     * exchange at create on (0: those waits have no limit).
     * 0, or DP_WATCHDOG_MIN_SECONDS to DP_WATCHDOG_MAX_SECONDS; anything
     * else (negative, NaN, Inf, 1e19) is DP_ERR_INVALID_ARGUMENT. */
    double watchdog_seconds;
    /* Replica consistency check (0 = off): every this many optimizer steps,
     * each device hashes its parameter replica after the all-gather and the
     * step fails with DP_ERR_INTERNAL naming the first device whose hash
     * differs from the root's (the replicas are re-synchronised from the
     * slice owners before the next step). Costs one pass over the parameters per device (plus a
     * device-to-host copy on GPUs). */
    long check_replicas_every;
    /* 1: let cuBLAS use TF32 tensor cores for the GEMMs on CUDA devices
     * (see dp_device_set_allow_tf32: faster, ~1e-3 relative error). No
     * effect on CPU devices. The same as matmul_precision DP_MATMUL_TF32.
     * Anything but 0 or 1 is DP_ERR_INVALID_ARGUMENT. */
    int allow_tf32;
    /* The arithmetic of every device's GEMMs (dp_device_set_matmul_precision):
     * DP_MATMUL_FP32 (default), DP_MATMUL_TF32 or DP_MATMUL_BF16 (operands
     * rounded to bfloat16, float32 sums: oneDNN on CPU devices, tensor
     * cores on CUDA devices). With a bf16 model (dp_model.param_dtype)
     * this makes the step's GEMMs bf16 math throughout, as llm.c and
     * PyTorch's autocast run them. allow_tf32 = 1 with another value than
     * FP32 or TF32 is DP_ERR_INVALID_ARGUMENT. */
    dp_matmul_precision matmul_precision;
    /* 0 (default): the root owns the optimizer state of every parameter
     * and updates them all. 1: the optimizer state is sharded over the
     * devices (ZeRO stage 1): device i owns slice i of the flat parameter
     * buffer, holds its moments, receives the reduced gradient of the
     * slice and updates it; the replicas then all-gather the slices.
     * Slice rule (both modes): with n = n_params floats and k devices,
     * slice i is [b_i, b_{i+1}) where b_i = floor(floor(n i / k) / 64) * 64
     * (DP_PARAM_ALIGN) and b_k = n: contiguous, in device order, each
     * within 64 floats of n / k (the last one takes the remainder; a slice
     * may be empty when n < 64 k). Same results as 0, bitwise; the
     * optimizer bytes per device are 2 x its slice (AdamW) instead of
     * 2 x n on the root. Anything but 0 or 1 is DP_ERR_INVALID_ARGUMENT. */
    int shard_optimizer;
    /* Output rows of logits per criterion call, for a model with a head
     * (dp_model.head_forward; the GPT has one): a micro-batch's n output
     * rows are cut into chunks of this many (the last one shorter), and a
     * device holds one chunk's logits at a time. 0 (default) = automatic:
     * max(ceil(n * head_features / n_classes), floor), i.e. a chunk's
     * logits about the size of the micro-batch's features, but no GEMM
     * smaller than the floor: DP_LOGITS_CHUNK_MIN_ROWS rows, or
     * DP_LOGITS_CHUNK_MIN_ROWS_GPU where any of the process's devices is a
     * GPU.
     * DP_LOGITS_WHOLE (or anything >= n): the whole micro-batch at once.
     * The chunking changes only the grouping of float sums (the loss sum
     * and the head's weight gradient): results match unchunked ones to
     * float rounding, and a given chunking is bitwise reproducible. Models
     * without a head and gather mode ignore it. */
    size_t logits_chunk_rows;
    /* Overlap of the reduce-scatter with the backward (CPU devices; CUDA
     * devices in one process with DP_CUDA_OVERLAP=1 in the environment at
     * create, which sums on a second stream per device; models that
     * signal with dp_grads_ready, dp/model.h): a slice's owner reduces
     * the signalled ranges of its slice while the backward goes on, in
     * pieces of at least this many bytes of gradient (PyTorch DDP's
     * bucket_cap_mb), and the rest when the last device's backward ends.
     * With ranks (MPI) the pieces are the reduce-scatter's rounds between
     * the ranks (1 MiB of each slice), sent as the backward makes them
     * final; any value other than DP_BUCKET_OFF turns that on.
     * 0: DP_BUCKET_DEFAULT_BYTES; DP_BUCKET_OFF: no overlap (the whole
     * reduce-scatter after every backward). Results are bitwise the same
     * for any value. */
    size_t bucket_bytes;
    /* The job's ranks (dp/dist.h), or NULL for one process. With R > 1
     * ranks the engine spans every rank's devices in global device order
     * (rank-major) and every call below except dp_engine_plan,
     * _num_devices, _device, _model, _outputs, _outputs_to_host,
     * _release_outputs and _set_lr (set the same rate on every rank) is
     * collective: every rank makes the same calls in the
     * same order, from the thread that opened the handle; a bad argument
     * on one rank fails the call on every rank. With CUDA devices (NCCL)
     * dp_engine_destroy is collective too. Every rank passes the same configuration (checked at create:
     * a difference is DP_ERR_INVALID_ARGUMENT naming the rank and field)
     * and its own devices and device_weights; gather mode across ranks,
     * and CUDA devices across ranks in a dp built without NCCL, are
     * DP_ERR_UNSUPPORTED. The global device count is at
     * most DP_MAX_DEVICES. Borrowed: it must outlive the engine. */
    const dp_dist *dist;
} dp_engine_config;

/* dp_engine_config.bucket_bytes: no overlap, and the default (measured
 * in docs/design.md's section on the overlap). */
#define DP_BUCKET_OFF SIZE_MAX
#define DP_BUCKET_DEFAULT_BYTES ((size_t)4 << 20)

/* dp_engine_config.logits_chunk_rows: one chunk per micro-batch. */
#define DP_LOGITS_WHOLE SIZE_MAX
/* The automatic chunk's smallest row count: below about this many rows a
 * GEMM re-reads the head's weight for too little work. */
#define DP_LOGITS_CHUNK_MIN_ROWS 256
/* The floor on GPUs, where the head's GEMM needs larger chunks to reach
 * the tensor cores' rate: GPT-2 small (V 50304, C 768, batch 8 x 1024) in
 * bf16 on an H200 ran 43.3 ms a step with 256-row chunks, 39.2 with 2048,
 * 38.8 with 4096 and 8192 (2048 rows cost 4 bytes a logit more: ~350
 * MiB at that vocabulary). */
#define DP_LOGITS_CHUNK_MIN_ROWS_GPU 2048

/* Sensible defaults: balanced, AdamW lr 1e-3 betas (0.9, 0.95) eps 1e-8,
 * weight decay 0.1, no clipping, equal shares, grad_accum 1, seed 1337,
 * automatic logits chunks. */
DP_API dp_engine_config dp_engine_config_default(void);

/* A global batch in host memory (read during the call only). */
typedef struct dp_batch {
    size_t rows;         /* >= 1 */
    const void *inputs;  /* rows * model->input_row_bytes */
    /* rows * dp_model_target_row_bytes(model) (dp/model.h): for class targets
     * (the default) rows * outputs_per_row int32 ids in [-1, n_classes), -1 =
     * ignored; for DP_TARGET_F32 rows * outputs_per_row * target_size floats,
     * NaN = ignored, +-Inf refused. At least one target must be valid. */
    const void *targets;
} dp_batch;

/* One stretch of a device's step between two phase changes (see
 * dp_device_step_stats.spans): the phase, when it began in seconds from the
 * step's start (dp_step_stats.start_seconds), and how long it lasted in
 * seconds of the device's time. */
typedef struct dp_phase_span {
    dp_phase phase;
    double start;
    double seconds;
} dp_phase_span;

typedef struct dp_device_step_stats {
    size_t rows;              /* rows of the global batch this device processed */
    size_t valid_targets;     /* valid targets in those rows */
    size_t micro_batches;     /* forward/backward passes this step */
    size_t in_use;            /* bytes allocated after the step */
    size_t peak;              /* bytes, high-water mark since the engine was created */
    size_t step_peak;         /* bytes, high-water mark during this step */
    size_t phase_peak[DP_PHASE_COUNT]; /* bytes, high-water mark within each phase */
    /* Seconds from the step's start (dp_step_stats.start_seconds) at which this
     * device first entered each phase, and how long it spent in it in all
     * (a phase repeated per micro-batch counts every pass; the time a device
     * waits at the barrier that ends a phase counts in that phase). The
     * seconds are the device's: events recorded on it as its thread enters
     * each phase, read once at the end of the step, so a GPU is never made
     * to wait between phases (on a CPU device, host time). In phase order the
     * starts never decrease, and start + seconds <= the step's seconds. A
     * phase the device did not run (the reduce, optimizer and broadcast of an
     * evaluation) has start and seconds 0. */
    double phase_start[DP_PHASE_COUNT];
    double phase_seconds[DP_PHASE_COUNT];
    size_t logits_bytes;      /* bytes held for logits and their gradient */
    size_t optimizer_bytes;   /* bytes of optimizer state on this device, for the slices it
                                 owns: the moments (AdamW: 2 x 4 bytes per parameter, SGD
                                 1 x) and, with bf16 replicas, the float32 masters (4 more) */
    size_t param_bytes;       /* bytes of the replica (4 or, bf16, 2 per parameter) and its
                                 float32 gradient (4 per parameter) */
    size_t reserved_bytes;    /* bytes the backend holds for itself (dp_memory_stats.reserved):
                                 CUDA's cuBLAS workspace and staging buffers, the GEMMs'
                                 conversion scratch in bf16; outside peak, inside the limit */
    /* The same time as it happened: n_spans stretches in the order the
     * device ran them, one per entry into a phase (per micro-batch's
     * forward, criterion and backward; each piece of the reduce-scatter
     * summed while the backward runs, between the backward's stretches),
     * timed as phase_seconds is. The phase_seconds of a phase is the sum of
     * its spans' seconds. On a GPU each job's first span starts when the
     * host recorded it (the device is idle between a step's jobs) and the
     * next ones follow by the device's elapsed time. Owned by the engine:
     * valid until its next step, evaluation or prediction, or its destroy
     * (dp_trace_add_step copies them). NULL and 0 where not recorded. */
    const dp_phase_span *spans;
    size_t n_spans;
    /* 1: this device's compute phase was a replay of a CUDA graph recorded
     * at an earlier step (DP_CUDA_GRAPHS=1 in the environment at create, a
     * dp_model.replayable model and a dp_criterion.replayable criterion;
     * docs/design.md): its forward phase then spans forward, criterion and
     * backward, which read 0. 0 otherwise. */
    int replayed;
} dp_device_step_stats;

typedef struct dp_step_stats {
    double loss;           /* global mean over valid targets */
    size_t valid_targets;  /* N */
    double grad_norm;      /* global L2 norm before clipping (0 for evaluate) */
    int skipped;           /* 1: the update was skipped (non-finite loss or gradient) */
    int skipped_device;    /* first device whose chunk gave a non-finite loss, or -1 (also
                              when only the summed gradient was non-finite); with ranks a
                              global device index */
    long step;             /* optimizer steps taken after this one */
    double seconds;        /* wall time of the step */
    double start_seconds;  /* when the step started (before the plan), seconds since the
                              engine was created */
    double phase_seconds[DP_PHASE_COUNT]; /* wall time of each phase: the longest
                                             any device spent in it */
    /* A training step's exposed communication: host seconds from the end
     * of this process's last backward to the first device's start of the
     * update, i.e. the reduce-scatter that the overlap
     * (dp_engine_config.bucket_bytes) did not hide, with ranks also the
     * exchanges and the norm's agreement; 0 in evaluation. On a GPU the
     * host runs ahead of the device, so it reads low. */
    double exposed_seconds;
    /* 1: this training step's reduce-scatter overlapped the backward
     * (dp_engine_config.bucket_bytes: two or more devices, a bucket set,
     * CPU devices, or CUDA devices in one process with DP_CUDA_OVERLAP=1
     * in the environment at create); 0 otherwise and in evaluation. */
    int overlapped;
    /* With ranks, a training step's exchanges: when this process had
     * rounds of the reduce-scatter in flight to or from the other ranks
     * (each round from its start to its arrival, as this process's
     * transport saw them, merged where they overlap), in time order;
     * phase DP_PHASE_REDUCE, start from start_seconds, host seconds. Beside
     * the devices' spans they show what the overlap hid. Owned by the
     * engine as the devices' spans are; NULL and 0 in one process, in
     * evaluation and where no round moved. */
    const dp_phase_span *exchange_spans;
    size_t n_exchange_spans;
    size_t n_devices;      /* this process's devices (with ranks, the others report theirs) */
    dp_device_step_stats devices[DP_MAX_DEVICES];
} dp_step_stats;

typedef struct dp_engine dp_engine;

/*
 * Creates the engine: opens the k devices, starts one worker thread per
 * device, allocates every replica's parameters and gradients (and the
 * optimizer state on its owners: the root, or each device its slice's with
 * shard_optimizer), initialises the parameters from cfg->seed and
 * broadcasts them. The model and criterion structs are copied; their
 * ctx must outlive the engine. The device list follows
 * dp_device_list_parse's rules: one kind, each CPU device at most once
 * (several logical devices may share one GPU: cuda:0,cuda:0).
 * Errors: DP_ERR_INVALID_ARGUMENT (bad config, model or device list, e.g.
 * cpu:0 twice), DP_ERR_NO_DEVICE,
 * DP_ERR_OUT_OF_MEMORY (the message names the device), DP_ERR_DEVICE.
 */
DP_API dp_status dp_engine_create(const dp_device_spec *devices, size_t k, const dp_model *model,
                                  const dp_criterion *criterion, const dp_engine_config *cfg,
                                  dp_engine **out);

/*
 * Stops the workers, frees every buffer and closes the devices. NULL ok.
 * Afterwards the handle dangles, as any freed pointer: using it, or
 * destroying it again, is undefined behaviour (set your pointer to NULL).
 * As a diagnostic only, every call checks a magic word in the engine on
 * entry and destroy overwrites it before freeing: while the freed memory
 * has not been reused, a second destroy does nothing and the other calls
 * return DP_ERR_INVALID_ARGUMENT ("... was destroyed ...") or 0 / NULL
 * (_num_devices, _device, _model) instead of crashing. Once the memory is
 * reused nothing can be promised, and AddressSanitizer rightly reports
 * the read as a use after free.
 */
DP_API void dp_engine_destroy(dp_engine *engine);

/*
 * One training step over a global batch. stats may be NULL.
 * Errors: DP_ERR_INVALID_ARGUMENT (empty batch, targets out of range, no
 * valid target, inputs the model rejects), DP_ERR_OUT_OF_MEMORY (a device's
 * limit; try a smaller batch or more micro-batches), DP_ERR_DEVICE, or a
 * worker's error; the message starts with "<device> <phase>:".
 * DP_ERR_BUSY: another call on this engine is running (nothing was done).
 * DP_ERR_TIMEOUT: the watchdog fired (see watchdog_seconds). DP_ERR_INTERNAL
 * from the replica check: the update was applied by the owners, a replica
 * differed and will be re-synchronised from them. A non-finite loss or gradient norm is
 * not an error: the step returns DP_OK with stats->skipped = 1 and nothing
 * updated (parameters, optimizer moments and the step count). After an
 * error nothing has been updated unless the failure was in the optimizer
 * or broadcast phase, in which case the replicas are re-synchronised from
 * the slice owners (the root, unless shard_optimizer) before the next step.
 */
DP_API dp_status dp_engine_step(dp_engine *engine, const dp_batch *batch, dp_step_stats *stats);

/* Loss of a batch without gradients or update (forward + criterion on every
 * device in parallel). stats->loss and stats->valid_targets are set.
 * Errors as dp_engine_step. */
DP_API dp_status dp_engine_evaluate(dp_engine *engine, const dp_batch *batch,
                                    dp_step_stats *stats);

/*
 * Predictions: the forward pass of a batch on every device (scatter,
 * forward, and for a model with a head the head over chunks of
 * logits_chunk_rows output rows, as evaluation runs it), no criterion,
 * no gradient, dropout off (dp_chunk.training = 0). The split is a
 * step's: device_weights, micro-batches (max_rows_per_micro,
 * max_tokens_per_micro, grad_accum) and, when batch->targets is given,
 * token_balanced, so each device's rows are those a step of the same
 * batch gives it (dp_engine_plan). batch->targets may be NULL (then the
 * split is by rows alone); when given they are checked as a step's, but
 * need not have a valid element.
 *
 * The outputs are the model's logits, (rows x outputs_per_row, n_classes)
 * float32 per device (float32 whatever param_dtype), and they stay where
 * they were computed:
 *   balanced  each device keeps the logits of its own rows: nothing is
 *             gathered. Device i holds rows_i x outputs_per_row x
 *             n_classes x 4 bytes (a GPT's 8 x 1024 tokens of a 50257-word
 *             vocabulary: 1.6 GB on each of its devices for 8 rows each;
 *             predict fewer rows per call to hold less).
 *   gather    nn.DataParallel's output gather: the root (device 0) ends up
 *             holding every local device's rows (the whole batch's logits),
 *             the others theirs as staging; dp_engine_outputs reports the
 *             root's rows alone.
 * Besides them a device needs a micro-batch's workspace (and features),
 * as in evaluation. The engine owns the outputs and keeps them, counted in
 * the devices' memory and their limit, until the next dp_engine_predict,
 * dp_engine_release_outputs or dp_engine_destroy; steps, evaluation and
 * the other calls leave them alone. A failed prediction leaves none.
 * With ranks dp_engine_predict is collective (every rank passes the same
 * batch) and each rank holds its own devices' rows.
 * Errors as dp_engine_evaluate (DP_ERR_OUT_OF_MEMORY names the device that
 * could not hold its outputs), DP_ERR_BUSY.
 */
DP_API dp_status dp_engine_predict(dp_engine *engine, const dp_batch *batch);

/* Where a device's predictions are (dp_engine_outputs). */
typedef struct dp_outputs {
    dp_device *device;    /* the device holding them: dp_engine_device(engine, i) */
    const float *logits;  /* memory of `device` (a CPU device's is host memory; read a CUDA
                             device's with dp_copy_d2h or dp/ops.h): rows x outputs_per_row x
                             n_classes floats, row-major, the batch's rows row_begin ..
                             row_begin + rows - 1 in order; NULL when rows is 0. Owned by
                             the engine, valid as long as the outputs are (above). */
    size_t row_begin;     /* the batch row (a global index, with ranks) of their first row */
    size_t rows;          /* input rows held: 0 for a device that got none, and in gather
                             mode for every device but the root */
} dp_outputs;

/* This process's device i's part of the last dp_engine_predict, into *out
 * (i < dp_engine_num_devices). Reads what the prediction left: no copy.
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL out, i out of range, no outputs:
 * no prediction since create or the last release, or it failed),
 * DP_ERR_BUSY. */
DP_API dp_status dp_engine_outputs(dp_engine *engine, size_t i, dp_outputs *out);

/* Copies the last prediction's logits to host memory in batch order: host
 * holds the batch's rows x outputs_per_row x n_classes floats, and row r's
 * go to host + r x outputs_per_row x n_classes. With ranks only the rows
 * of this process's devices are written (not collective: no rank waits;
 * combine them with your own all-gather if every rank needs all). Errors
 * as dp_engine_outputs, DP_ERR_DEVICE. */
DP_API dp_status dp_engine_outputs_to_host(dp_engine *engine, float *host);

/* Frees the outputs' device memory now (a prediction's outputs otherwise
 * stay until the next prediction). Not collective. Errors: DP_ERR_BUSY. */
DP_API dp_status dp_engine_release_outputs(dp_engine *engine);

/* Learning rate for the following steps (>= 0 and finite).
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL engine, NaN, Inf or negative lr;
 * the rate is unchanged), DP_ERR_BUSY. */
DP_API dp_status dp_engine_set_lr(dp_engine *engine, float lr);

/* Parameters to/from host memory (n_params floats; get reads each slice
 * from its owner: with bf16 replicas, the float32 masters). set broadcasts
 * to every replica (bf16: the masters take the values, the replicas their
 * rounding); it refuses (DP_ERR_INVALID_ARGUMENT, naming the index) a NaN
 * or Inf value, and for bf16 replicas a value whose rounding overflows
 * (|x| >= 3.39e38), and changes nothing then. Both: DP_ERR_BUSY. */
DP_API dp_status dp_engine_get_params(dp_engine *engine, float *host);
DP_API dp_status dp_engine_set_params(dp_engine *engine, const float *host);

/* Optimizer state: AdamW first/second moments (SGD: momentum in m, v
 * unused and may be NULL), n_params floats each in the flat parameter
 * layout whatever the sharding (gathered from / scattered to the slice
 * owners), and the step count t. State taken from an engine with any
 * device count and shard_optimizer setting fits any other engine of the
 * same model.
 * set leaves a moment given as NULL as it is (SGD: v is never read); it
 * refuses (DP_ERR_INVALID_ARGUMENT, changing nothing) t outside [0,
 * DP_MAX_STEP], a non-finite moment, or a negative second moment. Both:
 * DP_ERR_BUSY. */
DP_API dp_status dp_engine_get_optimizer_state(dp_engine *engine, float *m, float *v, long *t);
DP_API dp_status dp_engine_set_optimizer_state(dp_engine *engine, const float *m,
                                               const float *v, long t);

/* Whether the engine can still run steps: DP_OK, or DP_ERR_TIMEOUT when a
 * worker did not return after a watchdog timeout (dp_engine_destroy would
 * wait for it forever: a program may leave without destroying the engine)
 * or an exchange between the ranks left them out of step. Never waits
 * and claims nothing: call it after the call that failed. Errors:
 * DP_ERR_INVALID_ARGUMENT (NULL, or an engine destroyed). */
DP_API dp_status dp_engine_usable(const dp_engine *engine);

/* This process's devices (k), the job's devices over every rank (R x k,
 * or k without ranks), and the global index of this process's device 0
 * (its devices are first .. first + k - 1). */
DP_API size_t dp_engine_num_devices(const dp_engine *engine);
DP_API size_t dp_engine_num_global_devices(const dp_engine *engine);
DP_API size_t dp_engine_first_global_device(const dp_engine *engine);
DP_API dp_device *dp_engine_device(dp_engine *engine, size_t i);
DP_API const dp_model *dp_engine_model(const dp_engine *engine);

/*
 * The split of `rows` rows (targets as in dp_batch, may be NULL unless
 * token_balanced) over the engine's devices: rows_out[i] rows go to device
 * i, contiguous and in order; with ranks, over the job's global devices
 * (rows_out has dp_engine_num_global_devices entries). Equal shares: 7 rows on 3 devices are 3/2/2
 * (floor of the share, the remainder one row each to the first devices).
 * The shares add up to rows exactly. Errors: DP_ERR_INVALID_ARGUMENT
 * (NULL, a destroyed engine, rows past 2^53, whose shares a double cannot
 * hold), DP_ERR_OUT_OF_MEMORY (token_balanced's running counts).
 */
DP_API dp_status dp_engine_plan(const dp_engine *engine, size_t rows, const void *targets,
                                size_t *rows_out);

#ifdef __cplusplus
}
#endif

#endif /* DP_ENGINE_H */
