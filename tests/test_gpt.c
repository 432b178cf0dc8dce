/*
 * The GPT model (dp/gpt.h) on CPU devices.
 *
 *   reference    logits, loss and every parameter gradient against PyTorch
 *                (tests/data/gpt_reference.bin, made in float64 by
 *                tests/gen_gpt_reference.py; no Python at test time)
 *   table        tensor names, shapes, order, alignment, weight decay
 *   forward      causality, and a short T equal to a prefix of the full T
 *   init         nanoGPT's initialisation statistics, determinism in the seed
 *   engine       k devices == 1 device (balanced and gather), a tiny overfit
 *   chunks       the split LM head: chunked head + cross-entropy against
 *                PyTorch, chunked logits == whole logits through the engine,
 *                the memory they save, head callback failures
 *   errors       bad configurations and out-of-vocabulary tokens
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "dp_test.h"
#include "parallel/engine_testing.h"
#include "gpt_fixture.h"
#include "gpt_reference.h"

#include <criterion/parameterized.h>

// --- helpers ----------------------------------------------------------------------------

static void *dev_alloc(dp_device *dev, size_t bytes)
{
    void *p = NULL;
    dp_assert_ok(dp_device_alloc(dev, bytes ? bytes : 1, &p));
    return p;
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    cr_assert_not_null(p, "out of host memory");
    return p;
}

static void close_checked(dp_device *dev)
{
    dp_memory_stats st;
    dp_device_memory(dev, &st);
    cr_assert_eq(st.in_use, 0, "%zu bytes still allocated on %s", st.in_use,
                 dp_device_name(dev));
    dp_device_close(dev);
}

static dp_gpt *make_gpt(size_t V, size_t BS, size_t L, size_t NH, size_t C)
{
    dp_gpt_config cfg = {
        .vocab_size = V, .block_size = BS, .n_layer = L, .n_head = NH, .n_embd = C};
    dp_gpt *g = NULL;
    dp_assert_ok(dp_gpt_create(&cfg, &g));
    dp_assert_ok(dp_model_validate(dp_gpt_model(g, 0)));
    return g;
}

/* Host parameters from the model's init. */
static float *init_params(const dp_gpt *g, uint64_t seed)
{
    const dp_model *m = dp_gpt_model(g, 0);
    float *p = xmalloc(m->n_params * sizeof *p);
    dp_assert_ok(m->init(m->ctx, p, seed));
    return p;
}

/* One forward + cross-entropy + backward on cpu:0, as the engine's balanced
 * path does it, with the reference's parameters and batch. */
typedef struct ref_run {
    reference r;
    dp_gpt *g;
    dp_device *dev;
    float *params_h;
    float *params, *grads, *logits, *losses, *ws;
    int32_t *tokens, *targets;
    size_t ws_bytes, n_valid;
} ref_run;

#define GUARD_BYTES 4096

static void ref_open(ref_run *x)
{
    memset(x, 0, sizeof *x);
    dp_test_load_reference(&x->r);
    reference *r = &x->r;
    x->g = make_gpt(r->V, r->BS, r->L, r->NH, r->C);
    const dp_model *m = dp_gpt_model(x->g, 0);
    cr_assert_eq(m->n_tensors, r->n_tensors);
    x->params_h = xmalloc(m->n_params * sizeof(float));
    memset(x->params_h, 0, m->n_params * sizeof(float));
    for (size_t i = 0; i < r->n_tensors; i++) {
        long j = dp_gpt_find_tensor(x->g, r->t[i].name);
        cr_assert_eq(j, (long)i, "tensor %s is at index %ld of the table, PyTorch's order has %zu",
                     r->t[i].name, j, i);
        cr_assert_eq(m->tensors[j].numel, r->t[i].numel, "%s: numel", r->t[i].name);
        memcpy(x->params_h + m->tensors[j].offset, r->t[i].param, r->t[i].numel * sizeof(float));
    }
    size_t BT = (size_t)r->B * r->BS;
    x->dev = dp_test_cpu(0);
    x->params = dp_test_upload(x->dev, x->params_h, m->n_params);
    x->grads = dev_alloc(x->dev, m->n_params * sizeof(float));
    dp_assert_ok(dp_memset(x->dev, x->grads, 0, m->n_params * sizeof(float)));
    x->logits = dev_alloc(x->dev, BT * r->V * sizeof(float));
    x->losses = dev_alloc(x->dev, BT * sizeof(float));
    x->tokens = dev_alloc(x->dev, BT * sizeof(int32_t));
    x->targets = dev_alloc(x->dev, BT * sizeof(int32_t));
    dp_assert_ok(dp_copy_h2d(x->dev, x->tokens, r->tokens, BT * sizeof(int32_t)));
    dp_assert_ok(dp_copy_h2d(x->dev, x->targets, r->targets, BT * sizeof(int32_t)));
    /* The workspace starts as NaN (bytes 0xFF): a read of an unwritten
     * activation poisons the results. A guard zone after it catches writes
     * past dp_gpt_workspace_bytes. */
    x->ws_bytes = dp_gpt_workspace_bytes(x->g, r->B, r->BS);
    /* The dp_model keeps ln_f's output (B,T,C) outside its workspace: it is
     * the head's features, held by the engine. */
    size_t lnf_bytes = (BT * r->C + DP_PARAM_ALIGN - 1) / DP_PARAM_ALIGN * DP_PARAM_ALIGN * 4;
    cr_assert_eq(m->workspace_bytes(m->ctx, r->B), x->ws_bytes - lnf_bytes);
    cr_assert_eq(m->head_features, (size_t)r->C);
    x->ws = dev_alloc(x->dev, x->ws_bytes + GUARD_BYTES);
    dp_assert_ok(dp_memset(x->dev, x->ws, 0xFF, x->ws_bytes));
    dp_assert_ok(dp_memset(x->dev, (char *)x->ws + x->ws_bytes, 0x5A, GUARD_BYTES));
    x->n_valid = 0;
    for (size_t i = 0; i < BT; i++) x->n_valid += r->targets[i] >= 0;
    cr_assert(x->n_valid > 0 && x->n_valid < BT, "the reference should ignore a few targets");
}

/* forward + criterion + backward; returns the mean loss. If logits_out is
 * not NULL it receives the logits before the criterion overwrites them. */
static double ref_step(ref_run *x, float *logits_out)
{
    reference *r = &x->r;
    size_t BT = (size_t)r->B * r->BS;
    dp_assert_ok(dp_gpt_forward(x->g, x->dev, x->params, x->tokens, r->B, r->BS, x->ws,
                                x->logits));
    if (logits_out)
        dp_assert_ok(dp_copy_d2h(x->dev, logits_out, x->logits, BT * r->V * sizeof(float)));
    double loss_sum = 0.0;
    dp_assert_ok(dp_crossentropy_forward_backward(x->dev, &loss_sum, x->logits, x->losses,
                                                  x->logits, x->targets, BT, r->V,
                                                  (float)(1.0 / (double)x->n_valid)));
    dp_assert_ok(dp_gpt_backward(x->g, x->dev, x->params, x->grads, x->tokens, r->B, r->BS,
                                 x->ws, x->logits));
    return loss_sum / (double)x->n_valid;
}

static void ref_close(ref_run *x)
{
    unsigned char guard[GUARD_BYTES];
    dp_assert_ok(dp_copy_d2h(x->dev, guard, (char *)x->ws + x->ws_bytes, GUARD_BYTES));
    for (size_t i = 0; i < GUARD_BYTES; i++)
        cr_assert_eq(guard[i], 0x5A, "byte %zu past the workspace was written", i);
    void *bufs[] = {x->params, x->grads, x->logits, x->losses, x->tokens, x->targets, x->ws};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) dp_device_free(x->dev, bufs[i]);
    close_checked(x->dev);
    dp_gpt_destroy(x->g);
    free(x->params_h);
    dp_test_free_reference(&x->r);
}

// --- against PyTorch ----------------------------------------------------------------------

/*
 * Tolerances. The reference is float64; dp computes in float32.
 * - logits: each is a sum of C=32 products after two blocks of float32
 *   work; |logit| <= ~3, errors ~1e-6. rtol 1e-5, atol 1e-5 (for logits
 *   near zero).
 * - loss: a float32 log-sum-exp per row summed in double: rtol 1e-6.
 * - gradients: rtol 1e-4 as asked, plus an absolute floor of 1e-5 times
 *   the tensor's largest |gradient|. Each gradient element is a float32
 *   sum of many terms (B*T=48 rows for a weight, up to 4C=128 channels
 *   through a layer); rounding error is relative to the size of those
 *   terms, i.e. to the tensor's scale, not to the element, so elements
 *   that cancel to near zero would otherwise fail rtol alone. Measured:
 *   the largest error is below 1e-6 of the tensor's scale.
 */
/* Holds the gradients (host, the model's layout) and the mean loss to the
 * reference with the tolerances above; logs the largest errors. */
