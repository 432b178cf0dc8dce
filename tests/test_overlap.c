/*
 * The reduce-scatter overlapped with the backward (dp_grads_ready,
 * dp_engine_config.bucket_bytes), on CPU devices:
 *
 *  - bitwise: the GPT (which signals per block) and the test MLP give the
 *    same losses, norms and parameters with the overlap off, with a
 *    bucket of one float (every signal reduces what is ready) and with
 *    the default bucket: balanced and gather mode, root and sharded
 *    optimizer, micro-batches, grad accumulation, uneven device weights,
 *    bf16 replicas;
 *  - the overlap happens: with one device's backward held after its first
 *    signal, another device sums the signalled part of its slice before
 *    that backward ends, and the step's exposed communication is then
 *    below the whole reduce's; the step reports the overlap
 *    (dp_step_stats.overlapped), and none with DP_BUCKET_OFF;
 *  - refusals: a signal out of order, twice, reversed or past n_params
 *    fails the step with DP_ERR_INVALID_ARGUMENT naming the range, also
 *    when the backward swallows the status, leaves the parameters as they
 *    were, and the next step equals a run that never failed; a stale
 *    chunk is refused; a backward called by hand signals nothing;
 *  - a device that fails after its first signal, with another device's
 *    reduce waiting on it, leaves no worker waiting, and the next step is
 *    correct.
 */
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "dp/gpt.h"
#include "engine_fixture.h"
#include "gpt_fixture.h"

enum { GSTEPS = 3, MAXP = 20000 };

static const size_t buckets[] = {DP_BUCKET_OFF, sizeof(float), 0};

// --- bitwise: the GPT ---------------------------------------------------------------------

typedef struct outcome {
    double loss[GSTEPS], norm[GSTEPS];
    float params[MAXP];
} outcome;

static void run_gpt(const dp_model *m, size_t k, const dp_engine_config *cfg, outcome *o)
{
    dp_device_spec specs[DP_MAX_DEVICES];
    for (size_t i = 0; i < k; i++) specs[i] = (dp_device_spec){DP_DEVICE_CPU, (int)i};
    dp_criterion crit = dp_criterion_cross_entropy();
    dp_engine *e = NULL;
    dp_assert_ok(dp_engine_create(specs, k, m, &crit, cfg, &e));
    for (int s = 0; s < GSTEPS; s++) {
        int32_t tok[EROWS * EBS], tgt[EROWS * EBS];
        dp_test_gpt_batch(s, EROWS, tok, tgt);
        dp_batch b = {EROWS, tok, tgt};
        dp_step_stats st;
        dp_assert_ok(dp_engine_step(e, &b, &st));
        cr_assert(!st.skipped);
        o->loss[s] = st.loss;
        o->norm[s] = st.grad_norm;
    }
    dp_assert_ok(dp_engine_get_params(e, o->params));
    dp_engine_destroy(e);
}

static void assert_same(const outcome *a, const outcome *b, size_t n, const char *what)
{
    for (int s = 0; s < GSTEPS; s++) {
        cr_assert(a->loss[s] == b->loss[s], "%s: step %d loss %.17g != %.17g", what, s,
                  a->loss[s], b->loss[s]);
        cr_assert(a->norm[s] == b->norm[s], "%s: step %d norm %.17g != %.17g", what, s,
                  a->norm[s], b->norm[s]);
    }
    for (size_t i = 0; i < n; i++)
        cr_assert(memcmp(&a->params[i], &b->params[i], sizeof(float)) == 0,
                  "%s: parameter %zu %.9g != %.9g", what, i, a->params[i], b->params[i]);
}

