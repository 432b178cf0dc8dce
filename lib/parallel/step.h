/*
 * parallel/step.h - the step (docs/design.md section 5), written once for
 * one process and for R ranks: jobs on the worker pool for what runs on
 * the devices, the transport for what crosses between the ranks, and
 * every decision (the gradient norm, skipping, the replica check) made
 * once, from the same numbers on every rank.
 */
#ifndef DP_PARALLEL_STEP_H
#define DP_PARALLEL_STEP_H

#include "parallel/state.h"

/* At create, s the outcome of the local preparation: the setup job (each
 * worker's replica, gradient, optimizer state and collective staging on
 * its device) when s is DP_OK, then the transport joins the devices; the
 * ranks agree on each outcome over the bootstrap d (NULL: one rank). */
dp_status dp_step_setup(dp_engine *e, dp_dist *d, dp_status s);

/* After dp_plan_batch (planned: its outcome): every rank planned the
 * same batch, or every rank fails naming the first that differs. */
dp_status dp_step_agree_plan(dp_engine *e, dp_status planned);

/* One training step (train) or evaluation of the planned batch e->plan
 * over every rank; *out gets the loss sums, the norm, the skip decision,
 * whether the update reached every replica (counted: set even when the
 * replica check then fails) and what the replicas need before the next
 * step (also on failure). */
dp_status dp_step_run(dp_engine *e, int train, dp_step_outcome *out);

/* Every replica of every rank = the slices' owners' parameters: the
 * all-gather of a step (in_step: its phase is entered and timed; hash:
 * each replica is then hashed and compared, *check getting the outcome of
 * the comparison), or a re-synchronisation. */
dp_status dp_step_allgather(dp_engine *e, int in_step, int hash, dp_status *check);

/* Every local replica = local device 0's (after set_params; with ranks
 * every rank's device 0 holds rank 0's values then). */
dp_status dp_step_broadcast(dp_engine *e);

/* bf16 replicas: each owner's replica = the rounding of its masters
 * (before an all-gather re-synchronises the others from them). */
dp_status dp_step_refresh(dp_engine *e);

#endif /* DP_PARALLEL_STEP_H */
