/*
 * transport/dist_internal.h - the bootstrap's operations (dp/dist.h), not
 * installed: what the ranks use to join (parallel/ranks.c) and what the
 * MPI and NCCL transports are built on. Implemented over MPI
 * (dist_mpi.c) or, in a build without MPI, for one rank (dist_none.c).
 *
 * Every call is collective over the handle's ranks unless it says
 * otherwise, is made from the thread that opened the handle, and waits at
 * most timeout seconds (0: no limit) before failing with DP_ERR_TIMEOUT
 * naming what it waited for; the job must then end (an MPI request cannot
 * be taken back), so the engine marks itself unusable.
 */
#ifndef DP_DIST_INTERNAL_H
#define DP_DIST_INTERNAL_H

#include <stddef.h>

#include "dp/dist.h"

/* Reserves what the largest operation will need (data_bytes of data),
 * where a failure can still be agreed: the
 * operations themselves then allocate nothing, so none fails on one rank
 * alone. Not collective. */
dp_status dp_dist_reserve(dp_dist *d, size_t data_bytes);

/* Agreement with a payload: every rank's status and `bytes` of mine (may
 * be NULL: zeros) into all (R x bytes, may be NULL when bytes is 0). The
 * result is DP_OK on every rank, or the lowest failing rank's status with
 * its message prefixed "rank r: " on every rank. *lost is set when the
 * exchange itself failed (the ranks may no longer be in step). Allocates
 * nothing: a rank's part is on its stack, the answers in the scratch. */
dp_status dp_dist_agree_payload(dp_dist *d, double timeout, dp_status local, const void *mine,
                                void *all, size_t bytes, const char *what, int *lost);

/* In place on every rank's buf of esize-byte elements (4: float32, 2:
 * bfloat16): rank r's elements [begin[r], begin[r] + count[r]) go to
 * every other rank. */
dp_status dp_dist_allgatherv(dp_dist *d, void *buf, size_t esize, const size_t *begin,
                             const size_t *count, double timeout, const char *what);

/* Rank 0's bytes bytes of buf to every rank. */
dp_status dp_dist_bcast(dp_dist *d, void *buf, size_t bytes, double timeout, const char *what);

/* One message of a persistent set: bytes at ptr, to or from rank peer. */
typedef struct dp_dist_msg {
    int peer;
    void *ptr;
    size_t bytes;
} dp_dist_msg;

/* Persistent point-to-point requests (MPI_Send_init / MPI_Recv_init) on
 * buffers that stay where they are for the set's whole life: each run
 * starts every request and moves the bytes in place, copying nothing.
 * Messages past 1 GiB are cut in pieces; between a pair of ranks they
 * match in the order listed (MPI's non-overtaking rule; the tag keeps sets
 * of different kinds from matching each other's messages). A run that fails or
 * times out leaves its requests active, so the set is pinned: MPI may
 * still read or write the buffers, which must then never be freed (and
 * dp_dist_close leaves MPI as it is). */
typedef struct dp_dist_persist dp_dist_persist;
dp_status dp_dist_persist_create(dp_dist *d, int tag, const dp_dist_msg *sends, size_t n_sends,
                                 const dp_dist_msg *recvs, size_t n_recvs,
                                 dp_dist_persist **out);
dp_status dp_dist_persist_run(dp_dist_persist *p, double timeout, const char *what);
int dp_dist_persist_pinned(const dp_dist_persist *p);
/* Frees an unpinned set's requests; a pinned set is kept (and leaked). */
void dp_dist_persist_free(dp_dist_persist *p);

#endif /* DP_DIST_INTERNAL_H */