static void check_against_reference(const ref_run *x, const float *grads, double loss,
                                    const char *what)
{
    const reference *r = &x->r;
    const dp_model *m = dp_gpt_model(x->g, 0);
    cr_assert(fabs(loss - r->loss) <= 1e-6 * fabs(r->loss), "%s: loss %.10f, PyTorch %.10f", what,
              loss, r->loss);
    double worst_rel = 0.0, worst_scaled = 0.0;
    const char *worst_name = "";
    for (size_t i = 0; i < r->n_tensors; i++) {
        const ref_tensor *t = &r->t[i];
        const float *g = grads + m->tensors[i].offset;
        double scale = 0.0;
        for (size_t k = 0; k < t->numel; k++)
            if (fabs(t->grad[k]) > scale) scale = fabs(t->grad[k]);
        cr_assert(scale > 0.0, "%s: the reference gradient is all zero", t->name);
        for (size_t k = 0; k < t->numel; k++) {
            double d = fabs((double)g[k] - (double)t->grad[k]);
            if (d / scale > worst_scaled) worst_scaled = d / scale;
            /* relative error where the element is not a near-cancellation */
            if (fabs(t->grad[k]) > 1e-2 * scale && d / fabs(t->grad[k]) > worst_rel) {
                worst_rel = d / fabs(t->grad[k]);
                worst_name = t->name;
            }
        }
        dp_test_allclose_f(t->name, g, t->grad, t->numel, 1e-5 * scale, 1e-4, __FILE__,
                           __LINE__);
    }
    /* Padding between tensors receives no gradient. */
    size_t end = 0;
    for (size_t i = 0; i < m->n_tensors; i++) {
        for (size_t k = end; k < m->tensors[i].offset; k++)
            cr_assert_eq(grads[k], 0.0f, "padding float %zu has a gradient", k);
        end = m->tensors[i].offset + m->tensors[i].numel;
    }
    cr_log_info("%s vs PyTorch: loss %.10f (ref %.10f, rel %.2e); largest gradient error: "
                "%.2e relative (elements >= 1%% of their tensor's max, in %s), %.2e of the "
                "tensor's max |grad|",
                what, loss, r->loss, fabs(loss - r->loss) / r->loss, worst_rel, worst_name,
                worst_scaled);
}

Test(gpt, matches_pytorch_reference, .timeout = 30)
{
    ref_run x;
    ref_open(&x);
    reference *r = &x.r;
    const dp_model *m = dp_gpt_model(x.g, 0);
    size_t BT = (size_t)r->B * r->BS;
    float *logits = xmalloc(BT * r->V * sizeof(float));
    double loss = ref_step(&x, logits);
    dp_assert_allclose(logits, (const float *)r->logits, BT * r->V, 1e-5, 1e-5);
    double logit_err = 0.0;
    for (size_t i = 0; i < BT * r->V; i++)
        logit_err = fmax(logit_err, fabs((double)logits[i] - (double)r->logits[i]));
    cr_log_info("gpt vs PyTorch: largest |logit error| %.2e", logit_err);
    float *grads = xmalloc(m->n_params * sizeof(float));
    dp_assert_ok(dp_copy_d2h(x.dev, grads, x.grads, m->n_params * sizeof(float)));
    check_against_reference(&x, grads, loss, "dp_gpt_forward/backward");
    free(grads);
    free(logits);
    ref_close(&x);
}

/*
 * The dp_model's split head, as the engine drives it: forward to the
 * features (ln_f's output), then head, cross-entropy and head backward
 * over chunks of rows, then backward from the features' gradient. Every
 * chunking (one row, 7 rows: chunks cut sequences and the last one is
 * short, all rows) meets the PyTorch reference with the whole-logits
 * tolerances, and the chunks' logits are the reference's rows.
 */
Test(gpt, split_head_in_chunks_matches_pytorch_reference, .timeout = 30)
{
    ref_run x;
    ref_open(&x);
    reference *r = &x.r;
    const dp_model *m = dp_gpt_model(x.g, 0);
    size_t BT = (size_t)r->B * r->BS, C = r->C, V = r->V, n = m->n_params;
    size_t chunks[] = {1, 7, BT};
    float *feat = dev_alloc(x.dev, BT * C * sizeof(float));
    float *dfeat = dev_alloc(x.dev, BT * C * sizeof(float));
    float *grads = xmalloc(n * sizeof(float)), *lh = xmalloc(BT * V * sizeof(float));
    size_t mws = m->workspace_bytes(m->ctx, r->B);
    for (size_t ci = 0; ci < sizeof chunks / sizeof *chunks; ci++) {
        size_t c = chunks[ci];
        dp_assert_ok(dp_memset(x.dev, x.grads, 0, n * sizeof(float)));
        dp_assert_ok(dp_memset(x.dev, x.ws, 0xFF, mws)); /* NaN: unwritten reads poison */
        dp_assert_ok(dp_memset(x.dev, dfeat, 0xFF, BT * C * sizeof(float)));
        dp_chunk ch = {.rows = (size_t)r->B, .inputs = x.tokens, .targets = x.targets};
        dp_params p = {.f32 = x.params};
        dp_assert_ok(m->forward(m->ctx, x.dev, p, &ch, x.ws, feat));
        double loss_sum = 0.0;
        for (size_t o = 0; o < BT; o += c) {
            size_t rows = BT - o < c ? BT - o : c;
            dp_assert_ok(m->head_forward(m->ctx, x.dev, p, feat + o * C, rows, x.logits));
            dp_assert_ok(dp_copy_d2h(x.dev, lh + o * V, x.logits, rows * V * sizeof(float)));
            double l = 0.0;
            dp_assert_ok(dp_crossentropy_forward_backward(x.dev, &l, x.logits, x.losses, x.logits,
                                                          x.targets + o, rows, V,
                                                          (float)(1.0 / (double)x.n_valid)));
            loss_sum += l;
            dp_assert_ok(m->head_backward(m->ctx, x.dev, p, x.grads, feat + o * C, rows,
                                          x.logits, dfeat + o * C));
        }
        dp_assert_ok(m->backward(m->ctx, x.dev, p, x.grads, &ch, x.ws, dfeat));
        dp_assert_allclose(lh, (const float *)r->logits, BT * V, 1e-5, 1e-5);
        dp_assert_ok(dp_copy_d2h(x.dev, grads, x.grads, n * sizeof(float)));
        char what[48];
        snprintf(what, sizeof what, "split head, chunks of %zu rows", c);
        check_against_reference(&x, grads, loss_sum / (double)x.n_valid, what);
    }
    dp_device_free(x.dev, feat);
    dp_device_free(x.dev, dfeat);
    free(grads);
    free(lh);
    ref_close(&x);
}

/* Parameter gradients accumulate: a second backward without zeroing doubles them. */
Test(gpt, parameter_gradients_accumulate, .timeout = 30)
{
    ref_run x;
    ref_open(&x);
    const dp_model *m = dp_gpt_model(x.g, 0);
    size_t n = m->n_params;
    float *g1 = xmalloc(n * sizeof(float)), *g2 = xmalloc(n * sizeof(float));
    double l1 = ref_step(&x, NULL);
    dp_assert_ok(dp_copy_d2h(x.dev, g1, x.grads, n * sizeof(float)));
    double l2 = ref_step(&x, NULL);
    dp_assert_ok(dp_copy_d2h(x.dev, g2, x.grads, n * sizeof(float)));
    cr_assert_eq(l1, l2, "the same forward must give the same loss");
    /* Not bitwise: the GEMMs add into the old gradient block by block (beta
     * = 1), which rounds differently from 2 * g. Differences are ~1 ulp of
     * the tensor's scale (largest |g| ~ 0.3): atol 1e-7, rtol 1e-5. An
     * overwrite instead of += would be off by 100%. */
    for (size_t i = 0; i < n; i++) g1[i] *= 2.0f;
    dp_assert_allclose(g2, g1, n, 1e-7, 1e-5);
    free(g1);
    free(g2);
    ref_close(&x);
}

// --- the tensor table ---------------------------------------------------------------------

