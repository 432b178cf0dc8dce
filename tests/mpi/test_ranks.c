/*
 * tests/mpi/test_ranks.c - the engine over ranks joined by MPI, run by
 * ctest under `mpiexec -n 2` (label mpi). Not a Criterion program:
 * Criterion forks a process per test, and an MPI rank must not fork.
 *
 * Every case runs on both ranks; rank 0 also runs the one-process
 * reference with the same number of devices in all, and the ranks agree
 * on the outcome (dp_dist_agree), so both exit with the same status.
 *
 *  - R ranks x k devices == one process with R x k devices, bitwise
 *    (losses, gradient norms, parameters, moments) after 20 steps: k = 1
 *    and 2, root and sharded optimizer, AdamW with clipping and SGD, an
 *    uneven batch (7 rows), idle devices and an idle rank, the
 *    token-balanced split, gradient accumulation, and slices longer than
 *    one round of the reduce-scatter.
 *  - state moves between R x k and one process: 10 steps on 2 ranks x
 *    cpu:2, then 10 on one process with cpu:4, equal the 20 straight, and
 *    the reverse.
 *    Each with the reduce-scatter's rounds overlapped with the backward
 *    (the default bucket), and some with them after it (bucket off).
 *  - a failure injected on rank 1 in each phase fails the step on both
 *    ranks naming rank 1 and the phase; the next step works and the ranks
 *    agree; a non-finite loss on rank 1's rows skips the update on both.
 *  - rank 1's backward failing, or signalling a range twice, after its
 *    first signal started rounds on both ranks: the step fails on both
 *    naming rank 1, and the next steps equal a run without that step.
 *  - the overlap happens: with a backward held after its first signal,
 *    another device sums rounds that crossed from the other rank before
 *    that backward ends.
 *  - dp_trace_gather: rank 0's trace holds both ranks' steps (a process
 *    each), a second gather replaces the first's, a rank without a trace
 *    fails it on both; a peer's malformed part (each field broken in
 *    turn) is refused on rank 0, which keeps its trace as it was.
 *  - bad use: different configurations, different batches, gather mode;
 *    exactly DP_MAX_DEVICES over the ranks works, one more is refused.
 *  - a diverged replica on rank 1 is named on both ranks; a rank stalled
 *    past the watchdog makes both ranks' step time out; a rank late past
 *    the bound of dp_dist_agree_timeout / _broadcast_timeout times out
 *    the other's call.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <dp/dp.h>
#include <dp/dist.h>

#include "mlp_model.h"
#include "parallel/engine_testing.h"
#include "transport/dist_internal.h"

enum { D = 6, CLASSES = 5, MAXROWS = 16, STEPS = 20 };

static dp_dist *dist;
static int rank, failures;
/* --cuda: the same cases on GPUs joined by NCCL, rank r on cuda:r (NCCL
 * refuses two ranks on one GPU); the reference is one process on cuda:0,1. */
static dp_device_kind kind = DP_DEVICE_CPU;

