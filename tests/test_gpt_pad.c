/*
 * The GPT's padded vocabulary (dp_gpt_config.vocab_pad) on CPU devices:
 * the same model as the unpadded GPT, laid out for aligned head GEMMs.
 *
 *   layout   Vp, wte's tensor unchanged and its slot Vp rows, n_classes
 *            and target_classes, init (the padded rows zero), the layout
 *            copy there and back
 *   pass     dp_gpt_forward / dp_gpt_backward: the real logits, the loss
 *            and every gradient those of the unpadded GPT; the padded
 *            logits -inf, their dlogits and the padded rows' gradient 0
 *   engine   AdamW steps on 1 and 2 devices, balanced and gather, float32
 *            and bf16: losses, parameters and moments of the real tensors
 *            those of the unpadded run; the padded rows of the parameters
 *            and of both moments exactly zero after the steps
 *   files    a padded checkpoint reads unpadded and the reverse with
 *            identical tensors, and a run resumed across layouts goes on
 *            as the uninterrupted one; Hugging Face export writes V rows
 *   errors   pads past int32, targets in the padding, token ids >= V
 *   fill     dp_fill_columns_bf16, the padded columns of bfloat16 logits
 *
 * Not bitwise, and why. The padded columns themselves add exact zeros:
 * the cross-entropy's max skips -inf and its sum adds exp(-inf) = +0 to
 * the same partial sums (kernels/crossentropy.h puts element v in partial
 * v % 8 in the blocked loop and the tail alike), d(lnf) = dlogits @ wte
 * sums 0 * 0 past V, d(wte)'s padded rows are 0 * lnf. But OpenBLAS picks
 * its sgemm kernels by the matrix's edges: with m = 37 output columns the
 * last ones go through narrower edge kernels than with m = 64, and the
 * kernels round a C-term dot product differently (measured: logits 3e-8
 * apart, an ulp of their size; the losses of the first steps equal). So
 * the runs agree to float32 rounding, held to these tolerances:
 *   - logits: C = 16 float32 products of |lnf| <~ 3 and |wte| <~ 0.1,
 *     summed in two orders: at most C u sum|x w| ~ 16 * 6e-8 * 5 = 5e-6;
 *     atol 5e-6 (measured 3e-8);
 *   - loss sum: one log-sum-exp per row summed in double from those
 *     logits: rtol 1e-6 (measured: equal);
 *   - gradients: as the PyTorch reference test (test_gpt.c), each element
 *     a float32 sum of many terms whose rounding scales with the tensor's
 *     largest |gradient|: atol 1e-5 of that scale (measured 4e-7);
 *   - after STEPS AdamW steps, as test_gpt.c's k devices against one:
 *     losses rtol 1e-5 (measured 2e-9), parameters atol 5e-7 + rtol 1e-5,
 *     moments atol 1e-5 of their tensor's scale (measured 6e-7); except
 *     the key part of each c_attn.bias, whose exact gradient is 0 (softmax
 *     ignores a shift shared by all keys): its float gradient is rounding
 *     noise that AdamW turns into steps of either sign, so those entries
 *     are held to AdamW's bound of about lr per step (measured 1.3e-6, lr
 *     3e-3) and their moments are not compared.
 * The bf16 runs (operands rounded to bfloat16 before their GEMMs) come out
 * closer still (measured 1e-7 of the scale). On GPUs the GEMM's kernels
 * change too, by design: that is the point of the padding.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "dp/gpt_hf.h"
#include "dp_test.h"
#include "dp_test_fs.h"
#include "gpt_fixture.h"
#include "nn/nn_act16.h"

#include <criterion/parameterized.h>

/* EV = 37 pads to 64: 27 padded rows, more than half the real ones. */
enum { PAD = 64, VP = 64, STEPS = 3 };

static char tmpdir[64];

static void make_tmpdir(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dp_test_gpt_pad.XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir));
}

static void cleanup(void) { dp_test_remove_tree(tmpdir); }

TestSuite(gpt_pad, .init = make_tmpdir, .fini = cleanup, .timeout = 60);

// --- helpers ----------------------------------------------------------------------------

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    cr_assert_not_null(p, "out of host memory");
    return p;
}

static dp_gpt *make(size_t pad)
{
    dp_gpt_config cfg = {.vocab_size = EV, .block_size = EBS, .n_layer = EL, .n_head = ENH,
                         .n_embd = EC, .vocab_pad = pad};
    dp_gpt *g = NULL;
    dp_assert_ok(dp_gpt_create(&cfg, &g));
    dp_assert_ok(dp_model_validate(dp_gpt_model(g, 0)));
    return g;
}

static size_t n_params(const dp_gpt *g) { return dp_gpt_model(g, 0)->n_params; }

