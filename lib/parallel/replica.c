/*
 * parallel/replica.c - the replica consistency check: every
 * check_replicas_every steps each worker hashes its parameter replica
 * after the broadcast, and the caller compares the hashes with the root's.
 */
#include <stdlib.h>
#include <string.h>

#include "parallel/engine_internal.h"

/* Whether the step now running ends with a replica check (e->t counts the
 * steps before it). */
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
    dp_engine *e = w->e;
    if (atomic_load(&e->diverge_dev) == w->id) {
        atomic_store(&e->diverge_dev, -1);
        DP_TRY(flip_one_bit(w));
    }
    return hash_params(w, &w->param_hash);
}

dp_status dp_replica_compare(dp_engine *e)
{
    for (size_t i = 1; i < e->k; i++)
        if (e->w[i].param_hash != e->w[0].param_hash) {
            e->needs_sync |= DP_SYNC_FROM_OWNERS;
            return DP_FAIL(DP_ERR_INTERNAL, "replica on %s diverged from the root %s after step "
                           "%ld (parameter hash %016llx, root %016llx); it will be re-broadcast "
                           "from the root before the next step",
                           e->w[i].dev->name, e->w[0].dev->name, e->t,
                           (unsigned long long)e->w[i].param_hash,
                           (unsigned long long)e->w[0].param_hash);
        }
    return DP_OK;
}
