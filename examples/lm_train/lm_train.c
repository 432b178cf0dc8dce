/*
 * examples/lm_train/lm_train.c - the main job: train a GPT on real text
 * with the balanced DataParallel engine.
 *
 * Defaults run on a fresh machine with no arguments: the corpus is the
 * text of Debian's fortunes package, character-level tokens, every GPU or
 * else one CPU device per core. Prints progress, evaluates on the held-out
 * split, saves safetensors checkpoints nanoGPT can load, resumes exactly,
 * and samples text. `lm_train --help` lists every option.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <dp/dp.h>

#include "dp_cli.h"

// --- options ------------------------------------------------------------------------

typedef struct opts {
    const char *data, *tokenizer, *devices, *mode, *save, *resume, *log, *prompt;
    const char *memory_limit;
    long vocab_size, layers, heads, dim, context, batch_size, grad_accum, max_tokens;
    long steps, warmup, eval_interval, eval_iters, save_interval, sample, top_k;
    long max_skips, check_replicas;
    double lr, min_lr, weight_decay, beta1, beta2, grad_clip, temperature, watchdog;
    unsigned long long seed;
    int eval_only, tf32;
    int model_given; /* which model-shape options were on the command line (MG_* bits) */
} opts;

enum { MG_LAYERS = 1, MG_HEADS = 2, MG_DIM = 4, MG_CTX = 8 };

static void defaults(opts *o)
{
    memset(o, 0, sizeof *o);
    o->tokenizer = "char";
    o->devices = "auto";
    o->mode = "balanced";
    o->prompt = "\n";
    o->vocab_size = 8192;
    o->layers = 4;
    o->heads = 4;
    o->dim = 128;
    o->context = 64;
    o->batch_size = 12;
    o->grad_accum = 1;
    o->steps = 500;
    o->lr = 1e-3;
    o->min_lr = 1e-4;
    o->warmup = 100;
    o->weight_decay = 0.1;
    o->beta1 = 0.9;
    o->beta2 = 0.99;
    o->grad_clip = 1.0;
    o->eval_interval = 100;
    o->eval_iters = 20;
    o->seed = 1337;
    o->sample = 300;
    o->temperature = 0.8;
    o->top_k = 40;
    o->max_skips = 5;
}

static void usage(FILE *f)
{
    opts d;
    defaults(&d);
    fprintf(f,
            "usage: lm_train [options]\n"
            "Train a GPT (nanoGPT's architecture) on text with dp's balanced DataParallel engine.\n\n"
            "data\n"
            "  --data PATH            text file or directory of text files (default: %s)\n"
            "  --tokenizer char|word  tokenizer (default %s)\n"
            "  --vocab-size N         word tokenizer vocabulary size (default %ld)\n"
            "devices\n"
            "  --devices LIST         cpu, cpu:N, cpu:0,1, cuda:0,1, auto (default %s: every GPU,\n"
            "                         else one CPU device per core)\n"
            "  --mode balanced|gather where the loss is computed (default %s)\n"
            "  --memory-limit SIZE    per-device allocation limit, e.g. 12GiB (default none)\n"
            "  --tf32                 let cuBLAS use TF32 tensor cores on GPUs (default off)\n"
            "model\n"
            "  --layers N  --heads N  --dim N  --context N   (default %ld, %ld, %ld, %ld)\n"
            "training\n"
            "  --batch-size N         global sequences per step (default %ld)\n"
            "  --grad-accum N         micro-batches per device per step (default %ld)\n"
            "  --max-tokens-per-device N  tokens per forward/backward on a device (default no limit)\n"
            "  --steps N              total steps; with --resume, continue up to N (default %ld)\n"
            "  --lr X  --min-lr X     peak and final learning rate (default %g, %g)\n"
            "  --warmup N             linear warmup steps, then cosine decay to --min-lr (default %ld)\n"
            "  --weight-decay X       AdamW weight decay on 2-D weights (default %g)\n"
            "  --beta1 X  --beta2 X   AdamW betas (default %g, %g)\n"
            "  --grad-clip X          max global gradient norm, 0 = off (default %g)\n"
            "  --seed N               seed for initialisation and batches (default %llu)\n"
            "  --max-skips K          stop after K consecutive steps skipped for a non-finite\n"
            "                         loss or gradient (default %ld)\n"
            "  --watchdog SECONDS     fail a step when no device makes progress for this long,\n"
            "                         0 = off (default 0)\n"
            "  --check-replicas N     every N steps, check that every replica equals the root's\n"
            "                         parameters, 0 = off (default 0)\n"
            "evaluation and output\n"
            "  --eval-interval N      steps between evaluations (default %ld)\n"
            "  --eval-iters N         batches per split per evaluation (default %ld)\n"
            "  --eval-only            with --resume: print the loss over the whole validation split\n"
            "  --save PATH            safetensors checkpoint, written atomically (default none)\n"
            "  --save-interval N      steps between checkpoints, 0 = only at the end (default 0)\n"
            "  --resume PATH          continue from a checkpoint\n"
            "  --log PATH             JSONL, one row per step\n"
            "  --sample N             generate N tokens at the end, 0 = none (default %ld)\n"
            "  --temperature X  --top-k N  --prompt TEXT   sampling (default %g, %ld, newline)\n"
            "  --help                 this text\n",
            DP_DEFAULT_CORPUS, d.tokenizer, d.vocab_size, d.devices, d.mode, d.layers, d.heads,
            d.dim, d.context, d.batch_size, d.grad_accum, d.steps, d.lr, d.min_lr, d.warmup,
            d.weight_decay, d.beta1, d.beta2, d.grad_clip, d.seed, d.max_skips, d.eval_interval,
            d.eval_iters,
            d.sample, d.temperature, d.top_k);
}

