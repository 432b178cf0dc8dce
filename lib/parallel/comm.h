/*
 * parallel/comm.h - the collectives the engine moves data with (DESIGN.md
 * section 8), one function per collective.
 *
 * Each is called by every worker of the job that needs it, from the
 * worker's own thread, between the barriers of the step (like an NCCL
 * rank calling its collective); "root" is device 0. The in-process
 * implementation (comm.c) copies with the backend's device-to-device
 * copies and adds on the root's stream, always in device order 0..k-1, so
 * results do not depend on thread timing. Another implementation
 * (processes, NCCL) replaces comm.c alone.
 */
#ifndef DP_PARALLEL_COMM_H
#define DP_PARALLEL_COMM_H

#include "parallel/engine_internal.h"

/* Setup job, every worker: what the collectives need per worker (the
 * root-side staging buffer for its reduce slice on non-host devices).
 * Freed by dp_comm_teardown. */
dp_status dp_comm_setup(worker *w);
void dp_comm_teardown(worker *w);

/* Scatter of the batch: copies this worker's rows of the host batch
 * (inputs and targets) to its device (w->inputs, w->targets). */
dp_status dp_comm_scatter_batch(worker *w);

/* Gather of logits (gather mode, root only): the logits of micro-batch j
 * of every device, and their targets, into logits (rows x V floats on the
 * root) and targets (rows output rows of targets, dp_model_target_row_bytes
 * / outputs_per_row bytes each, on the root), in device order. rows is
 * dp_comm_gather_rows(e, j). */
size_t dp_comm_gather_rows(const dp_engine *e, size_t j);
dp_status dp_comm_gather_logits(worker *root, size_t j, float *logits, void *targets);

/* Scatter of dlogits (gather mode): worker w copies its rows of
 * micro-batch j (rows of them) from the root's gathered dlogits into
 * w->dlogits. */
dp_status dp_comm_scatter_dlogits(worker *w, size_t j, size_t rows);

/* Reduce to the slice owner: root grads[slice] += grads_d[slice] for
 * d = 1..k-1 in order, where slice is worker w's (idle devices skipped:
 * their gradient is zero). */
dp_status dp_comm_reduce_slice(worker *w);

/* All-reduce of the step's scalars: every worker gets the sums, in device
 * order, of the devices' loss sums and slice sums of squares. */
void dp_comm_allreduce_scalars(const worker *w, double *loss_sum, double *sumsq);

/* Broadcast of the parameters: this worker's replica = the root's (no-op
 * on the root). */
dp_status dp_comm_broadcast_params(worker *w);

#endif /* DP_PARALLEL_COMM_H */
