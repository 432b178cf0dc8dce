/*
 * transport/dist_persist.c - persistent point-to-point requests
 * (dist_internal.h): MPI_Send_init / MPI_Recv_init on buffers that stay
 * where they are, started each run, so what every step moves goes without
 * a copy. A run given up on pins its set: MPI may still use the buffers
 * until a late peer completes it, which a later sweep notices.
 */
#include <limits.h>
#include <stdlib.h>

#include "core/clock.h"
#include "core/error.h"
#include "transport/dist_mpi_internal.h"

struct dp_dist_persist {
    dp_mpi_dist *d;
    MPI_Request *req;
    int n;
    size_t sent; /* bytes this rank sends per run */
    int tag;
    int active; /* started and not yet seen complete */
    int pinned;
    struct dp_dist_persist *next_pinned;
};
static dp_dist_persist *pinned_sets; /* the opening thread only (MPI_THREAD_FUNNELED) */

void dp_dist_persist_sweep(void)
{
    for (dp_dist_persist **p = &pinned_sets; *p;) {
        int done = 0;
        if (MPI_Testall((*p)->n, (*p)->req, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS) done = 0;
        if (!done) {
            p = &(*p)->next_pinned;
            continue;
        }
        dp_dist_persist *x = *p;
        *p = x->next_pinned;
        x->pinned = 0; /* inactive again: its buffers are the owner's */
        x->d->pinned--;
    }
}

void dp_dist_persist_forget(const dp_mpi_dist *d)
{
    for (dp_dist_persist **p = &pinned_sets; *p;)
        if ((*p)->d == d) *p = (*p)->next_pinned;
        else p = &(*p)->next_pinned;
}

/* Appends the requests of msg (cut in pieces) to p: a send or a receive. */
static int persist_add(dp_dist_persist *p, const dp_dist_msg *m, int send)
{
    int rc = MPI_SUCCESS;
    for (size_t off = 0; rc == MPI_SUCCESS;) {
        size_t n = m->bytes - off < DIST_MAX_MESSAGE ? m->bytes - off : DIST_MAX_MESSAGE;
        unsigned char *at = (unsigned char *)m->ptr + off;
        rc = send ? MPI_Send_init(at, (int)n, MPI_BYTE, m->peer, p->tag, p->d->comm, &p->req[p->n])
                  : MPI_Recv_init(at, (int)n, MPI_BYTE, m->peer, p->tag, p->d->comm, &p->req[p->n]);
        if (rc == MPI_SUCCESS) p->n++;
        off += n;
        if (off >= m->bytes) break;
    }
    return rc;
}

dp_status dp_mpi_dist_persist_create(dp_mpi_dist *d, int tag, const dp_dist_msg *sends, size_t n_sends,
                                 const dp_dist_msg *recvs, size_t n_recvs, dp_dist_persist **out)
{
    *out = NULL;
    size_t n_req = 0, sent = 0;
    for (size_t i = 0; i < n_sends; i++) n_req += sends[i].bytes / DIST_MAX_MESSAGE + 1, sent += sends[i].bytes;
    for (size_t i = 0; i < n_recvs; i++) n_req += recvs[i].bytes / DIST_MAX_MESSAGE + 1;
    if (n_req > (size_t)INT_MAX)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%zu persistent requests: too many", n_req);
    dp_dist_persist *p = calloc(1, sizeof *p);
    if (p) p->req = malloc((n_req ? n_req : 1) * sizeof *p->req);
    if (!p || !p->req) {
        if (p) free(p->req);
        free(p);
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation of %zu requests failed", n_req);
    }
    p->d = d;
    p->sent = sent;
    p->tag = tag;
    /* Receives first, so the peers' sends find them posted. */
    int rc = MPI_SUCCESS;
    for (size_t i = 0; rc == MPI_SUCCESS && i < n_recvs; i++) rc = persist_add(p, &recvs[i], 0);
    for (size_t i = 0; rc == MPI_SUCCESS && i < n_sends; i++) rc = persist_add(p, &sends[i], 1);
    if (rc != MPI_SUCCESS) {
        dp_status s = dp_dist_mpi_fail(rc, "MPI_Send_init/MPI_Recv_init", "persistent requests");
        dp_mpi_dist_persist_free(p);
        return s;
    }
    *out = p;
    return DP_OK;
}

/* A run given up on: its requests may still complete (a late peer), so
 * its buffers stay MPI's until a sweep sees them done. */
static void pin(dp_dist_persist *p)
{
    p->pinned = 1;
    p->d->pinned++;
    p->next_pinned = pinned_sets;
    pinned_sets = p;
}

dp_status dp_mpi_dist_persist_start(dp_dist_persist *p, const char *what)
{
    if (p->pinned)
        return DP_FAIL(DP_ERR_COMM, "%s: an earlier exchange was given up on", what);
    if (p->active) return DP_FAIL(DP_ERR_INTERNAL, "%s: started twice", what);
    dp_dist_sweep();
    if (!p->n) return DP_OK;
    int rc = MPI_Startall(p->n, p->req);
    if (rc != MPI_SUCCESS) {
        pin(p); /* some may have started */
        return dp_dist_mpi_fail(rc, "MPI_Startall", what);
    }
    p->active = 1;
    atomic_fetch_add(&p->d->bytes_sent, p->sent);
    return DP_OK;
}

dp_status dp_mpi_dist_persist_test(dp_dist_persist *p, int *done, double since, double timeout,
                                   const char *what)
{
    *done = !p->active;
    if (*done) return DP_OK;
    int rc = MPI_Testall(p->n, p->req, done, MPI_STATUSES_IGNORE);
    if (rc == MPI_SUCCESS && *done) {
        p->active = 0;
        return DP_OK;
    }
    *done = 0;
    if (rc == MPI_SUCCESS && !(timeout > 0 && dp_now_seconds() > since + timeout)) return DP_OK;
    p->active = 0;
    pin(p); /* given up on: MPI may still use the buffers */
    if (rc != MPI_SUCCESS) return dp_dist_mpi_fail(rc, "MPI_Testall", what);
    return DP_FAIL(DP_ERR_TIMEOUT, "%s: rank %d waited %.3g s for the other ranks; one of them "
                   "is stuck or gone, so the job must end", what, p->d->rank, timeout);
}

dp_status dp_mpi_dist_persist_run(dp_dist_persist *p, double timeout, const char *what)
{
    DP_TRY(dp_mpi_dist_persist_start(p, what));
    if (!p->active) return DP_OK; /* nothing to move */
    p->active = 0;
    dp_status s = dp_dist_poll(p->d, p->req, p->n, timeout, what);
    if (s != DP_OK) pin(p);
    return s;
}

int dp_mpi_dist_persist_pinned(const dp_dist_persist *p)
{
    dp_dist_sweep(); /* a late peer's messages may have completed it */
    return p && p->pinned;
}

void dp_mpi_dist_persist_free(dp_dist_persist *p)
{
    if (!p || p->pinned) return; /* active requests: MPI may still use them */
    for (int i = 0; i < p->n; i++) MPI_Request_free(&p->req[i]);
    free(p->req);
    free(p);
}