/* Every tensor of a (ga's layout) equals b's (gb's), bit for bit. */
static void assert_same_tensors(const dp_gpt *ga, const float *a, const dp_gpt *gb,
                                const float *b, const char *what)
{
    const dp_model *ma = dp_gpt_model(ga, 0), *mb = dp_gpt_model(gb, 0);
    cr_assert_eq(ma->n_tensors, mb->n_tensors);
    for (size_t t = 0; t < ma->n_tensors; t++) {
        const dp_param_tensor *ta = &ma->tensors[t], *tb = &mb->tensors[t];
        cr_assert_str_eq(ta->name, tb->name);
        cr_assert_eq(ta->numel, tb->numel, "%s: numel", ta->name);
        const float *x = a + ta->offset, *y = b + tb->offset;
        for (size_t i = 0; i < ta->numel; i++)
            if (memcmp(&x[i], &y[i], sizeof(float)) != 0)
                cr_assert_fail("%s: %s[%zu] is %.9g and %.9g", what, ta->name, i, x[i], y[i]);
    }
}

/* Entry i of tensor t is in the key part of a c_attn.bias (see the top). */
static int is_key_bias(const dp_param_tensor *t, size_t i)
{
    size_t n = strlen(t->name);
    return n >= 16 && strcmp(t->name + n - 16, "attn.c_attn.bias") == 0 && i >= EC &&
           i < 2 * EC;
}

/* How close two runs' tensors must be (see the top): |a - b| <= atol +
 * rtol |b| + scale * (the tensor's largest |b|); key biases: <= key_atol
 * (negative: not compared). */
typedef struct tol {
    double atol, rtol, scale, key_atol;
} tol;

/* Tensors of a (ga's layout) close to b's (gb's) by tl; returns the
 * largest |a - b| outside the key biases over the tensor's largest |b|. */
static double assert_close_tensors(const dp_gpt *ga, const float *a, const dp_gpt *gb,
                                   const float *b, tol tl, const char *what)
{
    const dp_model *ma = dp_gpt_model(ga, 0), *mb = dp_gpt_model(gb, 0);
    double worst = 0.0;
    for (size_t t = 0; t < ma->n_tensors; t++) {
        const dp_param_tensor *ta = &ma->tensors[t];
        const float *x = a + ta->offset, *y = b + mb->tensors[t].offset;
        double mx = 0.0;
        for (size_t i = 0; i < ta->numel; i++) mx = fmax(mx, fabs(y[i]));
        for (size_t i = 0; i < ta->numel; i++) {
            double d = fabs((double)x[i] - y[i]);
            if (is_key_bias(ta, i)) {
                cr_assert(tl.key_atol < 0 || d <= tl.key_atol, "%s: key bias %s[%zu] is %.9g "
                          "and %.9g", what, ta->name, i, x[i], y[i]);
                continue;
            }
            cr_assert(d <= tl.atol + tl.rtol * fabs(y[i]) + tl.scale * mx, "%s: %s[%zu] is "
                      "%.9g and %.9g (the tensor's largest |value| %.3g)", what, ta->name, i,
                      x[i], y[i], mx);
            if (mx > 0) worst = fmax(worst, d / mx);
        }
    }
    return worst;
}

/* Every float of buf outside g's tensors (the padded rows of wte, the
 * alignment gaps) is zero: all bits clear when exact, else == 0. */
static void assert_gaps_zero(const dp_gpt *g, const float *buf, int exact, const char *what)
{
    const dp_model *m = dp_gpt_model(g, 0);
    size_t at = 0, after_wte = 0;
    for (size_t t = 0; t <= m->n_tensors; t++) {
        size_t end = t < m->n_tensors ? m->tensors[t].offset : m->n_params;
        for (; at < end; at++) {
            uint32_t bits;
            memcpy(&bits, &buf[at], sizeof bits);
            cr_assert(exact ? bits == 0 : buf[at] == 0.0f, "%s: float %zu, in the gap before "
                      "tensor %zu, is %.9g (bits %08x)", what, at, t, buf[at], (unsigned)bits);
            after_wte += t == 1;
        }
        if (t < m->n_tensors) at = m->tensors[t].offset + m->tensors[t].numel;
    }
    /* The gap after wte holds the padded rows: they were checked. */
    if (dp_gpt_padded_vocab(dp_gpt_config_of(g)) > EV)
        cr_assert_geq(after_wte, (size_t)(VP - EV) * EC);
}

// --- layout ---------------------------------------------------------------------------

