/*
 * bench/dp_bench/report.c - what dp_bench prints and records: the
 * banner, the per-device memory table, the step and phase times, the
 * logits arithmetic, --find-max-batch's and --scaling's lines, and the
 * results as JSON and CSV.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp_bench.h"

static const char *human(size_t bytes, char *buf, size_t cap)
{
    double b = (double)bytes;
    if (b >= 1e9) snprintf(buf, cap, "%.2f GB", b / 1e9);
    else if (b >= 1e6) snprintf(buf, cap, "%.1f MB", b / 1e6);
    else snprintf(buf, cap, "%.1f kB", b / 1e3);
    return buf;
}

/* "balanced", "gather+shard": a run's name in the table, CSV and plot. */
const char *run_name(dp_mode mode, int shard, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s%s", dp_mode_name(mode), shard ? "+shard" : "");
    return buf;
}

/* "cpu:0", "cuda:1": the name of a device of the list before it is opened. */
const char *spec_name(const dp_device_spec *sp, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s:%d", sp->kind == DP_DEVICE_CUDA ? "cuda" : "cpu", sp->index);
    return buf;
}

/* The last run of `mode` without a sharded optimizer (the root run), or NULL. */
static const mode_result *root_run(const run_results *rs, dp_mode mode)
{
    const mode_result *m = NULL;
    for (size_t r = 0; r < rs->nres; r++)
        if (rs->res[r].mode == mode && !rs->res[r].shard) m = &rs->res[r];
    return m;
}

/* What is about to run: the model, the batch, the devices and the options
 * that change the step. */
void print_banner(const bench *b, const run_plan *p)
{
    const opts *o = &b->o;
    size_t Vp = dp_gpt_padded_vocab(dp_gpt_config_of(b->gpt));
    char padded[48] = "";
    if (Vp != (size_t)o->vocab) snprintf(padded, sizeof padded, " (padded to %zu)", Vp);
    printf("dp_bench: GPT vocab %ld%s, context %ld, dim %ld, %ld layers, %ld heads: %.2fM "
           "parameters\n",
           o->vocab, padded, o->context, o->dim, o->layers, o->heads,
           (double)dp_gpt_model(b->gpt, 0)->n_params / 1e6);
    if (b->rk.ranks > 1)
        printf("          global batch %ld sequences (%ld tokens) on %d ranks x %s (%zu devices), "
               "%ld warm-up + %ld timed steps",
               o->batch, o->batch * o->context, b->rk.ranks, o->devices, b->k * (size_t)b->rk.ranks,
               o->warmup, o->steps);
    else
        printf("          global batch %ld sequences (%ld tokens) on %s (%zu devices), %ld "
               "warm-up + %ld timed steps",
               o->batch, o->batch * o->context, o->devices, b->k, o->warmup, o->steps);
    if (o->memory_limit) printf(", memory limit %s per device", o->memory_limit);
    if (o->weights_arg) printf(", device weights %s", o->weights_arg);
    if (o->token_balanced) printf(", token-balanced");
    cli_print_compute(&o->compute);
    size_t chunk = o->compute.logits_chunk;
    if (chunk == DP_LOGITS_WHOLE) printf(", whole logits");
    else if (chunk) printf(", logits in chunks of %zu rows", chunk);
    printf("\n");
    if (p->skip_gather)
        printf("gather mode: skipped across ranks (it reproduces one process's DataParallel)\n");
    fflush(stdout);
}