Test(gpt, tensor_table_follows_nanogpt)
{
    size_t V = 50, BS = 24, L = 3, NH = 2, C = 20;
    dp_gpt *g = make_gpt(V, BS, L, NH, C);
    const dp_model *m = dp_gpt_model(g, 0);
    cr_assert_eq(m->input_row_bytes, BS * sizeof(int32_t));
    cr_assert_eq(m->outputs_per_row, BS);
    cr_assert_eq(m->n_classes, V);
    cr_assert_not_null(m->validate_inputs);
    cr_assert_eq(m->n_tensors, 2 + 12 * L + 2);
    const dp_gpt_config *cf = dp_gpt_config_of(g);
    cr_assert(cf->vocab_size == V && cf->block_size == BS && cf->n_layer == L &&
              cf->n_head == NH && cf->n_embd == C);

    const char *sfx[12] = {"ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight",
                           "attn.c_attn.bias",   "attn.c_proj.weight", "attn.c_proj.bias",
                           "ln_2.weight",        "ln_2.bias",        "mlp.c_fc.weight",
                           "mlp.c_fc.bias",      "mlp.c_proj.weight", "mlp.c_proj.bias"};
    size_t shp[12][2] = {{C, 0},     {C, 0},     {3 * C, C}, {3 * C, 0}, {C, C},     {C, 0},
                         {C, 0},     {C, 0},     {4 * C, C}, {4 * C, 0}, {C, 4 * C}, {C, 0}};
    char name[96];
    size_t end = 0;
    for (size_t i = 0; i < m->n_tensors; i++) {
        size_t s0, s1;
        if (i == 0) {
            snprintf(name, sizeof name, "transformer.wte.weight");
            s0 = V, s1 = C;
        } else if (i == 1) {
            snprintf(name, sizeof name, "transformer.wpe.weight");
            s0 = BS, s1 = C;
        } else if (i < 2 + 12 * L) {
            size_t l = (i - 2) / 12, j = (i - 2) % 12;
            snprintf(name, sizeof name, "transformer.h.%zu.%s", l, sfx[j]);
            s0 = shp[j][0], s1 = shp[j][1];
        } else {
            snprintf(name, sizeof name, "transformer.ln_f.%s", i == 2 + 12 * L ? "weight" : "bias");
            s0 = C, s1 = 0;
        }
        const dp_param_tensor *t = &m->tensors[i];
        cr_assert_str_eq(t->name, name);
        cr_assert_eq(dp_gpt_find_tensor(g, name), (long)i);
        cr_assert_eq(t->ndim, s1 ? 2 : 1, "%s ndim", name);
        cr_assert_eq(t->shape[0], s0, "%s shape[0]", name);
        if (s1) cr_assert_eq(t->shape[1], s1, "%s shape[1]", name);
        cr_assert_eq(t->numel, s0 * (s1 ? s1 : 1), "%s numel", name);
        cr_assert_eq(t->weight_decay, s1 ? 1 : 0, "%s weight_decay", name);
        cr_assert_eq(t->offset % DP_PARAM_ALIGN, 0, "%s offset", name);
        cr_assert_geq(t->offset, end, "%s overlaps", name);
        /* Padding is less than one alignment unit: the buffer is packed. */
        cr_assert_lt(t->offset - end, DP_PARAM_ALIGN, "%s: gap", name);
        end = t->offset + t->numel;
    }
    cr_assert_geq(m->n_params, end);
    cr_assert_lt(m->n_params - end, DP_PARAM_ALIGN);
    cr_assert_eq(dp_gpt_find_tensor(g, "lm_head.weight"), -1, "the LM head is tied to wte");
    cr_assert_eq(dp_gpt_find_tensor(g, NULL), -1);
    cr_assert_eq(dp_gpt_find_tensor(NULL, "transformer.wte.weight"), -1);
    /* The workspace grows with B and T (so one sized for block_size serves shorter T). */
    cr_assert_lt(dp_gpt_workspace_bytes(g, 2, 5), dp_gpt_workspace_bytes(g, 2, BS));
    cr_assert_lt(dp_gpt_workspace_bytes(g, 1, BS), dp_gpt_workspace_bytes(g, 2, BS));
    cr_assert_eq(dp_gpt_workspace_bytes(g, 0, BS), 0);
    dp_gpt_destroy(g);
    dp_gpt_destroy(NULL);
}

// --- forward consistency ------------------------------------------------------------------

/* Forward of tokens(B,T) on dev; returns host logits (B,T,V). */
static float *forward_host(const dp_gpt *g, dp_device *dev, const float *params,
                           const int32_t *tok, size_t B, size_t T, void *ws)
{
    size_t V = dp_gpt_config_of(g)->vocab_size;
    int32_t *dtok = dev_alloc(dev, B * T * sizeof(int32_t));
    float *dlog = dev_alloc(dev, B * T * V * sizeof(float));
    dp_assert_ok(dp_copy_h2d(dev, dtok, tok, B * T * sizeof(int32_t)));
    dp_assert_ok(dp_gpt_forward(g, dev, params, dtok, B, T, ws, dlog));
    float *h = xmalloc(B * T * V * sizeof(float));
    dp_assert_ok(dp_copy_d2h(dev, h, dlog, B * T * V * sizeof(float)));
    dp_device_free(dev, dtok);
    dp_device_free(dev, dlog);
    return h;
}

/*
 * Causality: changing the tokens after position t0 leaves the logits at
 * positions <= t0 unchanged. The computation of those rows is the same
 * sequence of float operations on the same values (masked attention
 * weights are exact zeros), so they agree to rounding of at most a few
 * ulps; atol 1e-6 on logits of size ~0.1. Short T: dp_gpt_forward with
 * T < block_size, on a workspace sized for block_size, equals the first T
 * positions of the full forward (GEMM blocking may differ with the size:
 * atol 1e-6, rtol 1e-5).
 */
Test(gpt, forward_is_causal_and_short_T_is_a_prefix, .timeout = 30)
{
    size_t V = 40, BS = 12, L = 2, NH = 2, C = 16, B = 2;
    dp_gpt *g = make_gpt(V, BS, L, NH, C);
    const dp_model *m = dp_gpt_model(g, 0);
    float *ph = init_params(g, 5);
    /* Bigger weights than the init so attention is far from uniform. */
    dp_rng rng;
    dp_rng_seed(&rng, 77);
    for (size_t i = 0; i < m->n_tensors; i++)
        if (m->tensors[i].ndim == 2)
            dp_rng_fill_normal(&rng, ph + m->tensors[i].offset, m->tensors[i].numel, 0.0f, 0.3f);
    dp_device *dev = dp_test_cpu(0);
    float *params = dp_test_upload(dev, ph, m->n_params);
    void *ws = dev_alloc(dev, dp_gpt_workspace_bytes(g, B, BS));

    int32_t tok[2 * 12], tok2[2 * 12];
    for (size_t i = 0; i < B * BS; i++) tok[i] = (int32_t)dp_rng_below(&rng, V);
    float *full = forward_host(g, dev, params, tok, B, BS, ws);

    size_t t0 = 6;
    memcpy(tok2, tok, sizeof tok);
    for (size_t b = 0; b < B; b++)
        for (size_t t = t0 + 1; t < BS; t++) tok2[b * BS + t] = (int32_t)((tok[b * BS + t] + 7) % V);
    float *changed = forward_host(g, dev, params, tok2, B, BS, ws);
    for (size_t b = 0; b < B; b++) {
        const float *a = full + b * BS * V, *c = changed + b * BS * V;
        dp_assert_allclose(c, a, (t0 + 1) * V, 1e-6, 0.0);
        /* ... and the later positions did change (the test can see a difference). */
        double diff = 0.0;
        for (size_t i = (t0 + 1) * V; i < BS * V; i++) diff += fabs(a[i] - c[i]);
        cr_assert_gt(diff, 1e-2, "changing tokens after t0 changed nothing after t0");
    }

    /* Short contexts T = 1, 5, BS-1 on the same (block_size-sized) workspace. */
    size_t Ts[] = {1, 5, BS - 1};
    for (size_t k = 0; k < 3; k++) {
        size_t T = Ts[k];
        int32_t shortt[2 * 12];
        for (size_t b = 0; b < B; b++) memcpy(shortt + b * T, tok + b * BS, T * sizeof(int32_t));
        float *s = forward_host(g, dev, params, shortt, B, T, ws);
        for (size_t b = 0; b < B; b++)
            dp_assert_allclose((const float *)(s + b * T * V), (const float *)(full + b * BS * V),
                               T * V, 1e-6, 1e-5);
        free(s);
    }
    free(changed);
    free(full);
    free(ph);
    dp_device_free(dev, ws);
    dp_device_free(dev, params);
    close_checked(dev);
    dp_gpt_destroy(g);
}

// --- initialisation -----------------------------------------------------------------------

/*
 * nanoGPT's init: normal(0, 0.02) for 2-D weights and embeddings,
 * 0.02/sqrt(2L) for attn.c_proj and mlp.c_proj, zero biases, unit LayerNorm
 * gains, zero padding. With n >= 4096 samples the sample std has relative
 * standard error 1/sqrt(2n) <= 1.1%, so 5% is > 4 sigma; the sample mean's
 * standard error is std/sqrt(n) <= std/64, so |mean| < std/10 is > 6 sigma.
 */
