/*
 * transport/dist_mpi.c - ranks joined by MPI: the bootstrap (dp/dist.h,
 * dist_internal.h) the MPI and NCCL transports are built on, as the MPI
 * module (libdp-mpi, core/module.h) whose table the core's dist.c calls.
 *
 * Every wait is a nonblocking MPI call polled against a deadline, so a
 * rank that stops answering becomes DP_ERR_TIMEOUT on the others instead
 * of a hang. The communicator returns errors (MPI_ERRORS_RETURN) instead
 * of aborting, so they reach the caller as DP_ERR_COMM; a rank that dies
 * is normally noticed by the launcher first, which ends the job.
 * The persistent request sets are in dist_persist.c.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/clock.h"
#include "transport/dist_mpi_internal.h"

/* What a rank can always do without reserving: the exchanges of outcomes
 * and broadcasts in pieces of this size. */
#define DIST_MIN_SCRATCH ((size_t)1 << 20)

dp_status dp_dist_mpi_fail(int rc, const char *call, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "error %d", rc);
    return DP_FAIL(DP_ERR_COMM, "%s: %s failed: %s", what, call, msg);
}

dp_status dp_mpi_dist_open(int *argc, char ***argv, dp_mpi_dist **out)
{
    if (!out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "out must not be NULL");
    *out = NULL;
    int inited = 0, finalized = 0, provided = 0, rc;
    /* MPI_Initialized stays true after MPI_Finalize, and any other call
     * then ends the process: ask first. */
    MPI_Finalized(&finalized);
    if (finalized)
        return DP_FAIL(DP_ERR_UNSUPPORTED, "MPI was finalized in this process (by dp_dist_close "
                       "of an earlier handle, or by the application), and MPI cannot start "
                       "twice in a process: open the job once and keep its handle until the "
                       "process ends");
    MPI_Initialized(&inited);
    if (!inited) {
        rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
        if (rc != MPI_SUCCESS) return dp_dist_mpi_fail(rc, "MPI_Init_thread", "joining the job");
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_FUNNELED) {
        if (!inited) MPI_Finalize();
        return DP_FAIL(DP_ERR_UNSUPPORTED, "this MPI provides thread level %d; dp needs "
                       "MPI_THREAD_FUNNELED (MPI_Init_thread)", provided);
    }
    dp_mpi_dist *d = calloc(1, sizeof *d);
    if (d) d->scratch = malloc(DIST_MIN_SCRATCH);
    if (!d || !d->scratch) {
        free(d);
        if (!inited) MPI_Finalize();
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
    }
    d->scratch_bytes = DIST_MIN_SCRATCH;
    d->owns_init = !inited;
    atomic_init(&d->bytes_sent, 0);
    rc = MPI_Comm_dup(MPI_COMM_WORLD, &d->comm);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(d->comm, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(d->comm, &d->rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(d->comm, &d->size);
    if (rc != MPI_SUCCESS) {
        dp_status s = dp_dist_mpi_fail(rc, "MPI_Comm_dup", "joining the job");
        if (d->owns_init) MPI_Finalize();
        free(d->scratch);
        free(d);
        return s;
    }
    *out = d;
    return DP_OK;
}


int dp_mpi_dist_rank(const dp_mpi_dist *d) { return d ? d->rank : 0; }
int dp_mpi_dist_size(const dp_mpi_dist *d) { return d ? d->size : 1; }
size_t dp_mpi_dist_bytes_sent(const dp_mpi_dist *d) { return d ? atomic_load(&d->bytes_sent) : 0; }

void dp_mpi_dist_abort(dp_mpi_dist *d, int code)
{
    if (d) MPI_Abort(d->comm, code);
}

// --- requests given up on --------------------------------------------------------------

/* A wait that timed out leaves its requests pending: MPI may still write
 * the receive buffers (and read the send buffers) when a late rank
 * arrives. So every request works on memory of its own (the callers' data
 * is copied in and out), and a request given up on keeps it here until it
 * completes, instead of writing into memory its caller freed. */
typedef struct grave {
    MPI_Request *req;
    int n;
    void *mem;
    struct grave *next;
} grave;
static grave *graves; /* the opening thread only (MPI_THREAD_FUNNELED) */

void dp_dist_sweep(void)
{
    dp_dist_persist_sweep();
    for (grave **g = &graves; *g;) {
        int done = 0;
        if (MPI_Testall((*g)->n, (*g)->req, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS) done = 0;
        if (!done) {
            g = &(*g)->next;
            continue;
        }
        grave *dead = *g;
        *g = dead->next;
        free(dead->req);
        free(dead->mem);
        free(dead);
    }
}

/* Keeps n requests and their memory until they complete. Returns 0 when
 * even the bookkeeping failed (the memory must then never be freed). */
static int bury(MPI_Request *req, int n, void *mem)
{
    grave *g = malloc(sizeof *g);
    MPI_Request *copy = malloc((size_t)(n ? n : 1) * sizeof *copy);
    if (!g || !copy) {
        free(g);
        free(copy);
        return 0;
    }
    memcpy(copy, req, (size_t)n * sizeof *copy);
    *g = (grave){copy, n, mem, graves};
    graves = g;
    return 1;
}

/* The scratch for one operation, grown when it is too small (a
 * dp_dist_reserve that was too small; NULL when that fails). */
static unsigned char *take(dp_mpi_dist *d, size_t bytes)
{
    if (d->scratch_bytes >= bytes) return d->scratch;
    unsigned char *p = malloc(bytes);
    if (!p) return NULL;
    free(d->scratch);
    d->scratch = p;
    d->scratch_bytes = bytes;
    return p;
}

/* Where what follows `bytes` of data starts, aligned for any type. */
static size_t after(size_t bytes) { return (bytes + 15) / 16 * 16; }

dp_status dp_mpi_dist_reserve(dp_mpi_dist *d, size_t data_bytes)
{
    dp_dist_sweep();
    size_t need = after(data_bytes) + 2 * (size_t)d->size * sizeof(int) + 64;
    if (!take(d, need))
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot reserve %zu bytes of host memory for the "
                       "exchanges between the ranks", need);
    return DP_OK;
}

/* The requests given up on keep the scratch (MPI may still use it); the
 * next operation takes a new one. */
static void give_up(dp_mpi_dist *d, MPI_Request *req, int n)
{
    if (!bury(req, n, d->scratch)) d->leaked = 1; /* then never freed: MPI may write it */
    d->scratch = NULL;
    d->scratch_bytes = 0;
}

dp_status dp_dist_poll(const dp_mpi_dist *d, MPI_Request *req, int n, double timeout,
                       const char *what)
{
    double deadline = timeout > 0 ? dp_now_seconds() + timeout : 0.0;
    for (long spins = 1;; spins++) {
        int done = 0;
        int rc = MPI_Testall(n, req, &done, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) return dp_dist_mpi_fail(rc, "MPI_Testall", what);
        if (done) return DP_OK;
        if (deadline > 0 && dp_now_seconds() > deadline)
            return DP_FAIL(DP_ERR_TIMEOUT, "%s: rank %d waited %.3g s (watchdog) for the other "
                           "ranks; one of them is stuck or gone, so the job must end", what,
                           d->rank, timeout);
        dp_poll_pause(spins);
    }
}

/* dp_dist_poll; on any failure the requests keep the scratch (give_up). */
static dp_status wait_all(dp_mpi_dist *d, MPI_Request *req, int n, double timeout, const char *what)
{
    dp_status s = dp_dist_poll(d, req, n, timeout, what);
    if (s != DP_OK) give_up(d, req, n);
    return s;
}

static dp_status no_room(size_t bytes, const char *what)
{
    return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "%s: no host memory for %zu bytes of the exchange",
                   what, bytes);
}

/* Every rank's `bytes` of mine, in rank order, into the scratch: *got
 * points at them until the next operation. */
static dp_status allgather_view(dp_mpi_dist *d, const void *mine, size_t bytes, double timeout,
                                 const char *what, const unsigned char **got)
{
    dp_dist_sweep();
    if (bytes > (size_t)INT_MAX / (size_t)(d->size + 1))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: %zu bytes per rank is more than one MPI "
                       "message holds", what, bytes);
    size_t total = bytes * (size_t)(d->size + 1);
    unsigned char *mem = take(d, total ? total : 1);
    if (!mem) return no_room(total, what);
    memcpy(mem, mine, bytes);
    MPI_Request r;
    int rc = MPI_Iallgather(mem, (int)bytes, MPI_BYTE, mem + bytes, (int)bytes, MPI_BYTE, d->comm, &r);
    if (rc != MPI_SUCCESS) return dp_dist_mpi_fail(rc, "MPI_Iallgather", what);
    atomic_fetch_add(&d->bytes_sent, bytes * (size_t)(d->size - 1));
    DP_TRY(wait_all(d, &r, 1, timeout, what));
    *got = mem + bytes;
    return DP_OK;
}