Test(gpt_pad, layout_keeps_the_tensors_and_pads_the_slot)
{
    /* Vp: GPT-2's 50257 pads to llm.c's 50304 with 64 or 128. */
    dp_gpt_config c = {.vocab_size = 50257};
    cr_assert_eq(dp_gpt_padded_vocab(&c), 50257);
    c.vocab_pad = 1;
    cr_assert_eq(dp_gpt_padded_vocab(&c), 50257);
    c.vocab_pad = 64;
    cr_assert_eq(dp_gpt_padded_vocab(&c), 50304);
    c.vocab_pad = 128;
    cr_assert_eq(dp_gpt_padded_vocab(&c), 50304);
    c.vocab_size = 65;
    cr_assert_eq(dp_gpt_padded_vocab(&c), 128);
    c.vocab_size = 128;
    cr_assert_eq(dp_gpt_padded_vocab(&c), 128);
    c.vocab_pad = SIZE_MAX;
    cr_assert_eq(dp_gpt_padded_vocab(&c), 0, "the rounding overflows");
    cr_assert_eq(dp_gpt_padded_vocab(NULL), 0);

    dp_gpt *g0 = make(0), *g1 = make(PAD);
    const dp_model *m0 = dp_gpt_model(g0, 0), *m1 = dp_gpt_model(g1, 0);
    cr_assert_eq(m0->n_classes, EV);
    cr_assert_eq(m1->n_classes, VP, "the logits are Vp wide");
    cr_assert_eq(m1->target_classes, EV, "targets stop at V");
    /* wte's tensor is (V, C) in both; its slot holds Vp rows. */
    cr_assert_eq(m1->tensors[0].shape[0], EV);
    cr_assert_eq(m1->tensors[0].numel, (size_t)EV * EC);
    cr_assert_eq(m1->tensors[1].offset, (size_t)VP * EC, "wpe after Vp rows (1024 floats)");
    cr_assert_eq(m0->tensors[1].offset, 640, "unpadded: wpe after V*C = 592, aligned to 64");
    cr_assert_eq(n_params(g1) - n_params(g0), (size_t)VP * EC - 640);
    /* Every variant has the padded head. */
    const unsigned flags[] = {DP_GPT_BF16, DP_GPT_BF16_ACT, DP_GPT_CHUNKED_ATTENTION};
    for (size_t i = 0; i < 3; i++) {
        cr_assert_eq(dp_gpt_model(g1, flags[i])->n_classes, VP);
        cr_assert_eq(dp_gpt_model(g1, flags[i])->target_classes, EV);
    }
    /* A pad of 1 is no pad. */
    dp_gpt *g2 = make(1);
    cr_assert_eq(n_params(g2), n_params(g0));
    cr_assert_eq(dp_gpt_model(g2, 0)->n_classes, EV);

    /* init: the real tensors as the unpadded GPT's, the padded rows zero. */
    float *p0 = xmalloc(n_params(g0) * sizeof(float)), *p1 = xmalloc(n_params(g1) * sizeof(float));
    memset(p1, 0x7F, n_params(g1) * sizeof(float)); /* init must clear the gaps */
    dp_assert_ok(m0->init(m0->ctx, p0, 42));
    dp_assert_ok(m1->init(m1->ctx, p1, 42));
    assert_same_tensors(g1, p1, g0, p0, "init");
    assert_gaps_zero(g1, p1, 1, "init");

    /* dp_gpt_copy_layout: there and back, gaps zero. */
    float *q0 = xmalloc(n_params(g0) * sizeof(float)), *q1 = xmalloc(n_params(g1) * sizeof(float));
    memset(q1, 0x7F, n_params(g1) * sizeof(float));
    dp_assert_ok(dp_gpt_copy_layout(g1, q1, g0, p0));
    cr_assert_eq(memcmp(q1, p1, n_params(g1) * sizeof(float)), 0);
    dp_assert_ok(dp_gpt_copy_layout(g0, q0, g1, p1));
    cr_assert_eq(memcmp(q0, p0, n_params(g0) * sizeof(float)), 0);
    dp_gpt_config other = *dp_gpt_config_of(g0);
    other.n_embd = 2 * EC;
    dp_gpt *g3 = NULL;
    dp_assert_ok(dp_gpt_create(&other, &g3));
    cr_assert_eq(dp_gpt_copy_layout(g3, q1, g0, p0), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "n_embd"), "%s", dp_last_error());
    cr_assert_eq(dp_gpt_copy_layout(g1, NULL, g0, p0), DP_ERR_INVALID_ARGUMENT);
    free(p0);
    free(p1);
    free(q0);
    free(q1);
    dp_gpt_destroy(g0);
    dp_gpt_destroy(g1);
    dp_gpt_destroy(g2);
    dp_gpt_destroy(g3);
}

// --- one forward and backward ---------------------------------------------------------------

/* dp_gpt_forward, the cross-entropy and dp_gpt_backward of g on cpu:0 for
 * step s's batch (EROWS x EBS tokens) from the parameters p (g's layout):
 * the logits (before the criterion), the loss sum and the gradients; the
 * padded columns' dlogits are checked to be 0. */