void print_table(const bench *b, const run_results *rs)
{
    const mode_result *res = rs->res;
    size_t nres = rs->nres;
    char h[6][24], name[32];
    printf("\n%-14s %-8s %11s %11s %11s %11s %11s %11s\n", "mode", "device", "peak", "w/o optim",
           "params+grad", "optimizer", "logits", "reserved");
    for (size_t r = 0; r < nres; r++) {
        const mode_result *m = &res[r];
        run_name(m->mode, m->shard, name, sizeof name);
        for (size_t i = 0; i < m->k; i++) {
            const dev_result *d = &m->dev[i];
            printf("%-14s %-8s %11s %11s %11s %11s %11s %11s\n", i ? "" : name,
                   d->name, human(d->peak, h[0], 24), human(d->peak - d->optimizer, h[1], 24),
                   human(d->params, h[2], 24), human(d->optimizer, h[3], 24),
                   human(d->logits, h[4], 24), human(d->reserved, h[5], 24));
        }
    }
    printf("(peak: high-water mark of bytes allocated since the engine was created; logits:\n"
           " bytes held for logits and their gradient; reserved: the backend's own buffers\n"
           " (cuBLAS workspace, staging, bf16 GEMM conversion scratch), outside peak but\n"
           " counted by --memory-limit. Per-phase peaks: --json, --csv)\n");
    if (b->rk.ranks > 1)
        printf("(devices: rank 0's %zu of the job's %zu over %d ranks; the other ranks' are not\n"
               " shown)\n",
               res[0].k, res[0].k_global, b->rk.ranks);
    printf("\n");
    printf("%-14s %10s %10s %10s %12s %10s %12s\n", "mode", "step ms", "min", "max", "tokens/s",
           "imbalance", "w/o optim");
    for (size_t r = 0; r < nres; r++) {
        const mode_result *m = &res[r];
        printf("%-14s %10.1f %10.1f %10.1f %12.0f %10.3f %12.3f\n",
               run_name(m->mode, m->shard, name, sizeof name),
               m->step_ms_median, m->step_ms_min, m->step_ms_max, m->tokens_per_s, m->imbalance,
               m->imbalance_no_opt);
    }
    printf("(step ms: median of %ld timed steps; imbalance: max/min of peak bytes over devices,\n"
           " w/o optim: the same with the optimizer state taken out; +shard: the optimizer\n"
           " state sharded over the devices)\n\n",
           b->o.steps);
    printf("%-14s", "phase ms");
    for (int p = 0; p < DP_PHASE_COUNT; p++) printf(" %9.9s", dp_phase_name((dp_phase)p));
    printf(" %9s %9s\n", "outside", "exposed");
    for (size_t r = 0; r < nres; r++) {
        const mode_result *m = &res[r];
        double tot = 0, out = 0;
        printf("%-14s", run_name(m->mode, m->shard, name, sizeof name));
        for (int p = 0; p < DP_PHASE_COUNT; p++) {
            printf(" %9.2f", m->phase_ms[p]);
            tot += m->phase_ms[p];
            if (p != DP_PHASE_FORWARD && p != DP_PHASE_CRITERION && p != DP_PHASE_BACKWARD)
                out += m->phase_ms[p];
        }
        printf(" %8.1f%% %9.2f\n", tot > 0 ? 100.0 * out / tot : 0.0, m->exposed_ms);
    }
    printf("(median of the timed steps, each phase as long as its slowest device; outside: the\n"
           " share of scatter, reduce, optimizer and broadcast; exposed: ms from the last\n"
           " backward's end to the update, the reduce-scatter the overlap did not hide)\n");
    printf("overlap with the backward:");
    for (size_t r = 0; r < nres; r++)
        printf("%s %s %s", r ? "," : "", run_name(res[r].mode, res[r].shard, name, sizeof name),
               res[r].overlapped ? "on" : "off");
    printf("\n");
    /* the graphs' line where they were asked for or taken (as lm_train's) */
    const char *graphs = getenv("DP_CUDA_GRAPHS");
    size_t replayed = 0;
    for (size_t r = 0; r < nres; r++) replayed += res[r].replayed;
    if (!replayed && !(graphs && strcmp(graphs, "1") == 0)) return;
    printf("compute phase replayed from a CUDA graph (DP_CUDA_GRAPHS=1):");
    for (size_t r = 0; r < nres; r++)
        printf("%s %s %zu of %zu steps", r ? "," : "",
               run_name(res[r].mode, res[r].shard, name, sizeof name), res[r].replayed,
               (size_t)b->o.steps);
    printf("\n");
}