dp_status dp_mpi_dist_allgatherv(dp_mpi_dist *d, void *buf, size_t esize, const size_t *begin,
                             const size_t *count, double timeout, const char *what)
{
    dp_dist_sweep();
    /* Counts are elements of the buffer's own type, so a buffer of up to
     * 2^31 - 1 elements fits MPI's int counts whatever their size. */
    MPI_Datatype type = esize == 2 ? MPI_UINT16_T : MPI_FLOAT;
    size_t lo = (size_t)-1, hi = 0;
    for (int r = 0; r < d->size; r++) {
        if (begin[r] > (size_t)INT_MAX || count[r] > (size_t)INT_MAX - begin[r])
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: %zu elements is more than MPI counts "
                           "hold (2^31 - 1)", what, begin[r] + count[r]);
        if (!count[r]) continue;
        if (begin[r] < lo) lo = begin[r];
        if (begin[r] + count[r] > hi) hi = begin[r] + count[r];
    }
    if (hi == 0) return DP_OK;
    size_t data = (hi - lo) * esize, total = after(data) + 2 * (size_t)d->size * sizeof(int);
    unsigned char *base = take(d, total);
    if (!base) return no_room(total, what);
    unsigned char *mem = base, *host = buf;
    int *cnt = (int *)(base + after(data)), *dis = cnt + d->size;
    for (int r = 0; r < d->size; r++) {
        cnt[r] = (int)count[r];
        dis[r] = count[r] ? (int)(begin[r] - lo) : 0;
    }
    size_t mb = begin[d->rank], mc = count[d->rank];
    if (mc) memcpy(mem + (mb - lo) * esize, host + mb * esize, mc * esize);
    MPI_Request rq;
    int rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, mem, cnt, dis, type, d->comm,
                             &rq);
    if (rc != MPI_SUCCESS) return dp_dist_mpi_fail(rc, "MPI_Iallgatherv", what);
    atomic_fetch_add(&d->bytes_sent, mc * esize * (size_t)(d->size - 1));
    DP_TRY(wait_all(d, &rq, 1, timeout, what));
    for (int r = 0; r < d->size; r++)
        if (r != d->rank && count[r])
            memcpy(host + begin[r] * esize, mem + (begin[r] - lo) * esize, count[r] * esize);
    return DP_OK;
}

