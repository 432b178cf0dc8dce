/*
 * io/tokenizer.c - char- and word-level tokenizers: building from a corpus,
 * encode/decode; and the dispatch of every dp_tokenizer call to GPT-2's
 * byte-level BPE (io/bpe.c) for that kind. The JSON form (for checkpoint
 * metadata) is in tokenizer_json.c, llm.c's GPT-2 token table
 * (gpt2_tokenizer.bin, loaded to decode only) in tokenizer_llmc.c.
 */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "dp/checked.h"
#include "dp/tokenizer.h"
#include "io/bpe.h"
#include "io/hash.h"
#include "io/tokenizer_internal.h"

#define UNK_TEXT "<unk>"

// ----------------------------------------------------------------------------
// helpers

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
dp_status tok_create(dp_tokenizer_kind kind, const unsigned char *bytes, size_t nbytes,
                     const char *const *wp, const size_t *wl, size_t nwords, dp_tokenizer **out)
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
        if (!tok_is_word_byte(c)) {
            seen[c] = 1;
            i++;
            continue;
        }
        size_t j = i;
        while (j < len && tok_is_word_byte((unsigned char)text[j])) j++;
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
        if (tok_is_word_byte(c)) {
            size_t j = i;
            while (j < len && tok_is_word_byte((unsigned char)text[j])) j++;
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
            if (!tok_is_word_byte((unsigned char)text[p - 1])) return p;
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
