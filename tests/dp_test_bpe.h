/*
 * tests/dp_test_bpe.h - the byte-level BPE fixture of tests/data/bpe/
 * (made by tests/gen_bpe_reference.py with Hugging Face's `tokenizers`):
 * its paths, its reference strings and ids, and encoding helpers.
 * Include after dp_test.h; link jansson.
 */
#ifndef DP_TEST_BPE_H
#define DP_TEST_BPE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "dp/tokenizer.h"

/* The fixture: 657 ids, <|endoftext|> = 0 (the trainer puts special
 * tokens first), 400 merges. */
#define BPE_V 657
#define BPE_EOT 0

/* tests/data/bpe/<name> (a static buffer per call site's use: copy it). */
static inline const char *bpe_data(const char *name)
{
    static char buf[4][4096];
    static int k;
    char *p = buf[k++ % 4];
    const char *src = __FILE__, *slash = strrchr(src, '/');
    size_t dir = slash ? (size_t)(slash - src + 1) : 0;
    snprintf(p, 4096, "%.*sdata/bpe%s%s", (int)dir, src, *name ? "/" : "", name);
    return p;
}

typedef struct bpe_ref {
    const char *text; /* owned by the JSON */
    size_t len;
    int32_t *ids;
    size_t n;
} bpe_ref;

/* reference.json's strings and ids; *root owns the texts (json_decref it,
 * free each ids and the array). */
static inline bpe_ref *dp_test_bpe_refs(size_t *count, json_t **root)
{
    json_error_t e;
    *root = json_load_file(bpe_data("reference.json"), JSON_ALLOW_NUL, &e);
    cr_assert_not_null(*root, "cannot read %s: %s; regenerate it with "
                              "python3 tests/gen_bpe_reference.py",
                       bpe_data("reference.json"), e.text);
    size_t n = json_array_size(*root);
    cr_assert_gt(n, 50);
    bpe_ref *r = calloc(n, sizeof *r);
    cr_assert_not_null(r);
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(*root, i), *t = json_object_get(x, "text"),
               *ids = json_object_get(x, "ids");
        cr_assert(json_is_string(t) && json_is_array(ids), "reference.json entry %zu", i);
        r[i].text = json_string_value(t);
        r[i].len = json_string_length(t);
        r[i].n = json_array_size(ids);
        r[i].ids = malloc((r[i].n ? r[i].n : 1) * sizeof *r[i].ids);
        cr_assert_not_null(r[i].ids);
        for (size_t k = 0; k < r[i].n; k++)
            r[i].ids[k] = (int32_t)json_integer_value(json_array_get(ids, k));
    }
    *count = n;
    return r;
}

static inline void dp_test_bpe_refs_free(bpe_ref *r, size_t n, json_t *root)
{
    for (size_t i = 0; i < n; i++) free(r[i].ids);
    free(r);
    json_decref(root);
}

/* Encodes text[0..len) (special tokens recognised, or not when ordinary)
 * and returns the ids (malloc'd, *n of them). */
static inline int32_t *bpe_encode_all(const dp_tokenizer *t, const char *text, size_t len,
                                      int ordinary, size_t *n)
{
    int32_t *ids = malloc((len ? len : 1) * sizeof *ids);
    cr_assert_not_null(ids);
    dp_status st = ordinary ? dp_tokenizer_encode_ordinary(t, text, len, ids, len, n)
                            : dp_tokenizer_encode(t, text, len, ids, len, n, NULL);
    cr_assert_eq(st, DP_OK, "encoding %zu bytes: %s", len, dp_last_error());
    return ids;
}

/* The reference strings (with plain, those without '<', so no special
 * token), each followed by sep and a letter (sep 0: nothing), reps times
 * or until cap bytes; *len bytes (malloc'd). */
static inline char *dp_test_bpe_joined_refs(char sep, int reps, int plain, size_t cap, size_t *len)
{
    json_t *root;
    size_t count;
    bpe_ref *r = dp_test_bpe_refs(&count, &root);
    size_t n = 0;
    char *text = malloc(cap);
    cr_assert_not_null(text);
    for (int rep = 0; rep < reps; rep++)
        for (size_t i = 0; i < count; i++) {
            if (plain && memchr(r[i].text, '<', r[i].len)) continue;
            if (n + r[i].len + 2 > cap) {
                rep = reps;
                break;
            }
            memcpy(text + n, r[i].text, r[i].len);
            n += r[i].len;
            if (sep) {
                text[n++] = sep;
                text[n++] = (char)('A' + (i + (size_t)rep) % 26);
            }
        }
    dp_test_bpe_refs_free(r, count, root);
    *len = n;
    return text;
}

#endif /* DP_TEST_BPE_H */
