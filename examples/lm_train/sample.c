/*
 * examples/lm_train/sample.c - text from the trained model: the prompt
 * (text through the tokenizer, or token ids), checked before training,
 * and generation on the root device, each token drawn by
 * dp_sample_logits (top-k, temperature) and printed as it comes.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lm_train.h"

// --- the prompt ---------------------------------------------------------------------------

/* The prompt as tokens, checked before any training: a prompt given with
 * --prompt must be in the vocabulary; the default (a newline) falls back to
 * the first token of the training text when the vocabulary has no newline. */
static int prepare_text_prompt(run *r)
{
    const opts *o = &r->o;
    int given = (o->given & G_PROMPT) != 0;
    if (!o->sample && !given) return 0;
    /* as token data's: an empty prompt given is refused, not replaced */
    if (given && !*o->prompt) return cli_fail("--prompt is empty; give some text or drop --prompt");
    size_t plen = strlen(o->prompt), cap = plen ? plen : 1, bytes = 0;
    if (!dp_size_mul(cap, sizeof(int32_t), &bytes)) return cli_fail("--prompt is too long");
    r->prompt_ids = malloc(bytes);
    if (!r->prompt_ids) return cli_fail("out of host memory for --prompt");
    size_t n = 0, unk = 0;
    dp_status s = dp_tokenizer_encode(r->tok, o->prompt, plen, r->prompt_ids, cap, &n, &unk);
    if (s == DP_OK && !unk && n > 0) {
        r->prompt_len = n;
        r->prompt_text = strdup(o->prompt);
        return r->prompt_text ? 0 : cli_fail("out of host memory");
    }
    if (given) {
        if (s != DP_OK)
            return cli_fail("--prompt: %s; use text made of the corpus's characters",
                            dp_last_error());
        if (unk)
            return cli_fail("--prompt \"%s\": %zu word%s not in the vocabulary; use words of "
                            "the corpus", o->prompt, unk, unk == 1 ? " is" : "s are");
        return cli_fail("--prompt \"%s\" encodes to no token; give some text of the corpus",
                        o->prompt);
    }
    /* The corpus's first token exists in every vocabulary built from it. */
    int32_t first = 0;
    if (!dp_token_data_size(r->data, DP_SPLIT_TRAIN))
        return cli_fail("the training split is empty; nothing to prompt with");
    if (dp_token_data_read(r->data, DP_SPLIT_TRAIN, 0, 1, &first) != DP_OK)
        return cli_dp_fail("prompt token");
    r->prompt_ids[0] = first;
    r->prompt_len = 1;
    const char *tb = NULL;
    size_t tl = 0;
    if (dp_tokenizer_token(r->tok, first, &tb, &tl) != DP_OK) return cli_dp_fail("prompt token");
    r->prompt_text = malloc(tl + 1);
    if (!r->prompt_text) return cli_fail("out of host memory");
    memcpy(r->prompt_text, tb, tl);
    r->prompt_text[tl] = '\0';
    return 0;
}

/* --prompt-ids's text: decimal ids separated by ',' (each at most
 * INT32_MAX) into ids[0..*n) when ids is not NULL; *n is their count.
 * 0, or 1 after a message. The command line's check (options.c) and the
 * prompt's parse below share it. */
int prompt_ids_parse(const char *text, int32_t *ids, size_t *n)
{
    size_t count = 1;
    for (const char *p = text; *p; p++) count += *p == ',';
    const char *p = text;
    for (size_t i = 0; i < count; i++) {
        const char *end = p;
        unsigned long long id = 0;
        while (*end >= '0' && *end <= '9' && id <= (unsigned long long)INT32_MAX)
            id = id * 10 + (unsigned long long)(*end++ - '0');
        if (end == p || (*end != ',' && *end != '\0') || id > (unsigned long long)INT32_MAX)
            return cli_fail("--prompt-ids \"%s\": entry %zu is not a token id; give decimal ids "
                            "separated by commas, e.g. --prompt-ids %d,464", text, i + 1,
                            DP_GPT2_EOT);
        if (ids) ids[i] = (int32_t)id;
        p = end + 1;
    }
    *n = count;
    return 0;
}

/* Parses --prompt-ids into r->prompt_ids, each id below V. */
static int parse_prompt_ids(run *r, size_t V)
{
    const char *text = r->o.prompt_ids;
    size_t n = 0, bytes = 0;
    if (prompt_ids_parse(text, NULL, &n)) return 1; /* the count, to allocate */
    if (!dp_size_mul(n, sizeof(int32_t), &bytes) || !(r->prompt_ids = malloc(bytes)))
        return cli_fail("out of host memory for --prompt-ids");
    if (prompt_ids_parse(text, r->prompt_ids, &n)) return 1;
    for (size_t i = 0; i < n; i++)
        if ((size_t)r->prompt_ids[i] >= V)
            return cli_fail("--prompt-ids: id %d (entry %zu) is outside the model's vocabulary "
                            "[0, %zu); give ids below %zu (--vocab-size)", (int)r->prompt_ids[i],
                            i + 1, V, V);
    r->prompt_len = n;
    return 0;
}