Test(gpt, init_follows_nanogpt_and_is_deterministic, .timeout = 30)
{
    size_t V = 256, BS = 64, L = 4, NH = 4, C = 64;
    dp_gpt *g = make_gpt(V, BS, L, NH, C);
    const dp_model *m = dp_gpt_model(g, 0);
    float *p = xmalloc(m->n_params * sizeof(float));
    for (size_t i = 0; i < m->n_params; i++) p[i] = 7.0f; /* init must zero the padding */
    dp_assert_ok(m->init(m->ctx, p, 1337));
    double proj_std = 0.02 / sqrt(2.0 * (double)L);
    size_t end = 0;
    for (size_t i = 0; i < m->n_tensors; i++) {
        const dp_param_tensor *t = &m->tensors[i];
        const float *x = p + t->offset;
        for (size_t k = end; k < t->offset; k++) cr_assert_eq(p[k], 0.0f, "padding %zu", k);
        end = t->offset + t->numel;
        size_t nl = strlen(t->name);
        if (t->ndim == 2) {
            double want = strstr(t->name, "c_proj.weight") ? proj_std : 0.02;
            double s = 0.0, ss = 0.0;
            for (size_t k = 0; k < t->numel; k++) {
                s += x[k];
                ss += (double)x[k] * x[k];
            }
            double mean = s / (double)t->numel;
            double sd = sqrt(ss / (double)t->numel - mean * mean);
            cr_assert_geq(t->numel, 4096);
            cr_assert(fabs(sd - want) < 0.05 * want, "%s: std %g, want %g", t->name, sd, want);
            cr_assert(fabs(mean) < 0.1 * want, "%s: mean %g", t->name, mean);
        } else if (nl > 7 && strcmp(t->name + nl - 7, ".weight") == 0) {
            for (size_t k = 0; k < t->numel; k++)
                cr_assert_eq(x[k], 1.0f, "%s[%zu] = %g, want 1", t->name, k, x[k]);
        } else {
            for (size_t k = 0; k < t->numel; k++)
                cr_assert_eq(x[k], 0.0f, "%s[%zu] = %g, want 0", t->name, k, x[k]);
        }
    }
    for (size_t k = end; k < m->n_params; k++) cr_assert_eq(p[k], 0.0f, "padding %zu", k);

    float *same = init_params(g, 1337), *other = init_params(g, 1338);
    cr_assert(memcmp(p, same, m->n_params * sizeof(float)) == 0, "same seed, different params");
    size_t differ = 0, n2 = 0;
    for (size_t i = 0; i < m->n_tensors; i++)
        if (m->tensors[i].ndim == 2)
            for (size_t k = 0; k < m->tensors[i].numel; k++, n2++)
                differ += p[m->tensors[i].offset + k] != other[m->tensors[i].offset + k];
    cr_assert_gt(differ, n2 * 99 / 100, "seeds 1337 and 1338 agree on %zu of %zu weights",
                 n2 - differ, n2);
    free(same);
    free(other);
    free(p);
    dp_gpt_destroy(g);
}

// --- through the engine -------------------------------------------------------------------

enum { ESTEPS = 3 };

static dp_engine_config gpt_cfg(dp_mode mode)
{
    dp_engine_config c = dp_engine_config_default();
    c.mode = mode;
    c.optim.lr = 3e-3f;
    c.optim.weight_decay = 0.1f;
    c.optim.grad_clip = 1.0f;
    c.seed = 11;
    return c;
}

/* ESTEPS steps of EROWS rows on cpu:0..k-1 with cfg; the losses, the
 * parameters after, and (last may be NULL) the last step's stats. */
static void gpt_train_crit(const dp_gpt *g, size_t k, const dp_engine_config *cfg,
                           const dp_criterion *crit, double *losses, float *params,
                           dp_step_stats *last)
{
    size_t before = dp_device_bytes_freed_at_close();
    dp_device_spec specs[DP_MAX_DEVICES];
    for (size_t i = 0; i < k; i++) specs[i] = (dp_device_spec){DP_DEVICE_CPU, (int)i};
    dp_engine *e = NULL;
    dp_assert_ok(dp_engine_create(specs, k, dp_gpt_model(g, 0), crit, cfg, &e));
    int32_t tok[EROWS * EBS], tgt[EROWS * EBS];
    for (int s = 0; s < ESTEPS; s++) {
        dp_test_gpt_batch(s, EROWS, tok, tgt);
        dp_batch b = {EROWS, tok, tgt};
        dp_step_stats st;
        dp_assert_ok(dp_engine_step(e, &b, &st));
        cr_assert(!st.skipped);
        losses[s] = st.loss;
        if (last) *last = st;
    }
    dp_assert_ok(dp_engine_get_params(e, params));
    dp_engine_destroy(e);
    cr_assert_eq(dp_device_bytes_freed_at_close(), before, "the engine leaked device memory");
}

static void gpt_train_with(const dp_gpt *g, size_t k, const dp_engine_config *cfg,
                           double *losses, float *params, dp_step_stats *last)
{
    dp_criterion crit = dp_criterion_cross_entropy();
    gpt_train_crit(g, k, cfg, &crit, losses, params, last);
}

static void gpt_train(const dp_gpt *g, size_t k, dp_mode mode, double *losses, float *params)
{
    dp_engine_config cfg = gpt_cfg(mode);
    gpt_train_with(g, k, &cfg, losses, params, NULL);
}

typedef struct gpt_equiv {
    size_t k;
    dp_mode mode;
} gpt_equiv;

ParameterizedTestParameters(gpt, k_devices_equal_one_device)
{
    static gpt_equiv cases[] = {{2, DP_MODE_BALANCED}, {3, DP_MODE_BALANCED},
                                {2, DP_MODE_GATHER},   {3, DP_MODE_GATHER}};
    return cr_make_param_array(gpt_equiv, cases, sizeof cases / sizeof *cases);
}

/*
 * 5 rows on k devices (3/2 or 2/2/1) vs one device, three AdamW steps with
 * clipping. The k-device run sums the same per-row gradients in another
 * order, so gradients differ by float32 rounding (~1e-7 relative); AdamW's
 * g/sqrt(v) is scale-free, so parameter differences stay at an ulp or so
 * (measured <= 6e-8). Losses: rtol 1e-5, atol 1e-7. Parameters (|p| ~
 * 0.02..1): rtol 1e-5, atol 5e-7.
 *
 * Except the key part of each c_attn.bias: its exact gradient is zero (a
 * bias shared by all keys shifts every score of a query equally, and the
 * softmax ignores shifts), so its float gradient is rounding noise that
 * AdamW's normalisation turns into steps of arbitrary sign. Those entries
 * are only held to AdamW's bound: a parameter moves by at most ~lr per
 * step, so atol 2 * ESTEPS * lr.
 */
static int is_key_bias(const dp_gpt *g, size_t i)
{
    const dp_model *m = dp_gpt_model(g, 0);
    size_t C = dp_gpt_config_of(g)->n_embd;
    for (size_t t = 0; t < m->n_tensors; t++) {
        const dp_param_tensor *pt = &m->tensors[t];
        size_t nl = strlen(pt->name);
        if (nl >= 16 && strcmp(pt->name + nl - 16, "attn.c_attn.bias") == 0 &&
            i >= pt->offset + C && i < pt->offset + 2 * C)
            return 1;
    }
    return 0;
}

/* Parameters pk and losses lk of a run against the reference run's (p1,
 * l1), with the tolerances above; returns the largest parameter
 * difference (key biases excluded). */
static double assert_run_close(const dp_gpt *g, const float *pk, const float *p1,
                               const double *lk, const double *l1, const char *what)
{
    size_t n = dp_gpt_model(g, 0)->n_params;
    dp_assert_allclose(lk, l1, ESTEPS, 1e-7, 1e-5);
    /* Key-bias entries: compare them loosely, then copy them so the strict
     * check below covers every other parameter. */
    float *pk_strict = xmalloc(n * sizeof(float));
    memcpy(pk_strict, pk, n * sizeof(float));
    double lr = gpt_cfg(DP_MODE_BALANCED).optim.lr, dmax = 0.0;
    size_t n_key = 0;
    for (size_t i = 0; i < n; i++) {
        if (is_key_bias(g, i)) {
            cr_assert(fabs(pk[i] - p1[i]) <= 2.0 * ESTEPS * lr, "%s: key bias %zu: %g vs %g",
                      what, i, pk[i], p1[i]);
            pk_strict[i] = p1[i];
            n_key++;
        } else {
            dmax = fmax(dmax, fabs(pk[i] - p1[i]));
        }
    }
    cr_assert_eq(n_key, dp_gpt_config_of(g)->n_layer * dp_gpt_config_of(g)->n_embd);
    dp_assert_allclose(pk_strict, p1, n, 5e-7, 1e-5);
    free(pk_strict);
    return dmax;
}

ParameterizedTest(gpt_equiv *c, gpt, k_devices_equal_one_device, .timeout = 60)
{
    dp_gpt *g = make_gpt(EV, EBS, EL, ENH, EC);
    size_t n = dp_gpt_model(g, 0)->n_params;
    float *p1 = xmalloc(n * sizeof(float)), *pk = xmalloc(n * sizeof(float));
    double l1[ESTEPS], lk[ESTEPS], lmax = 0.0;
    gpt_train(g, 1, DP_MODE_BALANCED, l1, p1);
    gpt_train(g, c->k, c->mode, lk, pk);
    double dmax = assert_run_close(g, pk, p1, lk, l1, dp_mode_name(c->mode));
    for (int s = 0; s < ESTEPS; s++) lmax = fmax(lmax, fabs(lk[s] - l1[s]) / l1[s]);
    cr_log_info("k=%zu %s: largest |param diff| %.2e (key biases excluded), loss rel diff %.2e",
                c->k, dp_mode_name(c->mode), dmax, lmax);
    /* The steps did change the parameters. */
    float *p0 = init_params(g, gpt_cfg(DP_MODE_BALANCED).seed);
    double moved = 0.0;
    for (size_t i = 0; i < n; i++) moved += fabs(pk[i] - p0[i]);
    cr_assert_gt(moved, 1e-3 * (double)n * 3e-3, "training did not move the parameters");
    free(p0);
    free(p1);
    free(pk);
    dp_gpt_destroy(g);
}

