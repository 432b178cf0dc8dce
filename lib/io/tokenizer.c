/*
 * io/tokenizer.c - char- and word-level tokenizers: building from a corpus,
 * encode/decode, and a JSON form (jansson) for checkpoint metadata; and
 * llm.c's GPT-2 token table (gpt2_tokenizer.bin), loaded to decode only;
 * and the dispatch of every dp_tokenizer call to GPT-2's byte-level BPE
 * (io/bpe.c) for that kind.
 *
 * char, word and llmc share one representation: a table of token byte
 * strings by id, a byte -> id map for single-byte tokens (char, word), and
 * (word) a hash from word bytes to id. A bpe keeps its own tables.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "core/error.h"
#include "dp/checked.h"
#include "dp/tokenizer.h"
#include "io/bpe.h"
#include "io/hash.h"

#define UNK_TEXT "<unk>"
#define TOKENIZER_VERSION 1

struct dp_tokenizer {
    dp_tokenizer_kind kind;
    int32_t eot;           // llmc: the end-of-text id; else -1
    size_t vocab;          // V
    size_t n_bytes;        // single-byte tokens (char: all; word: separators after <unk>)
    int32_t byte_id[256];  // single-byte token id per byte, -1 if none
    size_t *tok_off;       // (V) offset of each token's bytes in pool
    size_t *tok_len;       // (V)
    char *pool;
    int32_t *word_slot;    // word -> id open-addressing table (word kind), -1 empty
    size_t word_cap;       // power of two
    bpe *bpe;              // the bpe kind's tables (the ones above unused)
};

// ----------------------------------------------------------------------------
// helpers

static int is_word_byte(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '\'';
}

dp_status dp_tokenizer_kind_parse(const char *text, dp_tokenizer_kind *out)
{
    if (!text || !out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "text or out is NULL");
    if (strcmp(text, "char") == 0) *out = DP_TOKENIZER_CHAR;
    else if (strcmp(text, "word") == 0) *out = DP_TOKENIZER_WORD;
    else
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "unknown tokenizer '%s': use 'char' or 'word'",
                       text);
    return DP_OK;
}

const char *dp_tokenizer_kind_name(dp_tokenizer_kind kind)
{
    switch (kind) {
    case DP_TOKENIZER_CHAR: return "char";
    case DP_TOKENIZER_WORD: return "word";
    case DP_TOKENIZER_LLMC: return "llmc";
    case DP_TOKENIZER_BPE: return "bpe";
    default: return "invalid tokenizer kind";
    }
}

void dp_tokenizer_destroy(dp_tokenizer *tok)
{
    if (!tok) return;
    free(tok->tok_off);
    free(tok->tok_len);
    free(tok->pool);
    free(tok->word_slot);
    bpe_destroy(tok->bpe);
    free(tok);
}

/*
 * The common constructor. For char: bytes[0..nbytes) ascending are the
 * whole vocabulary. For word: id 0 is <unk>, then bytes (separators), then
 * words[i] = (wp[i], wl[i]) in id order. Inputs are already validated.
 */