static void one_pass(const dp_gpt *g, const float *p, int s, float *logits, double *loss,
                     float *grads)
{
    const dp_model *m = dp_gpt_model(g, 0);
    size_t N = (size_t)EROWS * EBS, V = m->n_classes, n = m->n_params;
    int32_t tok[EROWS * EBS], tgt[EROWS * EBS];
    dp_test_gpt_batch(s, EROWS, tok, tgt);
    size_t valid = 0;
    for (size_t i = 0; i < N; i++) valid += tgt[i] >= 0;
    dp_device *dev = dp_test_cpu(0);
    float *dparams = dp_test_upload(dev, p, n), *dg = NULL, *dl = NULL, *dlos = NULL;
    void *ws = NULL, *dtok = NULL, *dtgt = NULL;
    dp_assert_ok(dp_device_alloc(dev, n * sizeof(float), (void **)&dg));
    dp_assert_ok(dp_memset(dev, dg, 0, n * sizeof(float)));
    dp_assert_ok(dp_device_alloc(dev, N * V * sizeof(float), (void **)&dl));
    dp_assert_ok(dp_device_alloc(dev, N * sizeof(float), (void **)&dlos));
    dp_assert_ok(dp_device_alloc(dev, dp_gpt_workspace_bytes(g, EROWS, EBS), &ws));
    dp_assert_ok(dp_device_alloc(dev, sizeof tok, &dtok));
    dp_assert_ok(dp_device_alloc(dev, sizeof tgt, &dtgt));
    dp_assert_ok(dp_copy_h2d(dev, dtok, tok, sizeof tok));
    dp_assert_ok(dp_copy_h2d(dev, dtgt, tgt, sizeof tgt));
    dp_assert_ok(dp_gpt_forward(g, dev, dparams, dtok, EROWS, EBS, ws, dl));
    dp_assert_ok(dp_copy_d2h(dev, logits, dl, N * V * sizeof(float)));
    dp_assert_ok(dp_crossentropy_forward_backward(dev, loss, dl, dlos, dl, dtgt, N, V,
                                                  (float)(1.0 / (double)valid)));
    float *dlh = xmalloc(N * V * sizeof(float));
    dp_assert_ok(dp_copy_d2h(dev, dlh, dl, N * V * sizeof(float)));
    for (size_t r = 0; r < N; r++)
        for (size_t v = EV; v < V; v++)
            cr_assert(dlh[r * V + v] == 0.0f, "dlogits[%zu][%zu] = %g", r, v, dlh[r * V + v]);
    free(dlh);
    dp_assert_ok(dp_gpt_backward(g, dev, dparams, dg, dtok, EROWS, EBS, ws, dl));
    dp_assert_ok(dp_copy_d2h(dev, grads, dg, n * sizeof(float)));
    void *bufs[] = {dparams, dg, dl, dlos, ws, dtok, dtgt};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) dp_device_free(dev, bufs[i]);
    dp_device_close(dev);
}

Test(gpt_pad, pass_matches_the_unpadded_gpt)
{
    dp_gpt *g0 = make(0), *g1 = make(PAD);
    const dp_model *m0 = dp_gpt_model(g0, 0), *m1 = dp_gpt_model(g1, 0);
    size_t N = (size_t)EROWS * EBS;
    float *p0 = xmalloc(n_params(g0) * sizeof(float)), *p1 = xmalloc(n_params(g1) * sizeof(float));
    dp_assert_ok(m0->init(m0->ctx, p0, 7));
    dp_assert_ok(m1->init(m1->ctx, p1, 7));
    float *l0 = xmalloc(N * EV * sizeof(float)), *l1 = xmalloc(N * VP * sizeof(float));
    float *d0 = xmalloc(n_params(g0) * sizeof(float)), *d1 = xmalloc(n_params(g1) * sizeof(float));
    double s0 = 0, s1 = 0;
    one_pass(g0, p0, 0, l0, &s0, d0);
    one_pass(g1, p1, 0, l1, &s1, d1);
    double dl = 0.0;
    for (size_t r = 0; r < N; r++) {
        for (size_t v = 0; v < EV; v++) {
            double d = fabs((double)l1[r * VP + v] - l0[r * EV + v]);
            cr_assert(d <= 5e-6, "logit [%zu][%zu] is %.9g padded, %.9g unpadded", r, v,
                      l1[r * VP + v], l0[r * EV + v]);
            dl = fmax(dl, d);
        }
        for (size_t v = EV; v < VP; v++)
            cr_assert(isinf(l1[r * VP + v]) && l1[r * VP + v] < 0, "logit [%zu][%zu] = %g, "
                      "want -inf", r, v, l1[r * VP + v]);
    }
    cr_assert(fabs(s1 - s0) <= 1e-6 * fabs(s0), "loss sum %.17g padded, %.17g unpadded", s1, s0);
    double dg = assert_close_tensors(g1, d1, g0, d0, (tol){0, 0, 1e-5, 1e-5}, "gradients");
    /* The padded rows' gradient: zero (== 0: a GEMM may write -0). */
    assert_gaps_zero(g1, d1, 0, "gradients");
    cr_log_info("largest differences: logits %.2g, loss sum %.2g (relative), gradients %.2g of "
                "their tensor's scale", dl, fabs(s1 - s0) / s0, dg);
    free(p0);
    free(p1);
    free(l0);
    free(l1);
    free(d0);
    free(d1);
    dp_gpt_destroy(g0);
    dp_gpt_destroy(g1);
}

// --- through the engine -------------------------------------------------------------------

/* A run's outcome: losses, and the parameters and moments after. */
typedef struct run_out {
    double loss[STEPS];
    float *p, *m, *v;
    long t;
} run_out;

