/*
 * io/bpe.c - GPT-2's byte-level BPE (Radford et al. 2019, OpenAI's
 * encoder.py; byte pair encoding after Sennrich et al. 2016): its tables,
 * built from what io/bpe_load.c parses (Hugging Face's tokenizer.json or
 * OpenAI's encoder.json + vocab.bpe), and the queries; io/bpe_encode.c
 * encodes with them.
 *
 * Vocabulary strings are GPT-2's byte-level alphabet (bytes_to_unicode):
 * each byte is one visible character, so every token is a string of those;
 * the loader turns them back into bytes, which is what decoding returns.
 */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "dp/checked.h"
#include "io/bpe.h"
#include "io/bpe_internal.h"
#include "io/hash.h"

#define EOT_TEXT "<|endoftext|>"

/*
 * GPT-2's pre-tokenizer expression, as in OpenAI's encoder.py and
 * tokenizers' ByteLevel:
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * with \s spelled out as Unicode's White_Space property, which is what \s
 * means to the engines behind the references (Oniguruma in tokenizers,
 * fancy-regex in tiktoken). PCRE2's \s under PCRE2_UCP also takes U+180E
 * (MONGOLIAN VOWEL SEPARATOR, no longer White_Space since Unicode 6.3).
 */
#define WS "\\t-\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
static const char GPT2_PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS
                                   "\\p{L}\\p{N}]+|[" WS "]+(?![^" WS "])|[" WS "]+";

// ----------------------------------------------------------------------------
// GPT-2's byte alphabet (bytes_to_unicode in encoder.py): the bytes '!'..'~',
// 0xA1..0xAC and 0xAE..0xFF stand for the code points of the same value;
// the other 68 bytes, in increasing order, for U+0100, U+0101, ...

static uint32_t byte_to_cp(unsigned b)
{
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) return b;
    unsigned n = 0; // the non-printable bytes below b
    for (unsigned c = 0; c < b; c++)
        if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE)) n++;
    return 256 + n;
}