static dp_status tok_create(dp_tokenizer_kind kind, const unsigned char *bytes, size_t nbytes,
                            const char *const *wp, const size_t *wl, size_t nwords,
                            dp_tokenizer **out)
{
    *out = NULL;
    dp_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate a tokenizer");
    t->kind = kind;
    t->eot = -1;
    size_t unk = kind == DP_TOKENIZER_WORD ? 1 : 0;
    t->vocab = unk + nbytes + nwords;
    t->n_bytes = nbytes;
    size_t pool = unk ? strlen(UNK_TEXT) : 0;
    pool += nbytes;
    for (size_t i = 0; i < nwords; i++) pool += wl[i];
    t->tok_off = malloc(t->vocab * sizeof *t->tok_off);
    t->tok_len = malloc(t->vocab * sizeof *t->tok_len);
    t->pool = malloc(pool ? pool : 1);
    if (!t->tok_off || !t->tok_len || !t->pool) goto oom;
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    size_t k = 0, id = 0;
    if (unk) {
        memcpy(t->pool, UNK_TEXT, strlen(UNK_TEXT));
        t->tok_off[0] = 0;
        t->tok_len[0] = strlen(UNK_TEXT);
        k = strlen(UNK_TEXT);
        id = 1;
    }
    for (size_t i = 0; i < nbytes; i++, id++) {
        t->pool[k] = (char)bytes[i];
        t->tok_off[id] = k++;
        t->tok_len[id] = 1;
        t->byte_id[bytes[i]] = (int32_t)id;
    }
    if (kind == DP_TOKENIZER_WORD) {
        t->word_cap = io_pow2_at_least(2 * nwords + 1);
        t->word_slot = malloc(t->word_cap * sizeof *t->word_slot);
        if (!t->word_slot) goto oom;
        for (size_t i = 0; i < t->word_cap; i++) t->word_slot[i] = -1;
        for (size_t i = 0; i < nwords; i++, id++) {
            memcpy(t->pool + k, wp[i], wl[i]);
            t->tok_off[id] = k;
            t->tok_len[id] = wl[i];
            k += wl[i];
            size_t s = (size_t)io_hash_bytes(wp[i], wl[i]) & (t->word_cap - 1);
            while (t->word_slot[s] >= 0) s = (s + 1) & (t->word_cap - 1);
            t->word_slot[s] = (int32_t)id;
        }
    }
    *out = t;
    return DP_OK;
oom:
    dp_tokenizer_destroy(t);
    return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate the tokenizer tables");
}

// Id of word p[0..n), or -1.
static int32_t word_lookup(const dp_tokenizer *t, const char *p, size_t n)
{
    size_t s = (size_t)io_hash_bytes(p, n) & (t->word_cap - 1);
    for (;;) {
        int32_t id = t->word_slot[s];
        if (id < 0) return -1;
        if (t->tok_len[id] == n && memcmp(t->pool + t->tok_off[id], p, n) == 0) return id;
        s = (s + 1) & (t->word_cap - 1);
    }
}

// ----------------------------------------------------------------------------
// building

dp_status dp_tokenizer_create_char(const char *text, size_t len, dp_tokenizer **out)
{
    if (!out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    if (!text && len) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "text is NULL");
    if (len == 0)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "the corpus is empty: a char tokenizer needs at least one byte of text");
    unsigned char seen[256] = {0};
    for (size_t i = 0; i < len; i++) seen[(unsigned char)text[i]] = 1;
    unsigned char bytes[256];
    size_t n = 0;
    for (int b = 0; b < 256; b++)
        if (seen[b]) bytes[n++] = (unsigned char)b;
    return tok_create(DP_TOKENIZER_CHAR, bytes, n, NULL, NULL, 0, out);
}

typedef struct word_count {
    const char *p;
    size_t len;
    size_t count;
} word_count;

static int cmp_word_count(const void *a, const void *b)
{
    const word_count *x = a, *y = b;
    if (x->count != y->count) return x->count > y->count ? -1 : 1;
    size_t m = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->p, y->p, m);
    if (c) return c;
    return x->len < y->len ? -1 : x->len > y->len ? 1 : 0;
}