// --- chunked logits (the split LM head) ------------------------------------------------------

typedef struct chunk_case {
    size_t k, chunk, max_rows;
    int shard, grad_accum;
} chunk_case;

ParameterizedTestParameters(gpt, logits_chunks_match_whole_logits)
{
    /* 5 rows of 8 tokens: 40 output rows on one device, 24/16 on two,
     * 16/16/8 on three. Chunks of 1 and 7 cut sequences, and with 7 the
     * last chunk of a device is short; micro-batches of 2 rows (16 output
     * rows) and accumulation restart the chunks per micro-batch. */
    static chunk_case cases[] = {
        {1, 1, 0, 0, 1},  {1, 7, 0, 0, 1}, {2, 7, 0, 0, 1}, {3, 13, 0, 1, 1},
        {2, 5, 2, 0, 1},  {2, 3, 0, 1, 2},
    };
    return cr_make_param_array(chunk_case, cases, sizeof cases / sizeof *cases);
}

/*
 * Chunking regroups float sums only (the loss sum, the head's share of
 * d(wte)): three AdamW steps with chunks match one device with whole
 * logits to the k-device tolerances, and the same chunking twice is
 * bitwise identical.
 */
ParameterizedTest(chunk_case *c, gpt, logits_chunks_match_whole_logits, .timeout = 60)
{
    dp_gpt *g = make_gpt(EV, EBS, EL, ENH, EC);
    size_t n = dp_gpt_model(g, 0)->n_params;
    float *p1 = xmalloc(n * sizeof(float)), *pk = xmalloc(n * sizeof(float)),
          *again = xmalloc(n * sizeof(float));
    double l1[ESTEPS], lk[ESTEPS], l2[ESTEPS];
    dp_engine_config whole = gpt_cfg(DP_MODE_BALANCED);
    whole.logits_chunk_rows = DP_LOGITS_WHOLE;
    gpt_train_with(g, 1, &whole, l1, p1, NULL);
    dp_engine_config cfg = gpt_cfg(DP_MODE_BALANCED);
    cfg.logits_chunk_rows = c->chunk;
    cfg.max_rows_per_micro = c->max_rows;
    cfg.shard_optimizer = c->shard;
    cfg.grad_accum = c->grad_accum;
    dp_step_stats st;
    gpt_train_with(g, c->k, &cfg, lk, pk, &st);
    char what[64];
    snprintf(what, sizeof what, "k=%zu chunks of %zu", c->k, c->chunk);
    double dmax = assert_run_close(g, pk, p1, lk, l1, what);
    /* Each device held one chunk's logits (or its micro-batch's, when
     * shorter), never its whole. */
    for (size_t i = 0; i < c->k; i++) {
        const dp_device_step_stats *d = &st.devices[i];
        size_t mb = d->micro_batches, out = (d->rows + mb - 1) / mb * EBS;
        size_t want = (c->chunk < out ? c->chunk : out) * EV * sizeof(float);
        cr_assert_eq(d->logits_bytes, want, "%s: device %zu holds %zu bytes of logits, want %zu",
                     what, i, d->logits_bytes, want);
    }
    gpt_train_with(g, c->k, &cfg, l2, again, NULL);
    cr_assert(memcmp(l2, lk, sizeof lk) == 0 && memcmp(again, pk, n * sizeof(float)) == 0,
              "%s: the same chunking is not bitwise reproducible", what);
    cr_log_info("%s: largest |param diff| vs whole logits %.2e", what, dmax);
    free(p1);
    free(pk);
    free(again);
    dp_gpt_destroy(g);
}

/* Cross-entropy that counts its valid targets itself (CPU devices: the
 * targets are host memory) instead of echoing the engine's count. */
static dp_status self_counting_fb(void *ctx, const dp_criterion_args *a, double *loss,
                                  size_t *count)
{
    const dp_criterion *inner = ctx;
    size_t echoed = 0, mine = 0;
    dp_status s = inner->forward_backward(inner->ctx, a, loss, &echoed);
    if (s != DP_OK) return s;
    const int32_t *t = a->targets;
    for (size_t i = 0; i < a->n; i++) mine += t[i] >= 0;
    *count = mine;
    return DP_OK;
}

static size_t self_counting_scratch(void *ctx, size_t n, size_t V)
{
    const dp_criterion *inner = ctx;
    return inner->scratch_bytes(inner->ctx, n, V);
}

/* Ignored targets only in device 1's rows (5 rows on 3 devices: 2/2/1),
 * logits in chunks of 3 output rows, so chunks start inside other
 * devices' rows: a criterion that counts for itself agrees with the
 * engine's count of every chunk on every device (a count taken at the
 * wrong rows would fail the step), and the loss is one device's. */
Test(gpt, a_self_counting_criterion_agrees_on_every_devices_chunks, .timeout = 60)
{
    dp_gpt *g = make_gpt(EV, EBS, EL, ENH, EC);
    dp_criterion ce = dp_criterion_cross_entropy();
    dp_criterion crit = {&ce, self_counting_scratch, self_counting_fb, DP_TARGET_CLASS, 0, 0, 0};
    int32_t tok[EROWS * EBS], tgt[EROWS * EBS];
    dp_test_gpt_batch(0, EROWS, tok, tgt);
    size_t ignored = 0;
    for (size_t i = 0; i < EROWS * EBS; i++) {
        size_t row = i / EBS;
        if (tgt[i] < 0) tgt[i] = tok[i]; /* valid everywhere ... */
        if ((row == 2 || row == 3) && i % 3 == 0) tgt[i] = -1, ignored++; /* ... but on device 1 */
    }
    cr_assert_gt(ignored, 3);
    dp_batch b = {EROWS, tok, tgt};
    double loss[2];
    for (int run = 0; run < 2; run++) {
        dp_engine_config cfg = gpt_cfg(DP_MODE_BALANCED);
        cfg.logits_chunk_rows = 3;
        size_t k = run ? 3 : 1;
        dp_device_spec specs[3] = {{DP_DEVICE_CPU, 0}, {DP_DEVICE_CPU, 1}, {DP_DEVICE_CPU, 2}};
        dp_engine *e = NULL;
        dp_assert_ok(dp_engine_create(specs, k, dp_gpt_model(g, 0), run ? &crit : &ce, &cfg, &e));
        dp_step_stats st;
        dp_status s = dp_engine_step(e, &b, &st);
        cr_assert_eq(s, DP_OK, "k=%zu: %s", k, dp_last_error());
        cr_assert_eq(st.valid_targets, EROWS * EBS - ignored);
        if (run) cr_assert_eq(st.devices[1].valid_targets, 2 * EBS - ignored);
        loss[run] = st.loss;
        dp_engine_destroy(e);
    }
    dp_assert_allclose(&loss[1], &loss[0], 1, 1e-7, 1e-5);
    dp_gpt_destroy(g);
}

/* The bundled cross-entropy behind a flag: with rows 0 the engine reads
 * each call's host sum; with rows 1 it gives row losses, and the host sum
 * is poisoned after the call (NaN), so a step that read it would fail. */
typedef struct ce_rows_case {
    dp_criterion inner;
    int rows;
} ce_rows_case;

static dp_status ce_rows_fb(void *ctx, const dp_criterion_args *a, double *loss, size_t *count)
{
    const ce_rows_case *c = ctx;
    dp_status s = c->inner.forward_backward(c->inner.ctx, a, loss, count);
    if (s == DP_OK && a->row_losses) *loss = NAN;
    return s;
}

static size_t ce_rows_scratch(void *ctx, size_t n, size_t V)
{
    const ce_rows_case *c = ctx;
    return c->inner.scratch_bytes(c->inner.ctx, n, V);
}

/*
 * Row losses (dp_criterion.writes_row_losses: the losses stay on the
 * device until the step's end) give the bits of the loss read back per
 * call: the same losses, parameters and evaluation over three AdamW
 * steps, with logits chunks that cut rows and devices, micro-batches and
 * accumulation, and with whole logits.
 */
