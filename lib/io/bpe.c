/*
 * io/bpe.c - GPT-2's byte-level BPE (Radford et al. 2019, OpenAI's
 * encoder.py; byte pair encoding after Sennrich et al. 2016): loading
 * Hugging Face's tokenizer.json or OpenAI's encoder.json + vocab.bpe, and
 * encoding text the way Hugging Face's `tokenizers` does:
 *
 *   1. added (special) tokens such as <|endoftext|> are split out first,
 *      leftmost then longest;
 *   2. each piece between them is cut into pre-tokens by GPT-2's regular
 *      expression (PCRE2, JIT-compiled where available);
 *   3. each pre-token's bytes start as one symbol per byte and the
 *      adjacent pair of lowest merge rank is merged (leftmost first among
 *      equals) until no pair has a merge: a linked list of symbols and a
 *      binary heap of candidate pairs, O(n log n) for n bytes, with a
 *      cache of word -> ids for the duration of one call.
 *
 * Vocabulary strings are GPT-2's byte-level alphabet (bytes_to_unicode):
 * each byte is one visible character, so every token is a string of those;
 * the loader turns them back into bytes, which is what decoding returns.
 */
#define PCRE2_CODE_UNIT_WIDTH 8

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <pcre2.h>

#include "core/error.h"
#include "dp/checked.h"
#include "dp/tokenizer.h"
#include "io/bpe.h"
#include "io/hash.h"

#define EOT_TEXT "<|endoftext|>"
#define MAX_FILE_BYTES ((size_t)1 << 30) /* a tokenizer file past 1 GiB is refused */

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

typedef struct merge_slot {
    uint64_t key;  /* left id << 32 | right id */
    uint32_t rank; /* the merge's position in the file: lower merges first */
    int32_t id;    /* the merged token; -1: an empty slot */
} merge_slot;

typedef struct special {
    size_t off, len; /* the token's bytes in the pool */
    int32_t id;
} special;

struct bpe {
    size_t vocab;      /* V */
    int32_t eot;       /* <|endoftext|>, or -1 */
    int ignore_merges; /* tokenizers' ignore_merges: a whole word in the vocabulary is one id */
    size_t *tok_off;   /* (V) each token's bytes in pool */
    size_t *tok_len;   /* (V) */
    char *pool;
    int32_t byte_id[256]; /* the one-byte token of each byte */
    merge_slot *merges;   /* open addressing, merge_cap a power of two */
    size_t merge_cap;
    special *specials; /* longest first */
    size_t n_specials;
    unsigned char special_first[256]; /* 1: some special token starts with this byte */
    int32_t *word_slot;               /* ignore_merges: token bytes -> id, -1 empty */
    size_t word_cap;
    pcre2_code *re;
    int jit; /* the pattern is JIT-compiled */
};

// ----------------------------------------------------------------------------
// GPT-2's byte alphabet (bytes_to_unicode in encoder.py): the bytes '!'..'~',
// 0xA1..0xAC and 0xAE..0xFF stand for the code points of the same value;
// the other 68 bytes, in increasing order, for U+0100, U+0101, ...

#define ALPHABET_END (256 + 68)

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
// hashing

// A 64-bit mixer (the finaliser of splitmix64) for the pair keys.
static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static const merge_slot *merge_find(const bpe *b, int32_t left, int32_t right)
{
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    size_t mask = b->merge_cap - 1, s = (size_t)mix64(key) & mask;
    for (;;) {
        const merge_slot *m = &b->merges[s];
        if (m->id < 0) return NULL;
        if (m->key == key) return m;
        s = (s + 1) & mask;
    }
}

// ----------------------------------------------------------------------------
// files

/* The whole regular file at path (malloc'd, NUL-terminated) and its size.
 * what names the file's role in messages. */
