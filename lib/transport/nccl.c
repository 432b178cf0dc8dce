/*
 * transport/nccl.c - ranks whose devices are GPUs, joined by NCCL
 * (transport.h): one communicator over all K = R x k devices of the job,
 * NCCL rank = global device index. Agreements, broadcasts and host
 * all-gathers go over MPI (transport/mpi.h), which also carries NCCL's id.
 *
 * A round's sends and receives run on each device's communication queue
 * (the plan's comms: with DP_CUDA_OVERLAP=1, the queue the owners' sums
 * run on, so a round runs beside the backward; else dp's stream of the
 * device), after the work queued on the device so far, and an event per
 * device marks its end, which test polls: the caller starts a round and
 * goes on. The all-gather enqueues on dp's stream of each device between
 * the engine's jobs. Waits poll the events or streams and NCCL's
 * asynchronous errors against a deadline, so a rank that stops answering
 * becomes an error here instead of a hang; the communicators are then
 * aborted at close instead of destroyed.
 */
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "backend/cuda/cuda_native.h"
#include "core/clock.h"
#include "core/error.h"
#include "transport/dist_internal.h"
#include "transport/mpi.h"

typedef struct nccl_state {
    size_t k;
    dp_device **devs;
    dp_device **queues; /* where each device's rounds run (the plan's comms) */
    ncclComm_t *comm;
    /* the rounds' messages (the engine's, which stay put), and per round
     * and local device that takes part, an event recorded after its
     * messages */
    const dp_xfer **msgs;
    size_t *n_msgs;
    cudaEvent_t *done; /* n_rounds x k; NULL where the device has no message */
    size_t n_rounds;
    int failed; /* a wait failed or timed out: abort instead of destroy */
} nccl_state;

static dp_status nccl_fail(ncclResult_t r, const char *call, const char *what)
{
    const char *last = ncclGetLastError(NULL);
    return DP_FAIL(DP_ERR_COMM, "%s: %s failed: %s%s%s", what, call, ncclGetErrorString(r),
                   last && *last ? ": " : "", last ? last : "");
}

/* Sets the calling thread's device for NCCL calls that need it, and puts
 * the caller's back afterwards (dp never leaves the caller on another device). */
static int current(void)
{
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess) cur = -1;
    return cur;
}

static int accepts(int nranks, int host_memory) { return nranks > 1 && !host_memory; }

/* NCCL's sends and receives between two ranks match in the order posted:
 * no tags. */
static dp_status in_order(int *on)
{
    *on = 1;
    return DP_OK;
}

static void close_nccl(dp_transport *t);

/* Where the rounds' messages are, and an event per round and local
 * device that takes part in it, made on its GPU. */
static dp_status register_rounds(nccl_state *n, const dp_transport_plan *plan)
{
    n->n_rounds = plan->n_rounds;
    n->msgs = calloc(n->n_rounds ? n->n_rounds : 1, sizeof *n->msgs);
    n->n_msgs = calloc(n->n_rounds ? n->n_rounds : 1, sizeof *n->n_msgs);
    size_t n_ev = n->n_rounds * n->k;
    n->done = calloc(n_ev ? n_ev : 1, sizeof *n->done);
    if (!n->msgs || !n->n_msgs || !n->done)
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation of %zu rounds failed", n->n_rounds);
    int prev = current();
    dp_status s = DP_OK;
    for (size_t r = 0; s == DP_OK && r < n->n_rounds; r++) {
        size_t m = plan->round_msgs[r];
        n->msgs[r] = plan->rounds[r];
        n->n_msgs[r] = m;
        for (size_t i = 0; s == DP_OK && i < m; i++) {
            size_t d = plan->rounds[r][i].local;
            cudaEvent_t *ev = &n->done[r * n->k + d];
            if (*ev) continue;
            cudaError_t e = cudaSetDevice(dp_cuda_native_ordinal(n->devs[d]));
            if (e == cudaSuccess) e = cudaEventCreateWithFlags(ev, cudaEventDisableTiming);
            if (e != cudaSuccess) {
                *ev = NULL;
                s = DP_FAIL(DP_ERR_DEVICE, "%s: the rounds' events: %s", n->devs[d]->name,
                            cudaGetErrorString(e));
            }
        }
    }
    if (prev >= 0) cudaSetDevice(prev);
    return s;
}

/* Rank 0 makes the NCCL id, MPI broadcasts it, and each rank joins its k
 * devices (global indices g0 .. g0 + k - 1). */
