/*
 * parallel/ranks.c - the engine over R ranks (dp/dist.h): the step cut
 * into local jobs at the points where the ranks exchange data, every
 * exchange made from the caller's thread (MPI_THREAD_FUNNELED).
 *
 * Global device order is rank-major, and every rank plans the whole
 * batch, so every rank knows every device's rows. The reduce-scatter
 * keeps one process's order of additions: each slice's owner receives
 * the chunk of every contributing device of the other ranks (one message
 * per device, never a partial sum) and adds all contributions in global
 * device order 0..K-1 (comm.c), so R ranks of k devices give the bits of
 * one process with R x k. Each exchange carries every rank's status, so
 * a failure anywhere ends the step on every rank with the same error, and
 * every wait is bounded by the watchdog.
 */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist_internal.h"
#include "dist/nccl.h"
#include "parallel/comm.h"
#include "parallel/engine_internal.h"

// --- the exchange of outcomes ------------------------------------------------------------

/* What every rank sends at a sync point: its outcome and a payload. */
typedef struct outcome {
    int status;
    char msg[600];
} outcome;

/* The largest payload of an exchange of outcomes (a rank's info at create,
 * or one double per device). */
#define OUTCOME_PAYLOAD_MAX 1024

/* Every rank's status and `bytes` of payload (mine) into all (R x bytes,
 * may be NULL when bytes is 0); the result is DP_OK on every rank, or the
 * lowest failing rank's status and message ("rank r: ...") on every rank.
 * *lost is set when the exchange itself failed (the ranks may no longer be
 * in step). */