static dp_status read_file(const char *path, const char *what, char **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return DP_FAIL(DP_ERR_IO, "cannot read the %s '%s': %s", what, path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return DP_FAIL(DP_ERR_FORMAT, "the %s '%s' is not a regular file (it is a %s)", what, path,
                       S_ISDIR(sb.st_mode)    ? "directory"
                       : S_ISCHR(sb.st_mode)  ? "character device"
                       : S_ISFIFO(sb.st_mode) ? "FIFO"
                                              : "special file");
    // Non-blocking, so a FIFO swapped in after stat is refused, not waited on.
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return DP_FAIL(DP_ERR_IO, "cannot open the %s '%s': %s", what, path, strerror(errno));
    dp_status st = DP_OK;
    char *b = NULL;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = DP_FAIL(DP_ERR_FORMAT, "the %s '%s' is not a regular file", what, path);
        goto done;
    }
    if ((uintmax_t)sb.st_size > MAX_FILE_BYTES) {
        st = DP_FAIL(DP_ERR_FORMAT, "the %s '%s' has %jd bytes, more than the %zu a tokenizer "
                     "file may have",
                     what, path, (intmax_t)sb.st_size, MAX_FILE_BYTES);
        goto done;
    }
    size_t n = (size_t)sb.st_size;
    if (n == 0) {
        st = DP_FAIL(DP_ERR_FORMAT, "the %s '%s' is empty", what, path);
        goto done;
    }
    b = malloc(n + 1);
    if (!b) {
        st = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes for '%s'", n + 1, path);
        goto done;
    }
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, b + got, n - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            st = DP_FAIL(DP_ERR_IO, "reading the %s '%s' failed: %s", what, path,
                         k < 0 ? strerror(errno) : "the file shrank while read");
            goto done;
        }
        got += (size_t)k;
    }
    b[n] = '\0';
    *buf = b;
    *len = n;
    b = NULL;
done:
    close(fd);
    free(b);
    return st;
}

static dp_status parse_json(const char *path, const char *what, const char *text, size_t len,
                            json_t **root)
{
    json_error_t jerr;
    *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
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

/* The loaders' shared state: the vocabulary object (token string -> id)
 * whose strings the merges name, and where messages point. */
typedef struct loader {
    const char *path; /* the file with the vocabulary */
    const char *merges_path;
    json_t *vocab;
    bpe *b;
    int16_t byte_of[ALPHABET_END]; /* inverse of the alphabet, -1 outside it */
    unsigned char *from_vocab;     /* (V bound) 1: the id came from the vocabulary */
    size_t bound;                  /* ids must be below it: entries + added tokens */
    char *cat;                     /* scratch for "a" + "b" */
    size_t cat_cap;
} loader;

/* Gives id the bytes p[0..n), copied to the pool at *used. */
static void set_token(loader *L, int32_t id, const char *p, size_t n, size_t *used)
{
    memcpy(L->b->pool + *used, p, n);
    L->b->tok_off[id] = *used;
    L->b->tok_len[id] = n;
    *used += n;
}

static int bool_field(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    return json_is_true(v);
}

/*
 * Fills ids and bytes from the vocabulary (token string -> id) and the
 * added tokens (tokenizer.json's added_tokens: objects with id, content;
 * NULL for OpenAI's files, where only <|endoftext|> is special).
 */
static dp_status build_vocab(loader *L, json_t *added)
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
            if (bool_field(a, opts[k]))
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

static dp_status merges_alloc(loader *L, size_t n)
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
static dp_status add_merge(loader *L, size_t rank, const char *a, const char *bs,
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
    size_t mask = b->merge_cap - 1, s = (size_t)mix64(key) & mask;
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
static dp_status finish(loader *L)
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

static void loader_init(loader *L, bpe *b, const char *path, const char *merges_path)
{
    memset(L, 0, sizeof *L);
    L->b = b;
    L->path = path;
    L->merges_path = merges_path;
    for (size_t i = 0; i < ALPHABET_END; i++) L->byte_of[i] = -1;
    for (unsigned c = 0; c < 256; c++) L->byte_of[byte_to_cp(c)] = (int16_t)c;
}

static void loader_free(loader *L)
{
    free(L->from_vocab);
    free(L->cat);
}

static bpe *bpe_new(void)
{
    bpe *b = calloc(1, sizeof *b);
    if (b) b->eot = -1;
    return b;
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
    if (bool_field(pre, "add_prefix_space"))
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
    loader_init(&L, b, path, path);
    L.vocab = vocab;
    b->ignore_merges = bool_field(model, "ignore_merges");
    dp_status st = build_vocab(&L, added);
    size_t nm = json_array_size(merges);
    if (st == DP_OK) st = merges_alloc(&L, nm);
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
            st = add_merge(&L, i, a, sp + 1, where);
            free(a);
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            st = add_merge(&L, i, json_string_value(json_array_get(m, 0)),
                           json_string_value(json_array_get(m, 1)), where);
        } else {
            st = DP_FAIL(DP_ERR_FORMAT, "'%s': merge %zu is neither a string \"a b\" nor a pair "
                         "[\"a\", \"b\"]",
                         path, i);
        }
    }
    if (st == DP_OK) st = finish(&L);
    loader_free(&L);
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
    DP_TRY(read_file(path, "tokenizer file", &text, &len));
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
    DP_TRY(merges_alloc(L, lines));
    size_t rank = 0, line = 0;
    char *p = text, *end = text + len;
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *e = nl ? nl : end;
        line++;
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
        DP_TRY(add_merge(L, rank++, p, sp + 1, where));
        p = e + 1;
    }
    return DP_OK;
}

