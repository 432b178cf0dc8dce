/*
 * io/bpe_load.c - loading GPT-2's byte-level BPE: Hugging Face's
 * tokenizer.json, OpenAI's encoder.json + vocab.bpe, or either told by
 * the path (bpe_load). io/bpe.c builds the tables from what is parsed.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "core/error.h"
#include "io/bpe.h"
#include "io/bpe_internal.h"
#include "io/file.h"
#include "io/json_load.h"

#define MAX_FILE_BYTES ((size_t)1 << 30) /* a tokenizer file past 1 GiB is refused */

// ----------------------------------------------------------------------------
// files

static dp_status parse_json(const char *path, const char *what, const char *text, size_t len,
                            json_t **root)
{
    json_error_t jerr;
    *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!*root && dp_json_load_out_of_memory(&jerr))
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "the %s '%s': out of host memory parsing its JSON",
                       what, path);
    if (!*root)
        return DP_FAIL(DP_ERR_FORMAT, "the %s '%s' is not valid JSON: %s (line %d, column %d)",
                       what, path, jerr.text, jerr.line, jerr.column);
    if (!json_is_object(*root)) {
        json_decref(*root);
        *root = NULL;
        return DP_FAIL(DP_ERR_FORMAT, "the %s '%s' is not a JSON object", what, path);
    }
    return DP_OK;
}

// ----------------------------------------------------------------------------
// Hugging Face's tokenizer.json

/* Refuses what would make `tokenizers` encode differently from plain
 * byte-level BPE: a normalizer, another pre-tokenizer, a prefix space,
 * dropout, subword affixes. */
static dp_status check_hf_config(const char *path, json_t *root, json_t *model)
{
    json_t *norm = json_object_get(root, "normalizer");
    if (norm && !json_is_null(norm))
        return DP_FAIL(DP_ERR_UNSUPPORTED,
                       "'%s' has a normalizer, which dp does not apply: only GPT-2's "
                       "byte-level BPE (no normalizer) is supported",
                       path);
    json_t *pre = json_object_get(root, "pre_tokenizer");
    const char *pt = json_string_value(json_object_get(pre, "type"));
    if (!json_is_object(pre) || !pt || strcmp(pt, "ByteLevel") != 0)
        return DP_FAIL(DP_ERR_UNSUPPORTED,
                       "'%s': the pre_tokenizer is %s%s%s, not ByteLevel: only GPT-2's "
                       "byte-level BPE is supported",
                       path, pt ? "'" : "", pt ? pt : "missing or not an object", pt ? "'" : "");
    if (bpe_bool_field(pre, "add_prefix_space"))
        return DP_FAIL(DP_ERR_UNSUPPORTED,
                       "'%s': the ByteLevel pre_tokenizer sets add_prefix_space, which dp does "
                       "not implement (GPT-2's does not)",
                       path);
    json_t *re = json_object_get(pre, "use_regex");
    if (re && json_is_false(re))
        return DP_FAIL(DP_ERR_UNSUPPORTED,
                       "'%s': the ByteLevel pre_tokenizer sets use_regex false; dp always splits "
                       "with GPT-2's expression",
                       path);
    const char *mt = json_string_value(json_object_get(model, "type"));
    if (mt && strcmp(mt, "BPE") != 0)
        return DP_FAIL(DP_ERR_UNSUPPORTED, "'%s': the model is '%s', not BPE", path, mt);
    json_t *drop = json_object_get(model, "dropout");
    if (drop && !json_is_null(drop) && !(json_is_number(drop) && json_number_value(drop) == 0))
        return DP_FAIL(DP_ERR_UNSUPPORTED,
                       "'%s': the model sets BPE dropout, which makes encoding random; dp "
                       "encodes deterministically",
                       path);
    const char *affix[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t k = 0; k < 2; k++) {
        json_t *v = json_object_get(model, affix[k]);
        if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0))
            return DP_FAIL(DP_ERR_UNSUPPORTED, "'%s': the model sets %s, which a byte-level BPE "
                           "does not use",
                           path, affix[k]);
    }
    return DP_OK;
}