static dp_status exchange_outcome(dp_dist *d, double timeout, dp_status local, const void *mine,
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
    if (local != DP_OK) snprintf(o->msg, sizeof o->msg, "%s", dp_last_error());
    if (bytes && mine) memcpy(buf + sizeof(outcome), mine, bytes);
    else if (bytes) memset(buf + sizeof(outcome), 0, bytes);
    size_t one = sizeof(outcome) + bytes;
    const unsigned char *got = NULL;
    dp_status s = dp_dist_allgather_view(d, buf, one, timeout, what, &got);
    if (s != DP_OK) {
        *lost = 1;
        return s;
    }
    for (int r = 0; r < dp_dist_size(d); r++) {
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

static dp_status sync_point(dp_engine *e, dp_status local, const void *mine, void *all,
                            size_t bytes, const char *what)
{
    int lost = 0;
    dp_status s = exchange_outcome(e->dist, e->cfg.watchdog_seconds, local, mine, all, bytes, what,
                                   &lost);
    if (lost) e->broken = 1;
    return s;
}

dp_status dp_ranks_agree(dp_engine *e, dp_status local)
{
    return sync_point(e, local, NULL, NULL, 0, "agreement between the ranks");
}

dp_status dp_ranks_bcast(dp_engine *e, void *buf, size_t bytes, const char *what)
{
    dp_status s = dp_dist_bcast(e->dist, buf, bytes, e->cfg.watchdog_seconds, what);
    if (s != DP_OK) e->broken = 1;
    return s;
}

dp_status dp_ranks_allgather_owned(dp_engine *e, void *buf, size_t esize, const char *what)
{
    size_t begin[DP_MAX_DEVICES], count[DP_MAX_DEVICES];
    for (int r = 0; r < e->nranks; r++) dp_opt_rank_range(e, r, &begin[r], &count[r]);
    dp_status s = dp_dist_allgatherv(e->dist, buf, esize, begin, count, e->cfg.watchdog_seconds,
                                     what);
    if (s != DP_OK) e->broken = 1;
    return s;
}

// --- create: every rank's devices and configuration -------------------------------------

/* What must be equal on every rank, and what each rank brings. */
typedef struct rank_info {
    uint64_t k;
    float weights[DP_MAX_DEVICES];
    int kind, mode, shard, optim, grad_accum, token_balanced, allow_tf32, matmul, param_dtype;
    float lr, beta1, beta2, eps, weight_decay, grad_clip, momentum;
    uint64_t max_rows, max_tokens, seed, memory_limit, n_params, n_tensors, n_classes,
        outputs_per_row, input_row_bytes, target_type, target_size, logits_chunk_rows,
        head_features;
    double watchdog;
    int64_t check_replicas_every;
} rank_info;

static void fill_info(rank_info *x, const dp_engine *e, const dp_device_spec *devices, size_t k)
{
    const dp_engine_config *c = &e->cfg;
    const dp_model *m = &e->model;
    memset(x, 0, sizeof *x);
    x->k = k;
    for (size_t i = 0; i < k; i++) x->weights[i] = e->weights[i];
    x->kind = (int)devices[0].kind;
    x->mode = (int)c->mode;
    x->shard = c->shard_optimizer;
    x->optim = (int)c->optim.kind;
    x->grad_accum = c->grad_accum;
    x->token_balanced = c->token_balanced;
    x->allow_tf32 = c->allow_tf32;
    x->matmul = (int)c->matmul_precision;
    x->param_dtype = (int)m->param_dtype;
    x->lr = c->optim.lr;
    x->beta1 = c->optim.beta1;
    x->beta2 = c->optim.beta2;
    x->eps = c->optim.eps;
    x->weight_decay = c->optim.weight_decay;
    x->grad_clip = c->optim.grad_clip;
    x->momentum = c->optim.momentum;
    x->max_rows = c->max_rows_per_micro;
    x->max_tokens = c->max_tokens_per_micro;
    x->seed = c->seed;
    x->memory_limit = c->memory_limit;
    x->n_params = m->n_params;
    x->n_tensors = m->n_tensors;
    x->n_classes = m->n_classes;
    x->outputs_per_row = m->outputs_per_row;
    x->input_row_bytes = m->input_row_bytes;
    x->target_type = (uint64_t)m->target_type;
    x->target_size = dp_model_target_size(m);
    x->logits_chunk_rows = c->logits_chunk_rows;
    x->head_features = m->head_features;
    x->watchdog = c->watchdog_seconds;
    x->check_replicas_every = c->check_replicas_every;
}

/* The first field where b differs from a, or NULL. (Not memcmp: the
 * padding is not compared, and the message names the field.) */
static const char *first_difference(const rank_info *a, const rank_info *b)
{
#define DIFF(f, name) \
    if (memcmp(&a->f, &b->f, sizeof a->f) != 0) return name
    DIFF(mode, "mode");
    DIFF(shard, "shard_optimizer");
    DIFF(optim, "optimizer");
    DIFF(grad_accum, "grad_accum");
    DIFF(token_balanced, "token_balanced");
    DIFF(allow_tf32, "allow_tf32");
    DIFF(matmul, "matmul_precision");
    DIFF(param_dtype, "the model's param_dtype");
    DIFF(lr, "optim.lr");
    DIFF(beta1, "optim.beta1");
    DIFF(beta2, "optim.beta2");
    DIFF(eps, "optim.eps");
    DIFF(weight_decay, "optim.weight_decay");
    DIFF(grad_clip, "optim.grad_clip");
    DIFF(momentum, "optim.momentum");
    DIFF(max_rows, "max_rows_per_micro");
    DIFF(max_tokens, "max_tokens_per_micro");
    DIFF(seed, "seed");
    DIFF(n_params, "the model's n_params");
    DIFF(n_tensors, "the model's n_tensors");
    DIFF(n_classes, "the model's n_classes");
    DIFF(outputs_per_row, "the model's outputs_per_row");
    DIFF(input_row_bytes, "the model's input_row_bytes");
    DIFF(target_type, "the model's target_type");
    DIFF(target_size, "the model's target_size");
    DIFF(logits_chunk_rows, "logits_chunk_rows");
    DIFF(head_features, "the model's head_features");
    DIFF(watchdog, "watchdog_seconds");
    DIFF(check_replicas_every, "check_replicas_every");
    DIFF(kind, "the device kind");
#undef DIFF
    return NULL;
}

#define INIT_WHAT "exchanging the ranks' devices and configuration"
static_assert(sizeof(rank_info) <= OUTCOME_PAYLOAD_MAX, "rank_info is a payload of an exchange");

dp_status dp_ranks_create_failed(dp_dist *d, dp_status s)
{
    int lost = 0;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", dp_last_error());
    /* the exchanges of dp_ranks_init and of the setup's end, as the others make them */
    rank_info none, all[DP_MAX_DEVICES];
    memset(&none, 0, sizeof none);
    if (dp_dist_size(d) <= DP_MAX_DEVICES)
        exchange_outcome(d, 0.0, s, &none, all, sizeof none, INIT_WHAT, &lost);
    dp_error_raw(s, msg);
    if (!lost) exchange_outcome(d, 0.0, s, NULL, NULL, 0, "agreement between the ranks", &lost);
    return dp_error_raw(s, msg);
}

dp_status dp_ranks_init(dp_engine *e, const dp_device_spec *devices, size_t k)
{
    e->nranks = dp_dist_size(e->dist);
    e->rank = dp_dist_rank(e->dist);
    if (e->nranks > DP_MAX_DEVICES)
        return DP_FAIL(DP_ERR_UNSUPPORTED, "%d ranks; an engine spans at most %d devices in all",
                       e->nranks, DP_MAX_DEVICES);
    rank_info mine, all[DP_MAX_DEVICES]; /* ranks <= DP_MAX_DEVICES: on the stack, cannot fail */
    fill_info(&mine, e, devices, k);
    /* No watchdog here: the ranks may still be starting up. */
    int lost = 0;
    dp_status s = exchange_outcome(e->dist, 0.0, DP_OK, &mine, all, sizeof mine, INIT_WHAT, &lost);
    if (lost) e->broken = 1;
    size_t K = 0;
    for (int r = 0; s == DP_OK && r < e->nranks; r++) {
        const char *f = first_difference(&all[0], &all[r]);
        if (f) {
            s = DP_FAIL(DP_ERR_INVALID_ARGUMENT, "rank %d's %s differs from rank 0's; every "
                        "rank must create its engine with the same configuration and model", r, f);
            break;
        }
        e->rank_first[r] = K;
        if (all[r].k > (uint64_t)(DP_MAX_DEVICES - K)) {
            s = DP_FAIL(DP_ERR_INVALID_ARGUMENT, "the ranks have more than %d devices in all; "
                        "use fewer devices per rank or fewer ranks", DP_MAX_DEVICES);
            break;
        }
        for (uint64_t i = 0; i < all[r].k; i++) e->weights[K + i] = all[r].weights[i];
        K += (size_t)all[r].k;
    }
    if (s == DP_OK && all[0].mode == DP_MODE_GATHER)
        s = DP_FAIL(DP_ERR_UNSUPPORTED, "gather mode across ranks: gather mode reproduces one "
                    "process's DataParallel; use balanced mode with ranks, or one process");
#ifndef DP_HAVE_NCCL
    if (s == DP_OK && all[0].kind != DP_DEVICE_CPU)
        s = DP_FAIL(DP_ERR_UNSUPPORTED, "CUDA devices across ranks need NCCL, and this dp was "
                    "built without it (it needs the CUDA backend, MPI and NCCL; -DDP_NCCL=ON); "
                    "use cpu devices with ranks, or one process for the GPUs");
#endif
    if (s == DP_OK && all[0].n_params > (uint64_t)0x7fffffff)
        s = DP_FAIL(DP_ERR_UNSUPPORTED, "%llu parameters: MPI counts hold at most 2^31 - 1 "
                    "floats", (unsigned long long)all[0].n_params);
    if (s != DP_OK) return s;
    double W = 0.0;
    for (size_t g = 0; g < K; g++) W += e->weights[g];
    if (W <= 0.0)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "device weights are zero on every rank; give at "
                       "least one device a positive share");
    e->K = K;
    e->rank_first[e->nranks] = K;
    e->g0 = e->rank_first[e->rank];
    /* the message lists of the reduce-scatter's rounds, made once here */
    size_t a = 2 * K * K * sizeof(dp_dist_msg), b = K * K * sizeof(dp_nccl_msg);
    e->msgs = malloc(a > b ? a : b);
    if (!e->msgs) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
    return DP_OK;
}

// --- the step ----------------------------------------------------------------------------

size_t dp_ranks_rounds(const dp_engine *e)
{
    size_t longest = 0, c = DP_COMM_CHUNK_FLOATS_RANKS;
    for (size_t j = 0; j < e->K; j++)
        if (e->s[j].end - e->s[j].begin > longest) longest = e->s[j].end - e->s[j].begin;
    return longest ? (longest + c - 1) / c : 1;
}

/* Adds the caller's seconds in an exchange to every local worker's phase p. */
static void charge(dp_engine *e, dp_phase p, double since)
{
    double t = dp_now_seconds() - since;
    for (size_t i = 0; i < e->k; i++) {
        worker *w = &e->w[i];
        if (w->phase_first[p] < 0.0) w->phase_first[p] = since;
        w->phase_seconds[p] += t;
    }
}

dp_status dp_ranks_open_gpus(dp_engine *e)
{
    dp_device *devs[DP_MAX_DEVICES];
    for (size_t i = 0; i < e->k; i++) devs[i] = e->w[i].dev;
    return dp_nccl_open(e->dist, devs, e->k, e->K, e->g0, &e->nccl);
}

/* Round r with NCCL: the same messages, device to device. */
static dp_status exchange_round_gpus(dp_engine *e, size_t r)
{
    size_t c = DP_COMM_CHUNK_FLOATS_RANKS, n = 0;
    dp_nccl_msg *m = e->msgs; /* room for K x K, allocated at create */
    for (size_t j = 0; j < e->K; j++) {
        slice *sl = &e->s[j];
        size_t len = sl->end - sl->begin, at = r * c;
        if (at >= len) continue;
        if (len - at > c) len = at + c;
        len -= at;
        worker *o = dp_local_worker(e, (size_t)sl->owner);
        for (size_t d = 0; d < e->K; d++) {
            if (!dp_contributes(e, d)) continue;
            worker *wd = dp_local_worker(e, d);
            if (!o && wd)
                m[n++] = (dp_nccl_msg){(size_t)wd->id, sl->owner, 1, wd->grads + sl->begin + at, len};
            else if (o && !wd)
                m[n++] = (dp_nccl_msg){(size_t)o->id, (int)d, 0, dp_comm_remote_chunk(e, sl, d), len};
        }
    }
    dp_status s = dp_nccl_exchange(e->nccl, m, n, e->cfg.watchdog_seconds,
                                   "reduce-scatter between the ranks' GPUs");
    if (s != DP_OK) e->broken = 1;
    return s;
}

/* The all-gather with NCCL: each run of slices with one owner broadcast
 * from it to every device of the job. */
static dp_status broadcast_owned_gpus(dp_engine *e)
{
    dp_nccl_range rg[DP_MAX_DEVICES];
    void *bufs[DP_MAX_DEVICES];
    size_t n = 0;
    for (size_t j = 0; j < e->K;) {
        size_t j2 = j + 1;
        while (j2 < e->K && e->s[j2].owner == e->s[j].owner) j2++;
        rg[n++] = (dp_nccl_range){e->s[j].begin, e->s[j2 - 1].end - e->s[j].begin, e->s[j].owner};
        j = j2;
    }
    for (size_t i = 0; i < e->k; i++) bufs[i] = e->w[i].params;
    dp_status s = dp_nccl_broadcast(e->nccl, bufs, e->psize, rg, n, e->cfg.watchdog_seconds,
                                    "all-gather of the parameters between the ranks' GPUs");
    if (s != DP_OK) e->broken = 1;
    return s;
}

/* Round r of the reduce-scatter between the ranks: every contributing
 * local device's chunk of each slice another rank owns goes to that rank;
 * the chunks of the other ranks' devices for the slices this rank owns
 * arrive in their staging. Both sides list the messages by (slice,
 * device), so each pair of ranks matches them in order. every: as if
 * every device contributed (the most a round can hold, for the reserve). */
static void round_messages(dp_engine *e, size_t r, int every, dp_dist_msg *sends, size_t *n_s,
                           dp_dist_msg *recvs, size_t *n_r)
{
    size_t c = DP_COMM_CHUNK_FLOATS_RANKS;
    *n_s = *n_r = 0;
    for (size_t j = 0; j < e->K; j++) {
        slice *sl = &e->s[j];
        size_t n = sl->end - sl->begin, at = r * c;
        if (at >= n) continue;
        size_t len = n - at < c ? n - at : c;
        int owner_rank = dp_rank_of(e, (size_t)sl->owner);
        for (size_t d = 0; d < e->K; d++) {
            if (!every && !dp_contributes(e, d)) continue;
            worker *wd = dp_local_worker(e, d);
            if (owner_rank != e->rank && wd)
                sends[(*n_s)++] = (dp_dist_msg){owner_rank, wd->grads + sl->begin + at, len * sizeof(float)};
            else if (owner_rank == e->rank && !wd)
                recvs[(*n_r)++] = (dp_dist_msg){dp_rank_of(e, d), dp_comm_remote_chunk(e, sl, d),
                                                len * sizeof(float)};
        }
    }
}

static dp_status exchange_round(dp_engine *e, size_t r)
{
    if (e->nccl) return exchange_round_gpus(e, r);
    size_t n_s, n_r;
    dp_dist_msg *sends = e->msgs, *recvs = sends + e->K * e->K;
    round_messages(e, r, 0, sends, &n_s, recvs, &n_r);
    dp_status s = dp_dist_exchange(e->dist, sends, n_s, recvs, n_r, e->cfg.watchdog_seconds,
                                   "reduce-scatter between the ranks");
    if (s != DP_OK) e->broken = 1;
    return s;
}

dp_status dp_ranks_reserve(dp_engine *e)
{
    /* The largest exchanges: the parameters (all-gather, broadcasts of the
     * parameters and the optimizer state) and the first round of the
     * reduce-scatter with every device contributing. */
    size_t n_s, n_r, bytes = 0;
    dp_dist_msg *sends = e->msgs, *recvs = sends + e->K * e->K;
    round_messages(e, 0, 1, sends, &n_s, recvs, &n_r);
    for (size_t i = 0; i < n_s; i++) bytes += sends[i].bytes;
    for (size_t i = 0; i < n_r; i++) bytes += recvs[i].bytes;
    size_t params = e->model.n_params * sizeof(float);
    return dp_dist_reserve(e->dist, bytes > params ? bytes : params, n_s + n_r);
}

/* The replica check over every rank: each device's hash against global device 0's. */
static dp_status compare_replicas(dp_engine *e, dp_status local)
{
    static_assert(sizeof(uint64_t) * DP_MAX_DEVICES <= OUTCOME_PAYLOAD_MAX, "payload");
    uint64_t mine[DP_MAX_DEVICES] = {0}, all[DP_MAX_DEVICES * DP_MAX_DEVICES];
    for (size_t i = 0; i < e->k; i++) mine[e->g0 + i] = e->w[i].param_hash;
    dp_status s = sync_point(e, local, mine, all, sizeof mine, "replica check between the ranks");
    uint64_t root = all[0];
    for (size_t g = 1; s == DP_OK && g < e->K; g++) {
        int r = dp_rank_of(e, g);
        uint64_t h = all[(size_t)r * DP_MAX_DEVICES + g];
        if (h != root) {
            e->needs_sync |= DP_SYNC_FROM_OWNERS;
            s = DP_FAIL(DP_ERR_INTERNAL, "replica of global device %zu (rank %d) diverged from "
                        "global device 0's after step %ld (parameter hash %016llx, root %016llx); "
                        "it will be re-synchronised before the next step", g, r, e->t,
                        (unsigned long long)h, (unsigned long long)root);
        }
    }
    return s;
}

static dp_status allgather_params(dp_engine *e, int hash)
{
    dp_status s;
    if (e->nccl) {
        double t0 = dp_now_seconds();
        DP_TRY(broadcast_owned_gpus(e));
        charge(e, DP_PHASE_BROADCAST, t0);
        s = hash ? compare_replicas(e, dp_workers_run(e, JOB_HASH)) : DP_OK;
        if (s != DP_OK) e->needs_sync |= DP_SYNC_FROM_OWNERS;
        return s;
    }
    s = dp_ranks_agree(e, dp_workers_run(e, JOB_GATHER_LOCAL));
    if (s != DP_OK) {
        e->needs_sync |= DP_SYNC_FROM_OWNERS;
        return s;
    }
    double t0 = dp_now_seconds();
    DP_TRY(dp_ranks_allgather_owned(e, e->w[0].params, e->psize, "all-gather of the parameters"));
    charge(e, DP_PHASE_BROADCAST, t0);
    e->hash_due = hash;
    s = dp_workers_run(e, JOB_COPY_REMOTE);
    e->hash_due = 0;
    s = hash ? compare_replicas(e, s) : dp_ranks_agree(e, s);
    if (s != DP_OK) e->needs_sync |= DP_SYNC_FROM_OWNERS;
    return s;
}

dp_status dp_ranks_allgather_params(dp_engine *e) { return allgather_params(e, 0); }

dp_status dp_ranks_step(dp_engine *e, int train)
{
    /* forward, criterion (and backward): every rank's loss sums to all */
    double mine[DP_MAX_DEVICES] = {0}, all[DP_MAX_DEVICES * DP_MAX_DEVICES];
    dp_status s = dp_workers_run(e, train ? JOB_COMPUTE : JOB_EVAL);
    for (size_t i = 0; i < e->k; i++) mine[e->g0 + i] = e->w[i].loss_sum;
    s = sync_point(e, s, mine, all, sizeof mine, "the step's losses");
    for (size_t g = 0; s == DP_OK && g < e->K; g++)
        e->gloss[g] = all[(size_t)dp_rank_of(e, g) * DP_MAX_DEVICES + g];
    if (s != DP_OK || !train) return s;

    /* reduce-scatter, round by round; the last round sums the squares. A
     * rank whose local adds failed keeps exchanging (its buffers are still
     * there) and reports at the end, so the rounds need no agreement of
     * their own: one exchange of outcomes per step. */
    size_t rounds = dp_ranks_rounds(e);
    dp_status local = DP_OK;
    for (size_t r = 0; r < rounds; r++) {
        double t0 = dp_now_seconds();
        s = exchange_round(e, r);
        charge(e, DP_PHASE_REDUCE, t0);
        if (s != DP_OK) return s; /* the ranks are out of step: the engine is unusable */
        e->round = r;
        if (local == DP_OK) local = dp_workers_run(e, JOB_REDUCE_ROUND);
    }
    memset(mine, 0, sizeof mine);
    for (size_t j = 0; j < e->K; j++)
        if (e->s[j].reducer >= 0) mine[j] = e->s[j].sumsq;
    s = sync_point(e, local, mine, all, sizeof mine, "the gradient's sums of squares");
    for (size_t j = 0; s == DP_OK && j < e->K; j++)
        e->s[j].sumsq = all[(size_t)dp_rank_of(e, (size_t)e->s[j].owner) * DP_MAX_DEVICES + j];
    if (s != DP_OK) return s;

    /* every rank derives the same norm and decision from the same numbers */
    double loss, sumsq;
    dp_comm_allreduce_scalars(e, &loss, &sumsq);
    e->grad_norm = sqrt(sumsq);
    e->skip = !isfinite(e->grad_norm) || !isfinite(loss);
    if (e->skip) return DP_OK;

    s = dp_ranks_agree(e, dp_workers_run(e, JOB_UPDATE));
    if (s != DP_OK) {
        e->needs_sync |= DP_SYNC_FROM_OWNERS;
        return s;
    }
    return allgather_params(e, dp_replica_check_due(e));
}

// --- the batch ---------------------------------------------------------------------------

/* FNV-1a of the batch's bytes: every rank must pass the same batch. */
static uint64_t batch_hash(const dp_engine *e, const dp_batch *b)
{
    uint64_t h = 0xcbf29ce484222325ull;
    const unsigned char *p = b->inputs;
    size_t n = b->rows * e->model.input_row_bytes;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    p = b->targets;
    n = b->rows * dp_model_target_row_bytes(&e->model);
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h ^ (uint64_t)b->rows;
}

dp_status dp_ranks_check_batch(dp_engine *e, const dp_batch *b, dp_status planned)
{
    uint64_t mine = planned == DP_OK ? batch_hash(e, b) : 0, all[DP_MAX_DEVICES];
    dp_status s = sync_point(e, planned, &mine, all, sizeof mine, "the batch");
    for (int r = 1; s == DP_OK && r < e->nranks; r++)
        if (all[r] != all[0])
            s = DP_FAIL(DP_ERR_INVALID_ARGUMENT, "rank %d's batch differs from rank 0's; every "
                        "rank passes the same global batch (sample it from the same seed) and "
                        "the engine takes each rank's rows", r);
    return s;
}
