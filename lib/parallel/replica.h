/*
 * parallel/replica.h - the replica consistency check: every
 * check_replicas_every steps each worker hashes its parameter replica
 * after the all-gather, and every rank compares every replica's hash with
 * global device 0's.
 */
#ifndef DP_PARALLEL_REPLICA_H
#define DP_PARALLEL_REPLICA_H

#include "parallel/state.h"

/* Whether the step now running ends with a replica check (e->t counts the
 * steps before it). */
int dp_replica_check_due(const dp_engine *e);
/* Inside a job: hashes this worker's replica into w->param_hash (the test
 * hook flips a bit first). */
dp_status dp_replica_hash(worker *w);
/* The caller's thread, after the hashing job (local: its outcome): every
 * rank's hashes and outcomes to all. Returns the agreed outcome of the
 * hashing; when that is DP_OK, *check gets the comparison's: DP_OK, or
 * DP_ERR_INTERNAL naming the first replica whose hash differs from global
 * device 0's (the caller then re-synchronises the replicas). */
dp_status dp_replica_compare(dp_engine *e, dp_status local, dp_status *check);

#endif /* DP_PARALLEL_REPLICA_H */
