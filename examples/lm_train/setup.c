/*
 * examples/lm_train/setup.c - everything before the first step: the
 * checkpoint, data, prompt and model (this rank's part), the devices and
 * the engine's configuration, the engine itself with a checkpoint's
 * parameters, and the batch buffers. Under ranks the local parts'
 * outcomes are agreed before the collective calls.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lm_train.h"

/* Says what --devices auto chose when it fell back to CPU devices. */
static void explain_auto(const opts *o, const dp_device_spec *specs, size_t k)
{
    if (strcmp(o->devices, "auto") != 0 || !k || specs[0].kind != DP_DEVICE_CPU) return;
#ifdef DP_HAVE_CUDA
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    printf("devices: auto chose %zu CPU device%s: no CUDA device is visible (no GPU or driver, "
           "or CUDA_VISIBLE_DEVICES=%s)\n", k, k == 1 ? "" : "s", cvd ? cvd : "unset");
#else
    printf("devices: auto chose %zu CPU device%s (one per core): this build has no CUDA "
           "backend\n", k, k == 1 ? "" : "s");
#endif
}

/* The model: a new GPT of the options' shape over vocabulary V, or the
 * checkpoint's, with the attention chunk asked for. */
static int make_model(run *r, size_t V)
{
    const opts *o = &r->o;
    if (!r->gpt) {
        dp_gpt_config gc = {.vocab_size = V,
                            .block_size = (size_t)o->context,
                            .n_layer = (size_t)o->layers,
                            .n_head = (size_t)o->heads,
                            .n_embd = (size_t)o->dim,
                            .attention_chunk = (size_t)o->compute.att_chunk};
        dp_status s = dp_gpt_create(&gc, &r->gpt);
        /* the library names its fields; these are the options */
        if (s == DP_ERR_OUT_OF_MEMORY)
            return cli_fail("model: %s; give a smaller model (--layers %ld, --dim %ld)",
                            dp_last_error(), o->layers, o->dim);
        if (s != DP_OK)
            return cli_fail("model (--layers %ld, --heads %ld, --dim %ld, --context %ld): %s",
                            o->layers, o->heads, o->dim, o->context, dp_last_error());
    } else if (o->compute.att_chunk) {
        /* How the attention runs is not in the checkpoint: the same model
         * with the chunk asked for (same tensors and parameters). */
        dp_gpt_config gc = *dp_gpt_config_of(r->gpt);
        gc.attention_chunk = (size_t)o->compute.att_chunk;
        dp_gpt *g = NULL;
        if (dp_gpt_create(&gc, &g) != DP_OK) return cli_dp_fail("--attention-chunk");
        dp_gpt_destroy(r->gpt);
        r->gpt = g;
    }
    size_t has = dp_gpt_config_of(r->gpt)->vocab_size;
    if (o->init_from && has != V) /* text's own tokenizer against the weights' */
        return cli_fail("--init-from %s has a vocabulary of %zu, but the %s tokenizer of --data has "
                        "%zu ids: train it on token data made with its own tokenizer (e.g. "
                        "dp_tokenize's shards)", o->init_from, has, o->tokenizer, V);
    r->n_params = dp_gpt_model(r->gpt, 0)->n_params;
    return 0;
}

/* *buf (n_from floats in from's layout) moved into to's layout (NULL stays NULL). */
static int move_layout(float **buf, const dp_gpt *to, const dp_gpt *from)
{
    if (!*buf) return 0;
    float *dst = malloc(dp_gpt_model(to, 0)->n_params * sizeof *dst);
    if (!dst) return cli_fail("out of host memory for the padded vocabulary's layout");
    if (dp_gpt_copy_layout(to, dst, from, *buf) != DP_OK) {
        free(dst);
        return cli_dp_fail("--vocab-pad");
    }
    free(*buf);
    *buf = dst;
    return 0;
}

/* The vocabulary's padding once the devices are known (--vocab-pad, with
 * --resume the checkpoint's unless given, else auto: cli_vocab_pad): the
 * GPT rebuilt with it. --resume's and --init-from's parameters, and the
 * checkpoint's moments, were read in the unpadded layout of their files
 * (each tensor at its offset, dp_checkpoint_read_tensors); they move
 * into the padded one tensor by tensor (dp_gpt_copy_layout: wte's V rows
 * stay where they are, the padded rows are zero, the tensors after it
 * shift), so a checkpoint of either layout resumes in the other. */
