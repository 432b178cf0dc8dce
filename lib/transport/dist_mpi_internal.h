/*
 * transport/dist_mpi_internal.h - what the MPI bootstrap's files share
 * (dist_mpi.c: joining, scratch and collectives; dist_persist.c: the
 * persistent request sets), the MPI module. Not installed; only in builds
 * with MPI.
 */
#ifndef DP_DIST_MPI_INTERNAL_H
#define DP_DIST_MPI_INTERNAL_H

#include <mpi.h>
#include <stdatomic.h>

#include "transport/dist_internal.h"

struct dp_mpi_dist {
    MPI_Comm comm;
    int rank, size;
    int owns_init; /* dp_dist_open initialised MPI, so close finalises it */
    int leaked;    /* memory of a request given up on could not be recorded */
    int pinned;    /* persistent requests given up on: MPI may still use their buffers */
    atomic_size_t bytes_sent;
    /* Every operation but the persistent sets works in this buffer (the
     * callers' data is copied in and out), reserved ahead
     * (dp_dist_reserve) where a failed allocation can still be agreed: an
     * allocation inside an operation that fails on one rank would leave
     * the others waiting for it. */
    unsigned char *scratch;
    size_t scratch_bytes;
};

/* The persistent sets (dist_persist.c), in the module's table. */
dp_status dp_mpi_dist_persist_create(dp_mpi_dist *d, int tag, const dp_dist_msg *sends,
                                     size_t n_sends, const dp_dist_msg *recvs, size_t n_recvs,
                                     dp_dist_persist **out);
dp_status dp_mpi_dist_persist_run(dp_dist_persist *p, double timeout, const char *what);
dp_status dp_mpi_dist_persist_start(dp_dist_persist *p, const char *what);
dp_status dp_mpi_dist_persist_test(dp_dist_persist *p, int *done, double since, double timeout,
                                   const char *what);
int dp_mpi_dist_persist_pinned(const dp_dist_persist *p);
void dp_mpi_dist_persist_free(dp_dist_persist *p);

/* Largest message: MPI counts are int; messages above this are split. */
#define DIST_MAX_MESSAGE ((size_t)1 << 30)

/* DP_ERR_COMM naming what, the MPI call and MPI's message for rc. */
dp_status dp_dist_mpi_fail(int rc, const char *call, const char *what);

/* Waits for n requests, polling until timeout seconds have passed (0: no
 * limit): DP_ERR_TIMEOUT then, naming what and this rank. The polling
 * sleeps a little once the first spins find nothing, so ranks sharing
 * cores leave them to the others. On failure the requests are still
 * active: the caller keeps their buffers from being reused. */
dp_status dp_dist_poll(const dp_mpi_dist *d, MPI_Request *req, int n, double timeout,
                       const char *what);

/* Reclaims what requests given up on held, where they have completed
 * since (a late peer's messages): every operation begins with it. */
void dp_dist_sweep(void);

/* The persistent sets' part of dp_dist_sweep: pinned sets whose requests
 * completed are unpinned. */
void dp_dist_persist_sweep(void);

/* Stops tracking d's pinned sets (dp_dist_close): they stay pinned, and
 * leaked, as nothing sweeps them after it. */
void dp_dist_persist_forget(const dp_mpi_dist *d);

#endif /* DP_DIST_MPI_INTERNAL_H */