static dp_engine_config engine_cfg(dp_mode mode, int bf16)
{
    dp_engine_config c = dp_engine_config_default();
    c.mode = mode;
    c.optim.lr = 3e-3f;
    c.optim.weight_decay = 0.1f;
    c.optim.grad_clip = 1.0f;
    c.seed = 11;
    c.matmul_precision = bf16 ? DP_MATMUL_BF16 : DP_MATMUL_FP32;
    return c;
}

static dp_engine *open_engine(const dp_gpt *g, size_t k, dp_mode mode, int bf16)
{
    dp_device_spec specs[DP_MAX_DEVICES];
    for (size_t i = 0; i < k; i++) specs[i] = (dp_device_spec){DP_DEVICE_CPU, (int)i};
    dp_criterion crit = dp_criterion_cross_entropy();
    dp_engine_config cfg = engine_cfg(mode, bf16);
    dp_engine *e = NULL;
    dp_assert_ok(dp_engine_create(specs, k, dp_gpt_model(g, bf16 ? DP_GPT_BF16_ACT : 0), &crit,
                                  &cfg, &e));
    return e;
}

/* Steps s0..s1-1 of e (step s's batch), their losses into out->loss[s]. */
static void steps(dp_engine *e, int s0, int s1, run_out *out)
{
    int32_t tok[EROWS * EBS], tgt[EROWS * EBS];
    for (int s = s0; s < s1; s++) {
        dp_test_gpt_batch(s, EROWS, tok, tgt);
        dp_batch b = {EROWS, tok, tgt};
        dp_step_stats st;
        dp_assert_ok(dp_engine_step(e, &b, &st));
        cr_assert(!st.skipped);
        out->loss[s] = st.loss;
    }
}

static void read_state(dp_engine *e, const dp_gpt *g, run_out *out)
{
    size_t n = n_params(g);
    out->p = xmalloc(n * sizeof(float));
    out->m = xmalloc(n * sizeof(float));
    out->v = xmalloc(n * sizeof(float));
    dp_assert_ok(dp_engine_get_params(e, out->p));
    dp_assert_ok(dp_engine_get_optimizer_state(e, out->m, out->v, &out->t));
}

static void free_run(run_out *r)
{
    free(r->p);
    free(r->m);
    free(r->v);
}

static run_out train(const dp_gpt *g, size_t k, dp_mode mode, int bf16)
{
    run_out out;
    memset(&out, 0, sizeof out);
    dp_engine *e = open_engine(g, k, mode, bf16);
    steps(e, 0, STEPS, &out);
    read_state(e, g, &out);
    dp_engine_destroy(e);
    return out;
}

/* b (padded, g1) is a's run (unpadded, g0) to the tolerances at the top:
 * losses, parameters, moments; the padded rows exactly zero. */
static void assert_close_run(const dp_gpt *g1, const run_out *b, const dp_gpt *g0,
                             const run_out *a, const char *what)
{
    double dloss = 0.0;
    for (int s = 0; s < STEPS; s++) {
        double d = fabs(a->loss[s] - b->loss[s]);
        cr_assert(d <= 1e-7 + 1e-5 * fabs(a->loss[s]), "%s: step %d loss %.17g padded, %.17g "
                  "unpadded", what, s, b->loss[s], a->loss[s]);
        dloss = fmax(dloss, d / a->loss[s]);
    }
    cr_assert_eq(a->t, b->t);
    double lr = engine_cfg(DP_MODE_BALANCED, 0).optim.lr;
    double dpar = assert_close_tensors(g1, b->p, g0, a->p,
                                       (tol){5e-7, 1e-5, 0, 2.0 * STEPS * lr}, what);
    double dm = assert_close_tensors(g1, b->m, g0, a->m, (tol){0, 0, 1e-5, -1}, what);
    double dv = assert_close_tensors(g1, b->v, g0, a->v, (tol){0, 0, 1e-5, -1}, what);
    cr_log_info("%s: largest differences: loss %.2g (relative); parameters %.2g, m %.2g, v "
                "%.2g of their tensor's scale (key biases aside)", what, dloss, dpar, dm, dv);
    /* After the steps: the padded rows still exactly zero, in the
     * parameters and in both moments (the optimizer never touches them). */
    assert_gaps_zero(g1, b->p, 1, what);
    assert_gaps_zero(g1, b->m, 1, what);
    assert_gaps_zero(g1, b->v, 1, what);
}

typedef struct engine_case {
    size_t k;
    dp_mode mode;
    int bf16;
} engine_case;

ParameterizedTestParameters(gpt_pad, engine_runs_match_the_unpadded_runs)
{
    static engine_case cases[] = {
        {1, DP_MODE_BALANCED, 0}, {1, DP_MODE_GATHER, 0},   {2, DP_MODE_BALANCED, 0},
        {2, DP_MODE_GATHER, 0},   {1, DP_MODE_BALANCED, 1}, {2, DP_MODE_BALANCED, 1},
        {2, DP_MODE_GATHER, 1},
    };
    return cr_make_param_array(engine_case, cases, sizeof cases / sizeof *cases);
}

