/*
 * transport/transport.h - what crosses between the ranks of a job, as one
 * small table of operations (docs/design.md section 8), not installed.
 *
 * The engine's step (parallel/step.c) is written once for any number of
 * ranks; everything that leaves this process goes through a transport:
 *   agree       every rank's outcome (and a payload) to every rank, the
 *               lowest failing rank's status on all; a bounded wait
 *   broadcast   rank 0's host bytes to every rank
 *   start/test  one round of the reduce-scatter, started and then
 *               tested for its end: each local device's piece of a slice
 *               summed on another rank goes to that rank's staging, or a
 *               sum to its owner (dp_xfer, listed by parallel/rounds.c by
 *               device)
 *   allgather   each rank's owned runs of a flat buffer to every rank: the
 *               host buffers of get_params and the optimizer state, and the
 *               replicas after the update
 *   close
 * The transports live in this folder, one file each: in-process (one rank,
 * inproc.c), MPI (host memory, mpi.c) and NCCL (GPU memory, nccl.c); the
 * list they are chosen from is in transport.c. A new one (TCP, UCX) is one
 * file defining its table, its line in that list and its source in
 * CMakeLists.txt.
 *
 * Ranks are joined before a transport exists (the bootstrap, dp/dist.h:
 * MPI, dist_internal.h); every call here is made from the thread that
 * drives the engine, and every wait ends within the transport's timeout
 * (0: none). An operation that fails in a way that leaves the ranks out of
 * step marks the transport lost (dp_transport_lost): the engine is then
 * unusable.
 */
#ifndef DP_TRANSPORT_TRANSPORT_H
#define DP_TRANSPORT_TRANSPORT_H

#include <stddef.h>

#include "backend/backend.h"
#include "dp/dist.h"
#include "dp/device.h"

/* The job's devices over its ranks, in global device order (rank-major):
 * rank r's devices are rank_first[r] .. rank_first[r + 1] - 1 of K, this
 * rank's g0 .. g0 + k - 1. One process: K = k, g0 = 0, nranks = 1. */
typedef struct dp_layout {
    size_t k, K, g0;
    int rank, nranks;
    size_t rank_first[DP_MAX_DEVICES + 1];
    float weights[DP_MAX_DEVICES]; /* per global device */
} dp_layout;

/* The rank of global device g. */
static inline int dp_layout_rank_of(const dp_layout *L, size_t g)
{
    int r = 0;
    while (r + 1 < L->nranks && g >= L->rank_first[r + 1]) r++;
    return r;
}

/* One message of a reduce-scatter round: local device `local` sends
 * `bytes` at ptr to global device `peer` (send), or receives them from it. */
typedef struct dp_xfer {
    size_t local;
    size_t peer;
    int send;
    void *ptr;
    size_t bytes;
} dp_xfer;

/* A run [begin, begin + count) of a flat buffer's elements whose slices
 * one global device owns. */
typedef struct dp_run {
    size_t begin, count;
    size_t owner;
} dp_run;

typedef struct dp_transport dp_transport;

/* What a transport may register once, at connect: the buffers and
 * messages every step moves, at addresses that stay put for the
 * engine's life (the arrays of this struct itself only during connect). */
typedef struct dp_transport_plan {
    dp_device *const *devs;       /* the k local devices */
    const dp_xfer *const *rounds; /* the reduce-scatter's rounds: every device's messages */
    const size_t *round_msgs;     /* messages per round */
    size_t n_rounds;
    /* rounds [n_forward, n_rounds) carry sums back to their owners: their
     * messages must never match a forward round's, as the two kinds start
     * in different orders on different ranks (unless in_order: then every
     * rank starts every round in one order) */
    size_t n_forward;
    /* where each local device's rounds run: its communication queue
     * (dp_device_open_comm), where the owners' sums run too, or the device
     * itself (a GPU transport orders them after the device's queued work) */
    dp_device *const *comms;
    void *const *replicas;        /* the k replicas, the all-gather's buffers */
    size_t esize;                 /* bytes per replica element: 4 float32, 2 bfloat16 */
    const dp_run *runs;           /* the owners' runs of the flat buffer */
    size_t n_runs;
    size_t max_bytes;             /* the largest other operation (broadcasts, host all-gathers) */
} dp_transport_plan;

/* A transport's table. Optional entries may be NULL: the wrappers below
 * supply what one rank needs (agree: the local outcome; the rest: nothing
 * to move). */
