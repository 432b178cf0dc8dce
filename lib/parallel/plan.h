/*
 * parallel/plan.h - planning a batch on the caller's thread, before any
 * device work: the split of rows over the job's devices (equal, weighted
 * or token-balanced), each device's micro-batches, and N, the valid target
 * elements. Pure functions of the batch, the configuration and the
 * layout; the result is a value (dp_plan) the step's phases read.
 */
#ifndef DP_PARALLEL_PLAN_H
#define DP_PARALLEL_PLAN_H

#include "parallel/state.h"

/* Checks a configuration and device list before anything is allocated. */
dp_status dp_plan_check_config(const dp_engine_config *cfg, const dp_device_spec *devices,
                               size_t k);

/* Checks batch b (targets in range, at least one valid, the model's
 * validate_inputs) and plans it into *plan. predict: targets are optional
 * (without them the split ignores token_balanced, N is 0) and need no
 * valid element. */
dp_status dp_plan_batch(const dp_engine *e, const dp_batch *b, int predict, dp_plan *plan);

/* Valid target elements (not -1 / NaN) of rows [first, first + rows) of a
 * host target array laid out as the engine's model says. */
size_t dp_plan_valid_targets(const dp_engine *e, const void *targets, size_t first, size_t rows);
/* The same over output rows [first, first + n) (rows x outputs_per_row of them). */
size_t dp_plan_valid_outputs(const dp_engine *e, const void *targets, size_t first, size_t n);
/* Output rows per logits chunk for a micro-batch of n output rows (a model
 * with a head; dp_engine_config.logits_chunk_rows), in [1, n]. */
size_t dp_plan_logits_chunk(const dp_engine *e, size_t n);

/* After a user callback (named by what) failed with s: keeps its
 * dp_set_error message, or records one saying it set none, and returns
 * s; a value outside dp_status becomes DP_ERR_INVALID_ARGUMENT, with a
 * message naming it. Call dp_clear_error() before the callback. */
dp_status dp_callback_message(dp_status s, const char *what);

#endif /* DP_PARALLEL_PLAN_H */