Test(gpt, row_losses_give_the_bits_of_per_call_losses, .timeout = 60)
{
    dp_gpt *g = make_gpt(EV, EBS, EL, ENH, EC);
    size_t n = dp_gpt_model(g, 0)->n_params;
    float *pr = xmalloc(n * sizeof(float)), *ph = xmalloc(n * sizeof(float));
    const struct {
        size_t k, chunk, max_rows;
        int accum;
    } cases[] = {{2, 7, 2, 2}, {3, 3, 0, 1}, {1, DP_LOGITS_WHOLE, 0, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        dp_engine_config cfg = gpt_cfg(DP_MODE_BALANCED);
        cfg.logits_chunk_rows = cases[i].chunk;
        cfg.max_rows_per_micro = cases[i].max_rows;
        cfg.grad_accum = cases[i].accum;
        double lr[ESTEPS], lh[ESTEPS];
        ce_rows_case rows = {dp_criterion_cross_entropy(), 1},
                     host = {dp_criterion_cross_entropy(), 0};
        dp_criterion cr = {&rows, ce_rows_scratch, ce_rows_fb, DP_TARGET_CLASS, 1, 0, 0};
        dp_criterion ch = {&host, ce_rows_scratch, ce_rows_fb, DP_TARGET_CLASS, 0, 0, 0};
        gpt_train_crit(g, cases[i].k, &cfg, &cr, lr, pr, NULL);
        gpt_train_crit(g, cases[i].k, &cfg, &ch, lh, ph, NULL);
        for (int s = 0; s < ESTEPS; s++)
            cr_assert(lr[s] == lh[s], "case %zu step %d: loss %.17g with row losses, %.17g "
                      "read per call", i, s, lr[s], lh[s]);
        cr_assert(memcmp(pr, ph, n * sizeof(float)) == 0, "case %zu: the parameters differ", i);
    }
    /* Evaluation: the same loss, and the poisoned host sum never read. */
    dp_device_spec specs[2] = {{DP_DEVICE_CPU, 0}, {DP_DEVICE_CPU, 1}};
    double ev[2];
    for (int r = 0; r < 2; r++) {
        ce_rows_case c = {dp_criterion_cross_entropy(), r};
        dp_criterion crit = {&c, ce_rows_scratch, ce_rows_fb, DP_TARGET_CLASS, r, 0, 0};
        dp_engine_config cfg = gpt_cfg(DP_MODE_BALANCED);
        cfg.logits_chunk_rows = 5;
        dp_engine *e = NULL;
        dp_assert_ok(dp_engine_create(specs, 2, dp_gpt_model(g, 0), &crit, &cfg, &e));
        int32_t tok[EROWS * EBS], tgt[EROWS * EBS];
        dp_test_gpt_batch(0, EROWS, tok, tgt);
        dp_batch b = {EROWS, tok, tgt};
        dp_step_stats st;
        dp_assert_ok(dp_engine_evaluate(e, &b, &st));
        ev[r] = st.loss;
        dp_engine_destroy(e);
    }
    cr_assert(ev[0] == ev[1] && isfinite(ev[0]), "evaluation: %.17g read per call, %.17g from "
              "row losses", ev[0], ev[1]);
    free(pr);
    free(ph);
    dp_gpt_destroy(g);
}

/* The graph test's schedule (tests/test_cuda_engine.c's, and more): 10
 * steps, a shorter batch at step 3, the first row's targets all ignored at
 * step 5 (the other rows as ever: on two devices only the loss scale
 * tells the second device's step from a full one), every target valid at
 * step 6, an evaluation after steps 2, 4 and 6, and after step 6 a
 * second one first (the fixture's count of ignored targets moved two
 * places on: the loss scale of the others, other chunks). Per step and
 * evaluation: its loss, and how many devices' stats say replayed. */
enum { GSTEPS = 10, GOPS = 14 };

static void graph_policy_run(const dp_gpt *g, size_t k, const dp_criterion *crit, int stand_in,
                             int overlap, double *loss, int *replayed, float *params,
                             uint64_t *replays)
{
    dp_device_spec specs[2] = {{DP_DEVICE_CPU, 0}, {DP_DEVICE_CPU, 1}};
    dp_engine_config cfg = gpt_cfg(DP_MODE_BALANCED);
    cfg.logits_chunk_rows = 5; /* chunks with and without ignored targets */
    if (!overlap) cfg.bucket_bytes = DP_BUCKET_OFF; /* CPU devices overlap by default */
    dp_engine *e = NULL;
    dp_assert_ok(dp_engine_create(specs, k, dp_gpt_model(g, 0), crit, &cfg, &e));
    if (stand_in) dp_engine_stand_in_graphs(e);
    int32_t tok[EROWS * EBS], tgt[EROWS * EBS];
    size_t at = 0;
    for (int s = 0; s < GSTEPS; s++) {
        dp_test_gpt_batch(s, EROWS, tok, tgt);
        for (size_t i = 0; s == 5 && i < EBS; i++) tgt[i] = -1;
        int32_t moved[EROWS * EBS], fixture[EROWS * EBS];
        memcpy(fixture, tgt, sizeof tgt);
        for (size_t i = 0; i < EROWS * EBS; i++) moved[i] = tok[i];
        for (size_t i = 0; i < EROWS * EBS; i++)
            if (tgt[i] < 0) moved[(i + 2) % (EROWS * EBS)] = -1;
        for (size_t i = 0; s == 6 && i < EROWS * EBS; i++)
            if (tgt[i] < 0) tgt[i] = tok[i];
        int evals = s == 6 ? 2 : s == 2 || s == 4;
        for (int ev = 0; ev <= evals; ev++) {
            const int32_t *t = ev == 1 && s == 6 ? moved : ev == 2 ? fixture : tgt;
            dp_batch b = {ev || s != 3 ? EROWS : EROWS - 1, tok, t};
            dp_step_stats st;
            dp_assert_ok(ev ? dp_engine_evaluate(e, &b, &st) : dp_engine_step(e, &b, &st));
            loss[at] = st.loss;
            replayed[at] = 0;
            for (size_t d = 0; d < k; d++) replayed[at] += st.devices[d].replayed;
            at++;
        }
    }
    dp_assert_ok(dp_engine_get_params(e, params));
    *replays = 0;
    for (size_t d = 0; d < k; d++) *replays += dp_engine_graph_replays(e, d, NULL);
    dp_engine_destroy(e);
}

/* parallel/graph.c's policy, where no device records (the stand-in,
 * engine_testing.h): a key replays from its third sighting... its
 * second records, and each step of a key seen before replays; a shorter
 * batch, an evaluation and a batch without ignored targets are keys of
 * their own, and the first step of each runs eagerly; the least recently
 * used key goes when a fifth comes. A criterion that is not replayable
 * never replays, nor does a step whose reduce-scatter overlaps the
 * backward (its evaluations do). The stand-in's replays keep the eager
 * bits. */
Test(gpt, graph_policy_replays_only_a_key_seen_before, .timeout = 60)
{
    /* step 0 (buffers not yet made), 1 (first sighting), 2 (recorded),
     * eval 2 (first), 3 (short: first), 4, eval 4 (recorded), 5 (first
     * row ignored: first), 6 (all valid: first, the short step's key
     * goes), eval 6 (moved targets: first; the full step's key, least
     * recently used, goes), eval 6 again (the fixture's: kept, having
     * been used after the full step's), 7 (first again), 8 (recorded), 9 */
    static const int want[GOPS] = {0, 0, 1, 0, 0, 1, 1, 0, 0, 0, 1, 0, 1, 1};
    dp_gpt *g = make_gpt(EV, EBS, EL, ENH, EC);
    size_t n = dp_gpt_model(g, 0)->n_params;
    float *pe = xmalloc(n * sizeof(float)), *pg = xmalloc(n * sizeof(float));
    dp_criterion ce = dp_criterion_cross_entropy();
    cr_assert(ce.replayable && dp_gpt_model(g, 0)->replayable);
    ce_rows_case wrapped = {dp_criterion_cross_entropy(), 1};
    dp_criterion opaque = {&wrapped, ce_rows_scratch, ce_rows_fb, DP_TARGET_CLASS, 1, 0, 0};
    for (size_t k = 1; k <= 2; k++) {
        double le[GOPS], lg[GOPS];
        int re[GOPS], rg[GOPS];
        uint64_t ne, ng;
        graph_policy_run(g, k, &ce, 0, 0, le, re, pe, &ne);
        graph_policy_run(g, k, &ce, 1, 0, lg, rg, pg, &ng);
        uint64_t want_replays = 0;
        for (int i = 0; i < GOPS; i++) {
            cr_assert(re[i] == 0, "%zu devices: op %d replayed without graphs", k, i);
            cr_assert(rg[i] == want[i] * (int)k, "%zu devices: op %d replayed on %d, not %d", k,
                      i, rg[i], want[i] * (int)k);
            cr_assert(memcmp(&le[i], &lg[i], sizeof le[i]) == 0,
                      "%zu devices: op %d loss %.17g eager, %.17g replayed", k, i, le[i], lg[i]);
            want_replays += (uint64_t)want[i] * k;
        }
        cr_assert(ne == 0 && ng == want_replays, "%zu devices: %llu and %llu replays, not 0 "
                  "and %llu", k, (unsigned long long)ne, (unsigned long long)ng,
                  (unsigned long long)want_replays);
        cr_assert(memcmp(pe, pg, n * sizeof(float)) == 0, "%zu devices: the parameters differ",
                  k);
        graph_policy_run(g, k, &opaque, 1, 0, lg, rg, pg, &ng);
        for (int i = 0; i < GOPS; i++)
            cr_assert(rg[i] == 0, "%zu devices: op %d replayed with a criterion that is not "
                      "replayable", k, i);
        cr_assert(memcmp(pe, pg, n * sizeof(float)) == 0);
        if (k < 2) continue;
        /* evaluations have no reduce-scatter: the second of a key replays */
        graph_policy_run(g, k, &ce, 1, 1, lg, rg, pg, &ng);
        for (int i = 0; i < GOPS; i++)
            cr_assert(rg[i] == (i == 6 || i == 10) * (int)k, "op %d: replayed on %d with the "
                      "overlap on", i, rg[i]);
    }
    free(pe);
    free(pg);
    dp_gpt_destroy(g);
}

/* A chunk of at least a micro-batch's rows, and the automatic chunk below
 * DP_LOGITS_CHUNK_MIN_ROWS rows, are the whole micro-batch: bitwise the
 * unchunked run. */
Test(gpt, logits_chunk_of_all_rows_is_whole_logits, .timeout = 60)
{
    dp_gpt *g = make_gpt(EV, EBS, EL, ENH, EC);
    size_t n = dp_gpt_model(g, 0)->n_params;
    float *pw = xmalloc(n * sizeof(float)), *pc = xmalloc(n * sizeof(float));
    double lw[ESTEPS], lc[ESTEPS];
    dp_engine_config cfg = gpt_cfg(DP_MODE_BALANCED);
    cfg.logits_chunk_rows = DP_LOGITS_WHOLE;
    gpt_train_with(g, 2, &cfg, lw, pw, NULL);
    size_t chunks[] = {0, EROWS * EBS, 1000000};
    for (size_t i = 0; i < 3; i++) {
        cfg.logits_chunk_rows = chunks[i];
        gpt_train_with(g, 2, &cfg, lc, pc, NULL);
        cr_assert(memcmp(lw, lc, sizeof lw) == 0 && memcmp(pw, pc, n * sizeof(float)) == 0,
                  "logits_chunk_rows %zu differs from whole logits", chunks[i]);
    }
    free(pw);
    free(pc);
    dp_gpt_destroy(g);
}

/* A vocabulary 32x the width: the logits dwarf everything else. */
enum { MV = 512, MC = 16, MROWS = 40 };

static dp_engine *open_wide(const dp_gpt *g, size_t chunk)
{
    dp_device_spec spec = {DP_DEVICE_CPU, 0};
    dp_criterion crit = dp_criterion_cross_entropy();
    dp_engine_config cfg = gpt_cfg(DP_MODE_BALANCED);
    cfg.logits_chunk_rows = chunk;
    dp_engine *e = NULL;
    dp_assert_ok(dp_engine_create(&spec, 1, dp_gpt_model(g, 0), &crit, &cfg, &e));
    return e;
}

static void wide_batch(int32_t *tok, int32_t *tgt)
{
    dp_rng rng;
    dp_rng_seed(&rng, 77);
    for (size_t i = 0; i < MROWS * EBS; i++) {
        tok[i] = (int32_t)dp_rng_below(&rng, MV);
        tgt[i] = i % 11 == 5 ? -1 : (int32_t)dp_rng_below(&rng, MV);
    }
}

/*
 * 320 output rows of 512 logits on one device: whole logits take 640 KiB;
 * the automatic chunk (DP_LOGITS_CHUNK_MIN_ROWS = 256 rows) and 32-row
 * chunks hold that many rows, and the step's peak falls by at least the
 * logits rows not held. Evaluation in chunks gives the same loss.
 */
Test(gpt, logits_chunks_lower_the_peak, .timeout = 60)
{
    dp_gpt *g = make_gpt(MV, EBS, 1, 2, MC);
    int32_t tok[MROWS * EBS], tgt[MROWS * EBS];
    wide_batch(tok, tgt);
    dp_batch b = {MROWS, tok, tgt};
    size_t n = MROWS * EBS, chunks[] = {DP_LOGITS_WHOLE, 0, 32}, held[] = {n, 256, 32};
    size_t peak[3];
    double loss[3], eval[3];
    for (int i = 0; i < 3; i++) {
        dp_engine *e = open_wide(g, chunks[i]);
        dp_step_stats st, ev;
        dp_assert_ok(dp_engine_evaluate(e, &b, &ev));
        dp_assert_ok(dp_engine_step(e, &b, &st));
        cr_assert_eq(st.devices[0].logits_bytes, held[i] * MV * sizeof(float),
                     "chunk %zu: %zu bytes of logits", chunks[i], st.devices[0].logits_bytes);
        peak[i] = st.devices[0].step_peak;
        loss[i] = st.loss;
        eval[i] = ev.loss;
        dp_engine_destroy(e);
    }
    for (int i = 1; i < 3; i++) {
        size_t saved = (n - held[i]) * MV * sizeof(float);
        cr_assert_geq(peak[0] - peak[i], saved, "chunk %zu: peak %zu, whole logits %zu: saved "
                      "%zu < %zu", chunks[i], peak[i], peak[0], peak[0] - peak[i], saved);
        cr_assert(fabs(loss[i] - loss[0]) <= 1e-6 * loss[0], "loss %.9g vs %.9g", loss[i],
                  loss[0]);
        cr_assert(fabs(eval[i] - eval[0]) <= 1e-6 * eval[0], "eval %.9g vs %.9g", eval[i],
                  eval[0]);
        cr_assert_eq(eval[i], loss[i], "evaluate and step see the same parameters and batch");
    }
    cr_log_info("step peak: whole logits %zu B, auto chunk %zu B, 32-row chunks %zu B", peak[0],
                peak[1], peak[2]);
    dp_gpt_destroy(g);
}

/* A head whose callbacks fail on request, around the GPT's. */
static dp_model failing;
static const dp_model *real;
static int fail_forward, fail_backward;

static dp_status failing_head_forward(void *ctx, dp_device *dev, dp_params params,
                                      const float *features, size_t m, float *logits)
{
    if (fail_forward) return dp_set_error(DP_ERR_DEVICE, "head forward broke (test)");
    return real->head_forward(ctx, dev, params, features, m, logits);
}

static dp_status failing_head_backward(void *ctx, dp_device *dev, dp_params params,
                                       float *grads, const float *features, size_t m,
                                       float *dlogits, float *dfeatures)
{
    if (fail_backward) return DP_ERR_DEVICE; /* without a message: the engine says so */
    return real->head_backward(ctx, dev, params, grads, features, m, dlogits, dfeatures);
}

/*
 * A failing head callback fails the step naming the device, the phase and
 * the callback, updates nothing, and the next step works; an incomplete
 * head is refused at create.
 */
Test(gpt, head_failures_are_reported_and_recoverable, .timeout = 60)
{
    dp_gpt *g = make_gpt(MV, EBS, 1, 2, MC);
    real = dp_gpt_model(g, 0);
    failing = *real;
    failing.head_forward = failing_head_forward;
    failing.head_backward = failing_head_backward;
    dp_device_spec specs[2] = {{DP_DEVICE_CPU, 0}, {DP_DEVICE_CPU, 1}};
    dp_criterion crit = dp_criterion_cross_entropy();
    dp_engine_config cfg = gpt_cfg(DP_MODE_BALANCED);
    cfg.logits_chunk_rows = 16;
    dp_engine *e = NULL;
    dp_assert_ok(dp_engine_create(specs, 2, &failing, &crit, &cfg, &e));
    int32_t tok[MROWS * EBS], tgt[MROWS * EBS];
    wide_batch(tok, tgt);
    dp_batch b = {MROWS, tok, tgt};
    size_t n = real->n_params;
    float *before = xmalloc(n * sizeof(float)), *after = xmalloc(n * sizeof(float));
    dp_assert_ok(dp_engine_get_params(e, before));
    fail_forward = 1;
    cr_assert_eq(dp_engine_step(e, &b, NULL), DP_ERR_DEVICE);
    cr_assert(strstr(dp_last_error(), "cpu:0 criterion: head forward broke (test)"), "%s",
              dp_last_error());
    fail_forward = 0;
    fail_backward = 1;
    cr_assert_eq(dp_engine_step(e, &b, NULL), DP_ERR_DEVICE);
    cr_assert(strstr(dp_last_error(), "cpu:0 criterion: ") &&
                  strstr(dp_last_error(), "the model's head_backward returned"),
              "%s", dp_last_error());
    dp_assert_ok(dp_engine_get_params(e, after));
    cr_assert(memcmp(before, after, n * sizeof(float)) == 0, "a failed step changed parameters");
    fail_backward = 0;
    dp_step_stats st;
    dp_assert_ok(dp_engine_step(e, &b, &st));
    cr_assert_eq(st.step, 1);
    dp_engine_destroy(e);

    /* An incomplete head. */
    dp_model half = *real;
    half.head_backward = NULL;
    dp_clear_error();
    cr_assert_eq(dp_engine_create(specs, 1, &half, &crit, &cfg, &e), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "head is incomplete"), "%s", dp_last_error());
    half = *real;
    half.head_features = 0;
    cr_assert_eq(dp_model_validate(&half), DP_ERR_INVALID_ARGUMENT);
    free(before);
    free(after);
    dp_gpt_destroy(g);
}

