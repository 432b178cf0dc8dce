/*
 * io/bpe_internal.h - what the parts of GPT-2's byte-level BPE share
 * (private to them; io/bpe.h is the module's interface): the tables of a
 * bpe, and the loaders' state with the calls that build the tables.
 *
 *   bpe.c         GPT-2's byte alphabet, building the vocabulary and the
 *                 merge table, the queries;
 *   bpe_load.c    Hugging Face's tokenizer.json, OpenAI's encoder.json +
 *                 vocab.bpe, bpe_load;
 *   bpe_encode.c  encoding text, cut points.
 */
#ifndef DP_IO_BPE_INTERNAL_H
#define DP_IO_BPE_INTERNAL_H

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <pcre2.h>

#include "dp/status.h"
#include "io/bpe.h"

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

/* The code points GPT-2's byte alphabet uses are below this (256 + 68). */
#define ALPHABET_END (256 + 68)

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

// A 64-bit mixer (the finaliser of splitmix64) for the pair keys.
static inline uint64_t bpe_mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* A bpe with no tables yet (eot -1), or NULL. */
bpe *bpe_new(void);

/* Starts L for b: messages name path (the vocabulary) and merges_path. */
void bpe_loader_init(loader *L, bpe *b, const char *path, const char *merges_path);
void bpe_loader_free(loader *L);

/* Whether obj's key is true. */
int bpe_bool_field(json_t *obj, const char *key);

/* Fills ids and bytes from L->vocab and the added tokens (tokenizer.json's
 * added_tokens; NULL for OpenAI's files). */
dp_status bpe_build_vocab(loader *L, json_t *added);

/* The merge table, for n merges. */
dp_status bpe_merges_alloc(loader *L, size_t n);

/* Adds merge number rank, "a b"; where names it in messages. */
dp_status bpe_add_merge(loader *L, size_t rank, const char *a, const char *bs, const char *where);

/* Whatever comes after the tables: special-token lookup, the word table
 * of ignore_merges, the compiled pattern. */
dp_status bpe_finish(loader *L);

#endif /* DP_IO_BPE_INTERNAL_H */
