/*
 * io/bpe_encode.c - encoding text with GPT-2's byte-level BPE the way
 * Hugging Face's `tokenizers` does:
 *
 *   1. added (special) tokens such as <|endoftext|> are split out first,
 *      leftmost then longest;
 *   2. each piece between them is cut into pre-tokens by GPT-2's regular
 *      expression (PCRE2, JIT-compiled where available);
 *   3. each pre-token's bytes start as one symbol per byte and the
 *      adjacent pair of lowest merge rank is merged (leftmost first among
 *      equals) until no pair has a merge: a linked list of symbols and a
 *      binary heap of candidate pairs, O(n log n) for n bytes, with a
 *      cache of word -> ids for the duration of one call;
 *
 * and where a text may be cut without changing its ids (bpe_cut_point).
 */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "dp/tokenizer.h"
#include "io/bpe.h"
#include "io/bpe_internal.h"
#include "io/hash.h"

/* The merge of the pair (left, right), or NULL. */
static const merge_slot *merge_find(const bpe *b, int32_t left, int32_t right)
{
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    size_t mask = b->merge_cap - 1, s = (size_t)bpe_mix64(key) & mask;
    for (;;) {
        const merge_slot *m = &b->merges[s];
        if (m->id < 0) return NULL;
        if (m->key == key) return m;
        s = (s + 1) & mask;
    }
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