static int parse_args(int argc, char **argv, opts *o)
{
    enum {
        O_DATA = 256, O_TOK, O_VOCAB, O_DEV, O_MODE, O_LAYERS, O_HEADS, O_DIM, O_CTX, O_BATCH,
        O_ACCUM, O_MAXTOK, O_STEPS, O_LR, O_MINLR, O_WARMUP, O_WD, O_B1, O_B2, O_CLIP, O_EVI,
        O_EVN, O_SEED, O_SAVE, O_SAVEI, O_RESUME, O_EVONLY, O_SAMPLE, O_TEMP, O_TOPK, O_PROMPT,
        O_LOG, O_MEM, O_SKIPS, O_WATCHDOG, O_CHECK, O_TF32, O_HELP
    };
    static const struct option lo[] = {
        {"data", 1, 0, O_DATA},          {"tokenizer", 1, 0, O_TOK},
        {"vocab-size", 1, 0, O_VOCAB},   {"devices", 1, 0, O_DEV},
        {"mode", 1, 0, O_MODE},          {"layers", 1, 0, O_LAYERS},
        {"heads", 1, 0, O_HEADS},        {"dim", 1, 0, O_DIM},
        {"context", 1, 0, O_CTX},        {"batch-size", 1, 0, O_BATCH},
        {"grad-accum", 1, 0, O_ACCUM},   {"max-tokens-per-device", 1, 0, O_MAXTOK},
        {"steps", 1, 0, O_STEPS},        {"lr", 1, 0, O_LR},
        {"min-lr", 1, 0, O_MINLR},       {"warmup", 1, 0, O_WARMUP},
        {"weight-decay", 1, 0, O_WD},    {"beta1", 1, 0, O_B1},
        {"beta2", 1, 0, O_B2},           {"grad-clip", 1, 0, O_CLIP},
        {"eval-interval", 1, 0, O_EVI},  {"eval-iters", 1, 0, O_EVN},
        {"seed", 1, 0, O_SEED},          {"save", 1, 0, O_SAVE},
        {"save-interval", 1, 0, O_SAVEI}, {"resume", 1, 0, O_RESUME},
        {"eval-only", 0, 0, O_EVONLY},   {"sample", 1, 0, O_SAMPLE},
        {"temperature", 1, 0, O_TEMP},   {"top-k", 1, 0, O_TOPK},
        {"prompt", 1, 0, O_PROMPT},      {"log", 1, 0, O_LOG},
        {"memory-limit", 1, 0, O_MEM},   {"max-skips", 1, 0, O_SKIPS},
        {"watchdog", 1, 0, O_WATCHDOG},  {"check-replicas", 1, 0, O_CHECK},
        {"tf32", 0, 0, O_TF32},          {"help", 0, 0, O_HELP},
        {0, 0, 0, 0}};
    opterr = 0;
    int c;
    /* The leading ':' makes a missing value return ':' rather than '?'. */
    while ((c = getopt_long(argc, argv, ":", lo, NULL)) != -1) {
        const char *v = optarg;
        int bad = 0;
        long seed = 0;
        switch (c) {
        case O_DATA: o->data = v; break;
        case O_TOK: o->tokenizer = v; break;
        case O_VOCAB: bad = cli_parse_long("--vocab-size", v, 2, LONG_MAX, &o->vocab_size); break;
        case O_DEV: o->devices = v; break;
        case O_MODE: o->mode = v; break;
        case O_LAYERS: bad = cli_parse_long("--layers", v, 1, LONG_MAX, &o->layers); o->model_given |= MG_LAYERS; break;
        case O_HEADS: bad = cli_parse_long("--heads", v, 1, LONG_MAX, &o->heads); o->model_given |= MG_HEADS; break;
        case O_DIM: bad = cli_parse_long("--dim", v, 1, LONG_MAX, &o->dim); o->model_given |= MG_DIM; break;
        case O_CTX: bad = cli_parse_long("--context", v, 1, LONG_MAX, &o->context); o->model_given |= MG_CTX; break;
        case O_BATCH: bad = cli_parse_long("--batch-size", v, 1, LONG_MAX, &o->batch_size); break;
        case O_ACCUM: bad = cli_parse_long("--grad-accum", v, 1, LONG_MAX, &o->grad_accum); break;
        case O_MAXTOK: bad = cli_parse_long("--max-tokens-per-device", v, 1, LONG_MAX, &o->max_tokens); break;
        case O_STEPS: bad = cli_parse_long("--steps", v, 0, LONG_MAX, &o->steps); break;
        case O_LR: bad = cli_parse_double("--lr", v, 0, &o->lr); break;
        case O_MINLR: bad = cli_parse_double("--min-lr", v, 0, &o->min_lr); break;
        case O_WARMUP: bad = cli_parse_long("--warmup", v, 0, LONG_MAX, &o->warmup); break;
        case O_WD: bad = cli_parse_double("--weight-decay", v, 0, &o->weight_decay); break;
        case O_B1: bad = cli_parse_double("--beta1", v, 0, &o->beta1); break;
        case O_B2: bad = cli_parse_double("--beta2", v, 0, &o->beta2); break;
        case O_CLIP: bad = cli_parse_double("--grad-clip", v, 0, &o->grad_clip); break;
        case O_EVI: bad = cli_parse_long("--eval-interval", v, 1, LONG_MAX, &o->eval_interval); break;
        case O_EVN: bad = cli_parse_long("--eval-iters", v, 1, LONG_MAX, &o->eval_iters); break;
        case O_SEED: bad = cli_parse_long("--seed", v, 0, LONG_MAX, &seed); o->seed = (unsigned long long)seed; break;
        case O_SAVE: o->save = v; break;
        case O_SAVEI: bad = cli_parse_long("--save-interval", v, 0, LONG_MAX, &o->save_interval); break;
        case O_RESUME: o->resume = v; break;
        case O_EVONLY: o->eval_only = 1; break;
        case O_TF32: o->tf32 = 1; break;
        case O_SAMPLE: bad = cli_parse_long("--sample", v, 0, LONG_MAX, &o->sample); break;
        case O_TEMP: bad = cli_parse_double("--temperature", v, 1e-6, &o->temperature); break;
        case O_TOPK: bad = cli_parse_long("--top-k", v, 0, LONG_MAX, &o->top_k); break;
        case O_PROMPT: o->prompt = v; break;
        case O_LOG: o->log = v; break;
        case O_MEM: o->memory_limit = v; break;
        case O_SKIPS: bad = cli_parse_long("--max-skips", v, 1, LONG_MAX, &o->max_skips); break;
        case O_WATCHDOG: bad = cli_parse_double("--watchdog", v, 0, &o->watchdog); break;
        case O_CHECK: bad = cli_parse_long("--check-replicas", v, 0, LONG_MAX, &o->check_replicas); break;
        case O_HELP: usage(stdout); exit(0);
        case ':': return cli_fail("%s needs a value (see --help)", argv[optind - 1]);
        default: return cli_fail("unknown option \"%s\" (see --help)", argv[optind - 1]);
        }
        if (bad) return 1;
    }
    if (optind < argc) return cli_fail("unexpected argument \"%s\" (see --help)", argv[optind]);
    if (o->beta1 >= 1 || o->beta2 >= 1) return cli_fail("--beta1 and --beta2 must be < 1");
    if (o->eval_only && !o->resume) return cli_fail("--eval-only needs --resume CHECKPOINT");
    if (o->grad_accum > INT_MAX)
        return cli_fail("--grad-accum %ld is too large (at most %d)", o->grad_accum, INT_MAX);
    /* With --resume the checkpoint's shape counts; setup reports a conflict. */
    if (!o->resume && o->dim % o->heads)
        return cli_fail("--heads %ld does not divide --dim %ld; pick heads that divide dim", o->heads,
                    o->dim);
    return 0;
}

