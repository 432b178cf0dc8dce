/*
 * transport/mpi.c - ranks whose devices are in host memory (CPU devices),
 * joined by MPI (transport.h). Every operation is one of the bootstrap's
 * nonblocking MPI calls polled against the transport's timeout
 * (dist_internal.h), made from the thread that drives the engine
 * (MPI_THREAD_FUNNELED).
 */
#include <stdlib.h>

#include "core/error.h"
#include "transport/dist_internal.h"
#include "transport/mpi.h"

/* The message lists of a round, made once at connect. */
typedef struct mpi_state {
    dp_dist_msg *sends, *recvs;
} mpi_state;

static int accepts(int nranks, int host_memory) { return nranks > 1 && host_memory; }

static dp_status connect(dp_transport *t, dp_device *const *devs, const dp_xfer *largest,
                         size_t n, size_t max_bytes)
{
    size_t K = t->L.K;
    mpi_state *st = calloc(1, sizeof *st);
    if (st) st->sends = malloc(2 * K * K * sizeof *st->sends);
    if (!st || !st->sends) {
        free(st);
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
    }
    st->recvs = st->sends + K * K;
    t->impl = st;
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++) bytes += largest[i].bytes;
    return dp_dist_reserve(t->dist, bytes > max_bytes ? bytes : max_bytes, n);
}

static void close_mpi(dp_transport *t)
{
    mpi_state *st = t->impl;
    if (st) free(st->sends);
    free(st);
}

dp_status dp_mpi_agree(dp_transport *t, dp_status local, const void *mine, void *all,
                       size_t bytes, const char *what)
{
    int lost = 0;
    dp_status s = dp_dist_agree_payload(t->dist, t->timeout, local, mine, all, bytes, what, &lost);
    if (lost) t->lost = 1;
    return s;
}

dp_status dp_mpi_broadcast(dp_transport *t, void *buf, size_t bytes, const char *what)
{
    return dp_dist_bcast(t->dist, buf, bytes, t->timeout, what);
}

/* Both sides list a round's messages in (slice, device) order, so between
 * a pair of ranks they match in the order posted. */
static dp_status exchange(dp_transport *t, const dp_xfer *m, size_t n, const char *what)
{
    mpi_state *st = t->impl;
    size_t n_s = 0, n_r = 0;
    for (size_t i = 0; i < n; i++) {
        dp_dist_msg x = {dp_layout_rank_of(&t->L, m[i].peer), m[i].ptr, m[i].bytes};
        if (m[i].send) st->sends[n_s++] = x;
        else st->recvs[n_r++] = x;
    }
    return dp_dist_exchange(t->dist, st->sends, n_s, st->recvs, n_r, t->timeout, what);
}

/* Each rank's owned runs are contiguous (the slices are, and a rank's
 * devices are consecutive in global order): one range per rank. */
dp_status dp_mpi_allgather_host(dp_transport *t, void *buf, size_t esize, const dp_run *runs,
                                size_t n, const char *what)
{
    size_t begin[DP_MAX_DEVICES] = {0}, count[DP_MAX_DEVICES] = {0};
    for (size_t i = 0; i < n; i++) {
        int r = dp_layout_rank_of(&t->L, runs[i].owner);
        if (!count[r]) begin[r] = runs[i].begin;
        count[r] = runs[i].begin + runs[i].count - begin[r];
    }
    return dp_dist_allgatherv(t->dist, buf, esize, begin, count, t->timeout, what);
}

/* Into local device 0's replica; the engine copies it to the others. */
static dp_status allgather_replicas(dp_transport *t, void *const *bufs, size_t esize,
                                    const dp_run *runs, size_t n, const char *what)
{
    return dp_mpi_allgather_host(t, bufs[0], esize, runs, n, what);
}

const dp_transport_ops dp_transport_mpi = {
    .name = "MPI",
    .accepts = accepts,
    .round_floats = (size_t)1 << 18,
    .fills_every_replica = 0,
    .connect = connect,
    .agree = dp_mpi_agree,
    .broadcast = dp_mpi_broadcast,
    .exchange = exchange,
    .allgather_host = dp_mpi_allgather_host,
    .allgather_replicas = allgather_replicas,
    .close = close_mpi,
};