/* UTF-8 of cp (< 0x800, all the alphabet needs) into buf; its length. */
static size_t cp_utf8(uint32_t cp, char *buf)
{
    if (cp < 0x80) {
        buf[0] = (char)cp;
        return 1;
    }
    buf[0] = (char)(0xC0 | (cp >> 6));
    buf[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* Decodes the alphabet string s[0..n) (valid UTF-8: jansson checks it)
 * into bytes out[0..*m), m <= n. 0, or -1 with *bad the first code point
 * outside the alphabet. */
static int alphabet_decode(const int16_t *byte_of, const char *s, size_t n, char *out, size_t *m,
                           uint32_t *bad)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, k = 0;
    while (i < n) {
        unsigned c = u[i];
        size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
        if (len > n - i) len = n - i; // cannot happen in valid UTF-8
        for (size_t j = 1; j < len; j++) cp = cp << 6 | (u[i + j] & 0x3F);
        i += len;
        if (cp >= ALPHABET_END || byte_of[cp] < 0) {
            *bad = cp;
            return -1;
        }
        out[k++] = (char)byte_of[cp];
    }
    *m = k;
    return 0;
}

// ----------------------------------------------------------------------------
// building

void bpe_destroy(bpe *b)
{
    if (!b) return;
    free(b->tok_off);
    free(b->tok_len);
    free(b->pool);
    free(b->merges);
    free(b->specials);
    free(b->word_slot);
    pcre2_code_free(b->re);
    free(b);
}

/* Gives id the bytes p[0..n), copied to the pool at *used. */
static void set_token(loader *L, int32_t id, const char *p, size_t n, size_t *used)
{
    memcpy(L->b->pool + *used, p, n);
    L->b->tok_off[id] = *used;
    L->b->tok_len[id] = n;
    *used += n;
}

int bpe_bool_field(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    return json_is_true(v);
}

/*
 * Fills ids and bytes from the vocabulary (token string -> id) and the
 * added tokens (tokenizer.json's added_tokens: objects with id, content;
 * NULL for OpenAI's files, where only <|endoftext|> is special).
 */
dp_status bpe_build_vocab(loader *L, json_t *added)
{
    bpe *b = L->b;
    size_t nv = json_object_size(L->vocab);
    size_t na = added ? json_array_size(added) : 0;
    if (nv == 0)
        return DP_FAIL(DP_ERR_FORMAT, "'%s': the vocabulary is empty", L->path);
    if (nv + na > (size_t)INT32_MAX)
        return DP_FAIL(DP_ERR_FORMAT, "'%s': %zu tokens do not fit int32 ids", L->path, nv + na);
    L->bound = nv + na;
    // Pool: every token's bytes are at most its string's bytes.
    size_t pool = 1;
    const char *key;
    json_t *val;
    json_object_foreach(L->vocab, key, val)
    {
        if (!dp_size_add(pool, strlen(key), &pool))
            return DP_FAIL(DP_ERR_FORMAT, "'%s': the vocabulary is too large", L->path);
    }
    for (size_t i = 0; i < na; i++) {
        json_t *c = json_object_get(json_array_get(added, i), "content");
        if (json_is_string(c) && !dp_size_add(pool, json_string_length(c), &pool))
            return DP_FAIL(DP_ERR_FORMAT, "'%s': the added tokens are too large", L->path);
    }
    b->tok_off = malloc(L->bound * sizeof *b->tok_off);
    b->tok_len = malloc(L->bound * sizeof *b->tok_len);
    b->pool = malloc(pool);
    L->from_vocab = calloc(L->bound, 1);
    if (!b->tok_off || !b->tok_len || !b->pool || !L->from_vocab)
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate the tables of %zu tokens", L->bound);
    for (size_t i = 0; i < L->bound; i++) b->tok_len[i] = SIZE_MAX; // no token yet
    size_t used = 0;

    // Added tokens first: their content is their bytes, verbatim.
    if (na) {
        b->specials = malloc(na * sizeof *b->specials);
        if (!b->specials) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate the added tokens");
    }
    for (size_t i = 0; i < na; i++) {
        json_t *a = json_array_get(added, i);
        json_t *jid = json_object_get(a, "id"), *jc = json_object_get(a, "content");
        if (!json_is_object(a) || !json_is_integer(jid) || !json_is_string(jc) ||
            json_string_length(jc) == 0)
            return DP_FAIL(DP_ERR_FORMAT,
                           "'%s': added_tokens[%zu] is not an object with an integer \"id\" and "
                           "a non-empty string \"content\"",
                           L->path, i);
        json_int_t id = json_integer_value(jid);
        const char *c = json_string_value(jc);
        if (id < 0 || (uintmax_t)id >= L->bound)
            return DP_FAIL(DP_ERR_FORMAT,
                           "'%s': added token '%s' has id %lld, outside [0, %zu) (the "
                           "vocabulary's and the added tokens' count)",
                           L->path, c, (long long)id, L->bound);
        if (b->tok_len[id] != SIZE_MAX)
            return DP_FAIL(DP_ERR_FORMAT, "'%s': id %lld is given to two added tokens", L->path,
                           (long long)id);
        const char *opts[] = {"lstrip", "rstrip", "single_word"};
        for (size_t k = 0; k < 3; k++)
            if (bpe_bool_field(a, opts[k]))
                return DP_FAIL(DP_ERR_UNSUPPORTED,
                               "'%s': added token '%s' sets \"%s\", which dp does not implement "
                               "(only tokens matched exactly, as GPT-2's <|endoftext|>)",
                               L->path, c, opts[k]);
        b->specials[b->n_specials++] = (special){used, json_string_length(jc), (int32_t)id};
        set_token(L, (int32_t)id, c, json_string_length(jc), &used);
        if (strcmp(c, EOT_TEXT) == 0) b->eot = (int32_t)id;
    }

    // The vocabulary: alphabet strings, or an added token's content verbatim.
    char *dec = malloc(pool);
    if (!dec) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate a scratch buffer");
    dp_status st = DP_OK;
    json_object_foreach(L->vocab, key, val)
    {
        json_int_t id = json_is_integer(val) ? json_integer_value(val) : -1;
        if (!json_is_integer(val)) {
            st = DP_FAIL(DP_ERR_FORMAT, "'%s': vocabulary token '%s' has a %s as id, not an "
                         "integer",
                         L->path, key, json_is_string(val) ? "string" : "non-integer");
            break;
        }
        if (id < 0 || (uintmax_t)id >= L->bound) {
            st = DP_FAIL(DP_ERR_FORMAT,
                         "'%s': vocabulary token '%s' has id %lld, outside [0, %zu) (the "
                         "vocabulary's and the added tokens' count): ids must be 0..V-1",
                         L->path, key, (long long)id, L->bound);
            break;
        }
        size_t klen = strlen(key);
        if (klen == 0) {
            st = DP_FAIL(DP_ERR_FORMAT, "'%s': the vocabulary has an empty token (id %lld)",
                         L->path, (long long)id);
            break;
        }
        if (L->from_vocab[id]) {
            st = DP_FAIL(DP_ERR_FORMAT, "'%s': id %lld is given to two vocabulary tokens (one "
                         "is '%s')",
                         L->path, (long long)id, key);
            break;
        }
        L->from_vocab[id] = 1;
        if (b->tok_len[id] != SIZE_MAX) {
            // An added token listed in the vocabulary too (GPT-2's <|endoftext|>).
            if (b->tok_len[id] != klen || memcmp(b->pool + b->tok_off[id], key, klen) != 0) {
                st = DP_FAIL(DP_ERR_FORMAT,
                             "'%s': id %lld is the vocabulary's '%s' and another added token",
                             L->path, (long long)id, key);
                break;
            }
            continue;
        }
        size_t m = 0;
        uint32_t bad = 0;
        if (alphabet_decode(L->byte_of, key, klen, dec, &m, &bad) != 0) {
            st = DP_FAIL(DP_ERR_FORMAT,
                         "'%s': vocabulary token '%s' (id %lld) has the character U+%04X, which "
                         "is not in GPT-2's byte alphabet: this is not a byte-level BPE",
                         L->path, key, (long long)id, (unsigned)bad);
            break;
        }
        set_token(L, (int32_t)id, dec, m, &used);
    }
    free(dec);
    if (st != DP_OK) return st;

    // Ids must be 0..V-1 with no gap.
    size_t V = 0;
    for (size_t i = 0; i < L->bound; i++)
        if (b->tok_len[i] != SIZE_MAX) V = i + 1;
    for (size_t i = 0; i < V; i++)
        if (b->tok_len[i] == SIZE_MAX)
            return DP_FAIL(DP_ERR_FORMAT,
                           "'%s': no token has id %zu, though ids go up to %zu: ids must be "
                           "0..V-1 without a gap",
                           L->path, i, V - 1);
    b->vocab = V;

    // Every byte has its one-character token: a byte-level BPE encodes any text.
    for (unsigned c = 0; c < 256; c++) {
        char s[3];
        s[cp_utf8(byte_to_cp(c), s)] = '\0';
        json_t *v = json_object_get(L->vocab, s);
        if (!v)
            return DP_FAIL(DP_ERR_FORMAT,
                           "'%s': the vocabulary has no token for byte 0x%02X ('%s'): a "
                           "byte-level BPE holds all 256",
                           L->path, c, s);
        b->byte_id[c] = (int32_t)json_integer_value(v);
    }
    if (b->eot < 0) {
        json_t *v = json_object_get(L->vocab, EOT_TEXT);
        if (v) b->eot = (int32_t)json_integer_value(v);
    }
    return DP_OK;
}

/* The id of vocabulary string s, or -1. */
static int32_t vocab_id(const loader *L, const char *s)
{
    json_t *v = json_object_get(L->vocab, s);
    return v ? (int32_t)json_integer_value(v) : -1;
}

dp_status bpe_merges_alloc(loader *L, size_t n)
{
    bpe *b = L->b;
    size_t cap = 0;
    if (!dp_size_mul(n, 2, &cap) || cap > SIZE_MAX / 2 / sizeof *b->merges)
        return DP_FAIL(DP_ERR_FORMAT, "'%s': too many merges (%zu)", L->merges_path, n);
    b->merge_cap = io_pow2_at_least(cap + 1);
    b->merges = malloc(b->merge_cap * sizeof *b->merges);
    if (!b->merges)
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate a table of %zu merges", n);
    for (size_t i = 0; i < b->merge_cap; i++) b->merges[i].id = -1;
    return DP_OK;
}

/* Adds merge number rank, "a b" (NUL-terminated token strings); where
 * names it in messages. A pair listed twice keeps its later rank, as
 * encoder.py's and tokenizers' dictionaries do. */
dp_status bpe_add_merge(loader *L, size_t rank, const char *a, const char *bs,
                           const char *where)
{
    bpe *b = L->b;
    int32_t ia = vocab_id(L, a), ib = vocab_id(L, bs);
    if (ia < 0 || ib < 0)
        return DP_FAIL(DP_ERR_FORMAT, "'%s': %s merges '%s' and '%s', but '%s' is not in the "
                       "vocabulary",
                       L->merges_path, where, a, bs, ia < 0 ? a : bs);
    size_t la = strlen(a), lb = strlen(bs);
    if (la + lb + 1 > L->cat_cap) {
        size_t cap = 2 * (la + lb + 1);
        char *c = realloc(L->cat, cap);
        if (!c) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate a merge's string");
        L->cat = c;
        L->cat_cap = cap;
    }
    memcpy(L->cat, a, la);
    memcpy(L->cat + la, bs, lb + 1);
    int32_t id = vocab_id(L, L->cat);
    if (id < 0)
        return DP_FAIL(DP_ERR_FORMAT,
                       "'%s': %s merges '%s' and '%s', but their concatenation '%s' is not in the "
                       "vocabulary",
                       L->merges_path, where, a, bs, L->cat);
    if (rank > UINT32_MAX)
        return DP_FAIL(DP_ERR_FORMAT, "'%s': more than 2^32 merges", L->merges_path);
    uint64_t key = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
    size_t mask = b->merge_cap - 1, s = (size_t)bpe_mix64(key) & mask;
    while (b->merges[s].id >= 0 && b->merges[s].key != key) s = (s + 1) & mask;
    b->merges[s] = (merge_slot){key, (uint32_t)rank, id};
    return DP_OK;
}

static int cmp_special(const void *x, const void *y)
{
    const special *a = x, *b = y;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

/* Whatever comes after the tables: special-token lookup, the word table
 * of ignore_merges, the compiled pattern. */
dp_status bpe_finish(loader *L)
{
    bpe *b = L->b;
    if (b->n_specials) qsort(b->specials, b->n_specials, sizeof *b->specials, cmp_special);
    for (size_t i = 0; i < b->n_specials; i++)
        b->special_first[(unsigned char)b->pool[b->specials[i].off]] = 1;
    if (b->ignore_merges) {
        b->word_cap = io_pow2_at_least(2 * b->vocab + 1);
        b->word_slot = malloc(b->word_cap * sizeof *b->word_slot);
        if (!b->word_slot) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate the word table");
        for (size_t i = 0; i < b->word_cap; i++) b->word_slot[i] = -1;
        for (size_t id = 0; id < b->vocab; id++) {
            if (!L->from_vocab[id]) continue; // added tokens are split out before
            size_t s = (size_t)io_hash_bytes(b->pool + b->tok_off[id], b->tok_len[id]) &
                       (b->word_cap - 1);
            while (b->word_slot[s] >= 0) s = (s + 1) & (b->word_cap - 1);
            b->word_slot[s] = (int32_t)id;
        }
    }
    int err;
    PCRE2_SIZE at;
    b->re = pcre2_compile((PCRE2_SPTR)GPT2_PATTERN, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                          &err, &at, NULL);
    if (!b->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return DP_FAIL(DP_ERR_INTERNAL, "PCRE2 cannot compile GPT-2's expression: %s (at %zu)",
                       (const char *)msg, (size_t)at);
    }
    // The JIT is optional (not every platform has it): the interpreter matches the same.
    b->jit = pcre2_jit_compile(b->re, PCRE2_JIT_COMPLETE) == 0;
    return DP_OK;
}

void bpe_loader_init(loader *L, bpe *b, const char *path, const char *merges_path)
{
    memset(L, 0, sizeof *L);
    L->b = b;
    L->path = path;
    L->merges_path = merges_path;
    for (size_t i = 0; i < ALPHABET_END; i++) L->byte_of[i] = -1;
    for (unsigned c = 0; c < 256; c++) L->byte_of[byte_to_cp(c)] = (int16_t)c;
}

void bpe_loader_free(loader *L)
{
    free(L->from_vocab);
    free(L->cat);
}

bpe *bpe_new(void)
{
    bpe *b = calloc(1, sizeof *b);
    if (b) b->eot = -1;
    return b;
}

// ----------------------------------------------------------------------------
// queries

size_t bpe_vocab_size(const bpe *b) { return b->vocab; }

int32_t bpe_eot(const bpe *b) { return b->eot; }

void bpe_token(const bpe *b, int32_t id, const char **bytes, size_t *len)
{
    *bytes = b->pool + b->tok_off[id];
    *len = b->tok_len[id];
}
