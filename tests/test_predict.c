/*
 * dp_engine_predict and its accessors (dp/engine.h): the logits of a batch
 * equal a forward computed by hand from dp_engine_get_params, on 1 and 3
 * devices, balanced and gather, with micro-batches, token-balanced splits,
 * device weights that leave the root without rows, bf16 replicas, no
 * targets, and dropout (off in predictions). Each device holds exactly its
 * own rows (balanced) or the root holds them all (gather), in the bytes
 * the docstring gives; the outputs outlive a step and go with a failed
 * prediction or a release. A model with a head (the GPT): the predicted
 * logits' cross-entropy is dp_engine_evaluate's loss, on any split and
 * chunking.
 */
#include "engine_fixture.h"
#include "gpt_fixture.h"

#include <criterion/parameterized.h>

enum { PROWS = 23, MAXP = 1024 };

typedef struct pcase {
    int mode;           /* dp_mode */
    int k;              /* devices */
    size_t micro;       /* max_rows_per_micro */
    int token_balanced; /* with rows 0..8 ignored, the split differs from the rows' */
    int bf16;           /* bf16 replicas */
    int root_idle;      /* device_weights {0, 1, 1} */
    int no_targets;     /* batch.targets NULL */
    int dropout;        /* the MLP drops half its hidden units in training */
} pcase;

// --- the hand-computed forward -----------------------------------------------------------

static double gelu_ref(double x)
{
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
}

/* logits(rows, K) of the test MLP (fc2(gelu(fc1(x)))) in double from the
 * host parameters (rounded to bfloat16 first for bf16 replicas). */
static void hand_forward(const mlp *net, const float *params, int bf16, const float *x,
                         size_t rows, double *logits)
{
    const dp_param_tensor *t = net->tensors;
    double p[MAXP];
    for (size_t i = 0; i < MAXP; i++) p[i] = bf16 ? dp_test_bf16_value(params[i]) : params[i];
    for (size_t r = 0; r < rows; r++) {
        double h[H];
        for (size_t j = 0; j < H; j++) {
            double a = p[t[1].offset + j];
            for (size_t d = 0; d < D; d++) a += p[t[0].offset + j * D + d] * x[r * D + d];
            h[j] = gelu_ref(a);
        }
        for (size_t c = 0; c < K; c++) {
            double a = p[t[3].offset + c];
            for (size_t j = 0; j < H; j++) a += p[t[2].offset + c * H + j] * h[j];
            logits[r * K + c] = a;
        }
    }
}

/* Host floats against the hand forward: float32 sums of D and H terms. */
static void assert_logits(const float *got, const double *want, size_t n, const char *what)
{
    double *g = malloc(n * sizeof *g);
    cr_assert_not_null(g);
    for (size_t i = 0; i < n; i++) g[i] = got[i];
    dp_test_allclose_d(what, g, want, n, 1e-5, 1e-5, __FILE__, __LINE__);
    free(g);
}

// --- the cases ---------------------------------------------------------------------------

static pcase cases_list[] = {
    {DP_MODE_BALANCED, 1, 0, 0, 0, 0, 0, 0},
    {DP_MODE_BALANCED, 3, 0, 0, 0, 0, 0, 0},
    {DP_MODE_GATHER, 3, 0, 0, 0, 0, 0, 0},
    {DP_MODE_GATHER, 1, 0, 0, 0, 0, 0, 0},
    {DP_MODE_BALANCED, 3, 3, 0, 0, 0, 0, 0},
    {DP_MODE_GATHER, 3, 3, 0, 0, 0, 0, 0},
    {DP_MODE_BALANCED, 3, 0, 1, 0, 0, 0, 0},
    {DP_MODE_GATHER, 3, 2, 1, 0, 0, 0, 0},
    {DP_MODE_BALANCED, 3, 0, 0, 1, 0, 0, 0},
    {DP_MODE_GATHER, 3, 4, 0, 1, 0, 0, 0},
    {DP_MODE_BALANCED, 3, 0, 0, 0, 1, 0, 0},
    {DP_MODE_GATHER, 3, 0, 0, 0, 1, 0, 0},
    {DP_MODE_BALANCED, 3, 0, 1, 0, 0, 1, 0},
    {DP_MODE_BALANCED, 3, 5, 0, 0, 0, 0, 1},
};