dp_status dp_tokenizer_create_word(const char *text, size_t len, size_t vocab_size,
                                  dp_tokenizer **out)
{
    if (!out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    if (!text && len) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "text is NULL");
    if (len == 0)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "the corpus is empty: a word tokenizer needs at least one byte of text");

    // Count words in an open-addressing table of (word, count), doubling at half load.
    size_t cap = 1024, used = 0;
    word_count *tab = calloc(cap, sizeof *tab);
    if (!tab) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate the word counts");
    unsigned char seen[256] = {0};
    size_t i = 0;
    while (i < len) {
        unsigned char c = (unsigned char)text[i];
        if (!is_word_byte(c)) {
            seen[c] = 1;
            i++;
            continue;
        }
        size_t j = i;
        while (j < len && is_word_byte((unsigned char)text[j])) j++;
        const char *p = text + i;
        size_t n = j - i;
        i = j;
        size_t s = (size_t)io_hash_bytes(p, n) & (cap - 1);
        while (tab[s].p && !(tab[s].len == n && memcmp(tab[s].p, p, n) == 0))
            s = (s + 1) & (cap - 1);
        if (tab[s].p) {
            tab[s].count++;
            continue;
        }
        tab[s].p = p;
        tab[s].len = n;
        tab[s].count = 1;
        if (++used * 2 > cap) {
            size_t ncap = cap * 2;
            word_count *nt = calloc(ncap, sizeof *nt);
            if (!nt) {
                free(tab);
                return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot grow the word counts");
            }
            for (size_t k = 0; k < cap; k++) {
                if (!tab[k].p) continue;
                size_t q = (size_t)io_hash_bytes(tab[k].p, tab[k].len) & (ncap - 1);
                while (nt[q].p) q = (q + 1) & (ncap - 1);
                nt[q] = tab[k];
            }
            free(tab);
            tab = nt;
            cap = ncap;
        }
    }
    unsigned char bytes[256];
    size_t nsep = 0;
    for (int b = 0; b < 256; b++)
        if (seen[b]) bytes[nsep++] = (unsigned char)b;
    size_t need = 1 + nsep + (used ? 1 : 0);
    if (vocab_size < need) {
        free(tab);
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "vocab_size %zu is too small: the corpus has %zu distinct separator "
                       "bytes, which with <unk>%s need at least %zu entries",
                       vocab_size, nsep, used ? " and one word" : "", need);
    }
    // Compact the table, sort by count desc then bytes asc, keep the top.
    size_t nw = 0;
    for (size_t k = 0; k < cap; k++)
        if (tab[k].p) tab[nw++] = tab[k];
    qsort(tab, nw, sizeof *tab, cmp_word_count);
    size_t keep = vocab_size - 1 - nsep;
    if (keep > nw) keep = nw;
    const char **wp = malloc((keep ? keep : 1) * sizeof *wp);
    size_t *wl = malloc((keep ? keep : 1) * sizeof *wl);
    dp_status st;
    if (!wp || !wl) {
        st = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate the word list");
    } else {
        for (size_t k = 0; k < keep; k++) {
            wp[k] = tab[k].p;
            wl[k] = tab[k].len;
        }
        st = tok_create(DP_TOKENIZER_WORD, bytes, nsep, wp, wl, keep, out);
    }
    free(wp);
    free(wl);
    free(tab);
    return st;
}

// ----------------------------------------------------------------------------
// GPT-2's byte-level BPE (io/bpe.c)

static dp_status bpe_wrap(dp_status st, bpe *b, dp_tokenizer **out)
{
    if (st != DP_OK) return st;
    dp_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        bpe_destroy(b);
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate a tokenizer");
    }
    t->kind = DP_TOKENIZER_BPE;
    t->bpe = b;
    t->vocab = bpe_vocab_size(b);
    t->eot = bpe_eot(b);
    for (int c = 0; c < 256; c++) t->byte_id[c] = -1;
    *out = t;
    return DP_OK;
}

dp_status dp_tokenizer_load_bpe(const char *path, dp_tokenizer **out)
{
    if (!out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    if (!path || !*path) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "the path is NULL or empty");
    bpe *b = NULL;
    dp_status st = bpe_load(path, &b);
    return bpe_wrap(st, b, out);
}

dp_status dp_tokenizer_load_bpe_openai(const char *encoder_json, const char *vocab_bpe,
                                       dp_tokenizer **out)
{
    if (!out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    if (!encoder_json || !*encoder_json || !vocab_bpe || !*vocab_bpe)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "a path is NULL or empty");
    bpe *b = NULL;
    dp_status st = bpe_load_openai(encoder_json, vocab_bpe, &b);
    return bpe_wrap(st, b, out);
}