static int pad_vocab(run *r, const dp_device_spec *specs, size_t k)
{
    size_t pad = cli_vocab_pad(&r->o.compute, specs, k);
    dp_gpt_config gc = *dp_gpt_config_of(r->gpt);
    if ((gc.vocab_pad > 1 ? gc.vocab_pad : 1) == pad) return 0;
    gc.vocab_pad = pad;
    dp_gpt *g = NULL;
    if (dp_gpt_create(&gc, &g) != DP_OK) return cli_dp_fail("--vocab-pad");
    int rc = 0;
    if (r->ck)
        rc = move_layout(&r->ck->params, g, r->gpt) || move_layout(&r->ck->m, g, r->gpt) ||
             move_layout(&r->ck->v, g, r->gpt);
    if (!rc) rc = move_layout(&r->init_params, g, r->gpt);
    if (rc) {
        dp_gpt_destroy(g);
        return 1;
    }
    dp_gpt_destroy(r->gpt);
    r->gpt = g;
    r->n_params = dp_gpt_model(g, 0)->n_params;
    return 0;
}

/* *out: the file `name` beside the file at path (the companion a loader
 * reads with it: config.json beside --init-from's weights, vocab.bpe
 * beside an encoder.json), malloc'd; NULL when path is absent or a
 * directory (its files are all inputs). Returns 1 when out of memory. */
static int beside(const char *path, const char *name, char **out)
{
    *out = NULL;
    struct stat sb;
    if (!path || (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))) return 0;
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, (size_t)(slash - path) + (slash == path)) : strdup(".");
    *out = dir ? export_file(dir, name) : NULL;
    free(dir);
    return !*out;
}

/* Rank 0's outputs, before anything is written: --save and --trace can
 * be written (their directories, their temporary files' names), and no
 * output is the same file as an input (--data's, or one of a data
 * directory's files: its *.bin for token data; --resume, which --save may
 * replace; --tokenizer-file, with vocab.bpe beside an encoder.json;
 * --init-from's weights and config.json, or
 * any file of its directory) or as another output (--export-hf's two
 * files and the outputs' lock files included); an existing --log must be
 * an lm_train log. Then takes
 * the locks of --save, --trace and --export-hf (cli_lock_output), so a
 * second run given the same path is refused, not left to replace this
 * run's files (and this run its): two exports into one directory could
 * otherwise leave one run's weights beside the other's config.json. */
static int check_outputs(run *r, const char *data)
{
    const opts *o = &r->o;
    if (o->save && cli_check_output("--save", o->save)) return 1;
    if (o->trace && cli_check_output("--trace", o->trace)) return 1;
    /* --log that does not exist yet as the others (an empty path, a
     * missing directory); an existing one is read first (check_log) */
    struct stat ls;
    if (o->log && stat(o->log, &ls) != 0 && cli_check_output("--log", o->log))
        return 1;
    char *ex_model = o->export_hf ? export_file(o->export_hf, "model.safetensors") : NULL;
    char *ex_config = o->export_hf ? export_file(o->export_hf, "config.json") : NULL;
    char *in_config = NULL, *tok_merges = NULL;
    /* the lock files are written and removed too (a --save at one was lost) */
    char *lock[3] = {o->save ? cli_lock_name(o->save) : NULL,
                     o->trace ? cli_lock_name(o->trace) : NULL,
                     o->export_hf ? cli_lock_name(o->export_hf) : NULL};
    int rc = 0;
    if (beside(o->init_from, "config.json", &in_config) ||
        beside(o->tokenizer_file, "vocab.bpe", &tok_merges) ||
        (o->export_hf && (!ex_model || !ex_config || !lock[2])) || (o->save && !lock[0]) ||
        (o->trace && !lock[1]))
        rc = cli_fail("out of host memory");
    const cli_file files[] = {
        {"--data", data, 0, r->is_tokens ? ".bin" : NULL, NULL},
        {"--resume", o->resume, 0, NULL, NULL},
        {"--tokenizer-file", o->tokenizer_file, 0, NULL, NULL},
        {"--tokenizer-file", tok_merges, 0, NULL, NULL},
        {"--init-from", o->init_from, 0, NULL, NULL},
        {"--init-from", in_config, 0, NULL, NULL},
        {"--save", o->save, 1, NULL, "--resume"},
        {"--log", o->log, 1, NULL, NULL},
        {"--trace", o->trace, 1, NULL, NULL},
        {"--export-hf", ex_model, 1, NULL, NULL},
        {"--export-hf", ex_config, 1, NULL, NULL},
        {"--export-hf", o->export_hf, 1, NULL, NULL}, /* the directory, made at the end */
        {"--save's lock file", lock[0], 1, NULL, NULL},
        {"--trace's lock file", lock[1], 1, NULL, NULL},
        {"--export-hf's lock file", lock[2], 1, NULL, NULL},
    };
    if (!rc) rc = cli_check_overlaps(files, sizeof files / sizeof files[0]);
    /* after the overlaps, whose message names both options: no file
     * another program wrote is replaced */
    if (!rc && o->save)
        rc = cli_check_replace("--save", o->save, is_checkpoint_file, "a dp checkpoint");
    if (!rc && o->trace)
        rc = cli_check_replace("--trace", o->trace, cli_is_dp_trace, "a dp trace");
    if (!rc && o->export_hf) rc = check_export_replace(ex_model, ex_config);
    free(ex_model), free(ex_config), free(in_config), free(tok_merges);
    for (int i = 0; i < 3; i++) free(lock[i]);
    if (!rc) rc = check_log(o);
    if (!rc && o->save) rc = cli_lock_output("--save", o->save, &r->locks[0]);
    if (!rc && o->trace) rc = cli_lock_output("--trace", o->trace, &r->locks[1]);
    if (!rc && o->export_hf) rc = cli_lock_output("--export-hf", o->export_hf, &r->locks[2]);
    return rc;
}

