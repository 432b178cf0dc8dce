/*
 * dp/tokenizer.h - character- and word-level tokenizers for the trainer,
 * and llm.c's GPT-2 token table to decode pre-tokenized data's samples.
 *
 * char: the vocabulary is the sorted set of distinct bytes of the corpus
 *   (nanoGPT's shakespeare_char preparation): id i <-> the i-th smallest
 *   byte. Text is handled as bytes, so UTF-8 characters are several tokens.
 * word: text is split into words (maximal runs of ASCII letters, digits and
 *   apostrophes, case-sensitive) and single other bytes (whitespace,
 *   punctuation, non-ASCII bytes: the "separators"). The vocabulary is
 *     id 0                  "<unk>"
 *     ids 1 .. S            every separator byte seen in the corpus, ascending
 *     ids S+1 .. V-1        the most frequent words, by count descending,
 *                           ties by bytes ascending (memcmp, shorter first)
 *   with V <= vocab_size. Words and separator bytes outside the vocabulary
 *   encode as <unk>, which decodes to the 5 bytes "<unk>"; so
 *   decode(encode(x)) == x whenever nothing in x is unknown.
 * llmc: llm.c's gpt2_tokenizer.bin (dp_tokenizer_load_llmc), the bytes of
 *   each of GPT-2's BPE tokens by id: it decodes ids to bytes but cannot
 *   encode (that needs the BPE merges) and has no JSON form.
 *
 * Ids are int32_t in [0, vocab size). A tokenizer is immutable after
 * creation and may be shared by threads.
 */
#ifndef DP_TOKENIZER_H
#define DP_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "dp/export.h"
#include "dp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dp_tokenizer_kind {
    DP_TOKENIZER_CHAR = 0,
    DP_TOKENIZER_WORD,
    DP_TOKENIZER_LLMC, /* decode only: dp_tokenizer_load_llmc */
    DP_TOKENIZER_KIND_COUNT
} dp_tokenizer_kind;

/* GPT-2's BPE vocabulary (tiktoken "gpt2"): 50257 ids, the last one,
 * 50256, the end-of-text token <|endoftext|> (EOT). */
#define DP_GPT2_VOCAB_SIZE 50257
#define DP_GPT2_EOT 50256

/* llm.c's tokenizer file: header[0] and the header's size in bytes. */
#define DP_LLMC_TOKENIZER_MAGIC 20240328
#define DP_LLMC_TOKENIZER_HEADER_BYTES 1024

typedef struct dp_tokenizer dp_tokenizer;

/* Parses "char" or "word" (the trainer's --tokenizer flag; "llmc" is
 * not built from a corpus, so not accepted).
 * Errors: DP_ERR_INVALID_ARGUMENT naming the accepted values. */
DP_API dp_status dp_tokenizer_kind_parse(const char *text, dp_tokenizer_kind *out);

/* "char", "word" or "llmc"; "invalid tokenizer kind" outside the enum. */
DP_API const char *dp_tokenizer_kind_name(dp_tokenizer_kind kind);

/* Builds a char tokenizer from text[0..len) (bytes; NULs allowed).
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL, empty corpus),
 * DP_ERR_OUT_OF_MEMORY. Free with dp_tokenizer_destroy. */
DP_API dp_status dp_tokenizer_create_char(const char *text, size_t len, dp_tokenizer **out);

/* Builds a word tokenizer from text[0..len) with at most vocab_size ids.
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL, empty corpus, vocab_size smaller
 * than 1 + S + 1 when the corpus has words, or 1 + S when it has none; the
 * message gives the minimum), DP_ERR_OUT_OF_MEMORY. */
DP_API dp_status dp_tokenizer_create_word(const char *text, size_t len, size_t vocab_size,
                                         dp_tokenizer **out);

/* NULL is a no-op. */
DP_API void dp_tokenizer_destroy(dp_tokenizer *tok);

DP_API dp_tokenizer_kind dp_tokenizer_kind_of(const dp_tokenizer *tok);

/* Number of ids (V): the model's vocabulary size. */
DP_API size_t dp_tokenizer_vocab_size(const dp_tokenizer *tok);

/* The id of <unk> (0) for a word tokenizer; -1 for char and llmc. */
DP_API int32_t dp_tokenizer_unk_id(const dp_tokenizer *tok);

