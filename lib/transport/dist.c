/*
 * transport/dist.c - the bootstrap (dp/dist.h, dist_internal.h) in the
 * core: ranks joined over MPI through the MPI module (libdp-mpi,
 * dist_mpi.c, loaded by the first dp_dist_open), or one rank without MPI
 * where the module is not built or cannot be loaded. Opening a job a
 * launcher started with more ranks then fails, naming the fix, so R
 * copies of a program never train R separate models by mistake.
 */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "transport/dist_internal.h"

/* A handle: over MPI (mpi set), or one rank without MPI (mpi NULL). */
struct dp_dist {
    dp_mpi_dist *mpi;
};

/* The MPI module, once a handle opened over it (handles over MPI exist
 * only after that). */
static const dp_mpi_module *mpi_mod;

int dp_dist_built(void)
{
#ifdef DP_MODULE_BUILT_MPI
    return 1;
#else
    return 0;
#endif
}

dp_status dp_dist_open(int *argc, char ***argv, dp_dist **out)
{
    if (!out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "out must not be NULL");
    *out = NULL;
    int n = dp_dist_launched_size();
    if (!dp_dist_built() && n > 1)
        return DP_FAIL(DP_ERR_UNSUPPORTED, "a launcher started %d ranks, but this dp was built "
                       "without MPI; install libopenmpi-dev and rebuild with -DDP_MPI=ON", n);
    const void *table = NULL;
    dp_status s = dp_dist_built() ? dp_module_load(DP_MODULE_MPI, &table) : DP_ERR_UNSUPPORTED;
    if (s != DP_OK && n > 1) {
        dp_error_prefix("a launcher started %d ranks", n);
        return s;
    }
    dp_dist *d = calloc(1, sizeof *d);
    if (!d) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
    if (table) { /* MPI, as a launcher started it or as a singleton */
        const dp_mpi_module *m = table;
        s = m->open(argc, argv, &d->mpi);
        if (s != DP_OK && n > 1) {
            free(d);
            return s;
        }
        /* Without a launcher one rank needs no MPI: where it cannot
         * start (finalized by an earlier handle), the handle does without. */
        if (s == DP_OK) mpi_mod = m;
        else d->mpi = NULL;
    }
    *out = d;
    return DP_OK;
}

void dp_dist_close(dp_dist *d)
{
    if (!d) return;
    if (d->mpi) mpi_mod->close(d->mpi);
    free(d);
}

int dp_dist_rank(const dp_dist *d) { return d && d->mpi ? mpi_mod->rank(d->mpi) : 0; }
int dp_dist_size(const dp_dist *d) { return d && d->mpi ? mpi_mod->size(d->mpi) : 1; }

size_t dp_dist_bytes_sent(const dp_dist *d)
{
    return d && d->mpi ? mpi_mod->bytes_sent(d->mpi) : 0;
}

void dp_dist_abort(dp_dist *d, int code)
{
    if (d && d->mpi) mpi_mod->abort(d->mpi, code);
}

dp_status dp_dist_agree_timeout(dp_dist *d, dp_status local, double seconds)
{
    if (!d || !d->mpi) return local;
    return mpi_mod->agree_timeout(d->mpi, local, seconds);
}

dp_status dp_dist_agree(dp_dist *d, dp_status local) { return dp_dist_agree_timeout(d, local, 0.0); }

dp_status dp_dist_broadcast_timeout(dp_dist *d, void *buf, size_t bytes, double seconds)
{
    if (!d || !d->mpi) return DP_OK;
    return mpi_mod->broadcast_timeout(d->mpi, buf, bytes, seconds);
}

dp_status dp_dist_broadcast(dp_dist *d, void *buf, size_t bytes)
{
    return dp_dist_broadcast_timeout(d, buf, bytes, 0.0);
}

// --- dist_internal.h ---------------------------------------------------------------

dp_status dp_dist_reserve(dp_dist *d, size_t data_bytes)
{
    return d->mpi ? mpi_mod->reserve(d->mpi, data_bytes) : DP_OK;
}

/* One rank: an agreement is its own outcome; nothing else is exchanged
 * (the engine's transport for one rank never calls these). */
dp_status dp_dist_agree_payload(dp_dist *d, double timeout, dp_status local, const void *mine,
                                void *all, size_t bytes, const char *what, int *lost)
{
    if (d->mpi)
        return mpi_mod->agree_payload(d->mpi, timeout, local, mine, all, bytes, what, lost);
    if (bytes && all) {
        if (mine) memcpy(all, mine, bytes);
        else memset(all, 0, bytes);
    }
    return local;
}

dp_status dp_dist_allgatherv(dp_dist *d, void *buf, size_t esize, const size_t *begin,
                             const size_t *count, double timeout, const char *what)
{
    if (d->mpi) return mpi_mod->allgatherv(d->mpi, buf, esize, begin, count, timeout, what);
    return DP_FAIL(DP_ERR_UNSUPPORTED, "%s: one rank without MPI", what);
}

dp_status dp_dist_bcast(dp_dist *d, void *buf, size_t bytes, double timeout, const char *what)
{
    if (d->mpi) return mpi_mod->bcast(d->mpi, buf, bytes, timeout, what);
    return DP_FAIL(DP_ERR_UNSUPPORTED, "%s: one rank without MPI", what);
}

dp_status dp_dist_persist_create(dp_dist *d, int tag, const dp_dist_msg *sends, size_t n_sends,
                                 const dp_dist_msg *recvs, size_t n_recvs, dp_dist_persist **out)
{
    *out = NULL;
    if (d->mpi) return mpi_mod->persist_create(d->mpi, tag, sends, n_sends, recvs, n_recvs, out);
    return DP_FAIL(DP_ERR_UNSUPPORTED, "persistent requests: one rank without MPI");
}

/* A set exists only where the module made it. */
dp_status dp_dist_persist_run(dp_dist_persist *p, double timeout, const char *what)
{
    return mpi_mod->persist_run(p, timeout, what);
}

dp_status dp_dist_persist_start(dp_dist_persist *p, const char *what)
{
    return mpi_mod->persist_start(p, what);
}

dp_status dp_dist_persist_test(dp_dist_persist *p, int *done, double since, double timeout,
                               const char *what)
{
    return mpi_mod->persist_test(p, done, since, timeout, what);
}

int dp_dist_persist_pinned(const dp_dist_persist *p)
{
    return mpi_mod ? mpi_mod->persist_pinned(p) : 0; /* (it also sweeps) */
}

void dp_dist_persist_free(dp_dist_persist *p)
{
    if (mpi_mod) mpi_mod->persist_free(p);
}
