/*
 * parallel/ranks.c - joining the ranks of a job at create (ranks.h): every
 * rank's devices and configuration compared and laid out in global device
 * order, over the bootstrap (dp/dist.h); what crosses between the ranks
 * after that goes through the engine's transport (transport/transport.h).
 */
#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "parallel/ranks.h"
#include "transport/dist_internal.h"

#define AGREE_WHAT "agreement between the ranks"

// --- create: every rank's devices and configuration -------------------------------------

/* What must be equal on every rank, and what each rank brings. */
typedef struct rank_info {
    uint64_t k;
    float weights[DP_MAX_DEVICES];
    int kind, mode, shard, optim, grad_accum, token_balanced, allow_tf32, matmul, param_dtype;
    float lr, beta1, beta2, eps, weight_decay, grad_clip, momentum;
    uint64_t max_rows, max_tokens, seed, memory_limit, n_params, n_tensors, n_classes,
        outputs_per_row, input_row_bytes, target_type, target_size, logits_chunk_rows, bucket_bytes,
        head_features, target_classes;
    double watchdog;
    int64_t check_replicas_every;
} rank_info;

static void fill_info(rank_info *x, const dp_engine *e, const dp_device_spec *devices, size_t k,
                      const float *weights)
{
    const dp_engine_config *c = &e->cfg;
    const dp_model *m = &e->model;
    memset(x, 0, sizeof *x);
    x->k = k;
    for (size_t i = 0; i < k; i++) x->weights[i] = weights[i];
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
    x->bucket_bytes = c->bucket_bytes;
    x->head_features = m->head_features;
    x->target_classes = m->target_classes;
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
    DIFF(param_dtype, "model param_dtype");
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
    DIFF(n_params, "model n_params");
    DIFF(n_tensors, "model n_tensors");
    DIFF(n_classes, "model n_classes");
    DIFF(outputs_per_row, "model outputs_per_row");
    DIFF(input_row_bytes, "model input_row_bytes");
    DIFF(target_type, "model target_type");
    DIFF(target_size, "model target_size");
    DIFF(logits_chunk_rows, "logits_chunk_rows");
    DIFF(bucket_bytes, "bucket_bytes");
    DIFF(head_features, "model head_features");
    DIFF(target_classes, "model target_classes");
    DIFF(watchdog, "watchdog_seconds");
    DIFF(check_replicas_every, "check_replicas_every");
    DIFF(kind, "the device kind");
#undef DIFF
    return NULL;
}

#define INIT_WHAT "exchanging the ranks' devices and configuration"
static_assert(sizeof(rank_info) <= 1024, "rank_info is the payload of an agreement");

dp_status dp_ranks_create_failed(dp_dist *d, dp_status s)
{
    int lost = 0;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", dp_last_error());
    /* the exchanges of dp_ranks_init and of the setup's end, as the others make them */
    rank_info none, all[DP_MAX_DEVICES];
    memset(&none, 0, sizeof none);
    if (dp_dist_size(d) <= DP_MAX_DEVICES)
        dp_dist_agree_payload(d, 0.0, s, &none, all, sizeof none, INIT_WHAT, &lost);
    dp_error_raw(s, msg);
    if (!lost) dp_dist_agree_payload(d, 0.0, s, NULL, NULL, 0, AGREE_WHAT, &lost);
    return dp_error_raw(s, msg);
}

dp_status dp_ranks_agree(dp_dist *d, double timeout, dp_status local)
{
    if (dp_dist_size(d) <= 1) return local;
    int lost = 0;
    return dp_dist_agree_payload(d, timeout, local, NULL, NULL, 0, AGREE_WHAT, &lost);
}

dp_status dp_ranks_join(const dp_engine *e, dp_dist *dist, const dp_device_spec *devices,
                        size_t k, const float *weights, dp_layout *L)
{
    memset(L, 0, sizeof *L);
    L->k = L->K = k;
    L->nranks = dp_dist_size(dist);
    L->rank = dp_dist_rank(dist);
    L->rank_first[1] = k;
    for (size_t i = 0; i < k; i++) L->weights[i] = weights[i];
    if (L->nranks == 1) return DP_OK;
    if (L->nranks > DP_MAX_DEVICES)
        return DP_FAIL(DP_ERR_UNSUPPORTED, "%d ranks; an engine spans at most %d devices in all",
                       L->nranks, DP_MAX_DEVICES);
    rank_info mine, all[DP_MAX_DEVICES]; /* ranks <= DP_MAX_DEVICES: on the stack, cannot fail */
    fill_info(&mine, e, devices, k, weights);
    /* Bounded by the watchdog when one is set (0: no limit): a rank that
     * never creates its engine must not leave the others waiting. */
    int lost = 0;
    dp_status s = dp_dist_agree_payload(dist, e->cfg.watchdog_seconds, DP_OK, &mine, all,
                                        sizeof mine, INIT_WHAT, &lost);
    size_t K = 0;
    for (int r = 0; s == DP_OK && r < L->nranks; r++) {
        const char *f = first_difference(&all[0], &all[r]);
        if (f) {
            s = DP_FAIL(DP_ERR_INVALID_ARGUMENT, "rank %d's %s differs from rank 0's; every "
                        "rank must create its engine with the same configuration and model", r, f);
            break;
        }
        L->rank_first[r] = K;
        if (all[r].k > (uint64_t)(DP_MAX_DEVICES - K)) {
            s = DP_FAIL(DP_ERR_INVALID_ARGUMENT, "the ranks have more than %d devices in all; "
                        "use fewer devices per rank or fewer ranks", DP_MAX_DEVICES);
            break;
        }
        for (uint64_t i = 0; i < all[r].k; i++) L->weights[K + i] = all[r].weights[i];
        K += (size_t)all[r].k;
    }
    if (s == DP_OK && all[0].mode == DP_MODE_GATHER)
        s = DP_FAIL(DP_ERR_UNSUPPORTED, "gather mode across ranks: gather mode reproduces one "
                    "process's DataParallel; use balanced mode with ranks, or one process");
    if (s == DP_OK && all[0].n_params > (uint64_t)0x7fffffff)
        s = DP_FAIL(DP_ERR_UNSUPPORTED, "%llu parameters: MPI counts hold at most 2^31 - 1 "
                    "floats", (unsigned long long)all[0].n_params);
    if (s != DP_OK) return s;
    double W = 0.0;
    for (size_t g = 0; g < K; g++) W += L->weights[g];
    if (W <= 0.0)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "device weights are zero on every rank; give at "
                       "least one device a positive share");
    L->K = K;
    L->rank_first[L->nranks] = K;
    L->g0 = L->rank_first[L->rank];
    return DP_OK;
}
