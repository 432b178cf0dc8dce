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
 * bpe: GPT-2's byte-level BPE (dp_tokenizer_load_bpe), from Hugging Face's
 *   tokenizer.json or OpenAI's encoder.json + vocab.bpe: encodes any UTF-8
 *   text to the ids Hugging Face's `tokenizers` gives, and decodes ids back
 *   to the exact bytes. Loaded from its files; it has no JSON form.
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
    DP_TOKENIZER_BPE,  /* GPT-2's byte-level BPE: dp_tokenizer_load_bpe */
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

/* Parses "char" or "word" (the trainer's --tokenizer flag; "llmc" and
 * "bpe" are not built from a corpus, so not accepted).
 * Errors: DP_ERR_INVALID_ARGUMENT naming the accepted values. */
DP_API dp_status dp_tokenizer_kind_parse(const char *text, dp_tokenizer_kind *out);

/* "char", "word", "llmc" or "bpe"; "invalid tokenizer kind" outside the enum. */
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

/* The id of <unk> (0) for a word tokenizer; -1 for char, llmc and bpe. */
DP_API int32_t dp_tokenizer_unk_id(const dp_tokenizer *tok);

/* The end-of-text id: an llmc table's (GPT-2: 50256); a bpe's token
 * "<|endoftext|>" (an added token or in the vocabulary), -1 if it has
 * none; -1 for char, word and NULL. */
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

/*
 * Loads GPT-2's byte-level BPE (Radford et al. 2019; OpenAI's encoder.py,
 * byte pair encoding after Sennrich et al. 2016) from path, one of:
 *  - Hugging Face's tokenizer.json: model.vocab (token -> id), model.merges
 *    by rank, either as strings "a b" or as pairs ["a", "b"], and
 *    added_tokens (special tokens such as <|endoftext|>, split out of the
 *    text before anything else, leftmost then longest);
 *  - OpenAI's encoder.json (token -> id), with its merges in vocab.bpe in
 *    the same directory ("#version" line, then one "a b" a line); there
 *    <|endoftext|>, if the encoder has it, is the one special token;
 *  - a directory holding tokenizer.json, or else encoder.json + vocab.bpe.
 * Tokens are strings of GPT-2's byte alphabet (bytes_to_unicode: each byte
 * one visible character); an added token's content is its bytes as is.
 *
 * Encoding (dp_tokenizer_encode) is a function of the files and the text
 * alone and gives the ids of Hugging Face's `tokenizers` (encode(text).ids;
 * no post-processor template is applied): special tokens are split out,
 * each piece between them is cut into pre-tokens by GPT-2's expression
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * (PCRE2, \s being Unicode's White_Space, as for tokenizers), and each
 * pre-token's bytes are merged pair by pair, the pair of lowest rank
 * first, the leftmost among equal ones. Letters and digits are those of
 * the Unicode version of the PCRE2 that dp is linked with (Debian 12's
 * 10.42: Unicode 14); characters assigned later count as symbols.
 * Decoding gives each id's bytes, so decode(encode(x)) == x for any UTF-8.
 *
 * Refused (DP_ERR_UNSUPPORTED, naming the setting) rather than encoded
 * differently from tokenizers: a normalizer, a pre-tokenizer other than
 * ByteLevel or one with add_prefix_space or without the expression, BPE
 * dropout, subword prefixes or suffixes, added tokens with lstrip, rstrip
 * or single_word. The model's ignore_merges (a pre-token that is itself a
 * token is that token) is followed.
 * Errors (each message names the file): DP_ERR_INVALID_ARGUMENT (NULL or
 * empty path, NULL out), DP_ERR_IO (missing, unreadable), DP_ERR_FORMAT
 * (not a regular file or such a directory, e.g. a FIFO, refused without
 * reading; empty; over 1 GiB; not JSON, or JSON cut short; no model, a
 * vocabulary that is not an object of token -> integer id, or is empty;
 * an id outside [0, entries + added tokens), an id given twice, a gap in
 * the ids; a token with a character outside the byte alphabet; one of the
 * 256 byte tokens missing; merges missing or not an array; a merge that
 * is not two tokens, names a token outside the vocabulary, or whose
 * concatenation is not in it; an encoder.json without vocab.bpe beside
 * it), DP_ERR_UNSUPPORTED (above), DP_ERR_OUT_OF_MEMORY.
 * Serializing it returns DP_ERR_UNSUPPORTED: keep its files. Free with
 * dp_tokenizer_destroy.
 */