static dp_status connect(dp_transport *t, const dp_transport_plan *plan)
{
    size_t k = t->L.k;
    dp_device *const *devs = plan->devs;
    ncclUniqueId id;
    if (t->L.rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess) return nccl_fail(r, "ncclGetUniqueId", "joining the GPUs");
    }
    DP_TRY(dp_dist_bcast(t->dist, &id, sizeof id, 0.0, "the NCCL id"));
    nccl_state *n = calloc(1, sizeof *n);
    if (!n) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
    t->impl = n;
    n->k = k;
    n->devs = calloc(k, sizeof *n->devs);
    n->queues = calloc(k, sizeof *n->queues);
    n->comm = calloc(k, sizeof *n->comm);
    if (!n->devs || !n->queues || !n->comm)
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
    for (size_t i = 0; i < k; i++) n->queues[i] = plan->comms[i] ? plan->comms[i] : devs[i];
    int prev = current();
    ncclResult_t r = ncclGroupStart();
    for (size_t i = 0; r == ncclSuccess && i < k; i++) {
        n->devs[i] = devs[i];
        if (cudaSetDevice(dp_cuda_native_ordinal(devs[i])) != cudaSuccess) break;
        r = ncclCommInitRank(&n->comm[i], (int)t->L.K, id, (int)(t->L.g0 + i));
    }
    ncclResult_t r2 = ncclGroupEnd();
    if (prev >= 0) cudaSetDevice(prev);
    if (r == ncclSuccess) r = r2;
    if (r != ncclSuccess) {
        n->failed = 1;
        return nccl_fail(r, "ncclCommInitRank", "joining the GPUs");
    }
    DP_TRY(register_rounds(n, plan));
    /* the host operations over MPI (get_params, the optimizer state) */
    return dp_dist_reserve(t->dist, plan->max_bytes);
}

static void close_nccl(dp_transport *t)
{
    nccl_state *n = t->impl;
    if (!n) return;
    /* Finalizing waits for every rank of the communicator, and this thread
     * holds k of them: finalize them in one group, then free them locally. */
    if (!n->failed && n->comm) {
        ncclGroupStart();
        for (size_t i = 0; i < n->k; i++)
            if (n->comm[i]) ncclCommFinalize(n->comm[i]);
        if (ncclGroupEnd() != ncclSuccess) n->failed = 1;
    }
    for (size_t i = 0; n->comm && i < n->k; i++) {
        if (!n->comm[i]) continue;
        if (n->failed) ncclCommAbort(n->comm[i]);
        else ncclCommDestroy(n->comm[i]);
    }
    for (size_t i = 0; n->done && i < n->n_rounds * n->k; i++)
        if (n->done[i]) cudaEventDestroy(n->done[i]);
    free(n->msgs);
    free(n->n_msgs);
    free(n->done);
    free(n->comm);
    free(n->queues);
    free(n->devs);
    free(n);
}