Test(overlap, gpt_is_bitwise_for_any_bucket)
{
    dp_gpt_config gc = {
        .vocab_size = EV, .block_size = EBS, .n_layer = EL, .n_head = ENH, .n_embd = EC};
    dp_gpt *g = NULL;
    dp_assert_ok(dp_gpt_create(&gc, &g));
    static outcome ref, got;
    static const float uneven[] = {0.5f, 1.0f, 2.0f};
    struct {
        const char *name;
        size_t k;
        int gather, shard, bf16, micro, accum;
        const float *weights;
    } cases[] = {
        {"cpu:2 balanced", 2, 0, 0, 0, 0, 1, NULL},
        {"cpu:3 balanced sharded", 3, 0, 1, 0, 0, 1, NULL},
        {"cpu:3 gather", 3, 1, 0, 0, 0, 1, NULL},
        {"cpu:2 micro-batches of 1 row, grad_accum 2", 2, 0, 0, 0, 1, 2, NULL},
        {"cpu:3 uneven weights, sharded", 3, 0, 1, 0, 0, 1, uneven},
        {"cpu:2 bf16 replicas", 2, 0, 0, 1, 0, 1, NULL},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const dp_model *m = dp_gpt_model(g, cases[c].bf16 ? DP_GPT_BF16 : 0);
        cr_assert_leq(m->n_params, MAXP);
        for (size_t b = 0; b < sizeof buckets / sizeof *buckets; b++) {
            dp_engine_config cfg = dp_test_base_cfg(cases[c].gather ? DP_MODE_GATHER
                                                                    : DP_MODE_BALANCED);
            cfg.shard_optimizer = cases[c].shard;
            cfg.grad_accum = cases[c].accum;
            cfg.max_rows_per_micro = cases[c].micro;
            cfg.device_weights = cases[c].weights;
            cfg.bucket_bytes = buckets[b];
            run_gpt(m, cases[c].k, &cfg, b ? &got : &ref);
            if (!b) continue;
            char what[128];
            snprintf(what, sizeof what, "%s, bucket %zu bytes vs no overlap", cases[c].name,
                     buckets[b]);
            assert_same(&ref, &got, m->n_params, what);
        }
    }
    dp_gpt_destroy(g);
}

// --- a model that holds, refuses or fails around its signals ------------------------------

/* The test MLP, whose backward signals fc2 then fc1 (examples/mlp),
 * wrapped: after its backward, signal as `mode` says, or hold device 0
 * between fc2's signal and fc1's, or fail device 1 after its first. */
typedef enum { PLAIN, TWICE, OUT_OF_ORDER, REVERSED, PAST_END, RETURNS, HOLD, FAIL_AFTER } mode;

typedef struct wrapped {
    mlp net;
    dp_model inner, model;
    mode m;
    size_t n;
    dp_chunk stale; /* a copy of a chunk kept past its backward */
} wrapped;

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

#define TRY(expr)                  \
    do {                           \
        dp_status try_s_ = (expr); \
        if (try_s_ != DP_OK) return try_s_; \
    } while (0)

static dp_status wrapped_backward(void *ctx, dp_device *dev, dp_params p, float *g,
                                  const dp_chunk *c, void *ws, float *dlogits)
{
    wrapped *w = ctx;
    size_t n = w->n, half = n / 4; /* below any slice boundary of 2 devices */
    dp_chunk quiet = *c;
    quiet.ready = NULL; /* the inner backward's own signals withheld */
    dp_status s = w->inner.backward(w->inner.ctx, dev, p, g, &quiet, ws, dlogits);
    if (s != DP_OK) return s;
    switch (w->m) {
    case PLAIN:
        return DP_OK;
    case TWICE:
        (void)dp_grads_ready(c, half, n);
        (void)dp_grads_ready(c, half, n); /* swallowed: the engine fails the step anyway */
        return DP_OK;
    case OUT_OF_ORDER:
        (void)dp_grads_ready(c, 0, half);
        return DP_OK;
    case REVERSED:
        (void)dp_grads_ready(c, n, half);
        return DP_OK;
    case PAST_END:
        (void)dp_grads_ready(c, half, n + 1);
        return DP_OK;
    case RETURNS:
        TRY(dp_grads_ready(c, half, n));
        return dp_grads_ready(c, half, n);
    case HOLD:
        TRY(dp_grads_ready(c, half, n));
        if (dp_test_hooked_is(dev, 0)) sleep_ms(300); /* device 0's backward goes on */
        return dp_grads_ready(c, 0, half);
    case FAIL_AFTER:
        TRY(dp_grads_ready(c, half, n));
        if (dp_test_hooked_is(dev, 0)) sleep_ms(100); /* the reducer of slice 1 waits */
        if (dp_test_hooked_is(dev, 1))
            return dp_set_error(DP_ERR_DEVICE, "injected failure after a signal");
        return dp_grads_ready(c, 0, half);
    }
    return DP_OK;
}

/* The test MLP with `backward` on k CPU devices, balanced; shard: device
 * i owns and reduces slice i (else the root owns them all). */
typedef dp_status (*backward_fn)(void *ctx, dp_device *dev, dp_params p, float *g,
                                 const dp_chunk *c, void *ws, float *dlogits);