// --- the run ------------------------------------------------------------------------

typedef struct run {
    opts o;
    dp_tokenizer *tok;
    dp_token_data *data;
    dp_gpt *gpt;
    dp_engine *engine;
    dp_sampler *train, *eval_train, *eval_val;
    int32_t *inputs, *targets; /* (batch_size, context) host */
    size_t n_params;
    long step;
    long skipped, consecutive_skips; /* steps skipped for non-finite values */
    FILE *log;
    int tty;
} run;

static void human_bytes(size_t b, char *buf, size_t cap)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double x = (double)b;
    int i = 0;
    while (x >= 1024 && i < 4) x /= 1024, i++;
    snprintf(buf, cap, i ? "%.1f%s" : "%.0f%s", x, u[i]);
}

/* Mean loss over eval_iters random batches of a split. */
static int estimate_loss(run *r, dp_sampler *s, double *out)
{
    size_t B = (size_t)r->o.batch_size, T = (size_t)r->o.context;
    double sum = 0.0;
    size_t n = 0;
    for (long i = 0; i < r->o.eval_iters; i++) {
        if (dp_sampler_next(s, r->inputs, r->targets, B) != DP_OK) return cli_dp_fail("eval batch");
        dp_batch b = {B, r->inputs, r->targets};
        dp_step_stats st;
        if (dp_engine_evaluate(r->engine, &b, &st) != DP_OK) return cli_dp_fail("evaluate");
        sum += st.loss * (double)st.valid_targets;
        n += st.valid_targets;
    }
    (void)T;
    *out = sum / (double)n;
    return 0;
}