static dp_status load_openai_json(const char *enc_path, json_t *vocab, const char *bpe_path,
                                  bpe **out)
{
    char *text;
    size_t len;
    DP_TRY(read_file(bpe_path, "merges file (vocab.bpe)", &text, &len));
    bpe *b = bpe_new();
    if (!b) {
        free(text);
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate a tokenizer");
    }
    loader L;
    loader_init(&L, b, enc_path, bpe_path);
    L.vocab = vocab;
    dp_status st = build_vocab(&L, NULL);
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
    if (st == DP_OK) st = finish(&L);
    loader_free(&L);
    free(text);
    if (st != DP_OK) {
        bpe_destroy(b);
        return st;
    }
    *out = b;
    return DP_OK;
}

dp_status bpe_load_openai(const char *encoder_json, const char *vocab_bpe, bpe **out)
{
    *out = NULL;
    char *text;
    size_t len;
    const char *what = "encoder file (encoder.json)";
    DP_TRY(read_file(encoder_json, what, &text, &len));
    json_t *root;
    dp_status st = parse_json(encoder_json, what, text, len, &root);
    free(text);
    if (st != DP_OK) return st;
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
    DP_TRY(read_file(path, "tokenizer file", &text, &len));
    json_t *root;
    st = parse_json(path, "tokenizer file", text, len, &root);
    free(text);
    if (st != DP_OK) return st;
    if (json_object_get(root, "model")) {
        st = load_hf_json(path, root, out);
    } else {
        // OpenAI's encoder.json (token -> id): its merges are vocab.bpe beside it.
        const char *slash = strrchr(path, '/');
        size_t dl = slash ? (size_t)(slash - path) : 1;
        char *vb = join_path(slash ? path : ".", dl, "vocab.bpe");
        if (!vb) st = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate a path");
        else if (!is_file(vb))
            st = DP_FAIL(DP_ERR_FORMAT,
                         "'%s' has no \"model\" (a tokenizers tokenizer.json) and no vocab.bpe "
                         "beside it ('%s'), as OpenAI's encoder.json has",
                         path, vb);
        else
            st = load_openai_json(path, root, vb, out);
        free(vb);
    }
    json_decref(root);
    return st;
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

// ----------------------------------------------------------------------------
// encoding

typedef struct heap_item {
    uint32_t rank, pos;         /* the merge's rank; its left symbol */
    int32_t left, right, merged; /* the pair it was made for, and the result */
} heap_item;

typedef struct cache_slot {
    uint64_t h;
    const char *p; /* the word, inside the text of this call; NULL: empty */
    uint32_t len, n;
    size_t off; /* its ids in the cache's arena */
} cache_slot;

/* The cache holds at most this many words, each at most CACHE_WORD bytes. */
#define CACHE_MAX_SLOTS ((size_t)1 << 21)
#define CACHE_WORD 256

typedef struct encoder {
    const bpe *b;
    int32_t *ids;
    size_t cap, k; /* ids written: min(k, cap); k counts on past cap */
    cache_slot *slots;
    size_t slot_cap, slot_used;
    int32_t *arena;
    size_t arena_len, arena_cap;
    int32_t *sym; /* per byte of the word: its symbol's id, -1 once merged into the left */
    uint32_t *next, *prev;
    size_t scratch_cap;
    heap_item *heap;
    size_t heap_len, heap_cap;
    pcre2_match_data *md;
} encoder;

static void emit(encoder *e, int32_t id)
{
    if (e->k < e->cap) e->ids[e->k] = id;
    e->k++;
}

static int heap_less(const heap_item *a, const heap_item *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(encoder *e, heap_item it)
{
    size_t i = e->heap_len++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&it, &e->heap[p])) break;
        e->heap[i] = e->heap[p];
        i = p;
    }
    e->heap[i] = it;
}

