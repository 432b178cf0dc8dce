/*
 * transport/dist_internal.h - the bootstrap's operations (dp/dist.h), not
 * installed: what the ranks use to join (parallel/ranks.c) and what the
 * MPI and NCCL transports are built on. The core's dist.c implements them
 * for one rank, or calls the MPI module's table (libdp-mpi, dist_mpi.c,
 * core/module.h) for a handle that joined ranks over MPI.
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

#include "core/module.h"
#include "dp/dist.h"

/* Reserves what the largest operation will need (data_bytes of data),
 * where a failure can still be agreed: the
 * operations themselves then allocate nothing, so none fails on one rank
 * alone. Not collective. */
DP_MODULE_API dp_status dp_dist_reserve(dp_dist *d, size_t data_bytes);

/* Agreement with a payload: every rank's status and `bytes` of mine (may
 * be NULL: zeros) into all (R x bytes, may be NULL when bytes is 0). The
 * result is DP_OK on every rank, or the lowest failing rank's status with
 * its message prefixed "rank r: " on every rank. *lost is set when the
 * exchange itself failed (the ranks may no longer be in step). Allocates
 * nothing: a rank's part is on its stack, the answers in the scratch. */
DP_MODULE_API dp_status dp_dist_agree_payload(dp_dist *d, double timeout, dp_status local, const void *mine,
                                void *all, size_t bytes, const char *what, int *lost);

/* In place on every rank's buf of esize-byte elements (4: float32, 2:
 * bfloat16): rank r's elements [begin[r], begin[r] + count[r]) go to
 * every other rank. */
DP_MODULE_API dp_status dp_dist_allgatherv(dp_dist *d, void *buf, size_t esize, const size_t *begin,
                             const size_t *count, double timeout, const char *what);

/* Rank 0's bytes bytes of buf to every rank. */
DP_MODULE_API dp_status dp_dist_bcast(dp_dist *d, void *buf, size_t bytes, double timeout, const char *what);

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
/* The tags of persistent sets: the transport's rounds, all-gather and
 * returns are 1 to 3 (transport/mpi.c); dp_trace_gather's parts, 4. */
#define DP_DIST_TAG_TRACE 4
DP_MODULE_API dp_status dp_dist_persist_create(dp_dist *d, int tag, const dp_dist_msg *sends, size_t n_sends,
                                 const dp_dist_msg *recvs, size_t n_recvs,
                                 dp_dist_persist **out);
DP_MODULE_API dp_status dp_dist_persist_run(dp_dist_persist *p, double timeout, const char *what);
/* A run in two parts, so the caller works while the bytes move: start
 * starts every request; test sets *done once all completed, and fails
 * with DP_ERR_TIMEOUT when they have not and timeout seconds (0: no
 * limit) have passed since `since` (monotonic seconds, core/clock.h: when
 * the caller began to wait); the set is then pinned, as a failed run's.
 * A set that moves nothing is done at once. */
DP_MODULE_API dp_status dp_dist_persist_start(dp_dist_persist *p, const char *what);
DP_MODULE_API dp_status dp_dist_persist_test(dp_dist_persist *p, int *done, double since,
                                             double timeout, const char *what);
DP_MODULE_API int dp_dist_persist_pinned(const dp_dist_persist *p);
/* Frees an unpinned set's requests; a pinned set is kept (and leaked). */
DP_MODULE_API void dp_dist_persist_free(dp_dist_persist *p);

// --- the MPI module's table --------------------------------------------------------

/* A handle of the MPI module: ranks joined over MPI (dist_mpi.c). */
typedef struct dp_mpi_dist dp_mpi_dist;

/* The functions above and those of dp/dist.h over MPI, for a handle the
 * module opened; the core's wrappers (dist.c) check the arguments first. */
typedef struct dp_mpi_module {
    dp_module_header hdr;
    dp_status (*open)(int *argc, char ***argv, dp_mpi_dist **out);
    void (*close)(dp_mpi_dist *d);
    int (*rank)(const dp_mpi_dist *d);
    int (*size)(const dp_mpi_dist *d);
    size_t (*bytes_sent)(const dp_mpi_dist *d);
    void (*abort)(dp_mpi_dist *d, int code);
    dp_status (*agree_timeout)(dp_mpi_dist *d, dp_status local, double seconds);
    dp_status (*broadcast_timeout)(dp_mpi_dist *d, void *buf, size_t bytes, double seconds);
    dp_status (*reserve)(dp_mpi_dist *d, size_t data_bytes);
    dp_status (*agree_payload)(dp_mpi_dist *d, double timeout, dp_status local,
                               const void *mine, void *all, size_t bytes, const char *what,
                               int *lost);
    dp_status (*allgatherv)(dp_mpi_dist *d, void *buf, size_t esize, const size_t *begin,
                            const size_t *count, double timeout, const char *what);
    dp_status (*bcast)(dp_mpi_dist *d, void *buf, size_t bytes, double timeout,
                       const char *what);
    dp_status (*persist_create)(dp_mpi_dist *d, int tag, const dp_dist_msg *sends,
                                size_t n_sends, const dp_dist_msg *recvs, size_t n_recvs,
                                dp_dist_persist **out);
    dp_status (*persist_run)(dp_dist_persist *p, double timeout, const char *what);
    dp_status (*persist_start)(dp_dist_persist *p, const char *what);
    dp_status (*persist_test)(dp_dist_persist *p, int *done, double since, double timeout,
                              const char *what);
    int (*persist_pinned)(const dp_dist_persist *p);
    void (*persist_free)(dp_dist_persist *p);
} dp_mpi_module;

#endif /* DP_DIST_INTERNAL_H */