typedef struct dp_transport_ops {
    const char *name;
    /* Whether it joins nranks ranks whose devices are in host memory (1)
     * or not (0, GPUs). */
    int (*accepts)(int nranks, int host_memory);
    /* Floats of each slice per reduce-scatter round (0: one round). */
    size_t round_floats;
    /* Optional: *in_order = 1 when two ranks' messages match in the order
     * they were posted, whatever their round (NCCL has no tags): every
     * rank must then start the rounds, forward and return, in one order
     * (rounds.h). NULL: tagged, the forward rounds and the returns match
     * apart. Fails when the transport's setting is malformed. */
    dp_status (*in_order)(int *in_order);
    /* allgather_replicas fills every local replica (1) or local device
     * 0's, which the engine then copies to the others (0). */
    int fills_every_replica;
    /* After the devices are set up: joins them (NCCL), registers what
     * every step moves (plan) and reserves what the other operations need,
     * so no later operation allocates. */
    dp_status (*connect)(dp_transport *t, const dp_transport_plan *plan);
    /* Every rank's status and `bytes` of mine (may be NULL: zeros) into
     * all (nranks x bytes, may be NULL when bytes is 0); the result is
     * DP_OK everywhere or the lowest failing rank's status with its
     * message prefixed "rank r: ". Sets t->lost when the exchange itself
     * failed. */
    dp_status (*agree)(dp_transport *t, dp_status local, const void *mine, void *all,
                       size_t bytes, const char *what);
    dp_status (*broadcast)(dp_transport *t, void *buf, size_t bytes, const char *what);
    /* Round `round` of the reduce-scatter (the plan's messages of that
     * round) in two parts, so the rounds move while the devices compute
     * (parallel/rounds.c): start starts its messages and returns; test
     * sets *done once they completed, and fails with DP_ERR_TIMEOUT when
     * they have not and timeout seconds (0: no limit) have passed since
     * `since` (monotonic seconds: when this rank began to wait, which the
     * caller knows). Rounds are started in the same order on every rank
     * (in_order: every round). A transport with ranks has both. */
    dp_status (*start)(dp_transport *t, size_t round, const char *what);
    dp_status (*test)(dp_transport *t, size_t round, int *done, double since, double timeout,
                      const char *what);
    /* In place on every rank's host buffer of esize-byte elements: the
     * runs owned on each rank go to every other rank. */
    dp_status (*allgather_host)(dp_transport *t, void *buf, size_t esize, const dp_run *runs,
                                size_t n, const char *what);
    /* The same for the replicas bufs[0..k) (device memory, the plan's
     * replicas), see fills_every_replica. */
    dp_status (*allgather_replicas)(dp_transport *t, void *const *bufs, size_t esize,
                                    const dp_run *runs, size_t n, const char *what);
    /* 1 when an operation was given up on with buffers the transport
     * registered still in use (the engine must never free them). */
    int (*pinned)(const dp_transport *t);
    void (*close)(dp_transport *t);
} dp_transport_ops;

struct dp_transport {
    const dp_transport_ops *ops;
    void *impl;     /* the transport's own state */
    dp_dist *dist;  /* the bootstrap (NULL for one rank) */
    dp_layout L;
    double timeout; /* seconds per wait, 0: none */
    int lost;       /* an operation failed with the ranks out of step */
    int in_order;   /* ops->in_order's answer at open */
};

/* Chooses the transport for layout L (every rank chooses the same: the
 * ranks agreed on the device kind when they joined) and opens it.
 * Errors: DP_ERR_UNSUPPORTED when none in this build joins such devices
 * across ranks (the message names the fix). */
dp_status dp_transport_open(dp_transport *t, dp_dist *dist, const dp_layout *L,
                            int host_memory, double timeout);
void dp_transport_close(dp_transport *t);

dp_status dp_transport_connect(dp_transport *t, const dp_transport_plan *plan);
dp_status dp_transport_agree(dp_transport *t, dp_status local, const void *mine, void *all,
                             size_t bytes, const char *what);
dp_status dp_transport_broadcast(dp_transport *t, void *buf, size_t bytes, const char *what);
/* A round started (ops->start) and tested (done at once without ops->test:
 * one rank, nothing moves). */
dp_status dp_transport_start(dp_transport *t, size_t round, const char *what);
dp_status dp_transport_test(dp_transport *t, size_t round, int *done, double since,
                            double timeout, const char *what);
/* Whether the engine's registered buffers must never be freed (ops->pinned). */
int dp_transport_pinned(const dp_transport *t);
dp_status dp_transport_allgather_host(dp_transport *t, void *buf, size_t esize,
                                      const dp_run *runs, size_t n, const char *what);
dp_status dp_transport_allgather_replicas(dp_transport *t, void *const *bufs, size_t esize,
                                          const dp_run *runs, size_t n, const char *what);

/* Whether a transport moves anything between ranks at all (more than one
 * rank), whether it fills every replica, and its round size. */
static inline int dp_transport_spans_ranks(const dp_transport *t) { return t->L.nranks > 1; }
static inline int dp_transport_fills_every_replica(const dp_transport *t)
{
    return t->ops->fills_every_replica;
}
static inline size_t dp_transport_round_floats(const dp_transport *t) { return t->ops->round_floats; }
static inline int dp_transport_lost(const dp_transport *t) { return t->lost; }
/* Whether every rank must start every round in one order (ops->in_order). */
static inline int dp_transport_in_order(const dp_transport *t) { return t->in_order; }

#endif /* DP_TRANSPORT_TRANSPORT_H */
