/*
 * dist/dist_mpi.c - ranks joined by MPI (dp/dist.h, dist_internal.h).
 *
 * Every wait is a nonblocking MPI call polled against a deadline, so a
 * rank that stops answering becomes DP_ERR_TIMEOUT on the others instead
 * of a hang. The communicator returns errors (MPI_ERRORS_RETURN) instead
 * of aborting, so they reach the caller as DP_ERR_COMM; a rank that dies
 * is normally noticed by the launcher first, which ends the job.
 */
#include <mpi.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "dist/dist_internal.h"
#include "parallel/clock.h"

struct dp_dist {
    MPI_Comm comm;
    int rank, size;
    int owns_init; /* dp_dist_open initialised MPI, so close finalises it */
    atomic_size_t bytes_sent;
};

/* Largest message: MPI counts are int; messages above this are split. */
#define DIST_MAX_MESSAGE ((size_t)1 << 30)

int dp_dist_built(void) { return 1; }

static dp_status mpi_fail(int rc, const char *call, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "error %d", rc);
    return DP_FAIL(DP_ERR_COMM, "%s: %s failed: %s", what, call, msg);
}

dp_status dp_dist_open(int *argc, char ***argv, dp_dist **out)
{
    if (!out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "out must not be NULL");
    *out = NULL;
    int inited = 0, provided = 0, rc;
    MPI_Initialized(&inited);
    if (!inited) {
        rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Init_thread", "joining the job");
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_FUNNELED) {
        if (!inited) MPI_Finalize();
        return DP_FAIL(DP_ERR_UNSUPPORTED, "this MPI provides thread level %d; dp needs "
                       "MPI_THREAD_FUNNELED (MPI_Init_thread)", provided);
    }
    dp_dist *d = calloc(1, sizeof *d);
    if (!d) {
        if (!inited) MPI_Finalize();
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
    }
    d->owns_init = !inited;
    atomic_init(&d->bytes_sent, 0);
    rc = MPI_Comm_dup(MPI_COMM_WORLD, &d->comm);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(d->comm, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(d->comm, &d->rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(d->comm, &d->size);
    if (rc != MPI_SUCCESS) {
        dp_status s = mpi_fail(rc, "MPI_Comm_dup", "joining the job");
        if (d->owns_init) MPI_Finalize();
        free(d);
        return s;
    }
    *out = d;
    return DP_OK;
}

void dp_dist_close(dp_dist *d)
{
    if (!d) return;
    MPI_Comm_free(&d->comm);
    if (d->owns_init) MPI_Finalize();
    free(d);
}

int dp_dist_rank(const dp_dist *d) { return d ? d->rank : 0; }
int dp_dist_size(const dp_dist *d) { return d ? d->size : 1; }
size_t dp_dist_bytes_sent(const dp_dist *d) { return d ? atomic_load(&d->bytes_sent) : 0; }

void dp_dist_abort(dp_dist *d, int code)
{
    if (d) MPI_Abort(d->comm, code);
}

/* Waits for n requests, polling until the deadline (timeout 0: none). The
 * polling sleeps a little once the first spins find nothing, so ranks
 * sharing cores (an oversubscribed machine) leave them to the others. */
static dp_status wait_all(dp_dist *d, MPI_Request *req, int n, double timeout, const char *what)
{
    double deadline = timeout > 0 ? dp_now_seconds() + timeout : 0.0;
    long spins = 0;
    for (;;) {
        int done = 0;
        int rc = MPI_Testall(n, req, &done, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Testall", what);
        if (done) return DP_OK;
        if (deadline > 0 && dp_now_seconds() > deadline)
            return DP_FAIL(DP_ERR_TIMEOUT, "%s: rank %d waited %.3g s (watchdog) for the other "
                           "ranks; one of them is stuck or gone, so the job must end", what,
                           d->rank, timeout);
        if (++spins > 1000) {
            struct timespec ts = {0, spins > 100000 ? 1000000 : 20000};
            nanosleep(&ts, NULL);
        }
    }
}

dp_status dp_dist_allgather(dp_dist *d, const void *mine, void *all, size_t bytes,
                            double timeout, const char *what)
{
    if (bytes > (size_t)INT_MAX)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: %zu bytes per rank is more than one MPI "
                       "message holds", what, bytes);
    MPI_Request r;
    int rc = MPI_Iallgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, d->comm, &r);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Iallgather", what);
    atomic_fetch_add(&d->bytes_sent, bytes * (size_t)(d->size - 1));
    return wait_all(d, &r, 1, timeout, what);
}

dp_status dp_dist_allgatherv(dp_dist *d, float *buf, const size_t *begin, const size_t *count,
                             double timeout, const char *what)
{
    int *cnt = malloc(2 * (size_t)d->size * sizeof *cnt);
    if (!cnt) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
    int *dis = cnt + d->size;
    for (int r = 0; r < d->size; r++) {
        if (begin[r] > (size_t)INT_MAX || count[r] > (size_t)INT_MAX - begin[r]) {
            free(cnt);
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: %zu floats is more than MPI counts "
                           "hold (2^31 - 1)", what, begin[r] + count[r]);
        }
        cnt[r] = (int)count[r];
        dis[r] = (int)begin[r];
    }
    MPI_Request rq;
    int rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, cnt, dis, MPI_FLOAT,
                             d->comm, &rq);
    free(cnt);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Iallgatherv", what);
    atomic_fetch_add(&d->bytes_sent, count[d->rank] * sizeof(float) * (size_t)(d->size - 1));
    return wait_all(d, &rq, 1, timeout, what);
}