/* 30 AdamW steps on one fixed batch: the loss must fall far below its start. */
Test(gpt, overfits_one_batch, .timeout = 60)
{
    dp_gpt *g = make_gpt(EV, 16, 2, 4, 32);
    dp_device_spec specs[2] = {{DP_DEVICE_CPU, 0}, {DP_DEVICE_CPU, 1}};
    dp_criterion crit = dp_criterion_cross_entropy();
    dp_engine_config cfg = dp_engine_config_default();
    cfg.optim.lr = 1e-2f;
    cfg.optim.weight_decay = 0.0f;
    dp_engine *e = NULL;
    dp_assert_ok(dp_engine_create(specs, 2, dp_gpt_model(g, 0), &crit, &cfg, &e));
    enum { R = 4, T = 16 };
    int32_t tok[R * T], tgt[R * T];
    dp_rng rng;
    dp_rng_seed(&rng, 99);
    for (size_t i = 0; i < R * T; i++) {
        tok[i] = (int32_t)dp_rng_below(&rng, EV);
        tgt[i] = (int32_t)dp_rng_below(&rng, EV);
    }
    dp_batch b = {R, tok, tgt};
    double first = 0.0, last = 0.0;
    for (int s = 0; s < 30; s++) {
        dp_step_stats st;
        dp_assert_ok(dp_engine_step(e, &b, &st));
        if (s == 0) first = st.loss;
        last = st.loss;
    }
    /* Random targets: the start is near log(V) = 3.6; memorising 64 targets
     * with 30 steps of lr 1e-2 brings it under a fifth of that (measured:
     * 3.61 -> 0.06). */
    cr_assert(fabs(first - log((double)EV)) < 0.5, "initial loss %g, want ~log(V) = %g", first,
              log((double)EV));
    cr_assert_lt(last, 0.2 * first, "loss %g -> %g after 30 steps", first, last);
    cr_log_info("overfit: loss %.4f -> %.4f in 30 steps", first, last);
    dp_engine_destroy(e);
    dp_gpt_destroy(g);
}

