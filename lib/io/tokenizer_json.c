/*
 * io/tokenizer_json.c - the JSON form (jansson) of char and word
 * tokenizers, for checkpoint metadata: dp_tokenizer_serialize and
 * dp_tokenizer_parse.
 */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/error.h"
#include "dp/tokenizer.h"
#include "io/tokenizer_internal.h"
#include "io/json_load.h"

#define TOKENIZER_VERSION 1

// ----------------------------------------------------------------------------
// JSON form

dp_status dp_tokenizer_serialize(const dp_tokenizer *tok, char **json)
{
    if (!tok || !json) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "tok or json is NULL");
    *json = NULL;
    if (tok->kind == DP_TOKENIZER_LLMC)
        return DP_FAIL(DP_ERR_UNSUPPORTED,
                       "the llm.c token table has no JSON form: keep its file and load it "
                       "again with dp_tokenizer_load_llmc");
    if (tok->kind == DP_TOKENIZER_BPE)
        return DP_FAIL(DP_ERR_UNSUPPORTED,
                       "a byte-level BPE has no JSON form: keep its tokenizer.json (or "
                       "encoder.json and vocab.bpe) and load it again with "
                       "dp_tokenizer_load_bpe");
    size_t first = tok->kind == DP_TOKENIZER_WORD ? 1 : 0;
    json_t *root = json_object();
    json_t *bytes = json_array();
    json_t *words = tok->kind == DP_TOKENIZER_WORD ? json_array() : NULL;
    int bad = !root || !bytes || (tok->kind == DP_TOKENIZER_WORD && !words);
    size_t id = first;
    for (; !bad && id < first + tok->n_bytes; id++) {
        json_int_t b = (unsigned char)tok->pool[tok->tok_off[id]];
        bad |= json_array_append_new(bytes, json_integer(b)) != 0;
    }
    for (; !bad && words && id < tok->vocab; id++) {
        json_t *w = json_stringn(tok->pool + tok->tok_off[id], tok->tok_len[id]);
        bad |= json_array_append_new(words, w) != 0;
    }
    if (!bad) {
        const char *kind = dp_tokenizer_kind_name(tok->kind);
        bad |= json_object_set_new(root, "type", json_string(kind)) != 0;
        bad |= json_object_set_new(root, "version", json_integer(TOKENIZER_VERSION)) != 0;
        bad |= json_object_set(root, "bytes", bytes) != 0;
        if (words) bad |= json_object_set(root, "words", words) != 0;
    }
    size_t flags = JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII;
    char *text = bad ? NULL : json_dumps(root, flags);
    json_decref(bytes);
    json_decref(words);
    json_decref(root);
    if (!text) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot serialize the tokenizer");
    *json = text;
    return DP_OK;
}

static int cmp_word_ptr(const void *a, const void *b)
{
    const char *x = *(const char *const *)a, *y = *(const char *const *)b;
    return strcmp(x, y);
}