double model_flops_per_token(const bench *b)
{
    const dp_model *m = dp_gpt_model(b->gpt, 0);
    double n = 0;
    for (size_t i = 0; i < m->n_tensors; i++) n += (double)m->tensors[i].numel;
    const opts *o = &b->o;
    return 6.0 * n + 6.0 * (double)o->layers * (double)o->dim * (double)o->context;
}

double model_tflops(const bench *b, const mode_result *m)
{
    return m->tokens_per_s * model_flops_per_token(b) / 1e12;
}

double mfu(const bench *b, const mode_result *m)
{
    return b->o.peak_tflops > 0 ? model_tflops(b, m) / b->o.peak_tflops : 0.0;
}

void print_arithmetic(const bench *b, const run_results *rs)
{
    const mode_result *res = rs->res;
    size_t nres = rs->nres;
    const mode_result *g = root_run(rs, DP_MODE_GATHER), *bal = root_run(rs, DP_MODE_BALANCED);
    char h[4][24], name[32];
    /* Under --find-max-batch the runs may have been timed at different batches. */
    int differ = 0;
    for (size_t r = 1; r < nres; r++) differ |= res[r].rows != res[0].rows;
    /* The logits are as wide as the padded vocabulary (--vocab-pad). */
    size_t Vp = dp_gpt_padded_vocab(dp_gpt_config_of(b->gpt));
    for (size_t r = 0; r < (differ ? nres : 1); r++) {
        double lb = (double)res[r].rows * (double)b->o.context * (double)Vp * 4.0;
        printf("%slogits of the global batch%s%s: %zu x %ld x %zu x 4 bytes = %s (%s with their "
               "gradient)\n",
               r ? "" : "\n", differ ? " in " : "",
               differ ? run_name(res[r].mode, res[r].shard, name, sizeof name) : "",
               res[r].rows, b->o.context, Vp, human((size_t)lb, h[0], 24),
               human((size_t)(2 * lb), h[1], 24));
    }
    if (g)
        printf("gather:   root holds %s of logits buffers (the gathered batch and its gradient\n"
               "          plus its own rows'), root peak %s\n",
               human(g->dev[0].logits, h[2], 24), human(g->dev[0].peak, h[3], 24));
    if (bal)
        printf("balanced: each device holds one --logits-chunk of its logits at a time\n"
               "          (gradient in place): root %s, root peak %s\n",
               human(bal->dev[0].logits, h[2], 24), human(bal->dev[0].peak, h[3], 24));
    /* A ratio of peaks only means something for the same batch. */
    if (g && bal && g->rows == bal->rows)
        printf("root peak gather / balanced = %.2f\n",
               (double)g->dev[0].peak / (double)bal->dev[0].peak);
    printf("model FLOPs per token: 6N + 6LCT = %.4g GFLOP (llm.c's count, N = %.4gM "
           "parameters)\n",
           model_flops_per_token(b) / 1e9,
           (model_flops_per_token(b) - 6.0 * (double)b->o.layers * (double)b->o.dim *
                                           (double)b->o.context) / 6e6);
    for (size_t r = 0; r < nres; r++) {
        printf("%-14s %.4g model TFLOP/s", run_name(res[r].mode, res[r].shard, name, sizeof name),
               model_tflops(b, &res[r]));
        if (b->o.peak_tflops > 0)
            printf(", MFU %.1f%% of %g TFLOP/s", 100.0 * mfu(b, &res[r]), b->o.peak_tflops);
        printf("\n");
    }
}

/* --find-max-batch: each run's largest batch, and the ratio of the modes' root runs. */
void print_max_batches(const bench *b, const run_plan *p, const run_results *rs)
{
    char name[32];
    printf("\nlargest global batch under --memory-limit %s per device:", b->o.memory_limit);
    for (size_t r = 0; r < p->n; r++)
        printf("  %s %ld", run_name(p->mode[r], p->shard[r], name, sizeof name), rs->max_batch[r]);
    /* The root runs of the two modes: runs 0 and n / 2. */
    if (p->nmodes == 2 && rs->max_batch[0] > 0)
        printf("  (balanced / gather = %.2f)",
               (double)rs->max_batch[p->n / 2] / (double)rs->max_batch[0]);
    printf("\n");
    /* What stopped each search: the limit, or the host's RAM or a GPU's
     * memory before it (then the answer is the machine's, not the limit's). */
    for (size_t r = 0; r < p->n; r++)
        if (rs->max_batch[r] > 0 && rs->max_why[r][0])
            printf("(%s: %ld sequences do not fit: %s)\n",
                   run_name(p->mode[r], p->shard[r], name, sizeof name), rs->max_batch[r] + 1,
                   rs->max_why[r]);
}