/* Token data's prompt: --prompt-ids, or --prompt's text encoded by the BPE
 * of --tokenizer-file, else the end-of-text id (as llm.c
 * starts its samples; --tokenizer-file's, else GPT-2's 50256), else, when
 * the vocabulary is smaller, the training split's first token. It prints
 * as text through --tokenizer-file, else as ids. */
static int prepare_token_prompt(run *r)
{
    const opts *o = &r->o;
    if (!o->sample && !o->prompt_ids) return 0;
    size_t V = (size_t)o->vocab_size;
    if (o->prompt_ids) {
        if (parse_prompt_ids(r, V)) return 1;
    } else if (o->given & G_PROMPT) { /* text, through the BPE of --tokenizer-file */
        size_t plen = strlen(o->prompt), cap = plen ? plen : 1, n = 0;
        if (!(r->prompt_ids = malloc(cap * sizeof(int32_t))))
            return cli_fail("out of host memory for --prompt");
        if (dp_tokenizer_encode(r->tok, o->prompt, plen, r->prompt_ids, cap, &n, NULL) != DP_OK)
            return cli_dp_fail("--prompt");
        if (n == 0) return cli_fail("--prompt is empty; give some text or drop --prompt");
        for (size_t i = 0; i < n; i++)
            if ((size_t)r->prompt_ids[i] >= V)
                return cli_fail("--prompt encodes to id %d, outside the model's vocabulary [0, "
                                "%zu): --tokenizer-file is not the model's tokenizer",
                                (int)r->prompt_ids[i], V);
        r->prompt_len = n;
    } else {
        if (!(r->prompt_ids = malloc(sizeof(int32_t)))) return cli_fail("out of host memory");
        int32_t eot = r->tok ? dp_tokenizer_eot_id(r->tok) : DP_GPT2_EOT;
        if (eot >= 0 && (size_t)eot < V)
            r->prompt_ids[0] = eot;
        else if (dp_token_data_read(r->data, DP_SPLIT_TRAIN, 0, 1, r->prompt_ids) != DP_OK)
            return cli_dp_fail("prompt token");
        r->prompt_len = 1;
    }
    /* Its text: each id's bytes, or the ids themselves. */
    size_t cap = 0, len = 0;
    for (size_t i = 0; i < r->prompt_len; i++) {
        const char *b = NULL;
        size_t bl = 0;
        if (r->tok && dp_tokenizer_token(r->tok, r->prompt_ids[i], &b, &bl) != DP_OK) bl = 0;
        cap += r->tok ? bl : 12;
    }
    if (!(r->prompt_text = malloc(cap + 1))) return cli_fail("out of host memory");
    for (size_t i = 0; i < r->prompt_len; i++) {
        const char *b = NULL;
        size_t bl = 0;
        if (!r->tok) {
            len += (size_t)snprintf(r->prompt_text + len, cap + 1 - len, "%s%d", i ? " " : "",
                                    (int)r->prompt_ids[i]);
        } else if (dp_tokenizer_token(r->tok, r->prompt_ids[i], &b, &bl) == DP_OK) {
            memcpy(r->prompt_text + len, b, bl);
            len += bl;
        }
    }
    r->prompt_text[len] = '\0';
    return 0;
}

int prepare_prompt(run *r)
{
    return r->is_tokens ? prepare_token_prompt(r) : prepare_text_prompt(r);
}

// --- generation ---------------------------------------------------------------------------

/* The sampling state; freed by sample_free on every path. */
typedef struct sampler_bufs {
    int32_t *ctx;
    float *params, *logits, *probs; /* probs: dp_sample_logits's work */
    void *ws, *dtok, *dparams, *dlogits;
    dp_device *dev;
} sampler_bufs;

static void sample_free(sampler_bufs *b)
{
    if (b->dev) {
        dp_device_free(b->dev, b->ws);
        dp_device_free(b->dev, b->dtok);
        dp_device_free(b->dev, b->dparams);
        dp_device_free(b->dev, b->dlogits);
    }
    free(b->ctx);
    free(b->params);
    free(b->logits);
    free(b->probs);
}

/* The host buffers (the context of prompt + n tokens, a row of logits,
 * the sampler's work) and the root device's (workspace, tokens,
 * parameters, logits) for a model of context T and vocabulary V, whose
 * logits rows are Vp wide (the padded vocabulary; the host keeps a row's
 * first V); b->params holds the parameters, copied to the device. */