/* The end-of-text id of an llmc table (GPT-2: 50256); -1 for char, word
 * and NULL. */
DP_API int32_t dp_tokenizer_eot_id(const dp_tokenizer *tok);

/*
 * Loads llm.c's token table, gpt2_tokenizer.bin as llm.c's train_gpt2.py
 * writes it: a header of 256 little-endian uint32 ([0] magic 20240328,
 * [1] version, [2] the number of tokens V; version 2: [3] the end-of-text
 * id; version 1 has no such field and holds GPT-2's 50257 tokens, EOT
 * 50256), then V records of a uint8 length (1..255) and that many bytes.
 * The result decodes (dp_tokenizer_token, dp_tokenizer_decode: ids in
 * [0, V)); encoding and serializing return DP_ERR_UNSUPPORTED.
 * The whole file is checked before *out is set: the header is read first,
 * and V against the file's size (every record is 2..256 bytes), so a huge
 * or wrong file is refused before the rest is read.
 * Errors (each message names the file): DP_ERR_INVALID_ARGUMENT (NULL or
 * empty path, NULL out), DP_ERR_IO (missing, unreadable), DP_ERR_FORMAT
 * (not a regular file, e.g. a FIFO or /dev/zero, refused without reading;
 * shorter than the header; another magic, e.g. an llm.c token shard's;
 * version other than 1 or 2; V zero, past INT32_MAX or more than the file
 * can hold; version 1 with V != 50257; an EOT id >= V; a zero length
 * byte; a record cut short; bytes past the last record),
 * DP_ERR_OUT_OF_MEMORY. Free with dp_tokenizer_destroy.
 */
DP_API dp_status dp_tokenizer_load_llmc(const char *path, dp_tokenizer **out);

/* The bytes of token id: *bytes (owned by tok, not NUL-terminated) and
 * *len. Errors: DP_ERR_INVALID_ARGUMENT (NULL, id out of range). */
DP_API dp_status dp_tokenizer_token(const dp_tokenizer *tok, int32_t id, const char **bytes,
                                    size_t *len);

/*
 * Encodes text[0..len) into ids[0..*n). Every token covers at least one
 * byte, so cap >= len always suffices. *n_unknown (may be NULL) gets the
 * number of <unk> ids produced (word tokenizer).
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL with len > 0; cap too small, with
 * *n set to the number needed; for char, a byte not in the vocabulary,
 * named with its offset), DP_ERR_UNSUPPORTED (an llmc table: it cannot
 * encode).
 */
DP_API dp_status dp_tokenizer_encode(const dp_tokenizer *tok, const char *text, size_t len,
                                     int32_t *ids, size_t cap, size_t *n, size_t *n_unknown);

/*
 * Decodes ids[0..n) into a new NUL-terminated buffer *text of *len bytes
 * (the NUL not counted; the text itself may contain NULs). The caller
 * frees *text with free().
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL, an id outside [0, V), named with
 * its position), DP_ERR_OUT_OF_MEMORY.
 */
DP_API dp_status dp_tokenizer_decode(const dp_tokenizer *tok, const int32_t *ids, size_t n,
                                     char **text, size_t *len);

/*
 * Serializes the tokenizer to a NUL-terminated JSON text (ASCII), e.g.
 *   {"type":"char","version":1,"bytes":[10,32,33,...]}
 *   {"type":"word","version":1,"bytes":[10,32,...],"words":["the","a",...]}
 * suitable for a checkpoint's __metadata__. The caller frees *json with
 * free(). Errors: DP_ERR_INVALID_ARGUMENT, DP_ERR_UNSUPPORTED (an llmc
 * table: keep its file instead), DP_ERR_OUT_OF_MEMORY.
 */
DP_API dp_status dp_tokenizer_serialize(const dp_tokenizer *tok, char **json);

/*
 * Parses what dp_tokenizer_serialize wrote, validating it fully: known
 * type and version, bytes strictly ascending integers in 0..255 (for word:
 * separator bytes only), words non-empty, made only of word characters
 * and unique. The result encodes and decodes exactly as the original.
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL), DP_ERR_FORMAT (the message says
 * what is wrong), DP_ERR_OUT_OF_MEMORY.
 */
DP_API dp_status dp_tokenizer_parse(const char *json, dp_tokenizer **out);

#ifdef __cplusplus
}
#endif

#endif /* DP_TOKENIZER_H */
