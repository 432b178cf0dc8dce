/*
 * io/tokenizer_internal.h - the representation of dp_tokenizer shared by
 * its parts (private to them; dp/tokenizer.h is the interface):
 *
 *   tokenizer.c       char and word tokenizers built from a corpus, the
 *                     queries, encode/decode, and the dispatch to GPT-2's
 *                     byte-level BPE (io/bpe.h);
 *   tokenizer_json.c  the JSON form of char and word tokenizers;
 *   tokenizer_llmc.c  llm.c's GPT-2 token table (gpt2_tokenizer.bin).
 *
 * char, word and llmc share one representation: a table of token byte
 * strings by id, a byte -> id map for single-byte tokens (char, word), and
 * (word) a hash from word bytes to id. A bpe keeps its own tables.
 */
#ifndef DP_IO_TOKENIZER_INTERNAL_H
#define DP_IO_TOKENIZER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "dp/tokenizer.h"
#include "io/bpe.h"

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

/* A byte of a word (the word kind): ASCII letters, digits and '\''. */
static inline int tok_is_word_byte(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '\'';
}

/*
 * The common constructor. For char: bytes[0..nbytes) ascending are the
 * whole vocabulary. For word: id 0 is <unk>, then bytes (separators), then
 * words[i] = (wp[i], wl[i]) in id order. Inputs are already validated.
 */
dp_status tok_create(dp_tokenizer_kind kind, const unsigned char *bytes, size_t nbytes,
                     const char *const *wp, const size_t *wl, size_t nwords, dp_tokenizer **out);

#endif /* DP_IO_TOKENIZER_INTERNAL_H */