static dp_status load_hf_json(const char *path, json_t *root, bpe **out)
{
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model))
        return DP_FAIL(DP_ERR_FORMAT, "'%s' has no \"model\" object: it is not a tokenizers "
                       "tokenizer.json",
                       path);
    DP_TRY(check_hf_config(path, root, model));
    json_t *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    json_t *added = json_object_get(root, "added_tokens");
    if (!json_is_object(vocab))
        return DP_FAIL(DP_ERR_FORMAT, "'%s': model.vocab is %s, not an object of token -> id",
                       path, vocab ? "another type" : "missing");
    if (!json_is_array(merges))
        return DP_FAIL(DP_ERR_FORMAT, "'%s': model.merges is %s, not an array", path,
                       merges ? "another type" : "missing");
    if (added && !json_is_null(added) && !json_is_array(added))
        return DP_FAIL(DP_ERR_FORMAT, "'%s': added_tokens is not an array", path);
    if (json_is_null(added)) added = NULL;

    bpe *b = bpe_new();
    if (!b) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate a tokenizer");
    loader L;
    bpe_loader_init(&L, b, path, path);
    L.vocab = vocab;
    b->ignore_merges = bpe_bool_field(model, "ignore_merges");
    dp_status st = bpe_build_vocab(&L, added);
    size_t nm = json_array_size(merges);
    if (st == DP_OK) st = bpe_merges_alloc(&L, nm);
    for (size_t i = 0; st == DP_OK && i < nm; i++) {
        json_t *m = json_array_get(merges, i);
        char where[48];
        snprintf(where, sizeof where, "merge %zu", i);
        if (json_is_string(m)) {
            // The string form "a b": exactly two tokens around one space.
            const char *s = json_string_value(m);
            const char *sp = strchr(s, ' ');
            if (!sp || sp == s || !sp[1] || strchr(sp + 1, ' ')) {
                st = DP_FAIL(DP_ERR_FORMAT, "'%s': merge %zu '%s' is not two tokens separated by "
                             "one space",
                             path, i, s);
                break;
            }
            size_t la = (size_t)(sp - s);
            char *a = malloc(la + 1);
            if (!a) {
                st = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate a merge");
                break;
            }
            memcpy(a, s, la);
            a[la] = '\0';
            st = bpe_add_merge(&L, i, a, sp + 1, where);
            free(a);
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            st = bpe_add_merge(&L, i, json_string_value(json_array_get(m, 0)),
                           json_string_value(json_array_get(m, 1)), where);
        } else {
            st = DP_FAIL(DP_ERR_FORMAT, "'%s': merge %zu is neither a string \"a b\" nor a pair "
                         "[\"a\", \"b\"]",
                         path, i);
        }
    }
    if (st == DP_OK) st = bpe_finish(&L);
    bpe_loader_free(&L);
    if (st != DP_OK) {
        bpe_destroy(b);
        return st;
    }
    *out = b;
    return DP_OK;
}

dp_status bpe_load_hf(const char *path, bpe **out)
{
    *out = NULL;
    char *text;
    size_t len;
    DP_TRY(dp_file_read(path, "tokenizer file", MAX_FILE_BYTES, &text, &len));
    json_t *root;
    dp_status st = parse_json(path, "tokenizer file", text, len, &root);
    free(text);
    if (st != DP_OK) return st;
    st = load_hf_json(path, root, out);
    json_decref(root);
    return st;
}

// ----------------------------------------------------------------------------
// OpenAI's encoder.json + vocab.bpe

/* Parses vocab.bpe (text[0..len), NUL-terminated, modified in place): an
 * optional "#version" first line, then one "a b" merge a line, by rank. */
static dp_status openai_merges(loader *L, char *text, size_t len)
{
    // Count the lines for the table's size.
    size_t lines = 1;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
    DP_TRY(bpe_merges_alloc(L, lines));
    size_t rank = 0, line = 0;
    char *p = text, *end = text + len;
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *e = nl ? nl : end;
        line++;
        if (memchr(p, '\0', (size_t)(e - p)))
            return DP_FAIL(DP_ERR_FORMAT, "'%s': line %zu holds a NUL byte, which is no byte of a "
                           "merge's tokens; is this GPT-2's vocab.bpe (text)?",
                           L->merges_path, line);
        if (e > p && e[-1] == '\r') e[-1] = '\0'; // \r\n line ends
        *e = '\0';
        if (line == 1 && strncmp(p, "#version", 8) == 0) {
            p = e + 1;
            continue;
        }
        char *sp = strchr(p, ' ');
        if (!sp || sp == p || !sp[1] || strchr(sp + 1, ' ')) {
            return DP_FAIL(DP_ERR_FORMAT, "'%s': line %zu '%s' is not two tokens separated by "
                           "one space",
                           L->merges_path, line, p);
        }
        *sp = '\0';
        char where[48];
        snprintf(where, sizeof where, "line %zu", line);
        DP_TRY(bpe_add_merge(L, rank++, p, sp + 1, where));
        p = e + 1;
    }
    return DP_OK;
}