static dp_engine *open_with(wrapped *w, int k, backward_fn backward, mode m, size_t bucket,
                            int shard)
{
    mlp_config mc = {D, H, K, DP_DTYPE_F32};
    memset(w, 0, sizeof *w);
    mlp_init_model(&w->net, &mc, &w->inner);
    w->model = w->inner;
    w->model.ctx = w;
    w->model.backward = backward;
    w->m = m;
    w->n = w->model.n_params;
    dp_criterion crit = dp_criterion_cross_entropy();
    dp_engine_config cfg = dp_test_base_cfg(DP_MODE_BALANCED);
    cfg.shard_optimizer = shard;
    cfg.bucket_bytes = bucket;
    dp_device_spec specs[DP_MAX_DEVICES];
    for (int i = 0; i < k; i++) specs[i] = (dp_device_spec){DP_DEVICE_CPU, i};
    dp_engine *e = NULL;
    dp_assert_ok(dp_engine_create(specs, (size_t)k, &w->model, &crit, &cfg, &e));
    return e;
}

/* The wrapped MLP, sharded: device 1 owns and reduces slice 1. */
static dp_engine *wrapped_open(wrapped *w, int k, mode m, size_t bucket)
{
    return open_with(w, k, wrapped_backward, m, bucket, 1);
}

static dp_status step_with(dp_engine *e, int s, dp_step_stats *st)
{
    float x[MAXROWS * D];
    int32_t y[MAXROWS];
    dp_test_make_batch(s, 8, 0, x, y);
    dp_batch b = {8, x, y};
    return dp_engine_step(e, &b, st);
}

/* After failed steps of e: the model made correct, the next step (batch
 * 1) gives the parameters of an engine that never failed. Destroys e. */
static void assert_recovers(dp_engine *e, wrapped *w, size_t bucket, const char *what)
{
    static float got[4096], ref[4096];
    cr_assert_leq(w->n, sizeof got / sizeof *got);
    dp_step_stats st;
    w->m = PLAIN;
    dp_assert_ok(step_with(e, 1, &st));
    dp_assert_ok(dp_engine_get_params(e, got));
    dp_engine_destroy(e);
    wrapped r;
    dp_engine *good = wrapped_open(&r, 2, PLAIN, bucket);
    dp_assert_ok(step_with(good, 1, &st));
    dp_assert_ok(dp_engine_get_params(good, ref));
    dp_engine_destroy(good);
    cr_assert(memcmp(ref, got, w->n * sizeof(float)) == 0,
              "%s: the step after a failure differs from a clean run", what);
}

Test(overlap, reduces_a_slice_while_another_backward_runs)
{
    wrapped w;
    dp_engine *e = wrapped_open(&w, 2, HOLD, sizeof(float));
    dp_step_stats st;
    for (int s = 0; s < 2; s++) dp_assert_ok(step_with(e, s, &st));
    /* Device 1 reduced slice 1 (final everywhere after device 0's first
     * signal) while device 0 was held inside its backward. */
    const dp_device_step_stats *d0 = &st.devices[0], *d1 = &st.devices[1];
    double bw_end = d0->phase_start[DP_PHASE_BACKWARD] + d0->phase_seconds[DP_PHASE_BACKWARD];
    cr_assert_gt(d1->phase_seconds[DP_PHASE_REDUCE], 0.0);
    cr_assert_lt(d1->phase_start[DP_PHASE_REDUCE], bw_end,
                 "device 1's reduce starts at %g s, after device 0's backward ended (%g s)",
                 d1->phase_start[DP_PHASE_REDUCE], bw_end);
    cr_assert_geq(st.exposed_seconds, 0.0);
    cr_assert(st.overlapped, "the step does not report its overlap");
    /* Its spans (what --trace draws) show it: a reduce span of device 1
     * that ends before device 0's last backward span does, and on device 1
     * a backward span (its wait for device 0's signals) after a reduce. */
    double bw_last_end = 0.0, reduce_first_end = -1.0;
    int back_after_reduce = 0, reduced = 0;
    for (size_t j = 0; j < d0->n_spans; j++)
        if (d0->spans[j].phase == DP_PHASE_BACKWARD)
            bw_last_end = d0->spans[j].start + d0->spans[j].seconds;
    for (size_t j = 0; j < d1->n_spans; j++) {
        const dp_phase_span *sp = &d1->spans[j];
        if (sp->phase == DP_PHASE_REDUCE && reduce_first_end < 0.0)
            reduce_first_end = sp->start + sp->seconds;
        reduced |= sp->phase == DP_PHASE_REDUCE;
        back_after_reduce |= reduced && sp->phase == DP_PHASE_BACKWARD;
    }
    cr_assert(reduce_first_end >= 0.0 && reduce_first_end < bw_last_end,
              "device 1's first reduce span ends at %g s, device 0's backward at %g s",
              reduce_first_end, bw_last_end);
    cr_assert(back_after_reduce, "device 1 has no backward span after a reduce span");
    dp_engine_destroy(e);

    /* The same model without overlap: bitwise the same parameters. */
    static float a[4096], b[4096];
    cr_assert_leq(w.n, sizeof a / sizeof *a);
    wrapped v;
    dp_engine *on = wrapped_open(&v, 2, HOLD, sizeof(float));
    dp_engine *off = NULL;
    wrapped u;
    off = wrapped_open(&u, 2, HOLD, DP_BUCKET_OFF);
    for (int s = 0; s < 2; s++) {
        dp_assert_ok(step_with(on, s, &st));
        cr_assert(st.overlapped);
        dp_assert_ok(step_with(off, s, &st));
        cr_assert(!st.overlapped, "DP_BUCKET_OFF: the step reports an overlap");
    }
    dp_assert_ok(dp_engine_get_params(on, a));
    dp_assert_ok(dp_engine_get_params(off, b));
    cr_assert(memcmp(a, b, w.n * sizeof(float)) == 0, "overlap changed the parameters");
    dp_engine_destroy(on);
    dp_engine_destroy(off);
}

