/*
 * parallel/optimizer.h - the optimizer's slices and state (optimizer.c).
 *
 * The flat buffer is cut into K contiguous slices, one per device of the
 * job; each slice's owner holds its moments (and, with bf16 replicas, its
 * float32 master weights), its reducer sums and updates it on the owner.
 */
#ifndef DP_PARALLEL_OPTIMIZER_H
#define DP_PARALLEL_OPTIMIZER_H

#include "parallel/state.h"

/* Cuts the flat buffer into K slices (the rule is in dp/engine.h,
 * shard_optimizer), names each slice's owner and reducer and splits the
 * slices by tensor into segments of one weight-decay setting. *out (K
 * slices) is the caller's, freed with dp_opt_free_state and free(). */
dp_status dp_opt_build_slices(const dp_engine *e, slice **out);
/* Allocates and zeroes the moments of the slices this worker's device
 * owns, on it (setup job). */
dp_status dp_opt_alloc_state(worker *owner);
void dp_opt_free_state(dp_engine *e);
/* Bytes of optimizer state held on local device d. */
size_t dp_opt_state_bytes(const dp_engine *e, size_t d);
/* The sum of squares of the reduced gradient of each slice this worker
 * reduces (on its owner). */
dp_status dp_opt_slice_sumsq(worker *w);
/* Clipping for the global norm and the update of the slices this worker
 * reduces (on their owners); with bf16 replicas the owner's float32 master
 * is updated and rounded into its replica. */
dp_status dp_opt_update_slice(worker *w, double grad_norm);
/* bf16 replicas: this worker's replica = bf16(master) over the slices its
 * device owns (before an all-gather that re-synchronises the replicas). */
dp_status dp_opt_refresh_replica(worker *owner);
/* bf16 replicas: the owners' masters <- host (n_params floats), or host <-
 * the masters of the slices this rank owns (to_host). */
dp_status dp_opt_move_masters(dp_engine *e, float *host_out, const float *host_in);
/* The caller's thread: the moments of the slices this rank owns, between
 * the host's flat m and v (n_params floats each; v may be NULL, and is
 * ignored for SGD) and the owners; get leaves the other ranks' ranges of
 * m and v untouched. */
dp_status dp_opt_get_state(dp_engine *e, float *m, float *v);
dp_status dp_opt_set_state(dp_engine *e, const float *m, const float *v);
/* The runs of consecutive slices with one owner (at most K) into runs;
 * returns how many: what an all-gather moves, one run per owner's range. */
size_t dp_opt_runs(const dp_engine *e, dp_run *runs);

#endif /* DP_PARALLEL_OPTIMIZER_H */
