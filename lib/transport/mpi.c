/*
 * transport/mpi.c - ranks whose devices are in host memory (CPU devices),
 * joined by MPI (transport.h). Every operation is one of the bootstrap's
 * nonblocking MPI calls polled against the transport's timeout
 * (dist_internal.h), made from the thread that drives the engine
 * (MPI_THREAD_FUNNELED).
 *
 * What every step moves goes without a copy: at connect each round of the
 * reduce-scatter, and the all-gather of the replicas, becomes a set of
 * persistent requests on the engine's own buffers (the devices' gradients,
 * the owners' staging, local device 0's replica), started each step. The
 * rest (agreements, broadcasts, host all-gathers) goes through the
 * bootstrap's scratch, copied in and out.
 */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "transport/dist_internal.h"
#include "transport/mpi.h"

/* Tags of the persistent sets: a round's messages never match the
 * all-gather's, nor a forward round's a return's (unless in order). */
enum { TAG_ROUND = 1, TAG_ALLGATHER = 2, TAG_RETURN = 3 };

/* DP_MPI_IN_ORDER=1: the returns share the forward rounds' tag, so two
 * ranks' messages match in the order posted whatever their round, as
 * NCCL's do; the CPU's check of the order the rounds start in, which the
 * NCCL transport relies on and no test could see on one GPU. */
static dp_status in_order(int *on)
{
    const char *v = getenv("DP_MPI_IN_ORDER");
    *on = v && strcmp(v, "1") == 0;
    if (!v || !*v || *on || strcmp(v, "0") == 0) return DP_OK;
    return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "DP_MPI_IN_ORDER is \"%.32s\": set it to 1 (the "
                   "rounds' messages match in the order posted, as NCCL's) or 0, or unset it", v);
}

/* The persistent requests, made once at connect. */
typedef struct mpi_state {
    dp_dist_persist **rounds; /* one set per round of the reduce-scatter */
    size_t n_rounds;
    dp_dist_persist *allgather; /* the owners' runs into local device 0's replica */
    void *replica;              /* that replica */
} mpi_state;

static int accepts(int nranks, int host_memory) { return nranks > 1 && host_memory; }

/* Round r's persistent requests: sends from the local devices' gradients,
 * receives into the owners' staging, each peer a rank. */
static dp_status round_set(dp_transport *t, const dp_xfer *m, size_t n, int tag,
                           dp_dist_persist **out)
{
    dp_dist_msg *msgs = malloc((n ? n : 1) * sizeof *msgs);
    if (!msgs) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
    size_t n_s = 0, n_r = n;
    for (size_t i = 0; i < n; i++) { /* sends from the front, receives from the back, in order */
        dp_dist_msg x = {dp_layout_rank_of(&t->L, m[i].peer), m[i].ptr, m[i].bytes};
        if (m[i].send) msgs[n_s++] = x;
    }
    for (size_t i = n; i-- > 0;)
        if (!m[i].send) msgs[--n_r] = (dp_dist_msg){dp_layout_rank_of(&t->L, m[i].peer), m[i].ptr,
                                                    m[i].bytes};
    dp_status s = dp_dist_persist_create(t->dist, tag, msgs, n_s, msgs + n_r, n - n_r, out);
    free(msgs);
    return s;
}

/* Each rank's owned runs are contiguous (the slices are, and a rank's
 * devices are consecutive in global order): rank r owns elements
 * [begin[r], begin[r] + count[r]) of a replica. */
static void rank_ranges(const dp_transport *t, const dp_run *runs, size_t n, size_t *begin,
                        size_t *count)
{
    for (int r = 0; r < t->L.nranks; r++) begin[r] = count[r] = 0;
    for (size_t i = 0; i < n; i++) {
        int r = dp_layout_rank_of(&t->L, runs[i].owner);
        if (!count[r]) begin[r] = runs[i].begin;
        count[r] = runs[i].begin + runs[i].count - begin[r];
    }
}

/* The all-gather into local device 0's replica buf: each rank's owned
 * range (contiguous) to every other rank, in place. */