/* Loss over the whole validation split: consecutive windows at multiples of
 * the context, the last incomplete one dropped. */
static int full_val_loss(run *r, double *out)
{
    size_t T = (size_t)r->o.context, B = (size_t)r->o.batch_size;
    size_t W = dp_eval_window_count(r->data, DP_SPLIT_VAL, T);
    if (!W) return cli_fail("the validation split has fewer than context+1 = %zu tokens", T + 1);
    double sum = 0.0;
    size_t n = 0;
    for (size_t first = 0; first < W; first += B) {
        size_t rows = W - first < B ? W - first : B;
        if (dp_eval_windows(r->data, DP_SPLIT_VAL, T, first, rows, r->inputs, r->targets) != DP_OK)
            return cli_dp_fail("validation windows");
        dp_batch b = {rows, r->inputs, r->targets};
        dp_step_stats st;
        if (dp_engine_evaluate(r->engine, &b, &st) != DP_OK) return cli_dp_fail("evaluate");
        sum += st.loss * (double)st.valid_targets;
        n += st.valid_targets;
    }
    *out = sum / (double)n;
    return 0;
}

static char *config_json(const opts *o)
{
    json_t *j = json_pack("{s:s, s:s, s:I, s:I, s:f, s:f, s:I, s:f, s:f, s:f, s:f, s:I, s:I}",
                          "tokenizer", o->tokenizer, "mode", o->mode, "batch_size",
                          (json_int_t)o->batch_size, "steps", (json_int_t)o->steps, "lr", o->lr,
                          "min_lr", o->min_lr, "warmup", (json_int_t)o->warmup, "weight_decay",
                          o->weight_decay, "beta1", o->beta1, "beta2", o->beta2, "grad_clip",
                          o->grad_clip, "seed", (json_int_t)o->seed, "grad_accum",
                          (json_int_t)o->grad_accum);
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(j);
    return s;
}

static int save_checkpoint(run *r)
{
    dp_checkpoint ck;
    memset(&ck, 0, sizeof ck);
    ck.config = *dp_gpt_config_of(r->gpt);
    ck.step = r->step;
    ck.params = malloc(r->n_params * sizeof(float));
    ck.m = malloc(r->n_params * sizeof(float));
    ck.v = malloc(r->n_params * sizeof(float));
    int rc = 0;
    if (!ck.params || !ck.m || !ck.v) rc = cli_fail("out of host memory saving a checkpoint");
    if (!rc && (dp_engine_get_params(r->engine, ck.params) != DP_OK ||
                dp_engine_get_optimizer_state(r->engine, ck.m, ck.v, &ck.optimizer_step) != DP_OK))
        rc = cli_dp_fail("reading parameters");
    if (!rc && dp_tokenizer_serialize(r->tok, &ck.tokenizer) != DP_OK) rc = cli_dp_fail("tokenizer");
    if (!rc && dp_sampler_get_state(r->train, ck.sampler) != DP_OK) rc = cli_dp_fail("sampler state");
    ck.has_sampler = 1;
    if (!rc) ck.config_json = config_json(&r->o);
    if (!rc && dp_checkpoint_save(r->o.save, r->gpt, &ck) != DP_OK) rc = cli_dp_fail("save");
    free(ck.params);
    free(ck.m);
    free(ck.v);
    free(ck.tokenizer);
    free(ck.config_json);
    return rc;
}

