/*
 * parallel/overlap.h - the reduce-scatter overlapped with the backward:
 * a model's dp_grads_ready signals (dp/model.h) move its worker's
 * watermark down the flat gradient buffer, and each slice's reducer sums
 * the part of its slice that every contributing device has finished
 * while the backward goes on, in pieces of at least the engine's bucket
 * (dp_engine_config.bucket_bytes; with ranks, the rounds, rounds.h). A reducer whose own
 * backward is done waits for the others' progress and sums as it comes;
 * what is left when every backward ended is summed by the reduce stage
 * (comm.h). Each element's sum keeps its order (comm.c), so the bits do
 * not depend on when a piece was summed.
 */
#ifndef DP_PARALLEL_OVERLAP_H
#define DP_PARALLEL_OVERLAP_H

#include "parallel/state.h"

/* The step's caller, before the step's job: decides whether this step's
 * reduce-scatter overlaps the backward (training, more than one device, a
 * bucket set, devices whose memory the host reads (CPU devices) or
 * that have a communication queue (worker.comm: CUDA devices with
 * DP_CUDA_OVERLAP=1 in one process); with ranks, a transport that starts rounds without waiting, whose rounds
 * are then the pieces, rounds.h), records it (engine.overlapping) and
 * returns it; for training, every watermark at n_params (nothing final)
 * and every slice unreduced. */
int dp_overlap_begin_step(dp_engine *e, int train);

/* compute.c, around one backward call of worker w: chunk->ready for the
 * call (last: the device's last backward of the step, whose signals make
 * ranges final) and, after it, the handle disabled and (report: the
 * backward returned DP_OK) a refusal it swallowed: DP_OK or the first
 * refused signal's status, its message set. */
void dp_overlap_arm(worker *w, dp_chunk *chunk, int last);
dp_status dp_overlap_disarm(worker *w, int report);

/* Worker w's gradient is final (its compute is done, or it had none):
 * the watermark to 0, the other reducers told. */
void dp_overlap_final(worker *w);

/* Worker w, its compute done: waits for the other devices' progress (in
 * the backward phase, as at a barrier) and reduces its slices as they
 * become final (in the reduce phase), until all are: the reduce stage
 * then has only the sums of squares left. Returns nonzero when the job
 * was aborted (another worker failed) or the reduce failed here (recorded
 * as CHECK does). */
int dp_overlap_drain(worker *w, const dp_plan *plan);

#endif /* DP_PARALLEL_OVERLAP_H */