// ----------------------------------------------------------------------------
// queries, encode, decode

/* The bytes of id (in range). */
static void token_bytes(const dp_tokenizer *t, int32_t id, const char **p, size_t *n)
{
    if (t->bpe) {
        bpe_token(t->bpe, id, p, n);
        return;
    }
    *p = t->pool + t->tok_off[id];
    *n = t->tok_len[id];
}

dp_tokenizer_kind dp_tokenizer_kind_of(const dp_tokenizer *tok)
{
    return tok ? tok->kind : DP_TOKENIZER_KIND_COUNT;
}

size_t dp_tokenizer_vocab_size(const dp_tokenizer *tok) { return tok ? tok->vocab : 0; }

int32_t dp_tokenizer_unk_id(const dp_tokenizer *tok)
{
    return tok && tok->kind == DP_TOKENIZER_WORD ? 0 : -1;
}

int32_t dp_tokenizer_eot_id(const dp_tokenizer *tok) { return tok ? tok->eot : -1; }

dp_status dp_tokenizer_token(const dp_tokenizer *tok, int32_t id, const char **bytes,
                             size_t *len)
{
    if (!tok || !bytes || !len) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "NULL argument");
    if (id < 0 || (size_t)id >= tok->vocab)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "token id %d is outside the vocabulary [0, %zu)",
                       (int)id, tok->vocab);
    token_bytes(tok, id, bytes, len);
    return DP_OK;
}

/* dp_tokenizer_encode; special: a bpe recognises its special tokens. */
static dp_status encode(const dp_tokenizer *tok, const char *text, size_t len, int32_t *ids,
                        size_t cap, size_t *n, size_t *n_unknown, int special)
{
    if (!tok || !n || (len && (!text || (!ids && cap))))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "NULL argument");
    *n = 0;
    if (n_unknown) *n_unknown = 0;
    if (tok->bpe) {
        dp_status st = bpe_encode(tok->bpe, text, len, special, ids, cap, n);
        if (st == DP_OK && *n > cap)
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "ids holds %zu ids but the text needs %zu",
                           cap, *n);
        if (st != DP_OK) *n = 0;
        return st;
    }
    if (tok->kind == DP_TOKENIZER_LLMC)
        return DP_FAIL(DP_ERR_UNSUPPORTED,
                       "the llm.c token table decodes only (ids to bytes): encoding text needs "
                       "GPT-2's BPE merges, which gpt2_tokenizer.bin does not hold");
    size_t k = 0, unknown = 0;
    size_t i = 0;
    if (tok->kind == DP_TOKENIZER_CHAR) {
        if (cap < len) {
            *n = len;
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "ids holds %zu ids but the text needs %zu",
                           cap, len);
        }
        for (; i < len; i++) {
            int32_t id = tok->byte_id[(unsigned char)text[i]];
            if (id < 0)
                return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                               "byte 0x%02x at offset %zu is not in the char vocabulary (%zu "
                               "bytes seen in the training corpus)",
                               (unsigned)(unsigned char)text[i], i, tok->vocab);
            ids[k++] = id;
        }
        *n = k;
        return DP_OK;
    }
    while (i < len) {
        unsigned char c = (unsigned char)text[i];
        int32_t id;
        if (is_word_byte(c)) {
            size_t j = i;
            while (j < len && is_word_byte((unsigned char)text[j])) j++;
            id = word_lookup(tok, text + i, j - i);
            i = j;
        } else {
            id = tok->byte_id[c];
            i++;
        }
        if (id < 0) {
            id = 0;
            unknown++;
        }
        if (k < cap) ids[k] = id;
        k++;
    }
    *n = k;
    if (n_unknown) *n_unknown = unknown;
    if (k > cap)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "ids holds %zu ids but the text needs %zu", cap, k);
    return DP_OK;
}