/* Samples n tokens after the prompt on the root device, printing them. */
static int generate(run *r)
{
    const dp_gpt_config *c = dp_gpt_config_of(r->gpt);
    size_t T = c->block_size, V = c->vocab_size, n = (size_t)r->o.sample;
    size_t plen = strlen(r->o.prompt);
    int32_t *ctx = malloc((plen + n + 1) * sizeof *ctx);
    float *params = malloc(r->n_params * sizeof(float));
    float *probs = malloc(V * sizeof(float));
    size_t len = 0, unk = 0;
    if (!ctx || !params || !probs) return cli_fail("out of host memory for sampling");
    if (dp_tokenizer_encode(r->tok, r->o.prompt, plen, ctx, plen + n + 1, &len, &unk) != DP_OK)
        return cli_dp_fail("--prompt");
    if (len == 0) ctx[len++] = 0;
    dp_device *dev = dp_engine_device(r->engine, 0);
    void *ws = NULL, *dtok = NULL, *dparams = NULL, *dlogits = NULL;
    int rc = 0;
    if (dp_engine_get_params(r->engine, params) != DP_OK ||
        dp_device_bind_thread(dev) != DP_OK ||
        dp_device_alloc(dev, dp_gpt_workspace_bytes(r->gpt, 1, T), &ws) != DP_OK ||
        dp_device_alloc(dev, T * sizeof(int32_t), &dtok) != DP_OK ||
        dp_device_alloc(dev, r->n_params * sizeof(float), &dparams) != DP_OK ||
        dp_device_alloc(dev, T * V * sizeof(float), &dlogits) != DP_OK ||
        dp_copy_h2d(dev, dparams, params, r->n_params * sizeof(float)) != DP_OK)
        rc = cli_dp_fail("sampling setup");
    dp_rng rng;
    dp_rng_seed(&rng, r->o.seed ^ 0x5eedULL);
    printf("--- sample (%zu tokens, temperature %g, top-k %ld) ---\n%s", n, r->o.temperature,
           r->o.top_k, r->o.prompt);
    for (size_t i = 0; !rc && i < n; i++) {
        size_t t = len < T ? len : T; /* crop to the last block_size tokens */
        const int32_t *win = ctx + len - t;
        if (dp_copy_h2d(dev, dtok, win, t * sizeof(int32_t)) != DP_OK ||
            dp_gpt_forward(r->gpt, dev, dparams, dtok, 1, t, ws, dlogits) != DP_OK ||
            dp_copy_d2h(dev, probs, (float *)dlogits + (t - 1) * V, V * sizeof(float)) != DP_OK) {
            rc = cli_dp_fail("sampling");
            break;
        }
        /* top-k: keep logits >= the k-th largest; softmax with temperature. */
        float kth = -INFINITY;
        if (r->o.top_k > 0 && (size_t)r->o.top_k < V) {
            float *tmp = malloc(V * sizeof(float));
            memcpy(tmp, probs, V * sizeof(float));
            for (long k = 0; k < r->o.top_k; k++) { /* k passes of selection: V is small */
                size_t best = 0;
                for (size_t j = 1; j < V; j++)
                    if (tmp[j] > tmp[best]) best = j;
                kth = tmp[best];
                tmp[best] = -INFINITY;
            }
            free(tmp);
        }
        float mx = -INFINITY;
        for (size_t j = 0; j < V; j++) mx = probs[j] > mx ? probs[j] : mx;
        double z = 0.0;
        for (size_t j = 0; j < V; j++) {
            double p = probs[j] < kth ? 0.0 : exp((probs[j] - mx) / r->o.temperature);
            probs[j] = (float)p;
            z += p;
        }
        double u = dp_rng_uniform(&rng) * z, acc = 0.0;
        size_t pick = V - 1;
        for (size_t j = 0; j < V; j++) {
            acc += probs[j];
            if (u < acc && probs[j] > 0) {
                pick = j;
                break;
            }
        }
        ctx[len++] = (int32_t)pick;
        const char *bytes;
        size_t blen;
        if (dp_tokenizer_token(r->tok, (int32_t)pick, &bytes, &blen) == DP_OK)
            fwrite(bytes, 1, blen, stdout);
    }
    printf("\n---\n");
    dp_device_free(dev, ws);
    dp_device_free(dev, dtok);
    dp_device_free(dev, dparams);
    dp_device_free(dev, dlogits);
    free(ctx);
    free(params);
    free(probs);
    return rc;
}