ParameterizedTestParameters(predict, equals_the_hand_forward)
{
    return cr_make_param_array(pcase, cases_list, sizeof cases_list / sizeof *cases_list);
}

ParameterizedTest(pcase *c, predict, equals_the_hand_forward)
{
    run r;
    mlp_config mc = {D, H, K, c->bf16 ? DP_DTYPE_BF16 : DP_DTYPE_F32};
    r.leaked_before = dp_device_bytes_freed_at_close();
    mlp_init_model(&r.net, &mc, &r.model);
    if (c->dropout) r.net.dropout = 0.5f;
    r.crit = dp_criterion_cross_entropy();
    dp_engine_config cfg = dp_test_base_cfg((dp_mode)c->mode);
    cfg.max_rows_per_micro = c->micro;
    cfg.token_balanced = c->token_balanced;
    const float weights[3] = {0.0f, 1.0f, 1.0f};
    if (c->root_idle) cfg.device_weights = weights;
    dp_device_spec specs[3] = {{DP_DEVICE_CPU, 0}, {DP_DEVICE_CPU, 1}, {DP_DEVICE_CPU, 2}};
    dp_assert_ok(dp_engine_create(specs, (size_t)c->k, &r.model, &r.crit, &cfg, &r.e));
    cr_assert_leq(r.model.n_params, MAXP);
    float x[PROWS * D];
    int32_t y[PROWS];
    for (int s = 0; s < 2; s++) { /* parameters away from their initialisation */
        dp_test_make_batch(s, PROWS, 4, x, y);
        dp_batch b = {PROWS, x, y};
        dp_assert_ok(dp_engine_step(r.e, &b, NULL));
    }
    dp_test_make_batch(9, PROWS, 0, x, y);
    for (int i = 0; i < 9; i++) y[i] = -1; /* token balance moves the cuts */
    dp_batch b = {PROWS, x, c->no_targets ? NULL : y};
    dp_assert_ok(dp_engine_predict(r.e, &b));

    float params[MAXP] = {0};
    dp_assert_ok(dp_engine_get_params(r.e, params));
    double want[PROWS * K];
    hand_forward(&r.net, params, c->bf16, x, PROWS, want);

    /* Each device's rows are a step's (dp_engine_plan), where they were computed. */
    size_t split[3], begin = 0;
    dp_assert_ok(dp_engine_plan(r.e, PROWS, b.targets, split));
    if (c->token_balanced && !c->no_targets)
        cr_assert(split[0] > (PROWS + 2) / 3, "the token-balanced split gives the root more rows "
                  "(%zu)", split[0]);
    int gather = c->mode == DP_MODE_GATHER && c->k > 1;
    for (int i = 0; i < c->k; i++) {
        dp_outputs o;
        dp_assert_ok(dp_engine_outputs(r.e, (size_t)i, &o));
        cr_assert_eq(o.device, dp_engine_device(r.e, (size_t)i));
        size_t rows = gather ? (i == 0 ? PROWS : 0) : split[i];
        cr_assert_eq(o.rows, rows, "device %d holds %zu rows, want %zu", i, o.rows, rows);
        cr_assert_eq(o.logits == NULL, rows == 0, "device %d: logits %p for %zu rows", i,
                     (const void *)o.logits, rows);
        if (rows) {
            cr_assert_eq(o.row_begin, begin, "device %d starts at row %zu, want %zu", i,
                         o.row_begin, begin);
            /* a CPU device's memory is host memory: read in place */
            assert_logits(o.logits, want + begin * K, rows * K, "a device's logits in place");
        }
        begin += gather ? 0 : split[i];
    }
    float host[PROWS * K];
    memset(host, 0xff, sizeof host); /* NaN: every row must be written */
    dp_assert_ok(dp_engine_outputs_to_host(r.e, host));
    assert_logits(host, want, PROWS * K, "dp_engine_outputs_to_host");
    dp_test_run_close(&r);
}