/* STEPS AdamW steps with clipping; bf16: DP_GPT_BF16_ACT with
 * DP_MATMUL_BF16 (oneDNN's GEMMs, or their emulation on OpenBLAS). */
ParameterizedTest(engine_case *c, gpt_pad, engine_runs_match_the_unpadded_runs, .timeout = 60)
{
    dp_gpt *g0 = make(0), *g1 = make(PAD);
    run_out a = train(g0, c->k, c->mode, c->bf16), b = train(g1, c->k, c->mode, c->bf16);
    char what[64];
    snprintf(what, sizeof what, "%zu device%s, %s, %s", c->k, c->k > 1 ? "s" : "",
             dp_mode_name(c->mode), c->bf16 ? "bf16" : "fp32");
    assert_close_run(g1, &b, g0, &a, what);
    /* Teeth: the steps moved the parameters. */
    float *p0 = xmalloc(n_params(g0) * sizeof(float));
    const dp_model *m0 = dp_gpt_model(g0, 0);
    dp_assert_ok(m0->init(m0->ctx, p0, engine_cfg(c->mode, 0).seed));
    cr_assert_neq(memcmp(p0, a.p, n_params(g0) * sizeof(float)), 0, "nothing trained");
    free(p0);
    free_run(&a);
    free_run(&b);
    dp_gpt_destroy(g0);
    dp_gpt_destroy(g1);
}

// --- checkpoints and Hugging Face ------------------------------------------------------------

static const char *in_tmp(const char *name) { return dp_test_join(tmpdir, name); }

static void save(const char *path, const dp_gpt *g, const run_out *r, long step)
{
    dp_checkpoint ck;
    memset(&ck, 0, sizeof ck);
    ck.params = r->p;
    ck.m = r->m;
    ck.v = r->v;
    ck.step = step;
    ck.optimizer_step = r->t;
    dp_assert_ok(dp_gpt_checkpoint_save(path, g, &ck));
}

/* The checkpoint at path read in g's layout (dp_checkpoint_read_tensors
 * places each tensor at g's offset; the gaps stay zero). */
static dp_checkpoint *read_as(const char *path, const dp_gpt *g)
{
    dp_checkpoint *ck = NULL;
    dp_assert_ok(dp_checkpoint_open(path, &ck));
    dp_assert_ok(dp_checkpoint_read_tensors(ck, dp_gpt_model(g, 0)));
    return ck;
}

/* Two steps in `from`'s layout, saved, read in `to`'s layout (the same
 * tensors, bit for bit, and zero gaps) into an engine of `to` for the
 * third step: the uninterrupted unpadded run `whole` (of g0), to the
 * tolerances of a padded run against it. gp is the padded one of the two. */
static void resume_across(const dp_gpt *from, const dp_gpt *to, const dp_gpt *g0,
                          const dp_gpt *gp, const run_out *whole, const char *name)
{
    run_out half;
    memset(&half, 0, sizeof half);
    dp_engine *e = open_engine(from, 1, DP_MODE_BALANCED, 0);
    steps(e, 0, 2, &half);
    read_state(e, from, &half);
    dp_engine_destroy(e);
    const char *path = in_tmp(name);
    save(path, from, &half, 2);

    dp_checkpoint *ck = read_as(path, to);
    cr_assert_eq(ck->step, 2);
    assert_same_tensors(to, ck->params, from, half.p, name);
    assert_same_tensors(to, ck->m, from, half.m, name);
    assert_same_tensors(to, ck->v, from, half.v, name);
    assert_gaps_zero(to, ck->params, 1, name);
    assert_gaps_zero(to, ck->m, 1, name);
    assert_gaps_zero(to, ck->v, 1, name);

    run_out rest;
    memset(&rest, 0, sizeof rest);
    e = open_engine(to, 1, DP_MODE_BALANCED, 0);
    dp_assert_ok(dp_engine_set_params(e, ck->params));
    dp_assert_ok(dp_engine_set_optimizer_state(e, ck->m, ck->v, ck->optimizer_step));
    steps(e, 2, STEPS, &rest);
    read_state(e, to, &rest);
    dp_engine_destroy(e);
    memcpy(rest.loss, half.loss, 2 * sizeof(double));
    if (to != gp) { /* the padded layout of the resumed run, for the zero checks */
        run_out r = rest;
        float **bufs[] = {&r.p, &r.m, &r.v}, *src[] = {rest.p, rest.m, rest.v};
        for (int i = 0; i < 3; i++) {
            *bufs[i] = xmalloc(n_params(gp) * sizeof(float));
            dp_assert_ok(dp_gpt_copy_layout(gp, *bufs[i], to, src[i]));
        }
        free_run(&rest);
        rest = r;
    }
    assert_close_run(gp, &rest, g0, whole, name);
    dp_checkpoint_close(ck);
    free_run(&half);
    free_run(&rest);
}

