/*
 * transport/transport.c - the list of transports, the choice among them,
 * and the wrappers that supply an optional operation's default
 * (transport.h).
 */
#include <string.h>

#include "core/error.h"
#include "transport/transport.h"

/* The transports of this build, tried in order: the first that accepts
 * the job's ranks and devices carries them. Each file defines its table. */
extern const dp_transport_ops dp_transport_inproc;
#ifdef DP_HAVE_MPI
extern const dp_transport_ops dp_transport_mpi;
#endif
static const dp_transport_ops *const transports[] = {
    &dp_transport_inproc,
#ifdef DP_HAVE_MPI
    &dp_transport_mpi,
#endif
};

/* NCCL's table is in the CUDA module (GPU memory is CUDA devices', so
 * the module is loaded by then); NULL without NCCL. */
static const dp_transport_ops *nccl_transport(int host_memory)
{
    const dp_cuda_module *cuda = NULL;
    if (host_memory || dp_backend_cuda(&cuda) != DP_OK) return NULL;
    return cuda->nccl;
}

static dp_status chosen(dp_transport *t, const dp_transport_ops *ops)
{
    t->ops = ops;
    if (!ops->in_order) return DP_OK;
    dp_status s = ops->in_order(&t->in_order);
    if (s != DP_OK) t->ops = &dp_transport_inproc; /* closes cleanly */
    return s;
}

dp_status dp_transport_open(dp_transport *t, dp_dist *dist, const dp_layout *L,
                            int host_memory, double timeout)
{
    memset(t, 0, sizeof *t);
    t->dist = dist;
    t->L = *L;
    t->timeout = timeout;
    for (size_t i = 0; i < sizeof transports / sizeof *transports; i++)
        if (transports[i]->accepts(L->nranks, host_memory)) return chosen(t, transports[i]);
    const dp_transport_ops *nccl = nccl_transport(host_memory);
    if (nccl && nccl->accepts(L->nranks, host_memory)) return chosen(t, nccl);
    t->ops = &dp_transport_inproc; /* closes cleanly; never carries the ranks */
    if (!host_memory)
        return DP_FAIL(DP_ERR_UNSUPPORTED, "CUDA devices across ranks need NCCL, and this dp was "
                       "built without it (it needs the CUDA backend, MPI and NCCL; "
                       "-DDP_NCCL=ON); use cpu devices with ranks, or one process for the GPUs");
    return DP_FAIL(DP_ERR_UNSUPPORTED, "%d ranks need MPI, and this dp was built without it; "
                   "install libopenmpi-dev and rebuild with -DDP_MPI=ON", L->nranks);
}

void dp_transport_close(dp_transport *t)
{
    if (t->ops && t->ops->close) t->ops->close(t);
    t->impl = NULL;
}

dp_status dp_transport_connect(dp_transport *t, const dp_transport_plan *plan)
{
    return t->ops->connect ? t->ops->connect(t, plan) : DP_OK;
}

int dp_transport_pinned(const dp_transport *t)
{
    return t->ops && t->ops->pinned ? t->ops->pinned(t) : 0;
}

dp_status dp_transport_agree(dp_transport *t, dp_status local, const void *mine, void *all,
                             size_t bytes, const char *what)
{
    if (t->ops->agree) return t->ops->agree(t, local, mine, all, bytes, what);
    /* One rank: its own outcome, with its message as this thread's error. */
    if (bytes && all) {
        if (mine) memcpy(all, mine, bytes);
        else memset(all, 0, bytes);
    }
    return local;
}

/* A failed move leaves the ranks out of step: the engine cannot go on. */
static dp_status moved(dp_transport *t, dp_status s)
{
    if (s != DP_OK) t->lost = 1;
    return s;
}

dp_status dp_transport_broadcast(dp_transport *t, void *buf, size_t bytes, const char *what)
{
    return t->ops->broadcast ? moved(t, t->ops->broadcast(t, buf, bytes, what)) : DP_OK;
}

dp_status dp_transport_start(dp_transport *t, size_t round, const char *what)
{
    if (t->ops->start) return moved(t, t->ops->start(t, round, what));
    return DP_OK;
}

dp_status dp_transport_test(dp_transport *t, size_t round, int *done, double since,
                            double timeout, const char *what)
{
    *done = 1;
    if (t->ops->test) return moved(t, t->ops->test(t, round, done, since, timeout, what));
    return DP_OK;
}

dp_status dp_transport_allgather_host(dp_transport *t, void *buf, size_t esize,
                                      const dp_run *runs, size_t n, const char *what)
{
    if (!t->ops->allgather_host) return DP_OK;
    return moved(t, t->ops->allgather_host(t, buf, esize, runs, n, what));
}

dp_status dp_transport_allgather_replicas(dp_transport *t, void *const *bufs, size_t esize,
                                          const dp_run *runs, size_t n, const char *what)
{
    if (!t->ops->allgather_replicas) return DP_OK;
    return moved(t, t->ops->allgather_replicas(t, bufs, esize, runs, n, what));
}