static heap_item heap_pop(encoder *e)
{
    heap_item top = e->heap[0], last = e->heap[--e->heap_len];
    size_t i = 0, n = e->heap_len;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && heap_less(&e->heap[c + 1], &e->heap[c])) c++;
        if (!heap_less(&e->heap[c], &last)) break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    e->heap[i] = last;
    return top;
}

/* Pushes the pair at left symbol i (if it has a merge). */
static void push_pair(encoder *e, uint32_t i)
{
    uint32_t r = e->next[i];
    if (r == UINT32_MAX) return;
    const merge_slot *m = merge_find(e->b, e->sym[i], e->sym[r]);
    if (m) heap_push(e, (heap_item){m->rank, i, e->sym[i], e->sym[r], m->id});
}

static dp_status grow_scratch(encoder *e, size_t n)
{
    if (n <= e->scratch_cap) return DP_OK;
    if (n >= UINT32_MAX)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "a pre-token of %zu bytes (a run of letters, digits, symbols or spaces) "
                       "is more than a byte-level BPE word can hold (4 GiB)",
                       n);
    size_t cap = n < 64 ? 64 : n + n / 2;
    if (cap >= UINT32_MAX) cap = UINT32_MAX - 1;
    int32_t *sym = realloc(e->sym, cap * sizeof *sym);
    if (sym) e->sym = sym;
    uint32_t *nx = sym ? realloc(e->next, cap * sizeof *nx) : NULL;
    if (nx) e->next = nx;
    uint32_t *pv = nx ? realloc(e->prev, cap * sizeof *pv) : NULL;
    if (pv) e->prev = pv;
    // At most n - 1 initial pairs and two new ones per merge (n - 1 merges).
    heap_item *h = pv ? realloc(e->heap, 3 * cap * sizeof *h) : NULL;
    if (h) e->heap = h;
    if (!h) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate scratch for a %zu-byte word", n);
    e->scratch_cap = cap;
    return DP_OK;
}

/* Merges the bytes of w[0..n) (n >= 2): on return the live symbols are
 * reached from index 0 through next. Hugging Face's order: the lowest
 * rank first, the leftmost among equal ranks. */
static dp_status merge_word(encoder *e, const char *w, size_t n)
{
    DP_TRY(grow_scratch(e, n));
    const bpe *b = e->b;
    for (size_t i = 0; i < n; i++) {
        e->sym[i] = b->byte_id[(unsigned char)w[i]];
        e->next[i] = i + 1 < n ? (uint32_t)(i + 1) : UINT32_MAX;
        e->prev[i] = i > 0 ? (uint32_t)(i - 1) : UINT32_MAX;
    }
    e->heap_len = 0;
    for (size_t i = 0; i + 1 < n; i++) push_pair(e, (uint32_t)i);
    while (e->heap_len > 0) {
        heap_item t = heap_pop(e);
        uint32_t i = t.pos, r = e->next[i];
        // Stale: the left symbol merged away or changed, or its right neighbour changed.
        if (e->sym[i] != t.left || r == UINT32_MAX || e->sym[r] != t.right) continue;
        e->sym[i] = t.merged;
        e->sym[r] = -1;
        uint32_t rr = e->next[r];
        e->next[i] = rr;
        if (rr != UINT32_MAX) e->prev[rr] = i;
        if (e->prev[i] != UINT32_MAX) push_pair(e, e->prev[i]);
        push_pair(e, i);
    }
    return DP_OK;
}

