/*
 * dist/nccl.c - GPUs of several ranks joined by NCCL (dist/nccl.h).
 *
 * NCCL's calls enqueue on dp's stream of each device, so they are ordered
 * after the kernels that wrote the buffers; the engine calls them between
 * its jobs, when no worker uses the streams. The wait polls the streams
 * and NCCL's asynchronous errors against a deadline, so a rank that
 * stops answering becomes an error here instead of a hang.
 */
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "backend/cuda/cuda_native.h"
#include "core/error.h"
#include "dist/dist_internal.h"
#include "dist/nccl.h"
#include "parallel/clock.h"

struct dp_nccl {
    size_t k;
    dp_device **devs;
    ncclComm_t *comm;
    int failed; /* a wait failed or timed out: abort instead of destroy */
};

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

dp_status dp_nccl_open(dp_dist *d, dp_device **devs, size_t k, size_t K, size_t g0,
                       dp_nccl **out)
{
    *out = NULL;
    ncclUniqueId id;
    if (dp_dist_rank(d) == 0) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess) return nccl_fail(r, "ncclGetUniqueId", "joining the GPUs");
    }
    DP_TRY(dp_dist_bcast(d, &id, sizeof id, 0.0, "the NCCL id"));
    dp_nccl *n = calloc(1, sizeof *n);
    if (!n) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
    n->k = k;
    n->devs = calloc(k, sizeof *n->devs);
    n->comm = calloc(k, sizeof *n->comm);
    if (!n->devs || !n->comm) {
        dp_nccl_close(n);
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
    }
    int prev = current();
    ncclResult_t r = ncclGroupStart();
    for (size_t i = 0; r == ncclSuccess && i < k; i++) {
        n->devs[i] = devs[i];
        if (cudaSetDevice(dp_cuda_native_ordinal(devs[i])) != cudaSuccess) break;
        r = ncclCommInitRank(&n->comm[i], (int)K, id, (int)(g0 + i));
    }
    ncclResult_t r2 = ncclGroupEnd();
    if (prev >= 0) cudaSetDevice(prev);
    if (r == ncclSuccess) r = r2;
    if (r != ncclSuccess) {
        dp_status s = nccl_fail(r, "ncclCommInitRank", "joining the GPUs");
        n->failed = 1;
        dp_nccl_close(n);
        return s;
    }
    *out = n;
    return DP_OK;
}

void dp_nccl_close(dp_nccl *n)
{
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
    free(n->comm);
    free(n->devs);
    free(n);
}

/* Waits until every local stream is idle, NCCL reports an error, or the deadline. */
static dp_status wait_streams(dp_nccl *n, double timeout, const char *what)
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

dp_status dp_nccl_exchange(dp_nccl *n, const dp_nccl_msg *m, size_t n_msgs, double timeout,
                           const char *what)
{
    ncclResult_t r = ncclGroupStart();
    const char *call = "ncclGroupStart";
    for (size_t i = 0; r == ncclSuccess && i < n_msgs; i++) {
        ncclComm_t c = n->comm[m[i].local];
        cudaStream_t st = dp_cuda_native_stream(n->devs[m[i].local]);
        call = m[i].send ? "ncclSend" : "ncclRecv";
        r = m[i].send ? ncclSend(m[i].ptr, m[i].count, ncclFloat, m[i].peer, c, st)
                      : ncclRecv(m[i].ptr, m[i].count, ncclFloat, m[i].peer, c, st);
    }
    ncclResult_t r2 = ncclGroupEnd();
    if (r == ncclSuccess && r2 != ncclSuccess) r = r2, call = "ncclGroupEnd";
    if (r != ncclSuccess) {
        n->failed = 1;
        return nccl_fail(r, call, what);
    }
    return wait_streams(n, timeout, what);
}

dp_status dp_nccl_broadcast(dp_nccl *n, void *const *bufs, size_t esize, const dp_nccl_range *rg,
                            size_t n_ranges, double timeout, const char *what)
{
    /* A broadcast only moves bytes: a 2-byte type of NCCL's for bfloat16. */
    ncclDataType_t type = esize == 2 ? ncclFloat16 : ncclFloat;
    ncclResult_t r = ncclGroupStart();
    for (size_t j = 0; r == ncclSuccess && j < n_ranges; j++)
        for (size_t i = 0; r == ncclSuccess && i < n->k; i++) {
            if (!rg[j].count) continue;
            /* in place: the root's buffer is its own source */
            unsigned char *p = (unsigned char *)bufs[i] + rg[j].begin * esize;
            r = ncclBroadcast(p, p, rg[j].count, type, rg[j].root, n->comm[i],
                              dp_cuda_native_stream(n->devs[i]));
        }
    ncclResult_t r2 = ncclGroupEnd();
    if (r == ncclSuccess) r = r2;
    if (r != ncclSuccess) {
        n->failed = 1;
        return nccl_fail(r, "ncclBroadcast", what);
    }
    return wait_streams(n, timeout, what);
}