Test(overlap, refuses_signals_out_of_order_and_recovers)
{
    struct {
        mode m;
        const char *says;
    } cases[] = {
        {TWICE, "does not end where the previous signal began"},
        {OUT_OF_ORDER, "does not end where the previous signal began"},
        {REVERSED, "is reversed"},
        {PAST_END, "ends past the gradient buffer's n_params"},
        {RETURNS, "does not end where the previous signal began"},
    };
    static float before[4096], after[4096];
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        for (size_t b = 0; b < sizeof buckets / sizeof *buckets; b++) {
            wrapped w;
            dp_engine *e = wrapped_open(&w, 2, cases[c].m, buckets[b]);
            cr_assert_leq(w.n, sizeof before / sizeof *before);
            dp_assert_ok(dp_engine_get_params(e, before));
            dp_step_stats st;
            dp_status s = step_with(e, 0, &st);
            cr_assert_eq(s, DP_ERR_INVALID_ARGUMENT, "case %zu: %s", c, dp_strerror(s));
            cr_assert(strstr(dp_last_error(), "dp_grads_ready") &&
                          strstr(dp_last_error(), ": range ["),
                      "case %zu: %s", c, dp_last_error());
            /* A swallowed refusal says so. */
            cr_assert_eq(strstr(dp_last_error(), "returned DP_OK after") != NULL,
                         cases[c].m != RETURNS, "case %zu: %s", c, dp_last_error());
            cr_assert(strstr(dp_last_error(), cases[c].says), "case %zu: %s", c,
                      dp_last_error());
            dp_assert_ok(dp_engine_get_params(e, after));
            cr_assert(memcmp(before, after, w.n * sizeof(float)) == 0,
                      "case %zu: a refused step changed the parameters", c);
            char what[64];
            snprintf(what, sizeof what, "case %zu, bucket %zu", c, buckets[b]);
            assert_recovers(e, &w, buckets[b], what);
        }
    }
}

/* Keeps the chunk for a signal after the backward returned. */
static dp_status keeping_backward(void *ctx, dp_device *dev, dp_params p, float *g,
                                  const dp_chunk *c, void *ws, float *dlogits)
{
    wrapped *w = ctx;
    if (dp_test_hooked_is(dev, 0)) w->stale = *c;
    return w->inner.backward(w->inner.ctx, dev, p, g, c, ws, dlogits);
}

/* Signals from a thread of the backward's own: refused, nothing reduced early. */
typedef struct from_thread {
    const dp_chunk *c;
    size_t n;
    dp_status s;
    char msg[256];
} from_thread;

static void *signal_elsewhere(void *arg)
{
    from_thread *t = arg;
    t->s = dp_grads_ready(t->c, 0, t->n);
    snprintf(t->msg, sizeof t->msg, "%s", dp_last_error());
    return NULL;
}