static void progress(run *r, const dp_step_stats *st, double lr, double elapsed, long first)
{
    double tok_s = (double)(r->o.batch_size * r->o.context) / st->seconds;
    double eta = (elapsed / (double)(r->step - first)) * (double)(r->o.steps - r->step);
    char line[512];
    int n = snprintf(line, sizeof line, "step %ld/%ld | loss %.4f | lr %.2e | %.0f tok/s | %.1f ms | ETA %.0fs | peak",
                     r->step, r->o.steps, st->loss, lr, tok_s, 1e3 * st->seconds, eta);
    for (size_t d = 0; d < st->n_devices && n < (int)sizeof line - 16; d++) {
        char b[32];
        human_bytes(st->devices[d].peak, b, sizeof b);
        n += snprintf(line + n, sizeof line - (size_t)n, " %s", b);
    }
    if (r->tty) {
        printf("\r%s\033[K", line);
        fflush(stdout);
    } else {
        long every = r->o.eval_interval / 10 > 0 ? r->o.eval_interval / 10 : 1;
        if (r->step % every == 0 || r->step == r->o.steps) printf("%s\n", line);
    }
}

static void log_row(run *r, const dp_step_stats *st, double lr)
{
    if (!r->log) return;
    json_t *peaks = json_array();
    for (size_t d = 0; d < st->n_devices; d++)
        json_array_append_new(peaks, json_integer((json_int_t)st->devices[d].peak));
    /* JSON has no NaN or Inf: a non-finite loss or norm is logged as null. */
    json_t *loss = isfinite(st->loss) ? json_real(st->loss) : json_null();
    json_t *norm = isfinite(st->grad_norm) ? json_real(st->grad_norm) : json_null();
    json_t *row = json_pack("{s:I, s:o, s:f, s:o, s:f, s:f, s:b, s:I, s:o}", "step",
                            (json_int_t)(st->skipped ? r->step + 1 : r->step), "loss", loss,
                            "lr", lr, "grad_norm", norm, "tokens_per_s",
                            (double)(r->o.batch_size * r->o.context) / st->seconds, "ms",
                            1e3 * st->seconds, "skipped", st->skipped, "skipped_total",
                            (json_int_t)r->skipped, "peak_bytes", peaks);
    if (row) {
        json_dumpf(row, r->log, JSON_COMPACT);
        fputc('\n', r->log);
        fflush(r->log);
    }
    json_decref(row);
}

/* Fails unless a checkpoint can be written at path: its directory exists
 * and is writable, and path is not a directory. Checked before training so
 * a typo does not cost the whole run. */
static int check_save_path(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return cli_fail("--save %s is a directory; give a file name for the checkpoint", path);
    char *dir = strdup(path);
    if (!dir) return cli_fail("out of host memory");
    char *slash = strrchr(dir, '/');
    const char *d = ".";
    if (slash == dir) {
        d = "/";
    } else if (slash) {
        *slash = '\0';
        d = dir;
    }
    int rc = 0;
    if (stat(d, &sb) != 0)
        rc = cli_fail("--save %s: directory '%s': %s; create it first", path, d, strerror(errno));
    else if (!S_ISDIR(sb.st_mode))
        rc = cli_fail("--save %s: '%s' is not a directory", path, d);
    else if (access(d, W_OK | X_OK) != 0)
        rc = cli_fail("--save %s: cannot write in directory '%s': %s", path, d, strerror(errno));
    free(dir);
    return rc;
}