static dp_status load_openai_json(const char *enc_path, json_t *vocab, const char *bpe_path,
                                  bpe **out)
{
    char *text;
    size_t len;
    DP_TRY(dp_file_read(bpe_path, "merges file (vocab.bpe)", MAX_FILE_BYTES, &text, &len));
    bpe *b = bpe_new();
    if (!b) {
        free(text);
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate a tokenizer");
    }
    loader L;
    bpe_loader_init(&L, b, enc_path, bpe_path);
    L.vocab = vocab;
    dp_status st = bpe_build_vocab(&L, NULL);
    if (st == DP_OK) st = openai_merges(&L, text, len);
    // <|endoftext|> is the one special token, as tiktoken's "gpt2" encoding has it.
    if (st == DP_OK && b->eot >= 0) {
        b->specials = malloc(sizeof *b->specials);
        if (!b->specials) st = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate a token");
        else {
            b->specials[0] = (special){b->tok_off[b->eot], b->tok_len[b->eot], b->eot};
            b->n_specials = 1;
        }
    }
    if (st == DP_OK) st = bpe_finish(&L);
    bpe_loader_free(&L);
    free(text);
    if (st != DP_OK) {
        bpe_destroy(b);
        return st;
    }
    *out = b;
    return DP_OK;
}

/* tokenizers' tokenizer.json has a "model" object; in OpenAI's
 * encoder.json "model" may be a token (an English word), with an integer. */
static int is_hf_tokenizer(const json_t *root)
{
    return json_is_object(json_object_get(root, "model"));
}

dp_status bpe_load_openai(const char *encoder_json, const char *vocab_bpe, bpe **out)
{
    *out = NULL;
    char *text;
    size_t len;
    const char *what = "encoder file (encoder.json)";
    DP_TRY(dp_file_read(encoder_json, what, MAX_FILE_BYTES, &text, &len));
    json_t *root;
    dp_status st = parse_json(encoder_json, what, text, len, &root);
    free(text);
    if (st != DP_OK) return st;
    if (is_hf_tokenizer(root))
        st = DP_FAIL(DP_ERR_FORMAT,
                     "'%s' is a tokenizers tokenizer.json (it has a \"model\" object), not "
                     "OpenAI's encoder.json: it holds its merges, so load it alone, without "
                     "'%s'", encoder_json, vocab_bpe);
    else
        st = load_openai_json(encoder_json, root, vocab_bpe, out);
    json_decref(root);
    return st;
}

/* dir + "/" + name, malloc'd. */
static char *join_path(const char *dir, size_t dlen, const char *name)
{
    size_t n = strlen(name);
    char *p = malloc(dlen + 1 + n + 1);
    if (!p) return NULL;
    memcpy(p, dir, dlen);
    p[dlen] = '/';
    memcpy(p + dlen + 1, name, n + 1);
    return p;
}

static int is_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

dp_status bpe_load(const char *path, bpe **out)
{
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return DP_FAIL(DP_ERR_IO, "cannot read the tokenizer '%s': %s", path, strerror(errno));
    dp_status st;
    if (S_ISDIR(sb.st_mode)) {
        // A model's directory: tokenizer.json, else encoder.json + vocab.bpe.
        size_t dl = strlen(path);
        char *tj = join_path(path, dl, "tokenizer.json");
        char *ej = join_path(path, dl, "encoder.json");
        char *vb = join_path(path, dl, "vocab.bpe");
        if (!tj || !ej || !vb) st = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate a path");
        else if (is_file(tj)) st = bpe_load_hf(tj, out);
        else if (is_file(ej) && is_file(vb)) st = bpe_load_openai(ej, vb, out);
        else
            st = DP_FAIL(DP_ERR_FORMAT, "the directory '%s' holds neither tokenizer.json nor "
                         "encoder.json and vocab.bpe",
                         path);
        free(tj);
        free(ej);
        free(vb);
        return st;
    }
    char *text;
    size_t len;
    DP_TRY(dp_file_read(path, "tokenizer file", MAX_FILE_BYTES, &text, &len));
    json_t *root;
    st = parse_json(path, "tokenizer file", text, len, &root);
    free(text);
    if (st != DP_OK) return st;
    if (is_hf_tokenizer(root)) {
        st = load_hf_json(path, root, out);
    } else {
        // OpenAI's encoder.json (token -> id): its merges are vocab.bpe beside it.
        const char *slash = strrchr(path, '/');
        size_t dl = slash ? (size_t)(slash - path) : 1;
        char *vb = join_path(slash ? path : ".", dl, "vocab.bpe");
        if (!vb) st = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate a path");
        else if (!is_file(vb))
            st = DP_FAIL(DP_ERR_FORMAT,
                         "'%s' has no \"model\" object (a tokenizers tokenizer.json) and no "
                         "vocab.bpe beside it ('%s'), as OpenAI's encoder.json has",
                         path, vb);
        else
            st = load_openai_json(path, root, vb, out);
        free(vb);
    }
    json_decref(root);
    return st;
}