// --- errors -------------------------------------------------------------------------------

static void expect_bad_config(dp_gpt_config cfg, const char *want)
{
    static char sentinel;
    dp_gpt *g = (dp_gpt *)&sentinel; /* must be reset to NULL on failure */
    dp_clear_error();
    dp_status s = dp_gpt_create(&cfg, &g);
    cr_assert_eq(s, DP_ERR_INVALID_ARGUMENT, "config {%zu,%zu,%zu,%zu,%zu}: %s", cfg.vocab_size,
                 cfg.block_size, cfg.n_layer, cfg.n_head, cfg.n_embd, dp_strerror(s));
    cr_assert_null(g);
    cr_assert(strstr(dp_last_error(), want), "message lacks '%s': %s", want, dp_last_error());
}

Test(gpt, bad_config_is_rejected_with_a_message)
{
    dp_gpt_config ok = {
        .vocab_size = 65, .block_size = 16, .n_layer = 2, .n_head = 4, .n_embd = 32};
    dp_gpt_config c = ok;
    c.n_head = 5;
    expect_bad_config(c, "n_head 5 does not divide n_embd 32");
    c = ok, c.vocab_size = 0;
    expect_bad_config(c, "vocab_size");
    c = ok, c.block_size = 0;
    expect_bad_config(c, "block_size");
    c = ok, c.n_layer = 0;
    expect_bad_config(c, "n_layer");
    c = ok, c.n_head = 0;
    expect_bad_config(c, "n_head");
    c = ok, c.n_embd = 0;
    expect_bad_config(c, "n_embd");
    c = ok, c.vocab_size = (size_t)1 << 40;
    expect_bad_config(c, "vocab_size");
    c = ok, c.block_size = SIZE_MAX / 16, c.n_embd = 1 << 20, c.n_head = 1;
    expect_bad_config(c, "block_size");
    c = ok, c.n_layer = SIZE_MAX / 4;
    expect_bad_config(c, "overflow");
    cr_assert_eq(dp_gpt_create(NULL, &(dp_gpt *){NULL}), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_gpt_create(&ok, NULL), DP_ERR_INVALID_ARGUMENT);
    cr_assert_null(dp_gpt_model(NULL, 0));
    cr_assert_null(dp_gpt_config_of(NULL));
}

Test(gpt, bad_tokens_and_calls_are_rejected, .timeout = 30)
{
    size_t V = 20, BS = 6;
    dp_gpt *g = make_gpt(V, BS, 1, 2, 8);
    const dp_model *m = dp_gpt_model(g, 0);
    int32_t tok[3 * 6];
    for (size_t i = 0; i < 3 * BS; i++) tok[i] = (int32_t)(i % V);
    dp_assert_ok(m->validate_inputs(m->ctx, tok, 3));
    tok[1 * BS + 4] = (int32_t)V;
    dp_clear_error();
    cr_assert_eq(m->validate_inputs(m->ctx, tok, 3), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "token id 20 at row 1, position 4"), "%s", dp_last_error());
    cr_assert(strstr(dp_last_error(), "vocab_size"), "%s", dp_last_error());
    tok[1 * BS + 4] = -3;
    cr_assert_eq(m->validate_inputs(m->ctx, tok, 3), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "token id -3"), "%s", dp_last_error());

    /* The engine refuses the batch before any device work. */
    dp_device_spec spec = {DP_DEVICE_CPU, 0};
    dp_criterion crit = dp_criterion_cross_entropy();
    dp_engine_config cfg = dp_engine_config_default();
    dp_engine *e = NULL;
    dp_assert_ok(dp_engine_create(&spec, 1, m, &crit, &cfg, &e));
    int32_t tgt[3 * 6];
    for (size_t i = 0; i < 3 * BS; i++) tgt[i] = 1;
    dp_batch b = {3, tok, tgt};
    cr_assert_eq(dp_engine_step(e, &b, NULL), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "token id -3"), "%s", dp_last_error());
    tok[1 * BS + 4] = 2;
    dp_assert_ok(dp_engine_step(e, &b, NULL));
    dp_engine_destroy(e);

    /* Direct calls: T out of range, NULL buffers. */
    dp_device *dev = dp_test_cpu(0);
    float *params = dev_alloc(dev, m->n_params * sizeof(float));
    void *ws = dev_alloc(dev, dp_gpt_workspace_bytes(g, 1, BS));
    float *logits = dev_alloc(dev, BS * V * sizeof(float));
    int32_t *dtok = dev_alloc(dev, BS * sizeof(int32_t));
    dp_clear_error();
    cr_assert_eq(dp_gpt_forward(g, dev, params, dtok, 1, BS + 1, ws, logits),
                 DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "block_size"), "%s", dp_last_error());
    cr_assert_eq(dp_gpt_forward(g, dev, params, dtok, 1, 0, ws, logits), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_gpt_forward(g, dev, params, dtok, 0, BS, ws, logits), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_gpt_forward(g, dev, params, dtok, 1, BS, NULL, logits),
                 DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "workspace"), "%s", dp_last_error());
    cr_assert_eq(dp_gpt_forward(NULL, dev, params, dtok, 1, BS, ws, logits),
                 DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_gpt_backward(g, dev, params, NULL, dtok, 1, BS, ws, logits),
                 DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_gpt_backward(g, dev, params, params, dtok, SIZE_MAX / 2, BS, ws, logits),
                 DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "overflow"), "%s", dp_last_error());
    /* An id outside [0, V): refused with its position, not read past wte
     * (it segfaulted or read other memory); both ends, both passes. */
    const int32_t bad[] = {-1, (int32_t)V, INT32_MAX, INT32_MIN};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        for (size_t t = 0; t < BS; t++) dtok[t] = (int32_t)(t % V);
        dtok[BS - 1] = bad[i];
        cr_assert_eq(dp_gpt_forward(g, dev, params, dtok, 1, BS, ws, logits),
                     DP_ERR_INVALID_ARGUMENT, "id %d", bad[i]);
        char want[96];
        snprintf(want, sizeof want, "token id %d at position %zu", (int)bad[i], BS - 1);
        cr_assert(strstr(dp_last_error(), want), "%s", dp_last_error());
        cr_assert_eq(dp_gpt_backward(g, dev, params, params, dtok, 1, BS, ws, logits),
                     DP_ERR_INVALID_ARGUMENT, "id %d", bad[i]);
        cr_assert(strstr(dp_last_error(), "dp_gpt_backward") && strstr(dp_last_error(), want),
                  "%s", dp_last_error());
    }
    dp_device_free(dev, params);
    dp_device_free(dev, ws);
    dp_device_free(dev, logits);
    dp_device_free(dev, dtok);
    close_checked(dev);
    dp_gpt_destroy(g);
}
