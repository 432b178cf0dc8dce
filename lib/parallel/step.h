/*
 * parallel/step.h - the step (docs/design.md section 5), written once for
 * one process and for R ranks as a list of stages: work on the devices
 * (jobs on the worker pool) and exchanges, where the transport carries
 * what crosses between the ranks and every decision (the gradient norm,
 * skipping, the replica check) is made once, from the same numbers on
 * every rank.
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

/* The forward of the planned batch e->plan (dp_engine_predict) on every
 * rank, its logits kept in each worker's outputs (compute.h). */
dp_status dp_step_predict(dp_engine *e);

/* The replicas re-synchronised outside a step (engine.needs_sync): from
 * local device 0 (from_root: after set_params; with ranks every rank's
 * device 0 holds rank 0's values then), or from the slices' owners (after
 * a failed update or a diverged replica; bf16 replicas are first rounded
 * from the owners' masters). */
dp_status dp_step_resync(dp_engine *e, int from_root);

#endif /* DP_PARALLEL_STEP_H */