/* The run's local part: checkpoint, data, tokenizer, prompt, samplers, model. */
static int load(run *r)
{
    const opts *o = &r->o;
    const char *path = NULL;
    if (probe_data(r, &path)) return 1;
    /* Rank 0 writes the outputs. */
    if (r->rk.rank == 0 && check_outputs(r, path)) return 1;
    if (o->resume) {
        if (dp_gpt_checkpoint_load(o->resume, &r->ck, &r->gpt) != DP_OK)
            return cli_dp_fail("--resume");
        if (apply_checkpoint(r)) return 1;
    }
    if (o->init_from && load_pretrained(r)) return 1;
    resolve_options(&r->o, r->is_tokens, r->gpt != NULL);
    /* --eval-only samples nothing: no prompt (nor the training split's first token).
     * The samplers first: a split too short for the context is named as
     * such, not as a prompt with nothing to take. */
    if (load_data(r, path) || make_samplers(r) || (!o->eval_only && prepare_prompt(r))) return 1;
    return make_model(r, r->is_tokens ? (size_t)o->vocab_size : dp_tokenizer_vocab_size(r->tok));
}

/* This rank's devices (specs[0..*k)) and the engine's configuration. */
static int configure(run *r, dp_device_spec *specs, size_t *kp, dp_engine_config *ecp)
{
    const opts *o = &r->o;
    /* --devices, --device-weights and --mode were read with the command line */
    size_t k = o->n_specs;
    memcpy(specs, o->specs, k * sizeof *specs);
    *kp = k;
    explain_auto(o, specs, k);
    dp_engine_config ec = dp_engine_config_default();
    ec.mode = strcmp(o->mode, "gather") == 0 ? DP_MODE_GATHER : DP_MODE_BALANCED;
    if (o->device_weights) ec.device_weights = o->weights;
    ec.token_balanced = o->token_balanced;
    ec.optim.lr = (float)o->lr;
    ec.optim.beta1 = (float)o->beta1;
    ec.optim.beta2 = (float)o->beta2;
    ec.optim.weight_decay = (float)o->weight_decay;
    ec.optim.grad_clip = (float)o->grad_clip;
    ec.grad_accum = (int)o->grad_accum;
    ec.max_tokens_per_micro = (size_t)o->max_tokens;
    ec.seed = o->seed;
    /* Under ranks every wait between them is bounded, the engine's too:
     * without --watchdog, by the default (cli_ranks_set_wait). */
    ec.watchdog_seconds = r->rk.ranks > 1 ? r->rk.wait : o->watchdog;
    ec.check_replicas_every = o->check_replicas;
    ec.allow_tf32 = o->tf32;
    ec.matmul_precision = o->compute.bf16 ? DP_MATMUL_BF16 : DP_MATMUL_FP32;
    ec.shard_optimizer = o->shard_optimizer;
    /* The same on every rank (the engine checks): it comes from the command line. */
    ec.logits_chunk_rows = o->compute.logits_chunk;
    ec.bucket_bytes = o->compute.bucket_bytes;
    ec.memory_limit = o->memory_limit_bytes;
    ec.dist = r->rk.dist;
    *ecp = ec;
    return 0;
}

/* Writes a byte of each page (through volatile: a malloc then memset to 0
 * may be compiled as a calloc, which touches nothing). */