// --- memory: what each device holds ------------------------------------------------------

/* Balanced: a device holds its own rows' logits, rows x K x 4 bytes, and
 * no more; gather: the root holds the whole batch's, the others their
 * rows' as staging. Measured as what dp_engine_release_outputs frees. */
ParameterizedTestParameters(predict, holds_the_documented_bytes)
{
    static int modes[] = {DP_MODE_BALANCED, DP_MODE_GATHER};
    return cr_make_param_array(int, modes, 2);
}

ParameterizedTest(int *mode, predict, holds_the_documented_bytes)
{
    run r;
    dp_test_run_open(&r, 3, dp_test_base_cfg((dp_mode)*mode), NULL);
    enum { R = 31 };
    float x[R * D];
    int32_t y[R];
    dp_test_make_batch(1, R, 0, x, y);
    dp_batch b = {R, x, y};
    size_t split[3], before[3];
    dp_assert_ok(dp_engine_plan(r.e, R, y, split));
    dp_assert_ok(dp_engine_predict(r.e, &b));
    for (int i = 0; i < 3; i++) {
        dp_memory_stats ms;
        dp_device_memory(dp_engine_device(r.e, (size_t)i), &ms);
        before[i] = ms.in_use;
    }
    dp_assert_ok(dp_engine_release_outputs(r.e));
    for (int i = 0; i < 3; i++) {
        dp_memory_stats ms;
        dp_device_memory(dp_engine_device(r.e, (size_t)i), &ms);
        size_t rows = *mode == DP_MODE_GATHER && i == 0 ? R : split[i];
        cr_assert_eq(before[i] - ms.in_use, rows * K * sizeof(float),
                     "device %d held %zu bytes of outputs, want %zu rows x %d x 4", i,
                     before[i] - ms.in_use, rows, K);
    }
    dp_test_run_close(&r);
}

// --- the outputs' lifetime --------------------------------------------------------------

static void assert_no_outputs(dp_engine *e)
{
    dp_outputs o;
    cr_assert_eq(dp_engine_outputs(e, 0, &o), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "call dp_engine_predict first"), "%s", dp_last_error());
    float host[K];
    cr_assert_eq(dp_engine_outputs_to_host(e, host), DP_ERR_INVALID_ARGUMENT);
}

/* None before the first prediction; a step leaves them (same memory, same
 * values); a failed prediction and a release take them; bad arguments. */
Test(predict, outputs_lifetime_and_errors)
{
    run r;
    dp_test_run_open(&r, 2, dp_test_base_cfg(DP_MODE_BALANCED), NULL);
    assert_no_outputs(r.e);
    float x[PROWS * D], first[PROWS * K], again[PROWS * K];
    int32_t y[PROWS];
    dp_test_make_batch(2, PROWS, 0, x, y);
    dp_batch b = {PROWS, x, y};
    dp_assert_ok(dp_engine_predict(r.e, &b));
    dp_outputs o0, o1;
    dp_assert_ok(dp_engine_outputs(r.e, 1, &o0));
    dp_assert_ok(dp_engine_outputs_to_host(r.e, first));
    dp_assert_ok(dp_engine_step(r.e, &b, NULL));
    dp_assert_ok(dp_engine_evaluate(r.e, &b, NULL));
    dp_assert_ok(dp_engine_outputs(r.e, 1, &o1));
    cr_assert(o0.logits == o1.logits && o0.rows == o1.rows, "a step moved the outputs");
    dp_assert_ok(dp_engine_outputs_to_host(r.e, again));
    cr_assert(memcmp(first, again, sizeof first) == 0, "a step changed the outputs");
    /* the next prediction sees the trained parameters */
    dp_assert_ok(dp_engine_predict(r.e, &b));
    dp_assert_ok(dp_engine_outputs_to_host(r.e, again));
    cr_assert(memcmp(first, again, sizeof first) != 0, "predictions after a step are unchanged");
    /* bad arguments */
    cr_assert_eq(dp_engine_outputs(r.e, 2, &o0), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "devices 0 to 1"), "%s", dp_last_error());
    cr_assert_eq(dp_engine_outputs(r.e, 0, NULL), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_engine_outputs_to_host(r.e, NULL), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_engine_predict(r.e, NULL), DP_ERR_INVALID_ARGUMENT);
    assert_no_outputs(r.e); /* a failed prediction leaves none */
    dp_assert_ok(dp_engine_predict(r.e, &b));
    y[3] = K; /* a target out of range fails the prediction as it fails a step */
    cr_assert_eq(dp_engine_predict(r.e, &b), DP_ERR_INVALID_ARGUMENT);
    assert_no_outputs(r.e);
    dp_assert_ok(dp_engine_predict(r.e, &(dp_batch){PROWS, x, NULL}));
    dp_assert_ok(dp_engine_release_outputs(r.e));
    assert_no_outputs(r.e);
    dp_assert_ok(dp_engine_release_outputs(r.e)); /* twice is fine */
    dp_test_run_close(&r);
}