dp_status dp_tokenizer_encode(const dp_tokenizer *tok, const char *text, size_t len,
                              int32_t *ids, size_t cap, size_t *n, size_t *n_unknown)
{
    return encode(tok, text, len, ids, cap, n, n_unknown, 1);
}

dp_status dp_tokenizer_encode_ordinary(const dp_tokenizer *tok, const char *text, size_t len,
                                       int32_t *ids, size_t cap, size_t *n)
{
    return encode(tok, text, len, ids, cap, n, NULL, 0);
}

size_t dp_tokenizer_cut_point(const dp_tokenizer *tok, const char *text, size_t len)
{
    if (!tok || !text) return 0;
    switch (tok->kind) {
    case DP_TOKENIZER_CHAR: return len;
    case DP_TOKENIZER_WORD:
        // A word is a maximal run of word bytes: a separator byte ends one.
        for (size_t p = len; p > 0; p--)
            if (!is_word_byte((unsigned char)text[p - 1])) return p;
        return 0;
    case DP_TOKENIZER_BPE: return bpe_cut_point(tok->bpe, text, len);
    default: return 0;
    }
}

dp_status dp_tokenizer_decode(const dp_tokenizer *tok, const int32_t *ids, size_t n, char **text,
                              size_t *len)
{
    if (!tok || !text || !len || (n && !ids))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "NULL argument");
    *text = NULL;
    *len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (size_t)ids[i] >= tok->vocab)
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                           "id %d at position %zu is outside the vocabulary [0, %zu)", (int)ids[i],
                           i, tok->vocab);
        const char *p;
        size_t l;
        token_bytes(tok, ids[i], &p, &l);
        if (!dp_size_add(total, l, &total) || total == SIZE_MAX)
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "the text of %zu ids overflows a size", n);
    }
    char *out = malloc(total + 1);
    if (!out) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of text", total + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const char *p;
        size_t l;
        token_bytes(tok, ids[i], &p, &l);
        memcpy(out + k, p, l);
        k += l;
    }
    out[k] = '\0';
    *text = out;
    *len = k;
    return DP_OK;
}

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
        if (kind == DP_TOKENIZER_WORD && is_word_byte((unsigned char)v)) {
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
            for (size_t c = 0; ok && c < l; c++) ok = is_word_byte((unsigned char)s[c]);
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

// ----------------------------------------------------------------------------
// llm.c's token table (gpt2_tokenizer.bin, written by llm.c's train_gpt2.py)
//
// A header of 256 little-endian uint32: [0] magic 20240328, [1] version
// (1: no EOT field, GPT-2's 50257 tokens with EOT 50256; 2: [3] is the EOT
// id), [2] the number of tokens V; then V records of a uint8 length
// (1..255) and that many bytes.

#define LLMC_DATA_MAGIC 20240520 /* a token shard, passed here by mistake */

static uint32_t tok_le32(const unsigned char *b)
{
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

/* Reads exactly n bytes from fd into buf; 0, or -1 with errno (0 at EOF). */
static int read_full(int fd, unsigned char *buf, size_t n)
{
    while (n > 0) {
        ssize_t k = read(fd, buf, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            if (k == 0) errno = 0;
            return -1;
        }
        buf += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Checks the records of body[0..len) (after the header) and builds the
 * table; body becomes the tokenizer's pool (freed with it). */
static dp_status llmc_table(const char *path, unsigned char *body, size_t len, size_t V,
                            int32_t eot, dp_tokenizer **out)
{
    size_t bytes = 0;
    int fits = dp_size_mul(V, sizeof(size_t), &bytes);
    dp_tokenizer *t = calloc(1, sizeof *t);
    size_t *off = fits ? malloc(bytes) : NULL, *lens = fits ? malloc(bytes) : NULL;
    if (!t || !off || !lens) {
        free(t);
        free(off);
        free(lens);
        free(body);
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate a table of %zu tokens", V);
    }
    t->kind = DP_TOKENIZER_LLMC;
    t->vocab = V;
    t->eot = eot;
    t->tok_off = off;
    t->tok_len = lens;
    t->pool = (char *)body;
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    size_t p = 0;
    dp_status st = DP_OK;
    for (size_t i = 0; i < V; i++) {
        size_t at = DP_LLMC_TOKENIZER_HEADER_BYTES + p; // offset in the file
        if (p >= len) {
            st = DP_FAIL(DP_ERR_FORMAT,
                         "'%s' is cut short: it ends at byte %zu, before token %zu of the %zu "
                         "its header announces; re-create it (llm.c's train_gpt2.py)",
                         path, at, i, V);
            break;
        }
        size_t n = body[p];
        if (n == 0) {
            st = DP_FAIL(DP_ERR_FORMAT,
                         "'%s': token %zu has a zero length byte (at byte %zu); every token is "
                         "1..255 bytes, so the file is corrupt; re-create it",
                         path, i, at);
            break;
        }
        if (n > len - p - 1) {
            st = DP_FAIL(DP_ERR_FORMAT,
                         "'%s' is cut short: token %zu needs %zu bytes after byte %zu but the "
                         "file ends at byte %zu; re-create it",
                         path, i, n, at, DP_LLMC_TOKENIZER_HEADER_BYTES + len);
            break;
        }
        off[i] = p + 1;
        lens[i] = n;
        p += 1 + n;
    }
    if (st == DP_OK && p != len)
        st = DP_FAIL(DP_ERR_FORMAT,
                     "'%s' has %zu bytes past its last token (token %zu ends at byte %zu): the "
                     "header's vocabulary size %zu is wrong or the file is corrupt",
                     path, len - p, V - 1, DP_LLMC_TOKENIZER_HEADER_BYTES + p, V);
    if (st != DP_OK) {
        dp_tokenizer_destroy(t);
        return st;
    }
    *out = t;
    return DP_OK;
}

dp_status dp_tokenizer_load_llmc(const char *path, dp_tokenizer **out)
{
    if (!out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    if (!path || !*path) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "the path is NULL or empty");
    const char *what = "llm.c tokenizer file (gpt2_tokenizer.bin)";
    struct stat sb;
    if (stat(path, &sb) != 0)
        return DP_FAIL(DP_ERR_IO, "cannot read the %s '%s': %s", what, path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return DP_FAIL(DP_ERR_FORMAT,
                       "the %s '%s' is not a regular file (it is a %s); pass the file llm.c's "
                       "train_gpt2.py writes",
                       what, path,
                       S_ISDIR(sb.st_mode)    ? "directory"
                       : S_ISCHR(sb.st_mode)  ? "character device"
                       : S_ISFIFO(sb.st_mode) ? "FIFO"
                                              : "special file");
    // Non-blocking, so a FIFO swapped in after stat is refused, not waited on.
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return DP_FAIL(DP_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    dp_status st = DP_OK;
    unsigned char *body = NULL;
    unsigned char h[DP_LLMC_TOKENIZER_HEADER_BYTES];
    size_t size = 0, V = 0;
    int32_t eot = -1;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = DP_FAIL(DP_ERR_FORMAT, "'%s' is not a regular file", path);
        goto done;
    }
    if ((uintmax_t)sb.st_size > (uintmax_t)SIZE_MAX / 2) {
        st = DP_FAIL(DP_ERR_FORMAT, "'%s' is too large (%jd bytes) for a %s", path,
                     (intmax_t)sb.st_size, what);
        goto done;
    }
    size = (size_t)sb.st_size;
    if (size < DP_LLMC_TOKENIZER_HEADER_BYTES) {
        st = DP_FAIL(DP_ERR_FORMAT,
                     "'%s' has %zu bytes, less than the %d-byte header of an %s: it is cut "
                     "short or not such a file",
                     path, size, DP_LLMC_TOKENIZER_HEADER_BYTES, what);
        goto done;
    }
    if (read_full(fd, h, sizeof h) != 0) {
        st = DP_FAIL(DP_ERR_IO, "reading '%s' failed: %s", path,
                     errno ? strerror(errno) : "the file shrank while read");
        goto done;
    }
    uint32_t magic = tok_le32(h), version = tok_le32(h + 4), nv = tok_le32(h + 8);
    if (magic != DP_LLMC_TOKENIZER_MAGIC) {
        if (magic == LLMC_DATA_MAGIC)
            st = DP_FAIL(DP_ERR_FORMAT,
                         "'%s' is an llm.c token file (magic %d), not a tokenizer: it is "
                         "training data; the tokenizer is gpt2_tokenizer.bin",
                         path, LLMC_DATA_MAGIC);
        else
            st = DP_FAIL(DP_ERR_FORMAT,
                         "'%s' is not an %s: its magic is %u, not %d", path, what, magic,
                         DP_LLMC_TOKENIZER_MAGIC);
        goto done;
    }
    if (version != 1 && version != 2) {
        st = DP_FAIL(DP_ERR_FORMAT,
                     "'%s': %s version %u; dp reads versions 1 and 2 (llm.c's train_gpt2.py "
                     "writes 2)",
                     path, what, version);
        goto done;
    }
    // Each token takes at least 2 bytes (length + 1 byte), at most 256.
    size_t rest = size - DP_LLMC_TOKENIZER_HEADER_BYTES;
    if (nv == 0 || nv > (uint32_t)INT32_MAX || (size_t)nv > rest / 2) {
        st = DP_FAIL(DP_ERR_FORMAT,
                     "'%s': the header's vocabulary size %u %s; the file is cut short or corrupt",
                     path, nv,
                     nv == 0                    ? "is zero"
                     : nv > (uint32_t)INT32_MAX ? "overflows an int32 id"
                                                : "cannot fit in the file (2 bytes a token at "
                                                  "least)");
        goto done;
    }
    V = nv;
    if (rest / 256 > V || (rest / 256 == V && rest % 256)) {
        st = DP_FAIL(DP_ERR_FORMAT,
                     "'%s': %zu bytes of records are more than %zu tokens of at most 255 bytes "
                     "can fill; the header's vocabulary size is wrong or the file is corrupt",
                     path, rest, V);
        goto done;
    }
    if (version == 1) {
        // No EOT field: llm.c takes it for GPT-2's, which fixes the size.
        if (V != DP_GPT2_VOCAB_SIZE) {
            st = DP_FAIL(DP_ERR_FORMAT,
                         "'%s': version 1 has no end-of-text field and holds GPT-2's %d "
                         "tokens, but the header says %zu; re-create it (version 2)",
                         path, DP_GPT2_VOCAB_SIZE, V);
            goto done;
        }
        eot = DP_GPT2_EOT;
    } else {
        uint32_t e = tok_le32(h + 12);
        if ((size_t)e >= V) {
            st = DP_FAIL(DP_ERR_FORMAT,
                         "'%s': the end-of-text id %u is outside the vocabulary [0, %zu); the "
                         "file is corrupt",
                         path, e, V);
            goto done;
        }
        eot = (int32_t)e;
    }
    body = malloc(rest);
    if (!body) {
        st = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes for '%s'", rest, path);
        goto done;
    }
    if (read_full(fd, body, rest) != 0) {
        st = DP_FAIL(DP_ERR_IO, "reading '%s' failed: %s", path,
                     errno ? strerror(errno) : "the file shrank while read");
        goto done;
    }
    close(fd);
    fd = -1;
    st = llmc_table(path, body, rest, V, eot, out); // owns body
    body = NULL;
done:
    if (fd >= 0) close(fd);
    free(body);
    return st;
}
