/*
 * examples/lm_train/export.c - GPT-2 in and out (dp/gpt_hf.h): the model
 * and weights of --init-from (Hugging Face's layout or a dp checkpoint's
 * weights), the shape options held to them, and --export-hf's directory
 * for transformers, checked up front and written at the end.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lm_train.h"

char *export_file(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* A model.safetensors dp exported (its producer metadata), which a new
 * export may replace: another model's weights (a download) are kept. */
static int is_dp_export(const char *path) { return cli_st_has_metadata(path, "producer", "dp"); }

/* A GPT-2 config.json (what an export writes beside the weights). */
static int is_gpt2_config(const char *path)
{
    json_t *j = json_load_file(path, 0, NULL);
    json_t *type = j ? json_object_get(j, "model_type") : NULL;
    int ours = type && json_is_string(type) && strcmp(json_string_value(type), "gpt2") == 0;
    json_decref(j);
    return ours;
}

int check_export_replace(const char *model, const char *config)
{
    return cli_check_replace("--export-hf", model, is_dp_export,
                             "the weights of an earlier dp export") ||
           cli_check_replace("--export-hf", config, is_gpt2_config, "a GPT-2 config.json");
}

/* Both files of an existing --export-hf directory can be written (the
 * atomic writer's checks: the directory writable, the names' temporary
 * files within the limit, no device or FIFO in their place). */
static int check_export_files(const char *dir)
{
    static const char *const names[] = {"model.safetensors", "config.json"};
    int rc = 0;
    for (int i = 0; i < 2 && !rc; i++) {
        char *p = export_file(dir, names[i]);
        rc = p ? cli_check_output("--export-hf", p) : cli_fail("out of host memory");
        free(p);
    }
    return rc;
}

int check_export_path(const char *dir)
{
    struct stat sb;
    if (!*dir) return cli_fail("--export-hf needs a directory name");
    if (stat(dir, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode))
            return cli_fail("--export-hf %s exists and is not a directory; give a directory to "
                            "write model.safetensors and config.json into", dir);
        return check_export_files(dir);
    }
    if (errno != ENOENT) return cli_fail("--export-hf %s: %s", dir, strerror(errno));
    if (lstat(dir, &sb) == 0) /* a symbolic link to nothing: mkdir would fail at the end */
        return cli_fail("--export-hf %s is a symbolic link to a path that does not exist; give "
                        "a directory, or create its target", dir);
    /* It will be made at the end: its parent must be there now. */
    char *parent = strdup(dir);
    if (!parent) return cli_fail("out of host memory");
    char *slash = strrchr(parent, '/');
    while (slash && slash > parent && slash[1] == '\0') { /* "a/b/" */
        *slash = '\0';
        slash = strrchr(parent, '/');
    }
    if (slash) slash[slash == parent] = '\0'; /* "/x" -> "/" */
    else strcpy(parent, ".");
    int bad = stat(parent, &sb) != 0 || !S_ISDIR(sb.st_mode);
    if (bad)
        cli_fail("--export-hf %s: its parent directory %s does not exist; create it or give "
                 "another directory", dir, parent);
    else if ((bad = access(parent, W_OK | X_OK) != 0))
        cli_fail("--export-hf %s: cannot create it: its parent directory %s is not writable "
                 "(%s); give another directory", dir, parent, strerror(errno));
    free(parent);
    return bad;
}

/* A shape option given on the command line must be the weights' own. */
static int held(const run *r, int flag, const char *name, long given, size_t has)
{
    if (!(r->o.given & flag) || (size_t)given == has) return 0;
    return cli_fail("--init-from %s holds a model with %s %zu, but %s %ld was given; drop %s "
                    "or match it", r->o.init_from, name, has, name, given, name);
}

/* Text --data from a dp checkpoint's weights: the checkpoint's own
 * tokenizer, as --resume takes it. A tokenizer built from --data would
 * give the trained rows to other characters whenever the vocabulary
 * merely has the same size (a silent wrong model). Weights without one
 * (Hugging Face's) keep the vocabulary check of make_model. */
static int take_tokenizer(run *r)
{
    opts *o = &r->o;
    dp_st_file *f = NULL;
    if (dp_st_open(o->init_from, &f) != DP_OK) return 0; /* a directory: Hugging Face's */
    const char *text = dp_st_metadata(f, "tokenizer");
    int rc = 0;
    if (text && dp_tokenizer_parse(text, &r->tok) != DP_OK)
        rc = cli_dp_fail("--init-from's tokenizer");
    dp_st_close(f);
    if (rc || !r->tok) return rc;
    const char *kind = dp_tokenizer_kind_name(dp_tokenizer_kind_of(r->tok));
    if ((o->given & G_TOK) && strcmp(o->tokenizer, kind) != 0)
        return cli_fail("--init-from %s uses the %s tokenizer, which differs from --tokenizer %s; "
                        "drop --tokenizer or match it", o->init_from, kind, o->tokenizer);
    o->tokenizer = kind;
    return 0;
}

int load_pretrained(run *r)
{
    opts *o = &r->o;
    size_t heads = (o->given & G_HEADS) ? (size_t)o->heads : 0;
    if (dp_gpt_init_from(o->init_from, heads, &r->gpt, &r->init_params) != DP_OK) {
        /* the library's fixes name its arguments; these are the options */
        if (!heads && strstr(dp_last_error(), "give n_head"))
            return cli_fail("--init-from: %s (--heads N)", dp_last_error());
        const char *says = strstr(dp_last_error(), "which says ");
        if (heads && says && strstr(dp_last_error(), "leave n_head out"))
            return cli_fail("--init-from %s holds a model with %lld heads, but --heads %zu was "
                            "given; drop --heads or match it", o->init_from,
                            strtoll(says + strlen("which says "), NULL, 10), heads);
        return cli_dp_fail("--init-from");
    }
    if (!r->is_tokens && take_tokenizer(r)) return 1;
    const dp_gpt_config *c = dp_gpt_config_of(r->gpt);
    if (held(r, G_LAYERS, "--layers", o->layers, c->n_layer) ||
        held(r, G_DIM, "--dim", o->dim, c->n_embd) ||
        held(r, G_CTX, "--context", o->context, c->block_size) ||
        held(r, G_VOCAB, "--vocab-size", o->vocab_size, c->vocab_size))
        return 1;
    o->vocab_size = (long)c->vocab_size;
    return adopt_shape(o, c, "the model's ");
}

int export_hf(run *r)
{
    if (!r->o.export_hf) return 0;
    float *params = malloc(r->n_params * sizeof *params);
    int rc = params ? 0 : cli_fail("out of host memory for --export-hf");
    rc = agree(r, rc);
    dp_status s = DP_OK;
    /* Every rank reads the parameters (collective); rank 0 writes. */
    if (!rc && (s = dp_engine_get_params(r->engine, params)) != DP_OK)
        rc = engine_fail(r, s, "--export-hf");
    int all_here = !rc;
    if (!rc && r->rk.rank == 0) {
        if (dp_gpt_export_hf(r->o.export_hf, r->gpt, params) != DP_OK)
            rc = cli_dp_fail("--export-hf");
        else
            printf("exported to %s: model.safetensors and config.json, for transformers' "
                   "GPT2LMHeadModel.from_pretrained\n", r->o.export_hf);
    }
    if (all_here) rc = agree(r, rc);
    free(params);
    return rc;
}