static int setup(run *r, dp_checkpoint **ck_out)
{
    opts *o = &r->o;
    dp_checkpoint *ck = NULL;
    if (o->save && !o->eval_only && check_save_path(o->save)) return 1;
    if (o->resume) {
        if (dp_checkpoint_load(o->resume, &ck, NULL) != DP_OK) return cli_dp_fail("--resume");
        *ck_out = ck; /* freed by the caller on every path */
        const dp_gpt_config *c = &ck->config;
        /* Only the options given count: the others are defaults, not requests. */
        int g = o->model_given;
        if (((g & MG_LAYERS) && (size_t)o->layers != c->n_layer) ||
            ((g & MG_HEADS) && (size_t)o->heads != c->n_head) ||
            ((g & MG_DIM) && (size_t)o->dim != c->n_embd) ||
            ((g & MG_CTX) && (size_t)o->context != c->block_size))
            return cli_fail("--resume %s holds a model with --layers %zu --heads %zu --dim %zu "
                        "--context %zu, which differs from the options given; drop them or "
                        "match them", o->resume, c->n_layer, c->n_head, c->n_embd, c->block_size);
        o->layers = (long)c->n_layer;
        o->heads = (long)c->n_head;
        o->dim = (long)c->n_embd;
        o->context = (long)c->block_size;
        if (!ck->tokenizer) return cli_fail("--resume %s has no tokenizer", o->resume);
        if (dp_tokenizer_parse(ck->tokenizer, &r->tok) != DP_OK) return cli_dp_fail("checkpoint tokenizer");
    }
    *ck_out = ck;

    char *text = NULL;
    size_t len = 0, files = 0;
    if (dp_text_load(o->data, &text, &len, &files) != DP_OK) return cli_dp_fail("--data");
    if (!r->tok) {
        dp_tokenizer_kind kind;
        if (dp_tokenizer_kind_parse(o->tokenizer, &kind) != DP_OK) return cli_dp_fail("--tokenizer");
        dp_status s = kind == DP_TOKENIZER_CHAR
                          ? dp_tokenizer_build_char(text, len, &r->tok)
                          : dp_tokenizer_build_word(text, len, (size_t)o->vocab_size, &r->tok);
        if (s != DP_OK) {
            free(text);
            return cli_dp_fail("tokenizer");
        }
    }
    dp_status s = dp_token_data_from_text(r->tok, text, len, &r->data);
    free(text);
    if (s != DP_OK) return cli_dp_fail("--data");
    size_t V = dp_tokenizer_vocab_size(r->tok);
    if (ck && V != ck->config.vocab_size)
        return cli_fail("--resume: the checkpoint's vocabulary (%zu) does not match its tokenizer (%zu)",
                    ck->config.vocab_size, V);
    printf("data: %s (%zu file%s, %zu tokens: %zu train, %zu validation), %s tokenizer, vocab %zu\n",
           o->data ? o->data : DP_DEFAULT_CORPUS, files, files == 1 ? "" : "s",
           dp_token_data_total(r->data), dp_token_data_size(r->data, DP_SPLIT_TRAIN),
           dp_token_data_size(r->data, DP_SPLIT_VAL), dp_tokenizer_kind_name(dp_tokenizer_kind_of(r->tok)), V);

    size_t T = (size_t)o->context;
    if (dp_sampler_create(r->data, DP_SPLIT_TRAIN, T, o->seed, &r->train) != DP_OK ||
        dp_sampler_create(r->data, DP_SPLIT_TRAIN, T, o->seed + 1, &r->eval_train) != DP_OK ||
        dp_sampler_create(r->data, DP_SPLIT_VAL, T, o->seed + 2, &r->eval_val) != DP_OK)
        return cli_dp_fail("--context");
    if (ck && ck->has_sampler && dp_sampler_set_state(r->train, ck->sampler) != DP_OK)
        return cli_dp_fail("--resume sampler state");

    dp_gpt_config gc = {V, T, (size_t)o->layers, (size_t)o->heads, (size_t)o->dim};
    if (dp_gpt_create(&gc, &r->gpt) != DP_OK) return cli_dp_fail("model");
    r->n_params = dp_gpt_model(r->gpt)->n_params;

    dp_device_spec specs[DP_MAX_DEVICES];
    size_t k = 0;
    if (dp_device_list_parse(o->devices, specs, DP_MAX_DEVICES, &k) != DP_OK) return cli_dp_fail("--devices");
    dp_engine_config ec = dp_engine_config_default();
    if (strcmp(o->mode, "balanced") == 0) ec.mode = DP_MODE_BALANCED;
    else if (strcmp(o->mode, "gather") == 0) ec.mode = DP_MODE_GATHER;
    else return cli_fail("--mode: \"%s\" is not balanced or gather", o->mode);
    ec.optim.lr = (float)o->lr;
    ec.optim.beta1 = (float)o->beta1;
    ec.optim.beta2 = (float)o->beta2;
    ec.optim.weight_decay = (float)o->weight_decay;
    ec.optim.grad_clip = (float)o->grad_clip;
    ec.grad_accum = (int)o->grad_accum;
    ec.max_tokens_per_micro = (size_t)o->max_tokens;
    ec.seed = o->seed;
    ec.watchdog_seconds = o->watchdog;
    ec.check_replicas_every = o->check_replicas;
    ec.allow_tf32 = o->tf32;
    if (o->memory_limit && dp_parse_bytes(o->memory_limit, &ec.memory_limit) != DP_OK)
        return cli_dp_fail("--memory-limit");
    dp_criterion ce = dp_criterion_cross_entropy();
    if (dp_engine_create(specs, k, dp_gpt_model(r->gpt), &ce, &ec, &r->engine) != DP_OK)
        return cli_dp_fail("engine");
    if (ck) {
        if (dp_engine_set_params(r->engine, ck->params) != DP_OK) return cli_dp_fail("--resume params");
        if (ck->m && dp_engine_set_optimizer_state(r->engine, ck->m, ck->v, ck->optimizer_step) != DP_OK)
            return cli_dp_fail("--resume optimizer state");
        r->step = ck->step;
    }
    printf("model: GPT %ld layers, %ld heads, dim %ld, context %ld: %.2fM parameters\n", o->layers,
           o->heads, o->dim, o->context, (double)r->n_params / 1e6);
    printf("engine: %s mode on %zu device%s (", dp_mode_name(ec.mode), k, k == 1 ? "" : "s");
    for (size_t i = 0; i < k; i++)
        printf("%s%s", i ? "," : "", dp_device_name(dp_engine_device(r->engine, i)));
    printf("), batch %ld x %ld tokens\n", o->batch_size, o->context);
    r->inputs = malloc((size_t)o->batch_size * T * sizeof(int32_t));
    r->targets = malloc((size_t)o->batch_size * T * sizeof(int32_t));
    if (!r->inputs || !r->targets) return cli_fail("out of host memory");
    if (o->log && !(r->log = fopen(o->log, r->step ? "a" : "w")))
        return cli_fail("--log %s: %s", o->log, strerror(errno));
    return 0;
}