static dp_status allgather_set(dp_transport *t, void *buf, size_t esize, const dp_run *runs,
                               size_t n, dp_dist_persist **out)
{
    int R = t->L.nranks, me = t->L.rank;
    size_t begin[DP_MAX_DEVICES], count[DP_MAX_DEVICES];
    rank_ranges(t, runs, n, begin, count);
    dp_dist_msg sends[DP_MAX_DEVICES], recvs[DP_MAX_DEVICES];
    size_t n_s = 0, n_r = 0;
    for (int r = 0; r < R; r++) {
        if (r == me) continue;
        if (count[me])
            sends[n_s++] = (dp_dist_msg){r, (unsigned char *)buf + begin[me] * esize,
                                         count[me] * esize};
        if (count[r])
            recvs[n_r++] = (dp_dist_msg){r, (unsigned char *)buf + begin[r] * esize,
                                         count[r] * esize};
    }
    return dp_dist_persist_create(t->dist, TAG_ALLGATHER, sends, n_s, recvs, n_r, out);
}

static dp_status connect(dp_transport *t, const dp_transport_plan *plan)
{
    mpi_state *st = calloc(1, sizeof *st);
    if (st) st->rounds = calloc(plan->n_rounds ? plan->n_rounds : 1, sizeof *st->rounds);
    if (!st || !st->rounds) {
        free(st);
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
    }
    t->impl = st;
    for (size_t r = 0; r < plan->n_rounds; r++) {
        int tag = r < plan->n_forward || t->in_order ? TAG_ROUND : TAG_RETURN;
        DP_TRY(round_set(t, plan->rounds[r], plan->round_msgs[r], tag, &st->rounds[r]));
        st->n_rounds = r + 1;
    }
    st->replica = plan->replicas[0];
    DP_TRY(allgather_set(t, st->replica, plan->esize, plan->runs, plan->n_runs, &st->allgather));
    return dp_dist_reserve(t->dist, plan->max_bytes);
}

static int pinned(const dp_transport *t)
{
    const mpi_state *st = t->impl;
    if (!st) return 0;
    for (size_t r = 0; r < st->n_rounds; r++)
        if (dp_dist_persist_pinned(st->rounds[r])) return 1;
    return dp_dist_persist_pinned(st->allgather);
}

static void close_mpi(dp_transport *t)
{
    mpi_state *st = t->impl;
    if (!st) return;
    for (size_t r = 0; r < st->n_rounds; r++) dp_dist_persist_free(st->rounds[r]);
    dp_dist_persist_free(st->allgather);
    free(st->rounds);
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

/* Both sides listed a round's messages in (slice, device) order at
 * connect and start the rounds of a kind in the same order (one tag per
 * kind; in order, every round in one order), so between a pair of ranks
 * they match in the order posted (MPI's non-overtaking rule). */
static dp_status start(dp_transport *t, size_t round, const char *what)
{
    mpi_state *st = t->impl;
    if (round >= st->n_rounds)
        return DP_FAIL(DP_ERR_INTERNAL, "%s: round %zu of %zu", what, round, st->n_rounds);
    return dp_dist_persist_start(st->rounds[round], what);
}

static dp_status test(dp_transport *t, size_t round, int *done, double since, double timeout,
                      const char *what)
{
    mpi_state *st = t->impl;
    return dp_dist_persist_test(st->rounds[round], done, since, timeout, what);
}

/* One range per rank (rank_ranges). */
dp_status dp_mpi_allgather_host(dp_transport *t, void *buf, size_t esize, const dp_run *runs,
                                size_t n, const char *what)
{
    size_t begin[DP_MAX_DEVICES], count[DP_MAX_DEVICES];
    rank_ranges(t, runs, n, begin, count);
    return dp_dist_allgatherv(t->dist, buf, esize, begin, count, t->timeout, what);
}

/* Into local device 0's replica (the registered one), in place; the
 * engine copies it to the others. */
static dp_status allgather_replicas(dp_transport *t, void *const *bufs, size_t esize,
                                    const dp_run *runs, size_t n, const char *what)
{
    mpi_state *st = t->impl;
    if (bufs[0] != st->replica)
        return DP_FAIL(DP_ERR_INTERNAL, "%s: not the replica registered at connect", what);
    return dp_dist_persist_run(st->allgather, t->timeout, what);
}

const dp_transport_ops dp_transport_mpi = {
    .name = "MPI",
    .accepts = accepts,
    .round_floats = (size_t)1 << 18,
    .in_order = in_order,
    .fills_every_replica = 0,
    .connect = connect,
    .agree = dp_mpi_agree,
    .broadcast = dp_mpi_broadcast,
    .start = start,
    .test = test,
    .allgather_host = dp_mpi_allgather_host,
    .allgather_replicas = allgather_replicas,
    .pinned = pinned,
    .close = close_mpi,
};