static int sample_setup(run *r, sampler_bufs *b, size_t T, size_t V, size_t Vp, size_t n)
{
    size_t cap = 0, pbytes = 0, ctx_bytes = 0, v_bytes = 0, tv_bytes = 0;
    /* --sample is bounded at parse time; checked anyway, as every size from input. */
    if (!dp_size_add(r->prompt_len, n, &cap) || !dp_size_mul(cap, sizeof(int32_t), &ctx_bytes) ||
        !dp_size_mul(r->n_params, sizeof(float), &pbytes) ||
        !dp_size_mul(V, sizeof(float), &v_bytes) || !dp_size_mul(T, Vp, &tv_bytes) ||
        !dp_size_mul(tv_bytes, sizeof(float), &tv_bytes))
        return cli_fail("--sample %zu: the sampling buffers' sizes overflow", n);
    b->ctx = malloc(ctx_bytes);
    b->logits = malloc(v_bytes);
    b->probs = malloc(v_bytes);
    if (!b->ctx || !b->logits || !b->probs)
        return cli_fail("out of host memory for sampling");
    memcpy(b->ctx, r->prompt_ids, r->prompt_len * sizeof(int32_t));
    b->dev = dp_engine_device(r->engine, 0);
    if (dp_device_bind_thread(b->dev) != DP_OK ||
        dp_device_alloc(b->dev, dp_gpt_workspace_bytes(r->gpt, 1, T), &b->ws) != DP_OK ||
        dp_device_alloc(b->dev, T * sizeof(int32_t), &b->dtok) != DP_OK ||
        dp_device_alloc(b->dev, pbytes, &b->dparams) != DP_OK ||
        dp_device_alloc(b->dev, tv_bytes, &b->dlogits) != DP_OK ||
        dp_copy_h2d(b->dev, b->dparams, b->params, pbytes) != DP_OK)
        return cli_dp_fail("sampling setup");
    return 0;
}

/* Prints token id: its bytes, or with ids set the id itself. An id past
 * the table (a padded vocabulary, 50304 > 50257) prints nothing. */
static void print_token(const run *r, int ids, int32_t id)
{
    const char *bytes;
    size_t blen;
    if (ids)
        printf(" %zu", (size_t)id);
    else if (dp_tokenizer_token(r->tok, id, &bytes, &blen) == DP_OK)
        fwrite(bytes, 1, blen, stdout);
}

/* Samples n tokens after the prompt on the root device, printing them;
 * b->params holds the parameters (generate reads them). With ranks every
 * rank samples the same tokens (ranks other than 0 print to /dev/null),
 * so no rank waits for another's sampling; a token's failure on any rank,
 * or a signal, is agreed before the next (go_on). */
static int generate_into(run *r, sampler_bufs *b)
{
    const dp_gpt_config *c = dp_gpt_config_of(r->gpt);
    /* Logits rows are Vp wide; only the first V are the vocabulary's (the
     * padded ones are -inf), and only they are sampled from: never an id
     * >= V. */
    size_t T = c->block_size, V = c->vocab_size, Vp = dp_gpt_padded_vocab(c);
    size_t n = (size_t)r->o.sample;
    if (agree(r, sample_setup(r, b, T, V, Vp, n))) return 1;
    size_t len = r->prompt_len;
    dp_rng rng;
    dp_rng_seed(&rng, r->o.seed ^ 0x5eedULL);
    int ids = r->is_tokens && !r->tok; /* token data without a table: print ids */
    printf("--- sample (%zu tokens, temperature %g, top-k %ld%s) ---\n%s", n, r->o.temperature,
           r->o.top_k, ids ? "; token ids: --tokenizer-file prints text" : "", r->prompt_text);
    int failed = 0;
    for (size_t i = 0; i < n && !failed; i++) {
        int sig = go_on(r, 0);
        if (sig < 0) return 1;
        if (sig) return interrupted(r, sig, "sampling");
        size_t t = len < T ? len : T; /* crop to the last block_size tokens */
        const int32_t *win = b->ctx + len - t;
        if (dp_copy_h2d(b->dev, b->dtok, win, t * sizeof(int32_t)) != DP_OK ||
            dp_gpt_forward(r->gpt, b->dev, b->dparams, b->dtok, 1, t, b->ws, b->dlogits) != DP_OK ||
            dp_copy_d2h(b->dev, b->logits, (float *)b->dlogits + (t - 1) * Vp,
                        V * sizeof(float)) != DP_OK) {
            failed = cli_dp_fail("sampling");
            break;
        }
        int32_t pick = 0;
        dp_status ss = dp_sample_logits(b->logits, V, r->o.temperature, (size_t)r->o.top_k, &rng,
                                         b->probs, &pick);
        /* Logits without a distribution (NaN, +inf, all -inf) print the
         * last id, as this sampler always did before it moved into dp. */
        if (ss == DP_ERR_NON_FINITE) pick = (int32_t)(V - 1);
        else if (ss != DP_OK) failed = cli_dp_fail("sampling");
        b->ctx[len++] = pick;
        if (!failed) print_token(r, ids, pick);
    }
    if (agree(r, failed)) return 1;
    printf("\n---\n");
    return 0;
}

/* With ranks every rank reads the parameters (collective) and samples. */
int generate(run *r)
{
    sampler_bufs b;
    memset(&b, 0, sizeof b);
    size_t pbytes = 0;
    int rc = 0;
    if (!dp_size_mul(r->n_params, sizeof(float), &pbytes) || !(b.params = malloc(pbytes)))
        rc = cli_fail("out of host memory for sampling");
    rc = agree(r, rc);
    dp_status s = DP_OK;
    if (!rc && (s = dp_engine_get_params(r->engine, b.params)) != DP_OK)
        rc = engine_fail(r, s, "sampling setup");
    if (!rc) rc = generate_into(r, &b);
    sample_free(&b);
    return rc;
}
