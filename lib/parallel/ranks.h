/*
 * parallel/ranks.h - joining the ranks of a job at create: every rank
 * creates its engine with its own devices and the same configuration and
 * model (dp/dist.h); the layout of the job's devices comes out of it.
 */
#ifndef DP_PARALLEL_RANKS_H
#define DP_PARALLEL_RANKS_H

#include "parallel/state.h"

/* On every rank after the local checks: exchanges device counts, weights
 * and the configuration (e's cfg and model), and fails on every rank when
 * they disagree, naming the first field that differs; fills *L (K, g0,
 * rank_first, the global weights). The wait is bounded by the
 * configuration's watchdog_seconds when set. One process (dist NULL or
 * one rank): the local layout, nothing exchanged. */
dp_status dp_ranks_join(const dp_engine *e, dp_dist *dist, const dp_device_spec *devices,
                        size_t k, const float *weights, dp_layout *L);
/* A rank whose create failed before it had an engine: takes part in the
 * exchanges the others make before they learn of it (the join and the
 * agreement after the setup), then returns s. */
dp_status dp_ranks_create_failed(dp_dist *d, dp_status s);
/* The agreements of create (before the transport carries the ranks): the
 * lowest failing rank's outcome on every rank, waiting at most timeout
 * seconds (0: no limit). One rank: local. */
dp_status dp_ranks_agree(dp_dist *d, double timeout, dp_status local);

#endif /* DP_PARALLEL_RANKS_H */