#define CHECK(cond, ...)                                                \
    do {                                                                \
        if (!(cond)) {                                                  \
            fprintf(stderr, "rank %d: %s:%d: ", rank, __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                               \
            fprintf(stderr, "\n");                                      \
            failures++;                                                 \
            return;                                                     \
        }                                                               \
    } while (0)
#define CHECK_OK(expr) CHECK((expr) == DP_OK, "%s: %s", #expr, dp_last_error())

typedef struct tcase {
    const char *name;
    int k;          /* devices per rank */
    int shard;
    int rows;
    size_t hidden;
    dp_optimizer optim;
    int token_balanced, grad_accum, ignore_every;
    float weight_rank1; /* device weight of rank 1's devices (1: equal) */
    int bf16;           /* bf16 replicas (float32 masters) and bf16 GEMMs */
    size_t bucket;      /* dp_engine_config.bucket_bytes (0: the default, overlapped) */
} tcase;

typedef struct result {
    double loss[STEPS], norm[STEPS];
    float *p, *m, *v;
    size_t n;
    long t;
} result;

static void batch(int s, int rows, int ignore_every, float *x, int32_t *y)
{
    dp_rng rng;
    dp_rng_seed(&rng, 1000 + (uint64_t)s);
    dp_rng_fill_normal(&rng, x, (size_t)rows * D, 0.0f, 1.0f);
    for (int i = 0; i < rows; i++) {
        y[i] = (int32_t)dp_rng_below(&rng, CLASSES);
        if (ignore_every > 0 && i % ignore_every == ignore_every - 1) y[i] = -1;
    }
}

static dp_engine_config config(const tcase *c)
{
    dp_engine_config cfg = dp_engine_config_default();
    cfg.optim.kind = c->optim;
    cfg.optim.lr = 1e-2f;
    cfg.optim.momentum = c->optim == DP_OPTIMIZER_SGD ? 0.9f : 0.0f;
    cfg.optim.grad_clip = 0.5f; /* below the first steps' norms: clipping is active */
    cfg.shard_optimizer = c->shard;
    cfg.token_balanced = c->token_balanced;
    cfg.grad_accum = c->grad_accum ? c->grad_accum : 1;
    cfg.seed = 11;
    cfg.watchdog_seconds = 60;
    cfg.matmul_precision = c->bf16 ? DP_MATMUL_BF16 : DP_MATMUL_FP32;
    cfg.bucket_bytes = c->bucket;
    return cfg;
}

/* What the MLP's backward does when a test arms it (faulty_backward). */
typedef enum {
    BACKWARD_PLAIN,
    BACKWARD_FAILS_AFTER_SIGNAL,
    BACKWARD_SIGNALS_TWICE,
    BACKWARD_HOLDS /* local device 0 held 300 ms between its two signals */
} backward_mode;

typedef struct run {
    mlp net;
    dp_model model, inner; /* model wraps inner's backward (faulty_backward) */
    backward_mode armed;
    dp_criterion crit;
    dp_engine *e;
} run;

/* The MLP's backward, or when armed: its back half of the gradient
 * signalled final (the rounds of that range start on both ranks), then a
 * failure, or the same signal again. */
static dp_status faulty_backward(void *ctx, dp_device *dev, dp_params p, float *g,
                                 const dp_chunk *c, void *ws, float *dlogits)
{
    run *r = ctx;
    if (r->armed == BACKWARD_PLAIN)
        return r->inner.backward(r->inner.ctx, dev, p, g, c, ws, dlogits);
    dp_chunk quiet = *c;
    quiet.ready = NULL; /* the inner backward's own signals withheld */
    dp_status s = r->inner.backward(r->inner.ctx, dev, p, g, &quiet, ws, dlogits);
    size_t n = r->inner.n_params;
    if (s == DP_OK) s = dp_grads_ready(c, n / 2, n);
    if (s != DP_OK) return s;
    if (r->armed == BACKWARD_SIGNALS_TWICE) return dp_grads_ready(c, n / 2, n);
    if (r->armed == BACKWARD_HOLDS) {
        if (dev == dp_engine_device(r->e, 0)) nanosleep(&(struct timespec){0, 300000000L}, NULL);
        return dp_grads_ready(c, 0, n / 2);
    }
    return dp_set_error(DP_ERR_DEVICE, "injected failure after a signal");
}

/* An engine of k CPU devices, over the ranks (ranked) or in this process. */
static dp_status open_run(run *r, const tcase *c, int k, int ranked, dp_engine_config cfg)
{
    mlp_config mc = {D, c->hidden, CLASSES, c->bf16 ? DP_DTYPE_BF16 : DP_DTYPE_F32};
    mlp_init_model(&r->net, &mc, &r->inner);
    r->model = r->inner;
    r->model.ctx = r;
    r->model.backward = faulty_backward;
    r->armed = BACKWARD_PLAIN;
    r->crit = dp_criterion_cross_entropy();
    dp_device_spec specs[DP_MAX_DEVICES];
    float weights[DP_MAX_DEVICES];
    for (int i = 0; i < k; i++) {
        specs[i] = (dp_device_spec){kind, kind == DP_DEVICE_CUDA && ranked ? rank * k + i : i};
        /* one process: the global devices of rank 1 are the second half */
        int on_rank1 = ranked ? rank == 1 : i >= k / 2;
        weights[i] = on_rank1 ? c->weight_rank1 : 1.0f;
    }
    cfg.device_weights = weights;
    cfg.dist = ranked ? dist : NULL;
    return dp_engine_create(specs, (size_t)k, &r->model, &r->crit, &cfg, &r->e);
}

static int alloc_result(result *res, size_t n)
{
    memset(res, 0, sizeof *res);
    res->n = n;
    res->p = calloc(n, sizeof(float));
    res->m = calloc(n, sizeof(float));
    res->v = calloc(n, sizeof(float));
    return res->p && res->m && res->v;
}

static void free_result(result *res)
{
    free(res->p);
    free(res->m);
    free(res->v);
}

static dp_status steps(dp_engine *e, const tcase *c, int from, int to, result *res)
{
    float x[MAXROWS * D];
    int32_t y[MAXROWS];
    for (int s = from; s < to; s++) {
        batch(s, c->rows, c->ignore_every, x, y);
        dp_batch b = {(size_t)c->rows, x, y};
        dp_step_stats st;
        dp_status rc = dp_engine_step(e, &b, &st);
        if (rc != DP_OK) return rc;
        /* GPUs with their communication queues (DP_CUDA_OVERLAP=1) overlap
         * the rounds with the backward, as CPUs do by default */
        const char *queues = getenv("DP_CUDA_OVERLAP");
        int expect = c->bucket != DP_BUCKET_OFF && dp_engine_num_global_devices(e) > 1 &&
                     (kind == DP_DEVICE_CPU || (queues && strcmp(queues, "1") == 0));
        if (st.overlapped != expect)
            return dp_set_error(DP_ERR_INTERNAL, "step %d overlapped %d, expected %d", s,
                                st.overlapped, expect);
        res->loss[s] = st.loss;
        res->norm[s] = st.grad_norm;
    }
    return DP_OK;
}

static dp_status finish(dp_engine *e, result *res)
{
    dp_status s = dp_engine_get_params(e, res->p);
    if (s == DP_OK) s = dp_engine_get_optimizer_state(e, res->m, res->v, &res->t);
    return s;
}

static const char *first_difference(const result *a, const result *b, int adamw)
{
    if (memcmp(a->loss, b->loss, sizeof a->loss)) return "losses";
    if (memcmp(a->norm, b->norm, sizeof a->norm)) return "gradient norms";
    if (memcmp(a->p, b->p, a->n * sizeof(float))) return "parameters";
    if (memcmp(a->m, b->m, a->n * sizeof(float))) return "first moments";
    if (adamw && memcmp(a->v, b->v, a->n * sizeof(float))) return "second moments";
    if (a->t != b->t) return "step counts";
    return NULL;
}

/* The outcome on every rank: rank 0's verdict (it ran the reference). */
static void agree_case(const char *name, int ok_here)
{
    dp_status s = dp_dist_agree(dist, ok_here ? DP_OK : DP_ERR_INTERNAL);
    if (rank == 0) printf("%s %s\n", s == DP_OK ? "PASS" : "FAIL", name);
    if (s != DP_OK && ok_here) failures++;
}

// --- R x k == one process with R x k -----------------------------------------------------

static void equivalence(const tcase *c)
{
    int before = failures;
    run r;
    result got, want;
    CHECK_OK(open_run(&r, c, c->k, 1, config(c)));
    CHECK(alloc_result(&got, r.model.n_params) && alloc_result(&want, r.model.n_params), "oom");
    CHECK(dp_engine_num_global_devices(r.e) == (size_t)(2 * c->k), "global devices %zu",
          dp_engine_num_global_devices(r.e));
    CHECK(dp_engine_first_global_device(r.e) == (size_t)(rank * c->k), "first global device");
    CHECK_OK(steps(r.e, c, 0, STEPS, &got));
    CHECK_OK(finish(r.e, &got));
    dp_engine_destroy(r.e);
    if (rank == 0) {
        run ref;
        CHECK_OK(open_run(&ref, c, 2 * c->k, 0, config(c)));
        CHECK_OK(steps(ref.e, c, 0, STEPS, &want));
        CHECK_OK(finish(ref.e, &want));
        dp_engine_destroy(ref.e);
        const char *diff = first_difference(&got, &want, c->optim == DP_OPTIMIZER_ADAMW);
        CHECK(!diff, "%s: %s differ from one process with %d devices (final loss %.9g vs %.9g)",
              c->name, diff, 2 * c->k, got.loss[STEPS - 1], want.loss[STEPS - 1]);
        CHECK(got.norm[0] > 0.5, "%s: clipping inactive (norm %g)", c->name, got.norm[0]);
    } else {
        /* every rank returns the whole state */
        CHECK(got.t == STEPS, "step count %ld", got.t);
    }
    free_result(&got);
    free_result(&want);
    (void)before;
}

static void run_equivalence(const tcase *c)
{
    int before = failures;
    equivalence(c);
    agree_case(c->name, failures == before);
}

// --- state across R x k ---------------------------------------------------------------------

/* 10 steps on `first` (ranked or not), the state moved into `second`, 10 more: == 20 on one process. */
static void handover(const char *name, int first_ranked)
{
    int before = failures;
    tcase c = {name, 2, 1, 7, 64, DP_OPTIMIZER_ADAMW, 0, 1, 3, 1.0f, 0};
    result mid, got, want;
    run a, b;
    size_t n;
    {
        mlp net;
        dp_model m;
        mlp_config mc = {D, c.hidden, CLASSES, DP_DTYPE_F32};
        mlp_init_model(&net, &mc, &m);
        n = m.n_params;
    }
    if (!alloc_result(&mid, n) || !alloc_result(&got, n) || !alloc_result(&want, n)) {
        failures++;
        goto out;
    }
    /* the ranked engine has cpu:2 per rank; the one-process engine cpu:4 on rank 0 */
    if (first_ranked) {
        CHECK_OK(open_run(&a, &c, 2, 1, config(&c)));
        CHECK_OK(steps(a.e, &c, 0, 10, &got));
        CHECK_OK(finish(a.e, &mid));
        dp_engine_destroy(a.e);
        if (rank == 0) {
            CHECK_OK(open_run(&b, &c, 4, 0, config(&c)));
            CHECK_OK(dp_engine_set_params(b.e, mid.p));
            CHECK_OK(dp_engine_set_optimizer_state(b.e, mid.m, mid.v, mid.t));
            CHECK_OK(steps(b.e, &c, 10, STEPS, &got));
            CHECK_OK(finish(b.e, &got));
            dp_engine_destroy(b.e);
        }
    } else {
        if (rank == 0) {
            CHECK_OK(open_run(&a, &c, 4, 0, config(&c)));
            CHECK_OK(steps(a.e, &c, 0, 10, &got));
            CHECK_OK(finish(a.e, &mid));
            dp_engine_destroy(a.e);
        }
        /* rank 1 passes garbage: the engine takes rank 0's values */
        if (rank == 1) memset(mid.p, 0, n * sizeof(float));
        CHECK_OK(open_run(&b, &c, 2, 1, config(&c)));
        CHECK_OK(dp_engine_set_params(b.e, mid.p));
        CHECK_OK(dp_engine_set_optimizer_state(b.e, mid.m, mid.v, rank == 0 ? mid.t : 999));
        CHECK_OK(steps(b.e, &c, 10, STEPS, &got));
        CHECK_OK(finish(b.e, &got));
        dp_engine_destroy(b.e);
    }
    if (rank == 0) {
        CHECK_OK(open_run(&a, &c, 4, 0, config(&c)));
        CHECK_OK(steps(a.e, &c, 0, STEPS, &want));
        CHECK_OK(finish(a.e, &want));
        dp_engine_destroy(a.e);
        const char *diff = first_difference(&got, &want, 1);
        CHECK(!diff, "%s: %s differ from 20 straight steps", name, diff);
    }
out:
    free_result(&mid);
    free_result(&got);
    free_result(&want);
    (void)before;
}

static void run_handover(const char *name, int first_ranked)
{
    int before = failures;
    handover(name, first_ranked);
    agree_case(name, failures == before);
}

// --- failures ----------------------------------------------------------------------------------

/* A failure on rank 1 in phase p fails the step on both ranks, naming rank
 * 1 and the phase; the next step works and every rank holds the same parameters. */
static void fault_in(dp_phase p, int shard)
{
    tcase c = {"fault", 1, shard, 7, 12, DP_OPTIMIZER_ADAMW, 0, 1, 0, 1.0f, 0};
    run r;
    result res;
    CHECK_OK(open_run(&r, &c, 1, 1, config(&c)));
    CHECK(alloc_result(&res, r.model.n_params), "oom");
    CHECK_OK(steps(r.e, &c, 0, 2, &res));
    if (rank == 1) dp_engine_inject_fault(r.e, 0, p, DP_ERR_DEVICE);
    float x[MAXROWS * D];
    int32_t y[MAXROWS];
    batch(2, c.rows, 0, x, y);
    dp_batch b = {(size_t)c.rows, x, y};
    dp_step_stats st;
    dp_status s = dp_engine_step(r.e, &b, &st);
    CHECK(s == DP_ERR_DEVICE, "fault in %s: step returned %d (%s)", dp_phase_name(p), (int)s,
          dp_last_error());
    CHECK(strstr(dp_last_error(), "rank 1") && strstr(dp_last_error(), dp_phase_name(p)),
          "fault in %s: message does not name rank 1 and the phase: %s", dp_phase_name(p),
          dp_last_error());
    CHECK_OK(steps(r.e, &c, 3, 5, &res));
    CHECK_OK(dp_engine_get_params(r.e, res.p));
    /* every rank's replica and owners agree: the hash of the params is rank 0's */
    uint64_t h = 1469598103934665603ull, h0;
    for (size_t i = 0; i < res.n; i++) {
        uint32_t u;
        memcpy(&u, &res.p[i], 4);
        h = (h ^ u) * 1099511628211ull;
    }
    h0 = h;
    CHECK_OK(dp_dist_broadcast(dist, &h0, sizeof h0));
    CHECK(h == h0, "fault in %s: the ranks' parameters differ afterwards", dp_phase_name(p));
    dp_engine_destroy(r.e);
    free_result(&res);
}

static void run_faults(void)
{
    for (int shard = 0; shard <= 1; shard++)
        for (int p = 0; p < DP_PHASE_COUNT; p++) {
            char name[96];
            int before = failures;
            snprintf(name, sizeof name, "fault on rank 1 in %s (%s)", dp_phase_name((dp_phase)p),
                     shard ? "sharded" : "root");
            fault_in((dp_phase)p, shard);
            agree_case(name, failures == before);
        }
}

/* Rank 1's backward fails (or signals a range twice, which the engine
 * refuses) after it signalled the back half of its gradient final, with
 * that half's rounds started on both ranks: the step fails on both,
 * naming rank 1, nobody waits, and the next steps give the bits of a run
 * that never took the failed step. */
static void fault_mid_backward(backward_mode mode, int shard, size_t bucket)
{
    /* 1.2M parameters: three rounds per slice, both staging halves used */
    tcase c = {"mid-backward", 1, shard, 7, 100000, DP_OPTIMIZER_ADAMW, 0, 1, 0, 1.0f, 0, bucket};
    run r, ref;
    result got, want;
    CHECK_OK(open_run(&r, &c, 1, 1, config(&c)));
    CHECK(alloc_result(&got, r.model.n_params) && alloc_result(&want, r.model.n_params), "oom");
    CHECK_OK(steps(r.e, &c, 0, 2, &got));
    if (rank == 1) r.armed = mode;
    dp_status s = steps(r.e, &c, 2, 3, &got);
    r.armed = BACKWARD_PLAIN;
    dp_status want_s = mode == BACKWARD_FAILS_AFTER_SIGNAL ? DP_ERR_DEVICE : DP_ERR_INVALID_ARGUMENT;
    const char *want_msg = mode == BACKWARD_FAILS_AFTER_SIGNAL ? "injected failure after a signal"
                                                               : "does not end where";
    CHECK(s == want_s, "mid-backward: step returned %d (%s)", (int)s, dp_last_error());
    CHECK(strstr(dp_last_error(), "rank 1") && strstr(dp_last_error(), want_msg),
          "mid-backward: the message does not name rank 1 and the failure: %s", dp_last_error());
    got.loss[2] = got.norm[2] = 0.0; /* the failed step's */
    CHECK_OK(steps(r.e, &c, 3, 5, &got));
    CHECK_OK(finish(r.e, &got));
    dp_engine_destroy(r.e);
    CHECK_OK(open_run(&ref, &c, 1, 1, config(&c)));
    CHECK_OK(steps(ref.e, &c, 0, 2, &want));
    CHECK_OK(steps(ref.e, &c, 3, 5, &want));
    CHECK_OK(finish(ref.e, &want));
    dp_engine_destroy(ref.e);
    const char *diff = first_difference(&got, &want, 1);
    CHECK(!diff, "mid-backward: %s differ from a run without the failed step", diff);
    free_result(&got);
    free_result(&want);
}

static void run_faults_mid_backward(void)
{
    static const struct {
        backward_mode mode;
        int shard;
        size_t bucket;
        const char *name;
    } cases[] = {
        {BACKWARD_FAILS_AFTER_SIGNAL, 0, 0, "rank 1 fails mid-backward, rounds in flight (root)"},
        {BACKWARD_FAILS_AFTER_SIGNAL, 1, 0, "rank 1 fails mid-backward, rounds in flight (sharded)"},
        {BACKWARD_SIGNALS_TWICE, 1, 0, "rank 1 signals a range twice: refused on both ranks"},
        {BACKWARD_FAILS_AFTER_SIGNAL, 1, DP_BUCKET_OFF,
         "rank 1 fails mid-backward, no overlap: no round moves"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int before = failures;
        fault_mid_backward(cases[i].mode, cases[i].shard, cases[i].bucket);
        agree_case(cases[i].name, failures == before);
    }
}

/* The overlap happens between the ranks: 2 x cpu:2, sharded, each
 * rank's device 0 held 300 ms after signalling the back half of its
 * gradient. The last slice (global device 3's, on rank 1) is final on
 * every device then, so its rounds cross from rank 0 and device 3 sums
 * them while device 2 is still inside its backward; the results are the
 * bits of the same run without the overlap. */
static void overlap_happens(void)
{
    tcase c = {"overlap", 2, 1, 8, 100000, DP_OPTIMIZER_ADAMW, 0, 1, 0, 1.0f, 0, 0};
    tcase off = c;
    off.bucket = DP_BUCKET_OFF;
    run r, ref;
    result got, want;
    CHECK_OK(open_run(&r, &c, 2, 1, config(&c)));
    CHECK_OK(open_run(&ref, &off, 2, 1, config(&off)));
    CHECK(alloc_result(&got, r.model.n_params) && alloc_result(&want, r.model.n_params), "oom");
    r.armed = ref.armed = BACKWARD_HOLDS;
    float x[MAXROWS * D];
    int32_t y[MAXROWS];
    dp_step_stats st;
    for (int s = 0; s < 2; s++) {
        batch(s, c.rows, 0, x, y);
        dp_batch b = {(size_t)c.rows, x, y};
        CHECK_OK(dp_engine_step(r.e, &b, &st));
        got.loss[s] = st.loss;
        got.norm[s] = st.grad_norm;
        if (rank == 1) {
            const dp_device_step_stats *d2 = &st.devices[0], *d3 = &st.devices[1];
            double bw_end = d2->phase_start[DP_PHASE_BACKWARD] + d2->phase_seconds[DP_PHASE_BACKWARD];
            CHECK(d3->phase_seconds[DP_PHASE_REDUCE] > 0.0, "device 3 reduced nothing");
            CHECK(d3->phase_start[DP_PHASE_REDUCE] < bw_end,
                  "step %d: device 3's reduce began at %g s, after device 2's backward ended "
                  "(%g s): the rounds did not cross during the backward", s,
                  d3->phase_start[DP_PHASE_REDUCE], bw_end);
        }
        /* The exchanges (the trace's track): rounds were in flight before
         * this rank's held backward ended, in time order, inside the step. */
        const dp_device_step_stats *held = &st.devices[0];
        double held_end = held->phase_start[DP_PHASE_BACKWARD] +
                          held->phase_seconds[DP_PHASE_BACKWARD], prev_end = 0.0;
        CHECK(st.n_exchange_spans > 0 && st.exchange_spans, "step %d: no exchange spans", s);
        for (size_t j = 0; j < st.n_exchange_spans; j++) {
            const dp_phase_span *x = &st.exchange_spans[j];
            CHECK(x->phase == DP_PHASE_REDUCE && x->start >= prev_end && x->seconds >= 0.0 &&
                      x->start + x->seconds <= st.seconds,
                  "step %d exchange %zu: %s at %g s for %g s (the one before ends at %g s, "
                  "the step lasts %g s)", s, j, dp_phase_name(x->phase), x->start, x->seconds,
                  prev_end, st.seconds);
            prev_end = x->start + x->seconds;
        }
        CHECK(st.n_exchange_spans == 0 || st.exchange_spans[0].start < held_end,
              "step %d: the first round left at %g s, after the held backward ended (%g s)", s,
              st.n_exchange_spans ? st.exchange_spans[0].start : -1.0, held_end);
        CHECK_OK(dp_engine_step(ref.e, &b, &st));
        CHECK(st.n_exchange_spans > 0, "no overlap: the rounds after it are exchanges too");
        want.loss[s] = st.loss;
        want.norm[s] = st.grad_norm;
    }
    /* an evaluation exchanges no round: none reported (not the last step's) */
    batch(0, c.rows, 0, x, y);
    dp_batch eb = {(size_t)c.rows, x, y};
    CHECK_OK(dp_engine_evaluate(r.e, &eb, &st));
    CHECK(st.n_exchange_spans == 0 && !st.exchange_spans, "an evaluation has %zu exchange spans",
          st.n_exchange_spans);
    CHECK_OK(finish(r.e, &got));
    CHECK_OK(finish(ref.e, &want));
    dp_engine_destroy(r.e);
    dp_engine_destroy(ref.e);
    const char *diff = first_difference(&got, &want, 1);
    CHECK(!diff, "overlap: %s differ from the run without it", diff);
    free_result(&got);
    free_result(&want);
}

/* A NaN input in rank 1's rows: the update is skipped on both ranks. */
static void nonfinite(void)
{
    tcase c = {"nonfinite", 1, 1, 8, 12, DP_OPTIMIZER_ADAMW, 0, 1, 0, 1.0f, 0};
    run r;
    result before, after;
    CHECK_OK(open_run(&r, &c, 1, 1, config(&c)));
    CHECK(alloc_result(&before, r.model.n_params) && alloc_result(&after, r.model.n_params), "oom");
    CHECK_OK(steps(r.e, &c, 0, 2, &before));
    CHECK_OK(dp_engine_get_params(r.e, before.p));
    float x[MAXROWS * D];
    int32_t y[MAXROWS];
    batch(2, c.rows, 0, x, y);
    x[(c.rows - 1) * D] = NAN; /* the last row: rank 1's */
    dp_batch b = {(size_t)c.rows, x, y};
    dp_step_stats st;
    CHECK_OK(dp_engine_step(r.e, &b, &st));
    CHECK(st.skipped == 1, "not skipped on rank %d", rank);
    CHECK(st.skipped_device == 1, "skipped_device %d, want global device 1", st.skipped_device);
    CHECK_OK(dp_engine_get_params(r.e, after.p));
    CHECK(memcmp(before.p, after.p, before.n * sizeof(float)) == 0, "parameters changed");
    CHECK_OK(steps(r.e, &c, 3, 4, &after));
    dp_engine_destroy(r.e);
    free_result(&before);
    free_result(&after);
}

/* A replica of rank 1 that diverges is named on both ranks and re-synchronised. */
static void divergence(void)
{
    tcase c = {"diverge", 1, 1, 7, 12, DP_OPTIMIZER_ADAMW, 0, 1, 0, 1.0f, 0};
    dp_engine_config cfg = config(&c);
    cfg.check_replicas_every = 1;
    run r;
    result res;
    CHECK_OK(open_run(&r, &c, 1, 1, cfg));
    CHECK(alloc_result(&res, r.model.n_params), "oom");
    CHECK_OK(steps(r.e, &c, 0, 2, &res));
    if (rank == 1) dp_engine_inject_divergence(r.e, 0);
    dp_status s = steps(r.e, &c, 2, 3, &res);
    CHECK(s == DP_ERR_INTERNAL && strstr(dp_last_error(), "global device 1 (rank 1)"),
          "divergence: %d %s", (int)s, dp_last_error());
    CHECK_OK(steps(r.e, &c, 3, 5, &res)); /* re-synchronised: the checks pass again */
    dp_engine_destroy(r.e);
    free_result(&res);
}

/* Rank 1 stalls past the watchdog: both ranks' step fails with
 * DP_ERR_TIMEOUT within a few watchdog periods instead of hanging. Last:
 * the engines are unusable afterwards. */
static void stall(void)
{
    tcase c = {"stall", 1, 0, 7, 12, DP_OPTIMIZER_ADAMW, 0, 1, 0, 1.0f, 0};
    dp_engine_config cfg = config(&c);
    cfg.watchdog_seconds = 1.0;
    run r;
    result res;
    CHECK_OK(open_run(&r, &c, 1, 1, cfg));
    CHECK(alloc_result(&res, r.model.n_params), "oom");
    CHECK_OK(steps(r.e, &c, 0, 1, &res));
    if (rank == 1) dp_engine_inject_stall(r.e, 0, DP_PHASE_FORWARD, 30.0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    dp_status s = steps(r.e, &c, 1, 2, &res);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double took = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    CHECK(s == DP_ERR_TIMEOUT, "stall: %d %s", (int)s, dp_last_error());
    CHECK(took < 10.0, "stall: the step took %.1f s", took);
    dp_engine_destroy(r.e);
    free_result(&res);
}

/* Rank 1 runs out of memory: at create (a smaller memory_limit on rank
 * 1: the limit may differ between ranks), then inside a step (its device's
 * limit lowered, and a larger batch grows its buffers). Both ranks fail
 * with rank 1's error; nobody waits for the other; the engine goes on
 * once memory is back. */
static void out_of_memory(void)
{
    tcase c = {"oom", 1, 1, 1, 100000, DP_OPTIMIZER_ADAMW, 0, 1, 0, 1.0f, 0};
    run r;
    dp_engine_config cfg = config(&c);
    if (rank == 1) cfg.memory_limit = 8u << 20; /* the 1.2M-parameter model needs more */
    dp_status s = open_run(&r, &c, 1, 1, cfg);
    CHECK(s == DP_ERR_OUT_OF_MEMORY && strstr(dp_last_error(), "rank 1: "),
          "create with rank 1 out of memory: %d %s", (int)s, dp_last_error());

    CHECK_OK(open_run(&r, &c, 1, 1, config(&c)));
    result res;
    CHECK(alloc_result(&res, r.model.n_params), "oom");
    CHECK_OK(steps(r.e, &c, 0, 1, &res));
    dp_device *dev = dp_engine_device(r.e, 0);
    dp_memory_stats ms;
    dp_device_memory(dev, &ms);
    if (rank == 1) CHECK_OK(dp_device_set_limit(dev, ms.in_use + (64u << 10)));
    tcase big = c;
    big.rows = MAXROWS;
    dp_clear_error();
    s = steps(r.e, &big, 1, 2, &res);
    CHECK(s == DP_ERR_OUT_OF_MEMORY && strstr(dp_last_error(), "rank 1: "),
          "step with rank 1 out of memory: %d %s", (int)s, dp_last_error());
    if (rank == 1) CHECK_OK(dp_device_set_limit(dev, 0));
    CHECK_OK(steps(r.e, &big, 2, 3, &res)); /* and it goes on once memory is back */
    dp_engine_destroy(r.e);
    free_result(&res);
}

/* The limit on the devices of a job: exactly DP_MAX_DEVICES over the two
 * ranks trains; one more is refused on both ranks, naming the limit. */
static void device_limit(void)
{
    tcase c = {"limit", DP_MAX_DEVICES / 2, 1, 7, 12, DP_OPTIMIZER_ADAMW, 0, 1, 0, 1.0f, 0};
    run r;
    CHECK_OK(open_run(&r, &c, DP_MAX_DEVICES / 2, 1, config(&c)));
    CHECK(dp_engine_num_global_devices(r.e) == DP_MAX_DEVICES, "%zu global devices",
          dp_engine_num_global_devices(r.e));
    result res;
    CHECK(alloc_result(&res, r.model.n_params), "oom");
    CHECK_OK(steps(r.e, &c, 0, 1, &res));
    dp_engine_destroy(r.e);
    free_result(&res);
    int k = DP_MAX_DEVICES / 2 + (rank == 1);
    dp_status s = open_run(&r, &c, k, 1, config(&c));
    CHECK(s == DP_ERR_INVALID_ARGUMENT && strstr(dp_last_error(), "more than 64 devices in all"),
          "%d + %d devices: %d %s", DP_MAX_DEVICES / 2, DP_MAX_DEVICES / 2 + 1, (int)s,
          dp_last_error());
}

/* dp/dist.h itself: a broadcast larger than a piece (1 MiB), its bytes
 * counted once per other rank on rank 0, and agreement naming the rank. */
static void dist_api(void)
{
    size_t n = (3u << 20) + 5;
    unsigned char *buf = malloc(n);
    CHECK(buf, "oom");
    for (size_t i = 0; i < n; i++) buf[i] = rank == 0 ? (unsigned char)(i * 7 + 3) : 0;
    size_t before = dp_dist_bytes_sent(dist);
    CHECK_OK(dp_dist_broadcast(dist, buf, n));
    size_t sent = dp_dist_bytes_sent(dist) - before;
    for (size_t i = 0; i < n; i++)
        CHECK(buf[i] == (unsigned char)(i * 7 + 3), "byte %zu of the broadcast is %d", i, buf[i]);
    CHECK(sent == (rank == 0 ? n : 0), "rank %d counted %zu bytes sent", rank, sent);
    free(buf);
    dp_status s = dp_dist_agree(dist, rank == 1 ? dp_set_error(DP_ERR_IO, "disk full") : DP_OK);
    CHECK(s == DP_ERR_IO && strncmp(dp_last_error(), "rank 1: disk full", 17) == 0,
          "agree: %d '%s'", (int)s, dp_last_error());
    CHECK_OK(dp_dist_agree(dist, DP_OK));
    CHECK(dp_dist_built() == 1 && dp_dist_launched_size() == 2, "built %d, launched %d",
          dp_dist_built(), dp_dist_launched_size());
}

/* Occurrences of needle in hay. */
static size_t count_of(const char *hay, const char *needle)
{
    size_t n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

/* Rank r's trace: 1 + r devices named "r<r> dev<i>" (rank 1's second with
 * a quote to escape), `steps` steps of a forward and a backward span per
 * device, and on rank 1 two exchange spans a step. */
static dp_status rank_trace(int steps, dp_trace **out)
{
    size_t k = 1 + (size_t)rank;
    char names[2][32];
    const char *np[2];
    for (size_t i = 0; i < k; i++) {
        snprintf(names[i], sizeof names[i], i == 1 ? "r%d \"dev\" %zu" : "r%d dev%zu", rank, i);
        np[i] = names[i];
    }
    dp_status s = dp_trace_create(np, k, out);
    const dp_phase_span spans[2] = {{DP_PHASE_FORWARD, 0.001, 0.002},
                                    {DP_PHASE_BACKWARD, 0.003, 0.004}};
    const dp_phase_span xs[2] = {{DP_PHASE_REDUCE, 0.004, 0.001}, {DP_PHASE_REDUCE, 0.006, 0.001}};
    for (int st = 0; st < steps && s == DP_OK; st++) {
        dp_step_stats ss;
        memset(&ss, 0, sizeof ss);
        ss.start_seconds = 0.01 * st;
        ss.step = st + 1;
        ss.n_devices = k;
        for (size_t i = 0; i < k; i++) {
            ss.devices[i].rows = 10 + i;
            ss.devices[i].spans = spans;
            ss.devices[i].n_spans = 2;
        }
        if (rank == 1) {
            ss.exchange_spans = xs;
            ss.n_exchange_spans = 2;
        }
        s = dp_trace_add_step(*out, &ss);
    }
    return s;
}

/* Rank 0's trace as written, or NULL (the test failed). */
static char *written(const dp_trace *t)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/dp_test_gather_%ld.json", (long)getpid());
    if (dp_trace_write(t, path) != DP_OK) return NULL;
    FILE *f = fopen(path, "rb");
    char *text = f ? calloc(1, 1 << 20) : NULL;
    if (text) text[fread(text, 1, (1 << 20) - 1, f)] = '\0';
    if (f) fclose(f);
    remove(path);
    return text;
}

/* dp_trace_gather: rank 0's file holds both ranks, a process each (pid 1
 * "rank 0" with its device, pid 2 "rank 1" with its two and its
 * exchanges); rank 0's own steps stay its count; a second gather replaces
 * the first's; a rank without a trace fails the gather on both ranks,
 * naming it, with no wait. */
static void trace_gather(void)
{
    dp_trace *t = NULL;
    CHECK_OK(rank_trace(3, &t));
    dp_status s = dp_trace_gather(t, dist, 30.0);
    CHECK(s == DP_OK, "gather: %s", dp_last_error());
    if (rank == 0) {
        CHECK(dp_trace_steps(t) == 3, "rank 0's steps: %zu", dp_trace_steps(t));
        char *j = written(t);
        CHECK(j, "writing the gathered trace: %s", dp_last_error());
        size_t f1 = count_of(j, "\"name\": \"forward\", \"cat\": \"step\", \"ph\": \"X\", "
                                 "\"pid\": 1,");
        size_t f2 = count_of(j, "\"name\": \"forward\", \"cat\": \"step\", \"ph\": \"X\", "
                                 "\"pid\": 2,");
        size_t x2 = count_of(j, "\"name\": \"rounds in flight\", \"cat\": \"step\", "
                                 "\"ph\": \"X\", \"pid\": 2,");
        int names = strstr(j, "\"pid\": 1, \"tid\": 0, \"args\": {\"name\": \"rank 0\"}") &&
                    strstr(j, "\"pid\": 2, \"tid\": 0, \"args\": {\"name\": \"rank 1\"}") &&
                    strstr(j, "\"pid\": 2, \"tid\": 1, \"args\": {\"name\": "
                              "\"r1 \\\"dev\\\" 1\"}");
        int none1 = count_of(j, "\"name\": \"rounds in flight\", \"cat\": \"step\", "
                                "\"ph\": \"X\", \"pid\": 1,") == 0;
        free(j);
        CHECK(f1 == 3 && f2 == 6 && x2 == 6 && names && none1,
              "forward events %zu and %zu, exchanges %zu, names %d, none on rank 0 %d", f1, f2, x2,
              names, none1);
    }
    /* rank 1 one step more: the second gather's replace the first's */
    dp_trace *t2 = NULL;
    CHECK_OK(rank == 1 ? rank_trace(4, &t2) : DP_OK);
    s = dp_trace_gather(rank == 1 ? t2 : t, dist, 30.0);
    CHECK(s == DP_OK, "second gather: %s", dp_last_error());
    if (rank == 0) {
        char *j = written(t);
        CHECK(j, "writing: %s", dp_last_error());
        size_t f2 = count_of(j, "\"name\": \"forward\", \"cat\": \"step\", \"ph\": \"X\", "
                                 "\"pid\": 2,");
        free(j);
        CHECK(f2 == 8, "after the second gather rank 1 has %zu forward events", f2);
    }
    /* rank 1 without a trace: both fail, naming rank 1 */
    s = dp_trace_gather(rank == 1 ? NULL : t, dist, 30.0);
    CHECK(s == DP_ERR_INVALID_ARGUMENT && strstr(dp_last_error(), "rank 1") &&
              strstr(dp_last_error(), "trace is NULL"),
          "a NULL trace on rank 1: %d %s", (int)s, dp_last_error());
    CHECK_OK(dp_trace_gather(t, NULL, 0.0)); /* one rank: nothing to do */
    dp_trace_destroy(t);
    dp_trace_destroy(t2);
}

/* Rank 1 as a peer whose trace bytes are not dp's: it makes the gather's
 * calls itself (agree, sizes, agree on the set, its send to rank 0) with
 * a hand-made part, one field broken per round. Rank 0 refuses each naming rank 1, its
 * trace as it was (one process); neither rank waits. The part: one
 * device "x", one step of one forward span (parallel/trace.c's wire),
 * which rank 0 takes when nothing is broken. */
static void trace_gather_malformed(void)
{
    enum { DOUBLES = 5 + 7 + 3, BYTES = DOUBLES * 8 + 2 };
    const char *broken[] = {"magic", "steps past the bytes", "span index past the spans",
                            "phase 99", "bytes short of the counts", "nothing (intact)"};
    dp_trace *t = NULL;
    if (rank == 0) CHECK_OK(rank_trace(1, &t));
    for (int b = 0; b < 6; b++) {
        if (rank == 0 && b == 5) { /* the same part intact is taken */
            CHECK_OK(dp_trace_gather(t, dist, 30.0));
            char *j = written(t);
            CHECK(j && strstr(j, "\"pid\": 2, \"tid\": 0, \"args\": {\"name\": \"x\"}"),
                  "the intact part is not in the trace");
            free(j);
            continue;
        }
        if (rank == 0) {
            dp_status s = dp_trace_gather(t, dist, 30.0);
            CHECK(s == DP_ERR_FORMAT && strstr(dp_last_error(), "rank 1's "),
                  "%s: %d %s", broken[b], (int)s, dp_last_error());
            char *j = written(t);
            CHECK(j && !strstr(j, "\"pid\": 2"), "%s: rank 1's part was kept", broken[b]);
            free(j);
            continue;
        }
        double w[DOUBLES] = {1685090420.0, 1, 1, 1, 2,      /* magic, k, steps, spans, names */
                             0, 1, 0, 0, 5, 0, 1,             /* the step: rows 5, span 0 */
                             (double)DP_PHASE_FORWARD, 0.001, 0.002};
        if (b == 0) w[0] = 1.0;
        if (b == 1) w[2] = 1e9;
        if (b == 2) w[10] = 7;
        if (b == 3) w[12] = 99;
        unsigned char part[BYTES + 2] = {0};
        memcpy(part, w, sizeof w);
        memcpy(part + sizeof w, "x", 2);
        size_t n = b == 4 ? BYTES - 8 : BYTES; /* b 4: a span's last double cut */
        uint64_t sizes[2], mine = n;
        int lost = 0;
        CHECK_OK(dp_dist_agree_timeout(dist, DP_OK, 30.0));
        CHECK_OK(dp_dist_agree_payload(dist, 30.0, DP_OK, &mine, sizes, 8, "test", &lost));
        dp_dist_msg to0 = {0, part, n};
        dp_dist_persist *p = NULL;
        CHECK_OK(dp_dist_agree_timeout(
            dist, dp_dist_persist_create(dist, DP_DIST_TAG_TRACE, &to0, 1, NULL, 0, &p), 30.0));
        dp_status s = dp_dist_persist_run(p, 30.0, "test");
        dp_dist_persist_free(p);
        CHECK_OK(s);
    }
    dp_trace_destroy(t);
}

/* The bounded agreement and broadcast: a rank that arrives late (a
 * sleep past the bound) makes the waiting rank's call fail with
 * DP_ERR_TIMEOUT within about the bound, not when the late rank comes;
 * the late rank's call then completes the one given up on, so the ranks
 * stay matched (the test's own agreements go on). */
static void dist_timeouts(void)
{
    struct timespec late = {1, 500000000L}, t0, t1;
    if (rank == 1) nanosleep(&late, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    dp_status s = dp_dist_agree_timeout(dist, DP_OK, 0.3);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double took = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    /* The next call, in time, keeps MPI progressing the one given up on. */
    dp_status next = dp_dist_agree_timeout(dist, DP_OK, 30.0);
    if (rank == 0)
        CHECK(s == DP_ERR_TIMEOUT && took < 1.2, "agree_timeout: %d after %.2f s: %s", (int)s,
              took, dp_last_error());
    else
        CHECK_OK(s);
    CHECK_OK(next);
    unsigned char b[64];
    memset(b, rank == 0 ? 7 : 0, sizeof b);
    if (rank == 0) nanosleep(&late, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    s = dp_dist_broadcast_timeout(dist, b, sizeof b, 0.3);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    took = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    next = dp_dist_agree_timeout(dist, DP_OK, 30.0);
    if (rank == 1)
        CHECK(s == DP_ERR_TIMEOUT && took < 1.2, "broadcast_timeout: %d after %.2f s: %s",
              (int)s, took, dp_last_error());
    else
        CHECK_OK(s);
    CHECK_OK(next);
    CHECK(dp_dist_agree_timeout(dist, DP_OK, -1.0) == DP_ERR_INVALID_ARGUMENT, "negative bound");
}

static void bad_use(void)
{
    tcase c = {"bad", 1, 0, 7, 12, DP_OPTIMIZER_ADAMW, 0, 1, 0, 1.0f, 0};
    run r;
    /* a different configuration on rank 1 */
    dp_engine_config cfg = config(&c);
    if (rank == 1) cfg.optim.lr = 2e-2f;
    dp_clear_error();
    dp_status s = open_run(&r, &c, 1, 1, cfg);
    CHECK(s == DP_ERR_INVALID_ARGUMENT && strstr(dp_last_error(), "rank 1's optim.lr differs"),
          "different lr: %d %s", (int)s, dp_last_error());
    /* a different overlap bucket on rank 1 */
    cfg = config(&c);
    if (rank == 1) cfg.bucket_bytes = DP_BUCKET_OFF;
    s = open_run(&r, &c, 1, 1, cfg);
    CHECK(s == DP_ERR_INVALID_ARGUMENT && strstr(dp_last_error(), "rank 1's bucket_bytes differs"),
          "different bucket: %d %s", (int)s, dp_last_error());
    /* bad arguments on rank 1 only: both fail, nobody waits */
    cfg = config(&c);
    if (rank == 1) cfg.grad_accum = -1;
    s = open_run(&r, &c, 1, 1, cfg);
    CHECK(s == DP_ERR_INVALID_ARGUMENT && strstr(dp_last_error(), "rank 1: ") &&
              strstr(dp_last_error(), "grad_accum"),
          "bad grad_accum on rank 1: %d %s", (int)s, dp_last_error());
    /* the rounds matched in order on rank 1 only, or a malformed setting:
     * both refuse (started differently, the ranks' rounds would mismatch) */
    const char *was = getenv("DP_MPI_IN_ORDER");
    char saved[8] = "";
    if (was) snprintf(saved, sizeof saved, "%s", was);
    const char *mine[] = {was && strcmp(was, "1") == 0 ? "0" : "1", "yes"};
    const char *want[] = {"rank 1's MPI transport matches the rounds' messages",
                          "DP_MPI_IN_ORDER is \"yes\": set it to 1"};
    for (int i = 0; i < 2; i++) {
        if (rank == 1) setenv("DP_MPI_IN_ORDER", mine[i], 1);
        s = open_run(&r, &c, 1, 1, config(&c));
        if (rank == 1 && was) setenv("DP_MPI_IN_ORDER", saved, 1);
        else if (rank == 1) unsetenv("DP_MPI_IN_ORDER");
        CHECK(s == DP_ERR_INVALID_ARGUMENT && strstr(dp_last_error(), want[i]) &&
                  strstr(dp_last_error(), "rank 1"),
              "DP_MPI_IN_ORDER=%s on rank 1: %d %s", mine[i], (int)s, dp_last_error());
    }
    /* gather mode */
    cfg = config(&c);
    cfg.mode = DP_MODE_GATHER;
    s = open_run(&r, &c, 1, 1, cfg);
    CHECK(s == DP_ERR_UNSUPPORTED && strstr(dp_last_error(), "gather mode"), "gather: %d %s",
          (int)s, dp_last_error());
    /* different batches */
    CHECK_OK(open_run(&r, &c, 1, 1, config(&c)));
    float x[MAXROWS * D];
    int32_t y[MAXROWS];
    batch(rank, c.rows, 0, x, y);
    dp_batch b = {(size_t)c.rows, x, y};
    dp_step_stats st;
    s = dp_engine_step(r.e, &b, &st);
    CHECK(s == DP_ERR_INVALID_ARGUMENT && strstr(dp_last_error(), "rank 1's batch differs"),
          "different batches: %d %s", (int)s, dp_last_error());
    /* a bad target on rank 1 only (same bytes otherwise): both fail */
    batch(0, c.rows, 0, x, y);
    if (rank == 1) y[0] = CLASSES;
    s = dp_engine_step(r.e, &b, &st);
    CHECK(s == DP_ERR_INVALID_ARGUMENT && strstr(dp_last_error(), "rank 1: "),
          "bad target on rank 1: %d %s", (int)s, dp_last_error());
    /* and the engine goes on */
    y[0] = 0;
    CHECK_OK(dp_engine_step(r.e, &b, &st));
    /* a NULL buffer on rank 1 only: both fail, nobody waits */
    float *p = calloc(r.model.n_params, sizeof *p);
    CHECK(p, "oom");
    s = dp_engine_get_params(r.e, rank == 1 ? NULL : p);
    CHECK(s == DP_ERR_INVALID_ARGUMENT && strstr(dp_last_error(), "rank 1: "),
          "get_params(NULL) on rank 1: %d %s", (int)s, dp_last_error());
    s = dp_engine_set_params(r.e, rank == 1 ? NULL : p);
    CHECK(s == DP_ERR_INVALID_ARGUMENT && strstr(dp_last_error(), "rank 1: "),
          "set_params(NULL) on rank 1: %d %s", (int)s, dp_last_error());
    CHECK_OK(dp_engine_get_params(r.e, p));
    CHECK_OK(dp_engine_step(r.e, &b, &st));
    free(p);
    dp_engine_destroy(r.e);
}

int main(int argc, char **argv)
{
    if (dp_dist_open(&argc, &argv, &dist) != DP_OK) {
        fprintf(stderr, "test_ranks: %s\n", dp_last_error());
        return 1;
    }
    rank = dp_dist_rank(dist);
    if (dp_dist_size(dist) != 2) {
        fprintf(stderr, "test_ranks: run me with mpiexec -n 2 (got %d ranks)\n", dp_dist_size(dist));
        dp_dist_close(dist);
        return 1;
    }
    if (argc > 1 && strcmp(argv[1], "--cuda") == 0) {
        kind = DP_DEVICE_CUDA;
        if (dp_cuda_device_count() < 2) {
            if (rank == 0 && dp_cuda_device_count() == 0)
                printf("test_ranks --cuda: SKIP: no CUDA device\n");
            else if (rank == 0)
                printf("test_ranks --cuda: SKIP: 1 CUDA device; two ranks need two GPUs (NCCL "
                       "refuses two ranks on one GPU)\n");
            dp_dist_close(dist);
            return 77;
        }
    }
    static const tcase cases[] = {
        /* name, k, shard, rows, hidden, optim, token_balanced, grad_accum, ignore_every, w1, bf16 */
        {"2 x cpu:1 == cpu:2, root, AdamW, B=7", 1, 0, 7, 12, DP_OPTIMIZER_ADAMW, 0, 1, 0, 1.0f, 0},
        {"2 x cpu:1 == cpu:2, sharded, AdamW, B=7", 1, 1, 7, 12, DP_OPTIMIZER_ADAMW, 0, 1, 0, 1.0f, 0},
        {"2 x cpu:2 == cpu:4, root, AdamW, B=7", 2, 0, 7, 12, DP_OPTIMIZER_ADAMW, 0, 1, 0, 1.0f, 0},
        {"2 x cpu:2 == cpu:4, sharded, AdamW, B=7", 2, 1, 7, 12, DP_OPTIMIZER_ADAMW, 0, 1, 0, 1.0f, 0},
        {"2 x cpu:2 == cpu:4, sharded, token-balanced, accum 2", 2, 1, 13, 12, DP_OPTIMIZER_ADAMW, 1, 2, 3, 1.0f, 0},
        {"2 x cpu:2 == cpu:4, root, token-balanced, accum 3", 2, 0, 13, 12, DP_OPTIMIZER_ADAMW, 1, 3, 2, 1.0f, 0},
        {"2 x cpu:2 == cpu:4, sharded, B=3 (an idle device)", 2, 1, 3, 12, DP_OPTIMIZER_ADAMW, 0, 1, 0, 1.0f, 0},
        {"2 x cpu:1 == cpu:2, root, rank 1 idle (weight 0)", 1, 0, 7, 12, DP_OPTIMIZER_ADAMW, 0, 1, 0, 0.0f, 0},
        {"2 x cpu:2 == cpu:4, sharded, SGD momentum", 2, 1, 7, 12, DP_OPTIMIZER_SGD, 0, 1, 0, 1.0f, 0},
        {"2 x cpu:1 == cpu:2, root, 3 rounds (1.2M params)", 1, 0, 7, 100000, DP_OPTIMIZER_ADAMW, 0, 1, 0, 1.0f, 0},
        {"2 x cpu:2 == cpu:4, sharded, 2 rounds (1.2M params)", 2, 1, 7, 100000, DP_OPTIMIZER_ADAMW, 0, 1, 0, 1.0f, 0},
        {"2 x cpu:1 == cpu:2, root, bf16 replicas and GEMMs", 1, 0, 7, 12, DP_OPTIMIZER_ADAMW, 0, 1, 0, 1.0f, 1},
        {"2 x cpu:2 == cpu:4, sharded, bf16, 2 rounds (1.2M params)", 2, 1, 7, 100000, DP_OPTIMIZER_ADAMW, 0, 1, 0, 1.0f, 1},
        /* the rounds after the backward, not overlapped with it */
        {"2 x cpu:1 == cpu:2, root, 3 rounds, no overlap", 1, 0, 7, 100000, DP_OPTIMIZER_ADAMW, 0, 1, 0, 1.0f, 0, DP_BUCKET_OFF},
        {"2 x cpu:2 == cpu:4, sharded, accum 2, no overlap", 2, 1, 13, 100000, DP_OPTIMIZER_ADAMW, 1, 2, 3, 1.0f, 0, DP_BUCKET_OFF},
        {"2 x cpu:2 == cpu:4, sharded, accum 2, overlapped", 2, 1, 13, 100000, DP_OPTIMIZER_ADAMW, 1, 2, 3, 1.0f, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        if (kind == DP_DEVICE_CPU || cases[i].k == 1) run_equivalence(&cases[i]);
    if (kind == DP_DEVICE_CPU) {
        run_handover("2 x cpu:2 for 10 steps, then cpu:4 for 10 == 20 on cpu:4", 1);
        run_handover("cpu:4 for 10 steps, then 2 x cpu:2 for 10 == 20 on cpu:4", 0);
    }
    run_faults();
    run_faults_mid_backward();
    if (kind == DP_DEVICE_CPU) {
        int before = failures;
        overlap_happens();
        agree_case("the rounds cross between the ranks while a backward runs", failures == before);
    }
    {
        int before = failures;
        nonfinite();
        agree_case("a non-finite loss on rank 1 skips the update on both ranks", failures == before);
    }
    {
        int before = failures;
        bad_use();
        agree_case("bad use fails on every rank with a message naming the rank", failures == before);
    }
    if (kind == DP_DEVICE_CPU) {
        int before = failures;
        device_limit();
        agree_case("64 devices over the ranks train, 65 are refused on both ranks",
                   failures == before);
    }
    {
        int before = failures;
        dist_api();
        agree_case("dp_dist: a 3 MiB broadcast, its bytes, agreement naming the rank",
                   failures == before);
    }
    {
        int before = failures;
        trace_gather();
        agree_case("dp_trace_gather: rank 0's trace holds both ranks' steps", failures == before);
    }
    {
        int before = failures;
        trace_gather_malformed();
        agree_case("dp_trace_gather: a peer's malformed part is refused on rank 0",
                   failures == before);
    }
    {
        int before = failures;
        dist_timeouts();
        agree_case("dp_dist: a late rank times out the bounded agreement and broadcast",
                   failures == before);
    }
    {
        int before = failures;
        out_of_memory();
        agree_case("rank 1 out of memory at create and in a step: both fail, no hang",
                   failures == before);
    }
    {
        int before = failures;
        divergence();
        agree_case("a diverged replica on rank 1 is named on both ranks and re-synchronised",
                   failures == before);
    }
    {
        int before = failures;
        stall();
        agree_case("rank 1 stalled past the watchdog: both ranks time out, no hang",
                   failures == before);
    }
    dp_status all = dp_dist_agree(dist, failures ? DP_ERR_INTERNAL : DP_OK);
    if (rank == 0) printf("%s\n", all == DP_OK ? "all cases passed" : "some cases FAILED");
    dp_dist_close(dist);
    return all == DP_OK ? 0 : 1;
}