/* Waits until every local stream is idle, NCCL reports an error, or the deadline. */
static dp_status wait_streams(nccl_state *n, double timeout, const char *what)
{
    double deadline = timeout > 0 ? dp_now_seconds() + timeout : 0.0;
    int prev = current();
    dp_status s = DP_OK;
    for (;;) {
        size_t busy = 0;
        for (size_t i = 0; s == DP_OK && i < n->k; i++) {
            ncclResult_t async = ncclSuccess;
            ncclCommGetAsyncError(n->comm[i], &async);
            if (async != ncclSuccess) {
                s = nccl_fail(async, "an NCCL operation", what);
                break;
            }
            cudaSetDevice(dp_cuda_native_ordinal(n->devs[i]));
            cudaError_t q = cudaStreamQuery(dp_cuda_native_stream(n->devs[i]));
            if (q == cudaErrorNotReady) busy++;
            else if (q != cudaSuccess)
                s = DP_FAIL(DP_ERR_DEVICE, "%s on %s: %s", what, n->devs[i]->name,
                            cudaGetErrorString(q));
        }
        if (s != DP_OK || !busy) break;
        if (deadline > 0 && dp_now_seconds() > deadline) {
            s = DP_FAIL(DP_ERR_TIMEOUT, "%s: waited %.3g s (watchdog) for the GPUs of the other "
                        "ranks; one of them is stuck or gone, so the job must end", what, timeout);
            break;
        }
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
    if (prev >= 0) cudaSetDevice(prev);
    if (s != DP_OK) n->failed = 1;
    return s;
}

/* Round `round`'s messages as one group on each device's queue, after
 * the work queued on the device so far (the piece's final gradient; the
 * sums run on that queue already), then each device's event. The caller
 * returns at once: test sees the events. */
static dp_status start(dp_transport *t, size_t round, const char *what)
{
    nccl_state *n = t->impl;
    if (round >= n->n_rounds)
        return DP_FAIL(DP_ERR_INTERNAL, "%s: round %zu of %zu", what, round, n->n_rounds);
    const dp_xfer *m = n->msgs[round];
    cudaEvent_t *done = n->done + round * n->k;
    for (size_t i = 0; i < n->k; i++)
        if (done[i]) DP_TRY(dp_device_order(n->devs[i], n->queues[i]));
    int prev = current();
    ncclResult_t r = ncclGroupStart();
    const char *call = "ncclGroupStart";
    for (size_t i = 0; r == ncclSuccess && i < n->n_msgs[round]; i++) {
        ncclComm_t c = n->comm[m[i].local];
        cudaStream_t st = dp_cuda_native_stream(n->queues[m[i].local]);
        size_t count = m[i].bytes / sizeof(float);
        call = m[i].send ? "ncclSend" : "ncclRecv";
        r = m[i].send ? ncclSend(m[i].ptr, count, ncclFloat, (int)m[i].peer, c, st)
                      : ncclRecv(m[i].ptr, count, ncclFloat, (int)m[i].peer, c, st);
    }
    ncclResult_t r2 = ncclGroupEnd();
    if (r == ncclSuccess && r2 != ncclSuccess) r = r2, call = "ncclGroupEnd";
    dp_status s = r == ncclSuccess ? DP_OK : nccl_fail(r, call, what);
    for (size_t i = 0; s == DP_OK && i < n->k; i++) {
        if (!done[i]) continue;
        cudaError_t e = cudaSetDevice(dp_cuda_native_ordinal(n->devs[i]));
        if (e == cudaSuccess) e = cudaEventRecord(done[i], dp_cuda_native_stream(n->queues[i]));
        if (e != cudaSuccess)
            s = DP_FAIL(DP_ERR_DEVICE, "%s on %s: cudaEventRecord: %s", what, n->devs[i]->name,
                        cudaGetErrorString(e));
    }
    if (prev >= 0) cudaSetDevice(prev);
    if (s != DP_OK) n->failed = 1;
    return s;
}

/* Done once every taking part device's event completed; NCCL's
 * asynchronous errors and the deadline end the wait. */
static dp_status test(dp_transport *t, size_t round, int *done, double since, double timeout,
                      const char *what)
{
    nccl_state *n = t->impl;
    const cudaEvent_t *ev = n->done + round * n->k;
    dp_status s = DP_OK;
    size_t busy = 0;
    for (size_t i = 0; s == DP_OK && i < n->k; i++) {
        if (!ev[i]) continue;
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(n->comm[i], &async);
        cudaError_t q = async == ncclSuccess ? cudaEventQuery(ev[i]) : cudaSuccess;
        if (async != ncclSuccess) s = nccl_fail(async, "an NCCL operation", what);
        else if (q == cudaErrorNotReady) busy++;
        else if (q != cudaSuccess)
            s = DP_FAIL(DP_ERR_DEVICE, "%s on %s: %s", what, n->devs[i]->name,
                        cudaGetErrorString(q));
    }
    *done = s == DP_OK && !busy;
    if (s == DP_OK && busy && timeout > 0 && dp_now_seconds() > since + timeout)
        s = DP_FAIL(DP_ERR_TIMEOUT, "%s: waited %.3g s (watchdog) for the GPUs of the other "
                    "ranks; one of them is stuck or gone, so the job must end", what, timeout);
    if (s != DP_OK) n->failed = 1;
    return s;
}

/* Each run broadcast from its owner to every device of the job, in one group. */
static dp_status allgather_replicas(dp_transport *t, void *const *bufs, size_t esize,
                                    const dp_run *runs, size_t n_runs, const char *what)
{
    nccl_state *n = t->impl;
    /* A broadcast only moves bytes: a 2-byte type of NCCL's for bfloat16. */
    ncclDataType_t type = esize == 2 ? ncclFloat16 : ncclFloat;
    ncclResult_t r = ncclGroupStart();
    for (size_t j = 0; r == ncclSuccess && j < n_runs; j++)
        for (size_t i = 0; r == ncclSuccess && i < n->k; i++) {
            if (!runs[j].count) continue;
            /* in place: the root's buffer is its own source */
            unsigned char *p = (unsigned char *)bufs[i] + runs[j].begin * esize;
            r = ncclBroadcast(p, p, runs[j].count, type, (int)runs[j].owner, n->comm[i],
                              dp_cuda_native_stream(n->devs[i]));
        }
    ncclResult_t r2 = ncclGroupEnd();
    if (r == ncclSuccess) r = r2;
    if (r != ncclSuccess) {
        n->failed = 1;
        return nccl_fail(r, "ncclBroadcast", what);
    }
    return wait_streams(n, t->timeout, what);
}

const dp_transport_ops dp_transport_nccl = {
    .name = "NCCL",
    .accepts = accepts,
    .round_floats = (size_t)1 << 18,
    .in_order = in_order,
    .fills_every_replica = 1,
    .connect = connect,
    .agree = dp_mpi_agree,
    .broadcast = dp_mpi_broadcast,
    .start = start,
    .test = test,
    .allgather_host = dp_mpi_allgather_host,
    .allgather_replicas = allgather_replicas,
    .close = close_nccl,
};
