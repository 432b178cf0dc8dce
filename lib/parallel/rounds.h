/*
 * parallel/rounds.h - the reduce-scatter between the ranks as rounds that
 * move beside the workers' jobs (docs/design.md section 8).
 *
 * A round is one piece of one slice, at most the transport's round_floats
 * long: every local device's piece goes to the slice's owner when that is
 * on another rank, and the owner's rank receives the piece of every other
 * rank's device into the slice's staging (comm.h). The rounds are cut back
 * to front, the last slice's last piece first: the order in which a
 * backward makes the gradient final (dp_grads_ready), and the order in
 * which every rank starts them, so between two ranks the messages match in
 * the order posted. The returns (a sum to an owner on another rank) match
 * apart from them (their own tag), or, with a transport that matches every
 * message in the order posted (NCCL), every rank starts the forward rounds
 * and the returns in one order fixed at setup (rounds.c's sequence).
 *
 * The caller's thread (the only one that calls the transport) starts each
 * round once this rank's part can go: its sends once every local device's
 * gradient of the piece is final (the watermarks, overlap.h); its
 * receives once the round before it in the same staging half was summed.
 * It tests the rounds in flight and marks them arrived; the slice's
 * reducer sums an arrived round (comm.c) and marks it reduced. This runs
 * while a job does (dp_pool_run_beside): the compute job when the
 * reduce-scatter overlaps the backward, else the reduce job. Each
 * element's sum is formed as without rounds, in global device order, so
 * the bits do not depend on when a round moved.
 *
 * A rank whose job failed still starts and completes every round
 * (dp_rounds_finish), so no rank waits for it; what its owners summed is
 * thrown away at the next agreement.
 */
#ifndef DP_PARALLEL_ROUNDS_H
#define DP_PARALLEL_ROUNDS_H

#include "parallel/state.h"

/* At setup, with ranks: the rounds and their messages (e->rounds,
 * e->xfers; every device sends, an idle one its zeroed gradient, which the
 * owner skips), for the transport to register. */
dp_status dp_rounds_setup(dp_engine *e);

/* The caller, before a training step's first job: no round moved yet. */
void dp_rounds_begin_step(dp_engine *e);

/* The caller, while a job runs (dp_pool_run_beside's beside, arg the
 * engine): starts what may start and tests what is in flight, waking the
 * reducers (the barrier's progress count) when a round arrived. Returns
 * how long to wait for the workers' progress before calling again
 * (INFINITY: until they make some), or -1 when every round arrived or
 * the transport failed (then recorded for dp_rounds_finish and the job
 * aborted, so no worker waits for a round). */
double dp_rounds_progress(void *engine);

/* The caller, after the job: every round not started is started (nobody
 * sums any more: a job that succeeded summed every round it receives),
 * and every round waited for. DP_OK, or the transport's failure (the
 * ranks are out of step: the engine is unusable). */
dp_status dp_rounds_finish(dp_engine *e);

/* After a training step: when this rank had rounds in flight (each that
 * moved something, from its start to its arrival, merged where they
 * overlap; phase DP_PHASE_REDUCE, seconds from origin), in time order
 * into out (e->n_rounds of room). Returns the count. */
size_t dp_rounds_spans(const dp_engine *e, double origin, dp_phase_span *out);

/* Worker w: sums the arrived rounds of the slices it reduces. *left:
 * whether some have not arrived yet. */
dp_status dp_rounds_reduce(worker *w, int *left);

#endif /* DP_PARALLEL_ROUNDS_H */
