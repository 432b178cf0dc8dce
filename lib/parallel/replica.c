/*
 * parallel/replica.c - the replica consistency check (replica.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/replica.h"

int dp_replica_check_due(const dp_engine *e)
{
    long n = e->cfg.check_replicas_every;
    return n > 0 && (e->t + 1) % n == 0;
}

/* FNV-1a over 64-bit words (Fowler, Noll, Vo): not cryptographic, but any
 * flipped bit changes the result, which is all a divergence check needs. */
static uint64_t hash_words(const unsigned char *p, size_t bytes)
{
    uint64_t h = 0xcbf29ce484222325ull;
    size_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
        uint64_t x;
        memcpy(&x, p + i, 8);
        h = (h ^ x) * 0x100000001b3ull;
    }
    for (; i < bytes; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static dp_status hash_params(worker *w, uint64_t *out)
{
    size_t bytes = w->e->model.n_params * w->e->psize;
    if (dp_device_is_host_memory(w->dev)) {
        *out = hash_words((const unsigned char *)w->params, bytes);
        return DP_OK;
    }
    unsigned char *host = malloc(bytes);
    if (!host) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host buffer for the replica check (%zu bytes)", bytes);
    dp_status s = dp_copy_d2h(w->dev, host, w->params, bytes);
    if (s == DP_OK) *out = hash_words(host, bytes);
    free(host);
    return s;
}

/* Test hook: flips the lowest bit of this replica's first parameter. */
static dp_status flip_one_bit(worker *w)
{
    uint32_t x;
    DP_TRY(dp_copy_d2h(w->dev, &x, w->params, sizeof x));
    x ^= 1u;
    return dp_copy_h2d(w->dev, w->params, &x, sizeof x);
}

dp_status dp_replica_hash(worker *w)
{
    dp_pool *p = w->pool;
    if (atomic_load(&p->diverge_dev) == w->id) {
        atomic_store(&p->diverge_dev, -1);
        DP_TRY(flip_one_bit(w));
    }
    return hash_params(w, &w->param_hash);
}

/* How a message names global device g: by its name in one process, by
 * global index and rank across ranks. */
static void name_device(const dp_engine *e, size_t g, int root, char *buf, size_t cap)
{
    if (dp_transport_spans_ranks(&e->tp))
        snprintf(buf, cap, root ? "global device %zu's" : "of global device %zu (rank %d)", g,
                 dp_layout_rank_of(&e->L, g));
    else
        snprintf(buf, cap, root ? "the root %s" : "on %s", e->w[g].dev->name);
}

dp_status dp_replica_compare(dp_engine *e, dp_status local, dp_status *check)
{
    _Static_assert(sizeof(uint64_t) * DP_MAX_DEVICES <= 1024, "an agreement's payload");
    uint64_t mine[DP_MAX_DEVICES] = {0}, all[DP_MAX_DEVICES * DP_MAX_DEVICES];
    for (size_t i = 0; i < e->L.k; i++) mine[e->L.g0 + i] = e->w[i].param_hash;
    dp_status s = dp_transport_agree(&e->tp, local, mine, all, sizeof mine,
                                     "replica check between the ranks");
    *check = DP_OK;
    uint64_t root = all[0];
    for (size_t g = 1; s == DP_OK && g < e->L.K; g++) {
        uint64_t h = all[(size_t)dp_layout_rank_of(&e->L, g) * DP_MAX_DEVICES + g];
        if (h == root) continue;
        char who[96], whom[96];
        name_device(e, g, 0, who, sizeof who);
        name_device(e, 0, 1, whom, sizeof whom);
        *check = DP_FAIL(DP_ERR_INTERNAL, "replica %s diverged from %s after step %ld (parameter "
                       "hash %016llx, root %016llx); it will be re-synchronised from the slices' "
                       "owners before the next step", who, whom, e->t + 1,
                       (unsigned long long)h, (unsigned long long)root);
        break;
    }
    return s;
}
