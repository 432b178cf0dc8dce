/*
 * transport/dist_none.c - the bootstrap (dp/dist.h) in a build without
 * MPI: one rank. Opening
 * a job a launcher started with more ranks fails, naming the fix, so R
 * copies of a program never train R separate models by mistake.
 */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "transport/dist_internal.h"

struct dp_dist {
    int unused;
};

int dp_dist_built(void) { return 0; }

dp_status dp_dist_open(int *argc, char ***argv, dp_dist **out)
{
    if (!out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "out must not be NULL");
    *out = NULL;
    int n = dp_dist_launched_size();
    if (n > 1)
        return DP_FAIL(DP_ERR_UNSUPPORTED, "a launcher started %d ranks, but this dp was built "
                       "without MPI; install libopenmpi-dev and rebuild with -DDP_MPI=ON", n);
    dp_dist *d = calloc(1, sizeof *d);
    if (!d) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
    *out = d;
    return DP_OK;
}

void dp_dist_close(dp_dist *d) { free(d); }
int dp_dist_rank(const dp_dist *d) { return 0; }
int dp_dist_size(const dp_dist *d) { return 1; }
size_t dp_dist_bytes_sent(const dp_dist *d) { return 0; }
void dp_dist_abort(dp_dist *d, int code) {}
dp_status dp_dist_agree(dp_dist *d, dp_status local) { return local; }
dp_status dp_dist_broadcast(dp_dist *d, void *buf, size_t bytes) { return DP_OK; }
dp_status dp_dist_agree_timeout(dp_dist *d, dp_status local, double seconds) { return local; }
dp_status dp_dist_broadcast_timeout(dp_dist *d, void *buf, size_t bytes, double seconds)
{
    return DP_OK;
}

/* One rank: an agreement is its own outcome; nothing else is exchanged
 * (the engine's transport for one rank never calls these). */
dp_status dp_dist_agree_payload(dp_dist *d, double timeout, dp_status local, const void *mine,
                                void *all, size_t bytes, const char *what, int *lost)
{
    if (bytes && all) {
        if (mine) memcpy(all, mine, bytes);
        else memset(all, 0, bytes);
    }
    return local;
}
dp_status dp_dist_allgatherv(dp_dist *d, void *buf, size_t esize, const size_t *begin,
                             const size_t *count, double timeout, const char *what)
{
    return DP_FAIL(DP_ERR_UNSUPPORTED, "%s: dp was built without MPI", what);
}
dp_status dp_dist_bcast(dp_dist *d, void *buf, size_t bytes, double timeout, const char *what)
{
    return DP_FAIL(DP_ERR_UNSUPPORTED, "%s: dp was built without MPI", what);
}
dp_status dp_dist_reserve(dp_dist *d, size_t data_bytes) { return DP_OK; }

struct dp_dist_persist {
    int unused;
};
dp_status dp_dist_persist_create(dp_dist *d, int tag, const dp_dist_msg *sends, size_t n_sends,
                                 const dp_dist_msg *recvs, size_t n_recvs, dp_dist_persist **out)
{
    *out = NULL;
    return DP_FAIL(DP_ERR_UNSUPPORTED, "persistent requests: dp was built without MPI");
}
dp_status dp_dist_persist_run(dp_dist_persist *p, double timeout, const char *what)
{
    return DP_FAIL(DP_ERR_UNSUPPORTED, "%s: dp was built without MPI", what);
}
int dp_dist_persist_pinned(const dp_dist_persist *p) { return 0; }
void dp_dist_persist_free(dp_dist_persist *p) {}