DP_API dp_status dp_tokenizer_load_bpe(const char *path, dp_tokenizer **out);

/* The same from OpenAI's two files named explicitly: encoder_json (token
 * -> id) and vocab_bpe (the merges by rank). Errors as above. */
DP_API dp_status dp_tokenizer_load_bpe_openai(const char *encoder_json, const char *vocab_bpe,
                                              dp_tokenizer **out);

/*
 * Checks that text[0..len) is well-formed UTF-8 (the Unicode Standard's
 * table 3-7, RFC 3629: no stray continuation byte, truncated sequence,
 * overlong form, surrogate U+D800..U+DFFF, or code point past U+10FFFF).
 * *bad_offset (may be NULL) gets the byte offset of the first invalid
 * sequence's first byte, or len when there is none.
 * Errors: DP_ERR_INVALID_ARGUMENT (text NULL with len > 0), DP_ERR_FORMAT
 * (invalid UTF-8: the message gives the offset, the bytes and the reason).
 */
DP_API dp_status dp_utf8_check(const char *text, size_t len, size_t *bad_offset);

/* The bytes of token id: *bytes (owned by tok, not NUL-terminated) and
 * *len. Errors: DP_ERR_INVALID_ARGUMENT (NULL, id out of range). */
DP_API dp_status dp_tokenizer_token(const dp_tokenizer *tok, int32_t id, const char **bytes,
                                    size_t *len);

/*
 * Encodes text[0..len) into ids[0..*n). Every token covers at least one
 * byte, so cap >= len always suffices. *n_unknown (may be NULL) gets the
 * number of <unk> ids produced (word tokenizer).
 * A bpe tokenizer needs UTF-8 text and caches each distinct word's ids
 * for the call (one call on a whole corpus is faster than many small
 * ones); its text of special tokens becomes their ids.
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL with len > 0; cap too small, with
 * *n set to the number needed; for char, a byte not in the vocabulary,
 * named with its offset), DP_ERR_FORMAT (bpe: text that is not UTF-8, the
 * message giving the byte offset as dp_utf8_check does),
 * DP_ERR_UNSUPPORTED (an llmc table: it cannot encode),
 * DP_ERR_OUT_OF_MEMORY (bpe).
 */
DP_API dp_status dp_tokenizer_encode(const dp_tokenizer *tok, const char *text, size_t len,
                                     int32_t *ids, size_t cap, size_t *n, size_t *n_unknown);

/* dp_tokenizer_encode with a bpe's special tokens not recognised: their
 * text is encoded as any other (tiktoken's encode_ordinary, what llm.c's
 * fineweb.py encodes documents with). The same as dp_tokenizer_encode for
 * the other kinds. Errors as dp_tokenizer_encode. */
DP_API dp_status dp_tokenizer_encode_ordinary(const dp_tokenizer *tok, const char *text,
                                              size_t len, int32_t *ids, size_t cap, size_t *n);

/*
 * Where a long text may be cut to encode it in pieces: the largest p <=
 * len such that, whatever bytes follow text[0..len), encoding text[0..p)
 * and the rest separately gives the ids of encoding them together
 * (special tokens recognised or not); 0 when there is none in the window.
 * char: len. word: after the last separator byte. bpe: just after a '
'
 * that has an ASCII graphic byte on both sides ("x
y"), outside any
 * special token (with a special token that contains one, 0 when it might
 * continue past len). llmc, NULL, or len < 3 for bpe: 0. Encoding a file
 * window by window this way bounds memory and allows progress reports:
 * read more when it returns 0, and encode the rest whole at the end.
 */
DP_API size_t dp_tokenizer_cut_point(const dp_tokenizer *tok, const char *text, size_t len);

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
 * table or a bpe: keep its files instead), DP_ERR_OUT_OF_MEMORY.
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