/* --scaling's title and column heads. */
void print_scaling_header(const bench *b, const run_results *rs)
{
    printf("\nscaling (%s mode, global batch %zu):\n", dp_mode_name(rs->scale_mode),
           rs->scale_rows);
    if (b->rk.ranks > 1)
        printf("%8s %8s %12s %9s %11s\n", "ranks x", "devices", "tokens/s", "speedup",
               "efficiency");
    else
        printf("%8s %12s %9s %11s\n", "devices", "tokens/s", "speedup", "efficiency");
}

/* --scaling's row of point i: tokens/s, and speedup and efficiency
 * against the first point. */
void print_scaling_row(const bench *b, const run_results *rs, size_t i)
{
    const scale_point *s = &rs->sc[i], *s0 = &rs->sc[0];
    double sp = s->tokens_per_s / s0->tokens_per_s;
    double eff = sp * (double)s0->global / (double)s->global;
    if (b->rk.ranks > 1) {
        char rk[32];
        snprintf(rk, sizeof rk, "%d x %zu", b->rk.ranks, s->k);
        printf("%8s %8zu %12.0f %9.2f %10.1f%%\n", rk, s->global, s->tokens_per_s, sp,
               100.0 * eff);
    } else {
        printf("%8zu %12.0f %9.2f %10.1f%%\n", s->k, s->tokens_per_s, sp, 100.0 * eff);
    }
    fflush(stdout);
}

/* "config": the command line's figures and the model's size. */
static json_t *json_config(const bench *b)
{
    const opts *o = &b->o;
    json_t *devs = json_array();
    for (size_t i = 0; i < b->k; i++) {
        char name[32];
        json_array_append_new(devs, json_string(spec_name(&b->specs[i], name, sizeof name)));
    }
    json_t *cfg = json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:o,s:I,s:I,s:I,s:b,s:I,s:s}", "vocab",
                            (json_int_t)o->vocab, "context", (json_int_t)o->context,
                            "batch_size", (json_int_t)o->batch, "dim", (json_int_t)o->dim,
                            "layers", (json_int_t)o->layers, "heads", (json_int_t)o->heads,
                            "devices", devs, "steps", (json_int_t)o->steps, "warmup",
                            (json_int_t)o->warmup, "memory_limit", (json_int_t)o->limit_bytes,
                            "tf32", o->tf32, "n_params",
                            (json_int_t)dp_gpt_model(b->gpt, 0)->n_params, "optimizer", "adamw");
    json_object_set_new(cfg, "token_balanced", json_boolean(o->token_balanced));
    if (o->n_weights) {
        json_t *w = json_array();
        for (size_t i = 0; i < o->n_weights; i++)
            json_array_append_new(w, json_real(o->weights[i]));
        json_object_set_new(cfg, "device_weights", w);
    }
    json_object_set_new(cfg, "shard_optimizer", json_boolean(o->shard_optimizer));
    const cli_compute *cp = &o->compute;
    json_object_set_new(cfg, "precision", json_string(cp->bf16 ? "bf16" : "fp32"));
    json_object_set_new(cfg, "recompute", json_string(cli_recompute_name(cp->recompute)));
    json_object_set_new(cfg, "attention", json_string(cp->chunked_att ? "chunked"
                                                      : cp->fused_att ? "fused"
                                                                      : "whole"));
    /* Queries per chunk of the chunked attention; null for the whole matrix. */
    json_object_set_new(cfg, "attention_chunk",
                        cp->chunked_att ? json_integer(cli_attention_chunk(cp)) : json_null());
    /* As given: a row count, or "auto" / "whole" (the count auto picks
     * depends on each run's rows; the devices' logits_bytes show it). */
    json_t *chunk = cp->logits_chunk == 0                 ? json_string("auto")
                    : cp->logits_chunk == DP_LOGITS_WHOLE ? json_string("whole")
                                                          : json_integer((json_int_t)cp->logits_chunk);
    json_object_set_new(cfg, "logits_chunk_rows", chunk);
    /* The model's padded vocabulary (--vocab-pad as resolved; 1: none). */
    json_object_set_new(cfg, "vocab_pad",
                        json_integer((json_int_t)dp_gpt_config_of(b->gpt)->vocab_pad));
    json_object_set_new(cfg, "vocab_padded",
                        json_integer((json_int_t)dp_gpt_padded_vocab(dp_gpt_config_of(b->gpt))));
    json_object_set_new(cfg, "model_flops_per_token", json_real(model_flops_per_token(b)));
    json_object_set_new(cfg, "peak_tflops",
                        b->o.peak_tflops > 0 ? json_real(b->o.peak_tflops) : json_null());
    size_t bk = cp->bucket_bytes;
    json_object_set_new(cfg, "bucket_bytes", bk == DP_BUCKET_OFF ? json_string("off")
                                             : json_integer((json_int_t)(bk ? bk : DP_BUCKET_DEFAULT_BYTES)));
    json_object_set_new(cfg, "ranks", json_integer(b->rk.ranks));
    return cfg;
}