static void touch_pages(void *p, size_t bytes)
{
    volatile unsigned char *b = p;
    long page = sysconf(_SC_PAGESIZE);
    size_t step = page > 0 ? (size_t)page : 4096;
    for (size_t i = 0; i < bytes; i += step) b[i] = 0;
}

/* The host batch buffers, (batch_size, context) tokens each. */
static int alloc_batches(run *r)
{
    const opts *o = &r->o;
    size_t bt = 0;
    if (!dp_size_mul((size_t)o->batch_size, (size_t)o->context, &bt) ||
        !dp_size_mul(bt, sizeof(int32_t), &bt))
        return cli_fail("--batch-size %ld x --context %ld overflows a buffer size", o->batch_size,
                        o->context);
    /* Refused past the host's available RAM before anything is touched:
     * with overcommit the buffers would grow until the kernel's OOM killer
     * ended the run without a word. */
    double ram = cli_host_available_bytes();
    if (2.0 * (double)bt > ram)
        return cli_fail("--batch-size %ld x --context %ld: the batch's tokens and targets "
                        "(%.3g GB) do not fit in the host's %.3g GB of available RAM; use a "
                        "smaller --batch-size", o->batch_size, o->context, 2e-9 * (double)bt,
                        1e-9 * ram);
    r->inputs = malloc(bt);
    r->targets = malloc(bt);
    if (!r->inputs || !r->targets)
        return cli_fail("--batch-size %ld x --context %ld: no host memory for the batch's tokens "
                        "and targets (%.3g GB); use a smaller --batch-size", o->batch_size,
                        o->context, 2e-9 * (double)bt);
    /* Touched now, before the engine's CPU devices measure the RAM left
     * (dp_host_memory_available): their per-row state is then refused
     * where it does not fit beside the batch, instead of both growing
     * into the OOM killer while the first batch loads. */
    touch_pages(r->inputs, bt);
    touch_pages(r->targets, bt);
    return 0;
}

/* Everything before the first step. With ranks the local parts' outcomes
 * are agreed before the collective calls (create, and with --resume the
 * parameters, which come from rank 0's file) and after the outputs. */
int setup(run *r)
{
    dp_device_spec specs[DP_MAX_DEVICES];
    size_t k = 0;
    dp_engine_config ec = dp_engine_config_default();
    int rc = load(r);
    if (!rc) rc = configure(r, specs, &k, &ec);
    if (!rc) rc = pad_vocab(r, specs, k);
    if (!rc) { /* --attention auto, on the model's final shape and precision */
        const dp_gpt_config *c = dp_gpt_config_of(r->gpt);
        cli_resolve_attention(&r->o.compute, specs, k, c->n_embd / c->n_head);
    }
    if (!rc) rc = alloc_batches(r);
    if (agree(r, rc) || compare_data(r)) return 1;
    dp_criterion ce = dp_criterion_cross_entropy();
    /* bf16: bf16 replicas, and the activations off the residual stream
     * kept as bfloat16 (dp/gpt.h). */
    const dp_model *model = dp_gpt_model(r->gpt, cli_gpt_flags(&r->o.compute));
    dp_status s = dp_engine_create(specs, k, model, &ce, &ec, &r->engine);
    if (s != DP_OK) return engine_fail(r, s, "engine");
    if (r->ck) {
        if ((s = dp_engine_set_params(r->engine, r->ck->params)) != DP_OK)
            return engine_fail(r, s, "--resume params");
        if (r->ck->m && (s = dp_engine_set_optimizer_state(r->engine, r->ck->m, r->ck->v,
                                                           r->ck->optimizer_step)) != DP_OK)
            return engine_fail(r, s, "--resume optimizer state");
        r->step = r->ck->step;
    }
    if (r->init_params) { /* weights only: a fresh optimizer, step 0 */
        s = dp_engine_set_params(r->engine, r->init_params);
        free(r->init_params);
        r->init_params = NULL;
        if (s != DP_OK) return engine_fail(r, s, "--init-from params");
    }
    print_summary(r, k, &ec);
    int out = r->rk.rank == 0 ? open_outputs(r) : 0;
    if (agree_writes(r, out) || agree(r, open_trace(r, k))) return 1;
    if (r->ck) {
        /* The parameters live in the engine now; the metadata stays for messages. */
        free(r->ck->params);
        free(r->ck->m);
        free(r->ck->v);
        r->ck->params = r->ck->m = r->ck->v = NULL;
    }
    return 0;
}