dp_status dp_mpi_dist_bcast(dp_mpi_dist *d, void *buf, size_t bytes, double timeout, const char *what)
{
    dp_dist_sweep();
    /* In pieces the scratch holds, so a broadcast of any size needs no
     * allocation (every rank cuts at the same places: its own scratch may
     * be larger, so the piece is the minimum every rank can hold). */
    for (size_t done = 0; done < bytes;) {
        size_t n = bytes - done < DIST_MIN_SCRATCH ? bytes - done : DIST_MIN_SCRATCH;
        unsigned char *mem = take(d, n);
        if (!mem) return no_room(n, what);
        if (d->rank == 0) memcpy(mem, (char *)buf + done, n);
        MPI_Request r;
        int rc = MPI_Ibcast(mem, (int)n, MPI_BYTE, 0, d->comm, &r);
        if (rc != MPI_SUCCESS) return dp_dist_mpi_fail(rc, "MPI_Ibcast", what);
        if (d->rank == 0) atomic_fetch_add(&d->bytes_sent, n * (size_t)(d->size - 1));
        DP_TRY(wait_all(d, &r, 1, timeout, what));
        if (d->rank != 0) memcpy((char *)buf + done, mem, n);
        done += n;
    }
    return DP_OK;
}

void dp_mpi_dist_close(dp_mpi_dist *d)
{
    if (!d) return;
    dp_dist_sweep();
    /* MPI_Finalize with requests still pending (a rank that never came back)
     * would wait for them: leave MPI as it is then; the launcher ends the job. */
    int pending = graves != NULL || d->leaked || d->pinned;
    dp_dist_persist_forget(d);
    if (!pending) MPI_Comm_free(&d->comm);
    if (d->owns_init && !pending) MPI_Finalize();
    free(d->scratch);
    free(d);
}