Test(gpt_pad, checkpoints_load_across_layouts)
{
    dp_gpt *g0 = make(0), *g1 = make(PAD);
    run_out whole = train(g0, 1, DP_MODE_BALANCED, 0);
    /* Padded file -> unpadded run, and unpadded file -> padded run. */
    resume_across(g1, g0, g0, g1, &whole, "padded.st");
    resume_across(g0, g1, g0, g1, &whole, "unpadded.st");

    /* dp_gpt_checkpoint_load of a padded run's file: an unpadded GPT (the
     * file keeps no pad: checkpoints hold the model, not its layout) with
     * the run's tensors, wte (V, C) among them. */
    run_out b = train(g1, 1, DP_MODE_BALANCED, 0);
    save(in_tmp("b1.st"), g1, &b, STEPS);
    dp_checkpoint *ck = NULL;
    dp_gpt *gl = NULL;
    dp_assert_ok(dp_gpt_checkpoint_load(in_tmp("b1.st"), &ck, &gl));
    cr_assert_eq(dp_gpt_config_of(gl)->vocab_pad, 0);
    cr_assert_eq(n_params(gl), n_params(g0));
    assert_same_tensors(gl, ck->params, g1, b.p, "padded file read unpadded");
    assert_same_tensors(gl, ck->m, g1, b.m, "padded file read unpadded");
    assert_same_tensors(gl, ck->v, g1, b.v, "padded file read unpadded");
    assert_gaps_zero(gl, ck->params, 1, "padded file read unpadded");
    dp_st_file *f = NULL;
    dp_assert_ok(dp_st_open(in_tmp("b1.st"), &f));
    const dp_st_tensor *wte = dp_st_find(f, "transformer.wte.weight");
    cr_assert(wte && wte->shape[0] == EV && wte->shape[1] == EC);
    cr_assert_eq(dp_st_count(f), 3 * dp_gpt_model(g1, 0)->n_tensors);
    dp_st_close(f);
    dp_checkpoint_close(ck);
    dp_gpt_destroy(gl);
    free_run(&b);
    free_run(&whole);
    dp_gpt_destroy(g0);
    dp_gpt_destroy(g1);
}

Test(gpt_pad, hf_export_writes_the_true_vocabulary)
{
    dp_gpt *g1 = make(PAD);
    run_out b = train(g1, 1, DP_MODE_BALANCED, 0);
    const char *dir = in_tmp("hf");
    cr_assert_eq(mkdir(dir, 0755), 0);
    dp_assert_ok(dp_gpt_export_hf(dir, g1, b.p));
    dp_st_file *f = NULL;
    dp_assert_ok(dp_st_open(dp_test_join(dir, "model.safetensors"), &f));
    const dp_st_tensor *t = dp_st_find(f, "transformer.wte.weight");
    cr_assert_not_null(t);
    cr_assert(t->ndim == 2 && t->shape[0] == EV && t->shape[1] == EC, "wte [%zu, %zu]",
              t->shape[0], t->shape[1]);
    cr_assert_eq(memcmp(t->data, b.p, (size_t)EV * EC * sizeof(float)), 0);
    dp_st_close(f);
    size_t cl = 0;
    char *config = (char *)dp_test_read_file(dp_test_join(dir, "config.json"), &cl);
    cr_assert(strstr(config, "\"vocab_size\": 37"), "%s", config);
    free(config);
    /* Read back: an unpadded GPT with the same tensors. */
    dp_gpt *gi = NULL;
    float *pi = NULL;
    dp_assert_ok(dp_gpt_init_from(dir, 0, &gi, &pi));
    cr_assert_eq(dp_gpt_model(gi, 0)->n_classes, EV);
    assert_same_tensors(g1, b.p, gi, pi, "exported");
    free(pi);
    dp_gpt_destroy(gi);
    free_run(&b);
    dp_gpt_destroy(g1);
}

// --- errors ---------------------------------------------------------------------------------

static void expect_bad(dp_gpt_config cfg, const char *want)
{
    dp_gpt *g = NULL;
    cr_assert_eq(dp_gpt_create(&cfg, &g), DP_ERR_INVALID_ARGUMENT, "%s accepted", want);
    cr_assert_null(g);
    cr_assert(strstr(dp_last_error(), want), "message \"%s\" lacks \"%s\"", dp_last_error(), want);
}