// --- a model with a head ----------------------------------------------------------------

/* Sum over valid targets of logsumexp - logit[target], in double. */
static double host_ce(const float *logits, const int32_t *tgt, size_t n, size_t V, size_t *valid)
{
    double sum = 0.0;
    *valid = 0;
    for (size_t i = 0; i < n; i++) {
        if (tgt[i] < 0) continue;
        const float *x = logits + i * V;
        double m = x[0], s = 0.0;
        for (size_t v = 1; v < V; v++) m = x[v] > m ? x[v] : m;
        for (size_t v = 0; v < V; v++) s += exp(x[v] - m);
        sum += m + log(s) - x[tgt[i]];
        ++*valid;
    }
    return sum;
}

/* The GPT (a head: features, then the tied LM head in chunks): on 1 and
 * 3 devices, balanced with chunks of 5 output rows and gather, the
 * logits agree with each other and their cross-entropy is the engine's
 * evaluation loss. */
Test(predict, a_model_with_a_head)
{
    dp_gpt_config gc = {.vocab_size = EV, .block_size = EBS, .n_layer = EL, .n_head = ENH, .n_embd = EC};
    dp_gpt *g = NULL;
    dp_assert_ok(dp_gpt_create(&gc, &g));
    const dp_model *m = dp_gpt_model(g, 0);
    enum { N = EROWS * EBS };
    int32_t tok[N], tgt[N];
    dp_test_gpt_batch(3, EROWS, tok, tgt);
    dp_batch b = {EROWS, tok, tgt};
    static float logits[3][N * EV];
    struct { int k; dp_mode mode; size_t chunk; } runs[3] = {
        {1, DP_MODE_BALANCED, DP_LOGITS_WHOLE}, {3, DP_MODE_BALANCED, 5}, {3, DP_MODE_GATHER, 0}};
    for (int i = 0; i < 3; i++) {
        dp_engine_config cfg = dp_engine_config_default();
        cfg.mode = runs[i].mode;
        cfg.logits_chunk_rows = runs[i].chunk;
        cfg.seed = 5;
        dp_device_spec specs[3] = {{DP_DEVICE_CPU, 0}, {DP_DEVICE_CPU, 1}, {DP_DEVICE_CPU, 2}};
        dp_criterion ce = dp_criterion_cross_entropy();
        dp_engine *e = NULL;
        dp_assert_ok(dp_engine_create(specs, (size_t)runs[i].k, m, &ce, &cfg, &e));
        dp_step_stats st;
        dp_assert_ok(dp_engine_evaluate(e, &b, &st));
        dp_assert_ok(dp_engine_predict(e, &b));
        dp_assert_ok(dp_engine_outputs_to_host(e, logits[i]));
        size_t valid;
        double loss = host_ce(logits[i], tgt, N, EV, &valid) / (double)valid;
        cr_assert_eq(valid, st.valid_targets);
        dp_assert_allclose(&loss, &st.loss, 1, 1e-6, 1e-6);
        dp_engine_destroy(e);
    }
    dp_assert_allclose(logits[1], logits[0], N * EV, 1e-5, 1e-5);
    dp_assert_allclose(logits[2], logits[0], N * EV, 1e-5, 1e-5);
    dp_gpt_destroy(g);
}