static int train(run *r)
{
    opts *o = &r->o;
    size_t B = (size_t)o->batch_size;
    long first = r->step;
    double t0 = cli_now();
    r->tty = isatty(STDOUT_FILENO);
    while (r->step < o->steps) {
        float lr = dp_lr_schedule(r->step, o->warmup, o->steps, (float)o->lr, (float)o->min_lr);
        if (dp_engine_set_lr(r->engine, lr) != DP_OK) return cli_dp_fail("learning rate");
        if (dp_sampler_next(r->train, r->inputs, r->targets, B) != DP_OK) return cli_dp_fail("batch");
        dp_batch b = {B, r->inputs, r->targets};
        dp_step_stats st;
        if (dp_engine_step(r->engine, &b, &st) != DP_OK) return cli_dp_fail("step");
        if (st.skipped) {
            /* Nothing was updated: the step is retried on the next batch. */
            r->skipped++;
            r->consecutive_skips++;
            char where[48] = "";
            if (st.skipped_device >= 0)
                snprintf(where, sizeof where, " on %s",
                         dp_device_name(dp_engine_device(r->engine, (size_t)st.skipped_device)));
            printf("%sstep %ld skipped: non-finite loss or gradient%s (%ld in a row, %ld in all)\n",
                   r->tty ? "\n" : "", r->step + 1, where, r->consecutive_skips, r->skipped);
            log_row(r, &st, lr);
            if (r->consecutive_skips >= o->max_skips)
                return cli_fail("%ld consecutive steps had a non-finite loss or gradient (last%s); "
                            "stopping at step %ld%s%s. Lower --lr, tighten --grad-clip or check "
                            "the data",
                            r->consecutive_skips, where[0] ? where : " on no single device",
                            r->step, o->save ? "; the last checkpoint is intact: " : "",
                            o->save ? o->save : "");
            continue;
        }
        r->consecutive_skips = 0;
        r->step++;
        progress(r, &st, lr, cli_now() - t0, first);
        log_row(r, &st, lr);
        if (r->step % o->eval_interval == 0 || r->step == o->steps) {
            double tl, vl;
            if (estimate_loss(r, r->eval_train, &tl) || estimate_loss(r, r->eval_val, &vl)) return 1;
            printf("%seval step %ld: train loss %.4f, val loss %.4f\n", r->tty ? "\n" : "", r->step, tl, vl);
        }
        if (o->save && o->save_interval > 0 && r->step % o->save_interval == 0 && save_checkpoint(r))
            return 1;
    }
    double secs = cli_now() - t0;
    if (r->step > first)
        printf("trained %ld steps in %.1f s (%.0f tokens/s)\n", r->step - first, secs,
               (double)(r->step - first) * (double)(B * (size_t)o->context) / secs);
    if (o->save && save_checkpoint(r)) return 1;
    return 0;
}

int main(int argc, char **argv)
{
    cli_prog = "lm_train";
    run r;
    memset(&r, 0, sizeof r);
    defaults(&r.o);
    if (parse_args(argc, argv, &r.o)) return 2;
    dp_checkpoint *ck = NULL;
    int rc = setup(&r, &ck);
    dp_checkpoint_free(ck);
    if (!rc && r.o.eval_only) {
        double vl;
        rc = full_val_loss(&r, &vl);
        if (!rc) printf("val_loss %.6f\n", vl);
    } else if (!rc) {
        rc = train(&r);
        double vl;
        if (!rc) rc = full_val_loss(&r, &vl);
        if (!rc) printf("final val_loss %.4f\n", vl);
        if (!rc && r.o.sample > 0) rc = generate(&r);
    }
    if (r.log) fclose(r.log);
    free(r.inputs);
    free(r.targets);
    dp_sampler_free(r.train);
    dp_sampler_free(r.eval_train);
    dp_sampler_free(r.eval_val);
    dp_engine_destroy(r.engine);
    dp_gpt_destroy(r.gpt);
    dp_token_data_free(r.data);
    dp_tokenizer_free(r.tok);
    return rc ? 1 : 0;
}