// --- the public collectives -----------------------------------------------------------

/* What every rank sends in an agreement: its outcome, then the payload. */
typedef struct outcome {
    int status;
    char msg[600];
} outcome;

/* The largest payload of an agreement (a rank's configuration when the
 * ranks join, or one value per device). */
#define OUTCOME_PAYLOAD_MAX 1024

dp_status dp_mpi_dist_agree_payload(dp_mpi_dist *d, double timeout, dp_status local, const void *mine,
                                void *all, size_t bytes, const char *what, int *lost)
{
    /* Nothing allocated: this rank's part on the stack, the answers read
     * where the exchange left them (an allocation failing on one rank
     * would leave the others waiting). */
    unsigned char buf[sizeof(outcome) + OUTCOME_PAYLOAD_MAX];
    if (bytes > OUTCOME_PAYLOAD_MAX) {
        *lost = 1;
        return DP_FAIL(DP_ERR_INTERNAL, "%s: %zu bytes of payload", what, bytes);
    }
    outcome *o = (outcome *)buf;
    memset(o, 0, sizeof *o);
    o->status = (int)local;
    if (local != DP_OK) dp_error_fit(o->msg, sizeof o->msg, dp_last_error(), strlen(dp_last_error()));
    if (bytes && mine) memcpy(buf + sizeof(outcome), mine, bytes);
    else if (bytes) memset(buf + sizeof(outcome), 0, bytes);
    size_t one = sizeof(outcome) + bytes;
    const unsigned char *got = NULL;
    dp_status s = allgather_view(d, buf, one, timeout, what, &got);
    if (s != DP_OK) {
        *lost = 1;
        return s;
    }
    for (int r = 0; r < d->size; r++) {
        const unsigned char *x = got + (size_t)r * one;
        outcome xo;
        memcpy(&xo, x, sizeof xo);
        if (bytes && all) memcpy((unsigned char *)all + (size_t)r * bytes, x + sizeof(outcome), bytes);
        if (s == DP_OK && xo.status != DP_OK) {
            char msg[sizeof xo.msg + 32];
            xo.msg[sizeof xo.msg - 1] = '\0';
            snprintf(msg, sizeof msg, "rank %d: %s", r, xo.msg);
            s = dp_error_raw((dp_status)xo.status, msg);
        }
    }
    return s;
}

dp_status dp_mpi_dist_agree_timeout(dp_mpi_dist *d, dp_status local, double seconds)
{
    if (!d || d->size == 1) return local;
    if (!(seconds >= 0)) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "seconds must be >= 0");
    int lost = 0;
    return dp_mpi_dist_agree_payload(d, seconds, local, NULL, NULL, 0, "dp_dist_agree", &lost);
}

dp_status dp_mpi_dist_broadcast_timeout(dp_mpi_dist *d, void *buf, size_t bytes, double seconds)
{
    if (!d || d->size == 1) return DP_OK;
    if (!buf && bytes) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "buf must not be NULL");
    if (!(seconds >= 0)) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "seconds must be >= 0");
    return dp_mpi_dist_bcast(d, buf, bytes, seconds, "dp_dist_broadcast");
}

// --- the module -----------------------------------------------------------------------

static const dp_mpi_module mpi_module = {
    .hdr = {DP_MODULE_ABI, "mpi"},
    .open = dp_mpi_dist_open,
    .close = dp_mpi_dist_close,
    .rank = dp_mpi_dist_rank,
    .size = dp_mpi_dist_size,
    .bytes_sent = dp_mpi_dist_bytes_sent,
    .abort = dp_mpi_dist_abort,
    .agree_timeout = dp_mpi_dist_agree_timeout,
    .broadcast_timeout = dp_mpi_dist_broadcast_timeout,
    .reserve = dp_mpi_dist_reserve,
    .agree_payload = dp_mpi_dist_agree_payload,
    .allgatherv = dp_mpi_dist_allgatherv,
    .bcast = dp_mpi_dist_bcast,
    .persist_create = dp_mpi_dist_persist_create,
    .persist_run = dp_mpi_dist_persist_run,
    .persist_start = dp_mpi_dist_persist_start,
    .persist_test = dp_mpi_dist_persist_test,
    .persist_pinned = dp_mpi_dist_persist_pinned,
    .persist_free = dp_mpi_dist_persist_free,
};

DP_API const void *dp_module_mpi(void) { return &mpi_module; }