Test(gpt_pad, bad_pads_targets_and_tokens_are_refused)
{
    dp_gpt_config c = {.vocab_size = EV, .block_size = EBS, .n_layer = EL, .n_head = ENH,
                       .n_embd = EC, .vocab_pad = SIZE_MAX};
    expect_bad(c, "vocab_pad");
    c.vocab_size = (size_t)INT32_MAX - 5;
    c.vocab_pad = 64;
    expect_bad(c, "use a pad such as 64");
    c.vocab_size = EV;
    c.vocab_pad = (size_t)1 << 40;
    expect_bad(c, "vocab_pad 1099511627776");

    /* A target in the padding: refused before the step, naming it. */
    dp_gpt *g1 = make(PAD);
    dp_engine *e = open_engine(g1, 2, DP_MODE_BALANCED, 0);
    int32_t tok[EROWS * EBS], tgt[EROWS * EBS];
    dp_test_gpt_batch(0, EROWS, tok, tgt);
    tgt[5] = EV + 3;
    dp_batch b = {EROWS, tok, tgt};
    dp_step_stats st;
    cr_assert_eq(dp_engine_step(e, &b, &st), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "target 40 at position 5 is in the model's padding"), "%s",
              dp_last_error());
    tgt[5] = VP;
    cr_assert_eq(dp_engine_step(e, &b, &st), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "outside [-1, 37)"), "%s", dp_last_error());
    /* A token id in the padding: validate_inputs. */
    dp_test_gpt_batch(0, EROWS, tok, tgt);
    tok[3] = EV;
    cr_assert_eq(dp_engine_step(e, &b, &st), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "outside the vocabulary [0, 37)"), "%s", dp_last_error());
    /* The engine is usable afterwards. */
    dp_test_gpt_batch(0, EROWS, tok, tgt);
    dp_assert_ok(dp_engine_step(e, &b, &st));
    dp_engine_destroy(e);
    dp_gpt_destroy(g1);

    /* The model's own check: target_classes within n_classes. */
    dp_gpt *g0 = make(0);
    dp_model m = *dp_gpt_model(g0, 0);
    m.target_classes = m.n_classes + 1;
    cr_assert_eq(dp_model_validate(&m), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "target_classes"), "%s", dp_last_error());
    dp_gpt_destroy(g0);

    /* dp_fill_columns: a block past the row is refused; rows 0 do nothing. */
    dp_device *dev = dp_test_cpu(0);
    float x[12] = {0};
    cr_assert_eq(dp_fill_columns(dev, x, -INFINITY, 3, 4, 2, 3), DP_ERR_INVALID_ARGUMENT);
    dp_assert_ok(dp_fill_columns(dev, x, 0.0f, 0, 4, 2, 3));
    dp_assert_ok(dp_fill_columns(dev, x, 5.0f, 3, 4, 1, 2));
    for (int i = 0; i < 12; i++)
        cr_assert_eq(x[i], (i % 4 == 1 || i % 4 == 2) ? 5.0f : 0.0f, "x[%d] = %g", i, x[i]);
    dp_device_close(dev);
}

/* The padded columns of bfloat16 logits (dp_fill_columns_bf16): the value
 * rounded once (-inf is 0xFF80), every other element's bits untouched; a
 * block past the row refused naming the call; rows or cols 0 do nothing. */
Test(gpt_pad, fill_columns_bf16)
{
    enum { R = 3, LD = 5 };
    dp_device *dev = dp_test_cpu(0);
    uint16_t x[R * LD], got[R * LD];
    for (int i = 0; i < R * LD; i++) x[i] = dp_bf16_round(0.7f * (float)(i - 6));
    void *dx = NULL;
    dp_assert_ok(dp_device_alloc(dev, sizeof x, &dx));
    static const float values[] = {-INFINITY, 0.1f, 1.00390625f}; /* 1 + 2^-8: a tie to even */
    static const uint16_t bits[] = {0xFF80, 0x3DCD, 0x3F80};
    for (int k = 0; k < 3; k++) {
        dp_assert_ok(dp_copy_h2d(dev, dx, x, sizeof x));
        dp_assert_ok(dp_fill_columns_bf16(dev, dx, values[k], R, LD, 2, 2));
        dp_assert_ok(dp_copy_d2h(dev, got, dx, sizeof got));
        for (int i = 0; i < R * LD; i++) {
            int in = i % LD == 2 || i % LD == 3;
            cr_assert_eq(got[i], in ? bits[k] : x[i], "value %g: x[%d] = 0x%04x", values[k], i,
                         got[i]);
        }
    }
    cr_assert_eq(dp_fill_columns_bf16(dev, dx, -INFINITY, R, LD, 3, 3), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "dp_fill_columns_bf16") &&
                  strstr(dp_last_error(), "pass the row length"),
              "%s", dp_last_error());
    cr_assert_eq(dp_fill_columns_bf16(dev, NULL, 0.0f, R, LD, 0, 1), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "x must not be NULL"), "%s", dp_last_error());
    cr_assert_eq(dp_fill_columns_bf16(NULL, dx, 0.0f, R, LD, 0, 1), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_fill_columns_bf16(dev, dx, 0.0f, SIZE_MAX / 2, LD, 0, 1),
                 DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "overflow"), "%s", dp_last_error());
    dp_assert_ok(dp_copy_h2d(dev, dx, x, sizeof x));
    dp_assert_ok(dp_fill_columns_bf16(dev, dx, 5.0f, 0, LD, 0, 1));
    dp_assert_ok(dp_fill_columns_bf16(dev, dx, 5.0f, R, LD, 1, 0));
    dp_assert_ok(dp_copy_d2h(dev, got, dx, sizeof got));
    cr_assert(memcmp(got, x, sizeof x) == 0, "an empty block wrote");
    dp_device_free(dev, dx);
    dp_device_close(dev);
}