static dp_status threaded_backward(void *ctx, dp_device *dev, dp_params p, float *g,
                                   const dp_chunk *c, void *ws, float *dlogits)
{
    wrapped *w = ctx;
    dp_chunk quiet = *c;
    quiet.ready = NULL;
    dp_status s = w->inner.backward(w->inner.ctx, dev, p, g, &quiet, ws, dlogits);
    if (s != DP_OK) return s;
    from_thread t = {c, w->n, DP_OK, ""};
    pthread_t th;
    if (pthread_create(&th, NULL, signal_elsewhere, &t) != 0)
        return dp_set_error(DP_ERR_DEVICE, "pthread_create failed");
    pthread_join(th, NULL);
    if (t.s == DP_OK) return dp_set_error(DP_ERR_DEVICE, "a signal from another thread passed");
    return dp_set_error(t.s, "%s", t.msg);
}

Test(overlap, refuses_a_signal_from_another_thread)
{
    wrapped w;
    dp_engine *e = open_with(&w, 2, threaded_backward, PLAIN, sizeof(float), 0);
    dp_step_stats st;
    dp_status s = step_with(e, 0, &st);
    cr_assert_eq(s, DP_ERR_INVALID_ARGUMENT, "%s", dp_strerror(s));
    cr_assert(strstr(dp_last_error(), "another thread than the backward's"), "%s",
              dp_last_error());
    dp_engine_destroy(e);
}

Test(overlap, refuses_a_stale_chunk_and_ignores_a_chunk_made_by_hand)
{
    wrapped w;
    dp_engine *e = open_with(&w, 2, keeping_backward, PLAIN, 0, 0);
    dp_step_stats st;
    dp_assert_ok(step_with(e, 0, &st));
    /* The handle is the engine's (still alive), disabled since the backward returned. */
    cr_assert_not_null(w.stale.ready);
    dp_status s = dp_grads_ready(&w.stale, 0, w.n);
    cr_assert_eq(s, DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "has returned"), "%s", dp_last_error());
    dp_engine_destroy(e);

    cr_assert_eq(dp_grads_ready(NULL, 0, 1), DP_ERR_INVALID_ARGUMENT);
    dp_chunk by_hand = {.rows = 1};
    dp_assert_ok(dp_grads_ready(&by_hand, 0, 1)); /* outside the engine: nothing to tell */
}

Test(overlap, a_failure_after_a_signal_leaves_no_worker_waiting)
{
    for (size_t b = 0; b < sizeof buckets / sizeof *buckets; b++) {
        wrapped w;
        dp_engine *e = wrapped_open(&w, 2, FAIL_AFTER, buckets[b]);
        dp_step_stats st;
        for (int rep = 0; rep < 3; rep++) {
            dp_status s = step_with(e, 0, &st);
            cr_assert_eq(s, DP_ERR_DEVICE, "bucket %zu: %s", buckets[b], dp_strerror(s));
            cr_assert(strstr(dp_last_error(), "injected failure after a signal"), "%s",
                      dp_last_error());
        }
        char what[64];
        snprintf(what, sizeof what, "bucket %zu", buckets[b]);
        assert_recovers(e, &w, buckets[b], what);
    }
}

// --- bitwise: the MLP, whose backward signals fc2 then fc1 ---------------------------------

Test(overlap, mlp_is_bitwise_for_any_bucket)
{
    static float ref[4096], got[4096];
    for (int mode_ = 0; mode_ < 2; mode_++)
        for (int k = 2; k <= 4; k++)
            for (size_t b = 0; b < sizeof buckets / sizeof *buckets; b++) {
                dp_engine_config cfg = dp_test_base_cfg((dp_mode)mode_);
                cfg.shard_optimizer = k % 2;
                cfg.bucket_bytes = buckets[b];
                run r;
                dp_test_run_open(&r, k, cfg, NULL);
                cr_assert_leq(r.model.n_params, sizeof ref / sizeof *ref);
                for (int s = 0; s < STEPS; s++) {
                    float x[MAXROWS * D];
                    int32_t y[MAXROWS];
                    dp_test_make_batch(s, 13, 4, x, y);
                    dp_batch bt = {13, x, y};
                    dp_step_stats st;
                    dp_assert_ok(dp_engine_step(r.e, &bt, &st));
                }
                dp_assert_ok(dp_engine_get_params(r.e, b ? got : ref));
                size_t n = r.model.n_params;
                dp_test_run_close(&r);
                if (b)
                    cr_assert(memcmp(ref, got, n * sizeof(float)) == 0,
                              "%s, cpu:%d, bucket %zu: parameters differ from no overlap",
                              dp_mode_name((dp_mode)mode_), k, buckets[b]);
            }
}