/* One timed run: its times, loss and imbalance, and each device's figures. */
static json_t *json_run(const bench *b, const mode_result *m)
{
    json_t *jd = json_array();
    for (size_t i = 0; i < m->k; i++) {
        const dev_result *d = &m->dev[i];
        json_t *pp = json_object();
        for (int p = 0; p < DP_PHASE_COUNT; p++)
            json_object_set_new(pp, dp_phase_name((dp_phase)p),
                                json_integer((json_int_t)d->phase_peak[p]));
        json_array_append_new(
            jd, json_pack("{s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:o}", "device", d->name, "rows",
                          (json_int_t)d->rows, "peak_bytes",
                          (json_int_t)d->peak, "optimizer_bytes", (json_int_t)d->optimizer,
                          "logits_bytes", (json_int_t)d->logits, "reserved_bytes",
                          (json_int_t)d->reserved, "param_bytes",
                          (json_int_t)d->params, "phase_peak_bytes", pp));
    }
    json_t *ph = json_object();
    for (int p = 0; p < DP_PHASE_COUNT; p++)
        json_object_set_new(ph, dp_phase_name((dp_phase)p), json_real(m->phase_ms[p]));
    json_t *jr = json_pack("{s:s,s:f,s:{s:f,s:f,s:f},s:o,s:f,s:f,s:f,s:o}", "mode",
                           dp_mode_name(m->mode), "tokens_per_s", m->tokens_per_s, "step_ms",
                           "median", m->step_ms_median, "min", m->step_ms_min, "max",
                           m->step_ms_max, "phase_ms", ph, "loss", m->loss, "imbalance",
                           m->imbalance, "imbalance_without_optimizer", m->imbalance_no_opt,
                           "devices", jd);
    json_object_set_new(jr, "shard_optimizer", json_boolean(m->shard));
    json_object_set_new(jr, "exposed_ms", json_real(m->exposed_ms));
    json_object_set_new(jr, "overlapped", json_boolean(m->overlapped));
    json_object_set_new(jr, "replayed_steps", json_integer((json_int_t)m->replayed));
    json_object_set_new(jr, "model_tflops", json_real(model_tflops(b, m)));
    json_object_set_new(jr, "mfu", b->o.peak_tflops > 0 ? json_real(mfu(b, m)) : json_null());
    json_object_set_new(jr, "batch_size", json_integer((json_int_t)m->rows));
    json_object_set_new(jr, "ranks", json_integer(b->rk.ranks));
    json_object_set_new(jr, "devices_per_rank", json_integer((json_int_t)m->k));
    json_object_set_new(jr, "bytes_sent_per_step",
                        json_integer((json_int_t)m->bytes_sent_per_step));
    if (b->o.find_max_batch) json_object_set_new(jr, "max_batch", json_integer(m->max_batch));
    return jr;
}