dp_status dp_tokenizer_parse(const char *json, dp_tokenizer **out)
{
    if (!json || !out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "json or out is NULL");
    *out = NULL;
    json_error_t jerr;
    json_t *root = json_loads(json, JSON_REJECT_DUPLICATES, &jerr);
    if (!root && dp_json_load_out_of_memory(&jerr))
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "out of host memory parsing the tokenizer JSON");
    if (!root)
        return DP_FAIL(DP_ERR_FORMAT, "tokenizer JSON is malformed: %s (line %d, column %d)",
                       jerr.text, jerr.line, jerr.column);
    dp_status st = DP_OK;
    const char **wp = NULL;
    const char **sorted = NULL;
    size_t *wl = NULL;
    if (!json_is_object(root)) {
        st = DP_FAIL(DP_ERR_FORMAT, "tokenizer JSON is not an object");
        goto out;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val)
    {
        if (strcmp(key, "type") && strcmp(key, "version") && strcmp(key, "bytes") &&
            strcmp(key, "words")) {
            st = DP_FAIL(DP_ERR_FORMAT, "tokenizer JSON has an unknown key '%s'", key);
            goto out;
        }
    }
    json_t *jt = json_object_get(root, "type"), *jv = json_object_get(root, "version");
    json_t *jb = json_object_get(root, "bytes"), *jw = json_object_get(root, "words");
    dp_tokenizer_kind kind;
    if (!json_is_string(jt) || dp_tokenizer_kind_parse(json_string_value(jt), &kind) != DP_OK) {
        st = DP_FAIL(DP_ERR_FORMAT, "tokenizer JSON: \"type\" must be \"char\" or \"word\"");
        goto out;
    }
    if (!json_is_integer(jv) || json_integer_value(jv) != TOKENIZER_VERSION) {
        st = DP_FAIL(DP_ERR_FORMAT, "tokenizer JSON: \"version\" must be %d (this build of dp)",
                     TOKENIZER_VERSION);
        goto out;
    }
    if (!json_is_array(jb) || json_array_size(jb) > 256) {
        st = DP_FAIL(DP_ERR_FORMAT, "tokenizer JSON: \"bytes\" must be an array of at most 256 "
                     "integers");
        goto out;
    }
    unsigned char bytes[256];
    size_t nb = json_array_size(jb);
    for (size_t i = 0; i < nb; i++) {
        json_t *e = json_array_get(jb, i);
        json_int_t v = json_is_integer(e) ? json_integer_value(e) : -1;
        if (v < 0 || v > 255 || (i > 0 && v <= bytes[i - 1])) {
            st = DP_FAIL(DP_ERR_FORMAT,
                         "tokenizer JSON: bytes[%zu] is not an integer in 0..255 greater than "
                         "the previous one",
                         i);
            goto out;
        }
        if (kind == DP_TOKENIZER_WORD && tok_is_word_byte((unsigned char)v)) {
            st = DP_FAIL(DP_ERR_FORMAT,
                         "tokenizer JSON: bytes[%zu] = %d is a word character, not a separator",
                         i, (int)v);
            goto out;
        }
        bytes[i] = (unsigned char)v;
    }
    size_t nw = 0;
    if (kind == DP_TOKENIZER_CHAR) {
        if (jw) {
            st = DP_FAIL(DP_ERR_FORMAT, "tokenizer JSON: a char tokenizer has no \"words\"");
            goto out;
        }
        if (nb == 0) {
            st = DP_FAIL(DP_ERR_FORMAT, "tokenizer JSON: a char tokenizer needs at least one byte");
            goto out;
        }
    } else {
        if (!json_is_array(jw)) {
            st = DP_FAIL(DP_ERR_FORMAT, "tokenizer JSON: \"words\" must be an array of strings");
            goto out;
        }
        nw = json_array_size(jw);
        if (nw > (size_t)INT32_MAX - 257) {
            st = DP_FAIL(DP_ERR_FORMAT, "tokenizer JSON: too many words (%zu)", nw);
            goto out;
        }
        wp = malloc((nw ? nw : 1) * sizeof *wp);
        sorted = malloc((nw ? nw : 1) * sizeof *sorted);
        wl = malloc((nw ? nw : 1) * sizeof *wl);
        if (!wp || !wl || !sorted) {
            st = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate the word list");
            goto out;
        }
        for (size_t i = 0; i < nw; i++) {
            json_t *e = json_array_get(jw, i);
            const char *s = json_is_string(e) ? json_string_value(e) : NULL;
            size_t l = s ? json_string_length(e) : 0;
            int ok = s && l > 0;
            for (size_t c = 0; ok && c < l; c++) ok = tok_is_word_byte((unsigned char)s[c]);
            if (!ok) {
                st = DP_FAIL(DP_ERR_FORMAT,
                             "tokenizer JSON: words[%zu] is not a non-empty string of letters, "
                             "digits and apostrophes",
                             i);
                goto out;
            }
            wp[i] = sorted[i] = s;
            wl[i] = l;
        }
        // Word strings have no NULs (checked above), so strcmp finds duplicates.
        qsort(sorted, nw, sizeof *sorted, cmp_word_ptr);
        for (size_t i = 1; i < nw; i++) {
            if (strcmp(sorted[i], sorted[i - 1]) == 0) {
                st = DP_FAIL(DP_ERR_FORMAT, "tokenizer JSON: word '%s' appears twice", sorted[i]);
                goto out;
            }
        }
        if (nb + nw == 0) {
            st = DP_FAIL(DP_ERR_FORMAT, "tokenizer JSON: a word tokenizer has no bytes and no "
                         "words");
            goto out;
        }
    }
    st = tok_create(kind, bytes, nb, wp, wl, nw, out);
out:
    free(wp);
    free(wl);
    free(sorted);
    json_decref(root);
    return st;
}