dp_status dp_dist_bcast(dp_dist *d, void *buf, size_t bytes, double timeout, const char *what)
{
    for (size_t done = 0; done < bytes || (bytes == 0 && done == 0); ) {
        size_t n = bytes - done < DIST_MAX_MESSAGE ? bytes - done : DIST_MAX_MESSAGE;
        MPI_Request r;
        int rc = MPI_Ibcast((char *)buf + done, (int)n, MPI_BYTE, 0, d->comm, &r);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Ibcast", what);
        if (d->rank == 0) atomic_fetch_add(&d->bytes_sent, n * (size_t)(d->size - 1));
        DP_TRY(wait_all(d, &r, 1, timeout, what));
        if (bytes == 0) break;
        done += n;
    }
    return DP_OK;
}

dp_status dp_dist_exchange(dp_dist *d, const dp_dist_msg *sends, size_t n_sends,
                           const dp_dist_msg *recvs, size_t n_recvs, double timeout,
                           const char *what)
{
    /* Each message is split into pieces of at most DIST_MAX_MESSAGE. */
    size_t n_req = 0;
    for (size_t i = 0; i < n_sends; i++) n_req += sends[i].bytes / DIST_MAX_MESSAGE + 1;
    for (size_t i = 0; i < n_recvs; i++) n_req += recvs[i].bytes / DIST_MAX_MESSAGE + 1;
    if (n_req > (size_t)INT_MAX) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: too many messages", what);
    MPI_Request *req = malloc((n_req ? n_req : 1) * sizeof *req);
    if (!req) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
    size_t at = 0;
    int rc = MPI_SUCCESS;
    const char *call = "MPI_Irecv";
    for (size_t i = 0; rc == MPI_SUCCESS && i < n_recvs; i++)
        for (size_t off = 0; rc == MPI_SUCCESS && (off < recvs[i].bytes || off == 0);) {
            size_t n = recvs[i].bytes - off < DIST_MAX_MESSAGE ? recvs[i].bytes - off : DIST_MAX_MESSAGE;
            rc = MPI_Irecv((char *)recvs[i].ptr + off, (int)n, MPI_BYTE, recvs[i].peer, 0, d->comm,
                           &req[at++]);
            off += n;
            if (n == 0) break;
        }
    if (rc == MPI_SUCCESS) call = "MPI_Isend";
    for (size_t i = 0; rc == MPI_SUCCESS && i < n_sends; i++)
        for (size_t off = 0; rc == MPI_SUCCESS && (off < sends[i].bytes || off == 0);) {
            size_t n = sends[i].bytes - off < DIST_MAX_MESSAGE ? sends[i].bytes - off : DIST_MAX_MESSAGE;
            rc = MPI_Isend((char *)sends[i].ptr + off, (int)n, MPI_BYTE, sends[i].peer, 0, d->comm,
                           &req[at++]);
            atomic_fetch_add(&d->bytes_sent, n);
            off += n;
            if (n == 0) break;
        }
    dp_status s = rc == MPI_SUCCESS ? wait_all(d, req, (int)at, timeout, what)
                                    : mpi_fail(rc, call, what);
    free(req);
    return s;
}

// --- the public collectives -----------------------------------------------------------

dp_status dp_dist_agree(dp_dist *d, dp_status local)
{
    if (!d || d->size == 1) return local;
    struct {
        int status;
        char msg[512];
    } mine, *all = malloc((size_t)d->size * sizeof *all);
    if (!all) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
    memset(&mine, 0, sizeof mine);
    mine.status = (int)local;
    if (local != DP_OK) snprintf(mine.msg, sizeof mine.msg, "%s", dp_last_error());
    dp_status s = dp_dist_allgather(d, &mine, all, sizeof mine, 0.0, "dp_dist_agree");
    for (int r = 0; s == DP_OK && r < d->size; r++)
        if (all[r].status != DP_OK) {
            all[r].msg[sizeof all[r].msg - 1] = '\0';
            s = DP_FAIL((dp_status)all[r].status, "rank %d: %s", r, all[r].msg);
        }
    free(all);
    return s;
}

dp_status dp_dist_broadcast(dp_dist *d, void *buf, size_t bytes)
{
    if (!d || d->size == 1) return DP_OK;
    if (!buf && bytes) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "buf must not be NULL");
    return dp_dist_bcast(d, buf, bytes, 0.0, "dp_dist_broadcast");
}