static cache_slot *cache_find(encoder *e, const char *w, size_t n, uint64_t h)
{
    if (!e->slots) return NULL;
    size_t mask = e->slot_cap - 1, s = (size_t)h & mask;
    for (;;) {
        cache_slot *c = &e->slots[s];
        if (!c->p) return c;
        if (c->h == h && c->len == n && memcmp(c->p, w, n) == 0) return c;
        s = (s + 1) & mask;
    }
}

/* Remembers w's ids (the last n_ids emitted). Failing to grow only stops
 * the caching: the ids are already out. */
static void cache_put(encoder *e, const char *w, size_t n, uint64_t h, size_t n_ids,
                      const int32_t *ids)
{
    if (n > CACHE_WORD) return;
    if (2 * (e->slot_used + 1) > e->slot_cap) {
        if (e->slot_cap >= CACHE_MAX_SLOTS) return;
        size_t cap = e->slot_cap ? 2 * e->slot_cap : 4096;
        cache_slot *ns = calloc(cap, sizeof *ns);
        if (!ns) return;
        for (size_t i = 0; i < e->slot_cap; i++) {
            if (!e->slots[i].p) continue;
            size_t s = (size_t)e->slots[i].h & (cap - 1);
            while (ns[s].p) s = (s + 1) & (cap - 1);
            ns[s] = e->slots[i];
        }
        free(e->slots);
        e->slots = ns;
        e->slot_cap = cap;
    }
    if (e->arena_len + n_ids > e->arena_cap) {
        size_t cap = e->arena_cap ? 2 * e->arena_cap : 16384;
        while (cap < e->arena_len + n_ids) cap *= 2;
        int32_t *a = realloc(e->arena, cap * sizeof *a);
        if (!a) return;
        e->arena = a;
        e->arena_cap = cap;
    }
    cache_slot *c = cache_find(e, w, n, h);
    memcpy(e->arena + e->arena_len, ids, n_ids * sizeof *ids);
    *c = (cache_slot){h, w, (uint32_t)n, (uint32_t)n_ids, e->arena_len};
    e->arena_len += n_ids;
    e->slot_used++;
}

static int32_t word_lookup(const bpe *b, const char *w, size_t n)
{
    size_t s = (size_t)io_hash_bytes(w, n) & (b->word_cap - 1);
    for (;;) {
        int32_t id = b->word_slot[s];
        if (id < 0) return -1;
        if (b->tok_len[id] == n && memcmp(b->pool + b->tok_off[id], w, n) == 0) return id;
        s = (s + 1) & (b->word_cap - 1);
    }
}

/* Encodes one pre-token. */
static dp_status encode_word(encoder *e, const char *w, size_t n)
{
    const bpe *b = e->b;
    if (n == 1) {
        emit(e, b->byte_id[(unsigned char)w[0]]);
        return DP_OK;
    }
    if (b->ignore_merges) {
        int32_t id = word_lookup(b, w, n);
        if (id >= 0) {
            emit(e, id);
            return DP_OK;
        }
    }
    uint64_t h = 0;
    if (n <= CACHE_WORD) {
        h = io_hash_bytes(w, n);
        const cache_slot *c = cache_find(e, w, n, h);
        if (c && c->p) {
            for (uint32_t i = 0; i < c->n; i++) emit(e, e->arena[c->off + i]);
            return DP_OK;
        }
    }
    DP_TRY(merge_word(e, w, n));
    size_t n_ids = 0;
    for (uint32_t i = 0; i != UINT32_MAX; i = e->next[i]) {
        emit(e, e->sym[i]);
        e->sym[n_ids++] = e->sym[i]; // compacted for the cache (n_ids <= i)
    }
    if (n <= CACHE_WORD) cache_put(e, w, n, h, n_ids, e->sym);
    return DP_OK;
}

/* Pre-tokenizes and encodes t[0..n), a piece without special tokens (the
 * expression sees its end as the text's end, as tokenizers splits). */