/* --scaling's points, each with its efficiency against the first. */
static json_t *json_scaling(const bench *b, const run_results *rs)
{
    const scale_point *sc = rs->sc;
    json_t *js = json_array();
    for (size_t i = 0; i < rs->nsc; i++)
        json_array_append_new(
            js, json_pack("{s:I,s:I,s:I,s:f,s:f,s:I}", "devices", (json_int_t)sc[i].global,
                          "ranks", (json_int_t)b->rk.ranks, "devices_per_rank",
                          (json_int_t)sc[i].k, "tokens_per_s", sc[i].tokens_per_s,
                          "efficiency",
                          sc[i].tokens_per_s * (double)sc[0].global /
                              ((double)sc[i].global * sc[0].tokens_per_s),
                          "bytes_sent_per_step", (json_int_t)sc[i].bytes_sent_per_step));
    return json_pack("{s:s,s:o}", "mode", dp_mode_name(rs->scale_mode), "points", js);
}

json_t *json_results(const bench *b, const run_results *rs)
{
    json_t *cfg = json_config(b), *runs = json_array();
    for (size_t r = 0; r < rs->nres; r++) json_array_append_new(runs, json_run(b, &rs->res[r]));
    json_t *root = json_pack("{s:o,s:o}", "config", cfg, "results", runs);
    const mode_result *g = root_run(rs, DP_MODE_GATHER), *bal = root_run(rs, DP_MODE_BALANCED);
    if (g && bal && g->rows == bal->rows)
        json_object_set_new(root, "root_peak_ratio",
                            json_real((double)g->dev[0].peak / (double)bal->dev[0].peak));
    if (rs->nsc) json_object_set_new(root, "scaling", json_scaling(b, rs));
    return root;
}

char *csv_text(const run_results *rs, int ranks)
{
    const mode_result *res = rs->res;
    size_t nres = rs->nres;
    size_t cap = 4096 + nres * DP_MAX_DEVICES * 512, len = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    len += (size_t)snprintf(s + len, cap - len,
                            "mode,device,peak_bytes,optimizer_bytes,logits_bytes,param_bytes,"
                            "reserved_bytes");
    for (int p = 0; p < DP_PHASE_COUNT; p++)
        len += (size_t)snprintf(s + len, cap - len, ",%s_peak_bytes", dp_phase_name((dp_phase)p));
    len += (size_t)snprintf(s + len, cap - len,
                            ",step_ms_median,step_ms_min,step_ms_max,tokens_per_s,max_batch,rows,"
                            "ranks,devices_per_rank,bytes_sent_per_step,exposed_ms,shard_optimizer\n");
    for (size_t r = 0; r < nres; r++) {
        const mode_result *m = &res[r];
        for (size_t i = 0; i < m->k; i++) {
            const dev_result *d = &m->dev[i];
            len += (size_t)snprintf(s + len, cap - len, "%s,%s,%zu,%zu,%zu,%zu,%zu",
                                    dp_mode_name(m->mode), d->name, d->peak, d->optimizer,
                                    d->logits, d->params, d->reserved);
            for (int p = 0; p < DP_PHASE_COUNT; p++)
                len += (size_t)snprintf(s + len, cap - len, ",%zu", d->phase_peak[p]);
            len += (size_t)snprintf(s + len, cap - len,
                                    ",%.3f,%.3f,%.3f,%.1f,%ld,%zu,%d,%zu,%zu,%.3f,%d\n",
                                    m->step_ms_median, m->step_ms_min, m->step_ms_max,
                                    m->tokens_per_s, m->max_batch, d->rows, ranks, m->k,
                                    m->bytes_sent_per_step, m->exposed_ms, m->shard);
        }
    }
    return s;
}
