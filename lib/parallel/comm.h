/*
 * parallel/comm.h - the collectives between this process's devices
 * (docs/design.md section 8), one function per collective: scatter of the
 * batch, gather of logits and scatter of their gradient (gather mode), gather
 * of predictions,
 * reduce-scatter of the gradients to the slice owners, all-gather of the
 * updated slices, broadcast of the root's parameters.
 *
 * Each is called by every worker of the job that needs it, from the
 * worker's own thread, between the barriers of the step (like an NCCL
 * rank calling its collective); "root" is device 0, the owner of a slice
 * is slice.owner (state.h). They copy with the backend's device-to-device
 * copies and add on the owner's device (its stream), always in global
 * device order, so results do not depend on thread timing. What crosses
 * between ranks goes through the transport (transport/transport.h); the
 * reduce-scatter adds the chunks it received like any other device's.
 */
#ifndef DP_PARALLEL_COMM_H
#define DP_PARALLEL_COMM_H

#include "parallel/state.h"

/* Floats per chunk of the reduce-scatter: what an owner stages at a time
 * (a running sum and one incoming chunk), so no device holds a
 * params-sized staging buffer. Small on host memory, where the only
 * buffer is the running sum and a loop costs nothing; larger on GPUs,
 * where each chunk is a copy and a kernel launch. */
#define DP_COMM_CHUNK_FLOATS_HOST ((size_t)1 << 14)
#define DP_COMM_CHUNK_FLOATS_DEVICE ((size_t)1 << 20)
/* With ranks, the chunk is the transport's round (round_floats): the
 * summer stages one chunk per device of the other ranks, twice (rounds.h). */
size_t dp_comm_chunk_floats(const dp_engine *e, const dp_device *owner);

/* Setup job, every worker, after the buffers of every worker exist: what
 * the collectives need for the slices this worker's device sums (their
 * summer, state.h), on its device: per slice a running sum when the
 * summer is not device 0, an incoming chunk on non-host devices, each at
 * most one chunk, and with ranks the other ranks' chunks.
 * dp_comm_teardown frees them. */
dp_status dp_comm_setup(worker *summer);
void dp_comm_teardown(dp_engine *e);
/* Where global device d's chunk of slice sl arrives from another rank,
 * in staging half `half` (rounds.h). */
float *dp_comm_remote_chunk(const dp_engine *e, const slice *sl, size_t d, int half);

/* Scatter of the batch: copies this worker's rows of the planned host
 * batch (inputs and targets) to its device (w->inputs, w->targets). */
dp_status dp_comm_scatter_batch(worker *w, const dp_plan *plan);

/* Gather of logits (gather mode, root only): the logits of micro-batch j
 * of every device, and their targets, into logits (rows x V floats on the
 * root) and targets (rows output rows of targets, dp_model_target_row_bytes
 * / outputs_per_row bytes each, on the root), in device order. rows is
 * dp_comm_gather_rows(e, plan, j). */
size_t dp_comm_gather_rows(const dp_engine *e, const dp_plan *plan, size_t j);
dp_status dp_comm_gather_logits(worker *root, const dp_plan *plan, size_t j, float *logits,
                                void *targets);

/* Scatter of dlogits (gather mode): worker w copies its rows of
 * micro-batch j (rows of them) from the root's gathered dlogits into
 * w->dlogits. */
dp_status dp_comm_scatter_dlogits(worker *w, const dp_plan *plan, size_t j, size_t rows);

/* Gather of predictions (gather mode, root only): every other local
 * device's outputs (its rows' logits, w->outputs) into the root's
 * outputs after the root's own rows, in device order. */
dp_status dp_comm_gather_outputs(worker *root, const dp_plan *plan);

/* Reduce-scatter in one process, worker w's part: for every slice it
 * reduces, the owner ends up with owner->grads[slice] = ((g_0 + g_1) +
 * g_2) + ... + g_{K-1} over the job's devices' gradients of the slice,
 * added in that order on the owner's device whoever the owner is (idle
 * devices d >= 1 are skipped: their gradient is zero), over the part
 * [begin, reduced_from) the overlap (overlap.h) has not reduced yet.
 * Other devices' gradient buffers are only read. */
dp_status dp_comm_reduce_scatter(worker *w, const dp_plan *plan);
/* Waits until the sums worker w queued for its slices are done: on the
 * owners' communication queues (worker.comm) their work runs beside the
 * devices' own, so every reducer calls this before its job ends, even
 * after a failure, and nothing reads a sum or writes a summed gradient
 * before. DP_OK, or the first queue's failure (every queue is waited for). */
dp_status dp_comm_settle(worker *w);
/* The same sum over the elements [from, to) of slice sl, on its reducer's
 * thread; with ranks, one round (rounds.h), starting at from, whose other
 * ranks' chunks arrived in staging half `half`. */
dp_status dp_comm_reduce_range(dp_engine *e, const dp_plan *plan, slice *sl, size_t from,
                               size_t to, int half);

/* All-gather of the parameters (the replicas' own type, bfloat16 or
 * float32): worker w's replica gets every slice it
 * does not own from the slice's owner on this rank, or (from_other_ranks)
 * every slice of another rank's owner from local device 0. */
dp_status dp_comm_allgather_params(worker *w, int from_other_ranks);

/* Broadcast of the parameters: this worker's replica = local device 0's
 * (no-op on it). */
dp_status dp_comm_broadcast_params(worker *w);

#endif /* DP_PARALLEL_COMM_H */