static dp_status encode_piece(encoder *e, const char *t, size_t n)
{
    const bpe *b = e->b;
    size_t off = 0;
    while (off < n) {
        int rc = b->jit ? pcre2_jit_match(b->re, (PCRE2_SPTR)t, n, off, PCRE2_NO_UTF_CHECK, e->md,
                                          NULL)
                        : pcre2_match(b->re, (PCRE2_SPTR)t, n, off, PCRE2_NO_UTF_CHECK, e->md,
                                      NULL);
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return DP_FAIL(rc == PCRE2_ERROR_NOMEMORY ? DP_ERR_OUT_OF_MEMORY : DP_ERR_INTERNAL,
                           "matching GPT-2's expression at byte %zu of a %zu-byte piece: %s", off,
                           n, (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        // The expression matches any character, so each match starts where the last ended.
        if (ov[0] != off || ov[1] <= off)
            return DP_FAIL(DP_ERR_INTERNAL, "GPT-2's expression matched [%zu, %zu) after byte %zu",
                           (size_t)ov[0], (size_t)ov[1], off);
        DP_TRY(encode_word(e, t + off, ov[1] - off));
        off = ov[1];
    }
    return DP_OK;
}

/* The leftmost, then longest, special token in t[from..len) (tokenizers'
 * leftmost-longest matching): its offset and index, or len. */
static size_t find_special(const bpe *b, const char *t, size_t from, size_t len, size_t *which)
{
    for (size_t i = from; i < len; i++) {
        if (!b->special_first[(unsigned char)t[i]]) continue;
        for (size_t k = 0; k < b->n_specials; k++) {
            const special *s = &b->specials[k];
            if (s->len <= len - i && memcmp(t + i, b->pool + s->off, s->len) == 0) {
                *which = k;
                return i;
            }
        }
    }
    return len;
}

dp_status bpe_encode(const bpe *b, const char *text, size_t len, int with_special, int32_t *ids,
                     size_t cap, size_t *n)
{
    *n = 0;
    DP_TRY(dp_utf8_check(text, len, NULL));
    encoder e = {.b = b, .ids = ids, .cap = cap};
    e.md = pcre2_match_data_create(1, NULL);
    if (!e.md) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate PCRE2's match data");
    dp_status st = DP_OK;
    size_t pos = 0;
    while (st == DP_OK && pos < len) {
        size_t k = 0;
        size_t at = with_special && b->n_specials ? find_special(b, text, pos, len, &k) : len;
        if (at > pos) st = encode_piece(&e, text + pos, at - pos);
        if (at < len) {
            emit(&e, b->specials[k].id);
            at += b->specials[k].len;
        }
        pos = at;
    }
    pcre2_match_data_free(e.md);
    free(e.sym);
    free(e.next);
    free(e.prev);
    free(e.heap);
    free(e.slots);
    free(e.arena);
    *n = e.k;
    return st;
}

// ----------------------------------------------------------------------------
// cut points

static int ascii_graphic(unsigned char c) { return c > 0x20 && c < 0x7F; }

/*
 * A cut just after a '\n' that sits between two ASCII graphic bytes
 * ("x\ny") changes nothing: the pre-token before it ends with that lone
 * '\n' either way (with or without the text after it, the whitespace run
 * is that one byte: \s+(?!\S) and \s+ both give it), and the one after it
 * starts at y either way. It must not split a special token either.
 */
size_t bpe_cut_point(const bpe *b, const char *text, size_t len)
{
    const unsigned char *u = (const unsigned char *)text;
    for (size_t p = len > 0 ? len - 1 : 0; p >= 2; p--) {
        if (u[p - 1] != '\n' || !ascii_graphic(u[p]) || !ascii_graphic(u[p - 2])) continue;
        int inside = 0;
        for (size_t k = 0; k < b->n_specials && !inside; k++) {
            const special *s = &b->specials[k];
            const char *sp = b->pool + s->off;
            // An occurrence starting at q = p - j with a '\n' at j - 1 would span p.
            for (size_t j = 1; j < s->len && !inside; j++) {
                if (sp[j - 1] != '\n' || j > p) continue;
                size_t q = p - j;
                inside = q + s->len > len || memcmp(text + q, sp, s->len) == 0;
            }
        }
        if (!inside) return p;
    }
    return 0;
}
