/*
 * dp/data.h - text corpora, token datasets with a train/validation split,
 * pre-tokenized files (nanoGPT's and llm.c's uint16 formats, mapped
 * read-only), a seeded random batch sampler and fixed validation windows.
 *
 * All arrays here are host memory; token ids are int32_t. The trainer
 * copies a batch to each device with dp_copy_h2d. A dataset's tokens live
 * either in memory as int32 (from text or from an id array) or in files
 * mapped read-only, of which only the windows asked for are converted:
 * dp_token_data_read copies any range of either kind.
 */
#ifndef DP_DATA_H
#define DP_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "dp/export.h"
#include "dp/status.h"
#include "dp/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Loads a corpus from path:
 *  - a regular file (or a symlink to one): its bytes;
 *  - a directory: its regular files, not recursing, sorted by name (byte
 *    order, so the corpus is the same on every machine), joined with one
 *    '\n' between files. Skipped: dot-files, names ending in ".dat" or
 *    ".u8" (the fortunes package's index files and UTF-8 duplicates),
 *    symlinks whose target's name is one of those, subdirectories and
 *    other non-regular entries, and empty files.
 * *text gets a malloc'd NUL-terminated buffer of *len bytes (the NUL not
 * counted) that the caller frees with free(); *n_files (may be NULL) the
 * number of files read.
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL or empty path, NULL text or len), DP_ERR_IO (path does
 * not exist, or a file or directory cannot be read: the message has the
 * path and the reason), DP_ERR_FORMAT (path is neither a regular file nor
 * a directory, e.g. /dev/zero or a FIFO: refused before reading; an empty
 * file, a directory with no usable file, a file holding a NUL byte, i.e.
 * binary, found while reading, within the first 64 KiB piece that holds
 * one: the message names the file and the offset), DP_ERR_OUT_OF_MEMORY.
 */
DP_API dp_status dp_text_load(const char *path, char **text, size_t *len, size_t *n_files);

typedef enum dp_split {
    DP_SPLIT_TRAIN = 0, /* the first 90% of the tokens, or the training files */
    DP_SPLIT_VAL,       /* the last 10%, or the validation files */
    DP_SPLIT_COUNT
} dp_split;

/* "training" or "validation" (for messages); "invalid split" outside the enum. */
DP_API const char *dp_split_name(dp_split split);

typedef struct dp_token_data dp_token_data;

/*
 * Encodes text[0..len) with tok into a token dataset (ids in [0, V)).
 * Split: train = floor(0.9 n) tokens (computed exactly in integers), val =
 * the remaining n - train (so validation gets the rounding remainder, at
 * least 10%). tok is not kept.
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL, empty text, a byte missing from a
 * char vocabulary), DP_ERR_OUT_OF_MEMORY.
 */
DP_API dp_status dp_token_data_from_text(const dp_tokenizer *tok, const char *text, size_t len,
                                         dp_token_data **out);

/* Same from tokens[0..n) (copied); every id must be in [0, vocab_size).
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL, n == 0, vocab_size == 0 or >
 * INT32_MAX, an id out of range, named with its position),
 * DP_ERR_OUT_OF_MEMORY. */
DP_API dp_status dp_token_data_from_tokens(const int32_t *tokens, size_t n, size_t vocab_size,
                                           dp_token_data **out);

/* NULL is a no-op. */
DP_API void dp_token_data_destroy(dp_token_data *data);

/* Total number of tokens (both splits). */
DP_API size_t dp_token_data_total(const dp_token_data *data);

/* Vocabulary size the ids were checked against (data from files: are
 * checked against as they are read). */
DP_API size_t dp_token_data_vocab_size(const dp_token_data *data);

/* Number of <unk> ids in the data (0 for char, from tokens or from files). */
DP_API size_t dp_token_data_unknown_count(const dp_token_data *data);

/* Number of tokens in split (0 for a bad split). */
DP_API size_t dp_token_data_size(const dp_token_data *data, dp_split split);

/* The split's tokens (owned by data) when they are held in memory as
 * int32 (data from dp_token_data_from_text or _from_tokens); NULL for a
 * bad split and for data mapped from files (dp_token_data_open), whose
 * tokens are uint16 on disk: read those with dp_token_data_read. */
DP_API const int32_t *dp_token_data_tokens(const dp_token_data *data, dp_split split);

/*
 * Copies tokens [first, first + count) of split into out[0..count) as
 * int32, for data of any kind (in memory or mapped from files, where a
 * range may span several files: a split is its files' tokens joined in
 * name order). Ids read from files are checked against the vocabulary
 * given to dp_token_data_open as they are converted.
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL, bad split, count 0, the range
 * past the split's end), DP_ERR_FORMAT (an id >= the vocabulary size in a
 * file: the message names the file, the token's index in it and the id).
 * out may be partly written on error.
 */
DP_API dp_status dp_token_data_read(const dp_token_data *data, dp_split split, size_t first,
                                    size_t count, int32_t *out);

// --- pre-tokenized files: nanoGPT and llm.c -----------------------------------

/* Where a dataset's tokens come from. */
typedef enum dp_token_format {
    DP_TOKEN_FORMAT_MEMORY = 0, /* int32 ids in memory (from text or an id array) */
    DP_TOKEN_FORMAT_NANOGPT,    /* nanoGPT's prepare.py (train.bin, val.bin): raw
                                   little-endian uint16 ids, no header */
    DP_TOKEN_FORMAT_LLMC,       /* llm.c's shards (*_train_*.bin, *_val_*.bin): a header of
                                   256 little-endian int32 (magic 20240520, version 1, the
                                   token count), then that many little-endian uint16 ids */
    DP_TOKEN_FORMAT_COUNT
} dp_token_format;

/* llm.c's token shard: header[0], header[1], and the header's size in bytes. */
#define DP_LLMC_DATA_MAGIC 20240520
#define DP_LLMC_DATA_VERSION 1
#define DP_LLMC_HEADER_BYTES 1024

/* "memory", "nanogpt" or "llmc"; "invalid token format" outside the enum. */
DP_API const char *dp_token_format_name(dp_token_format format);

/*
 * Says whether path holds pre-tokenized data (dp_token_data_open) rather
 * than text (dp_text_load), looking at names and at most the first 4 bytes
 * of one file: *is_tokens = 1 for a regular file (or a symlink to one)
 * whose name ends in ".bin" or that starts with llm.c's magic 20240520
 * (little-endian int32), and for a directory holding at least one entry
 * whose name ends in ".bin" (dot-files aside); 0 for any other regular
 * file or directory.
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL or empty path, NULL is_tokens),
 * DP_ERR_IO (path does not exist or cannot be read: the path and the
 * reason), DP_ERR_FORMAT (path is neither a regular file nor a directory,
 * e.g. /dev/zero or a FIFO: refused without opening it).
 */
DP_API dp_status dp_token_files_probe(const char *path, int *is_tokens);

/*
 * Opens pre-tokenized data at path, mapping each file read-only (mmap):
 * nothing is converted or copied at open, and no id is scanned; the
 * sampler and the validation windows convert the windows they draw.
 *  - a regular file: its tokens, split 90/10 as dp_token_data_from_text
 *    splits text (train = floor(0.9 n));
 *  - a directory: its entries whose names end in ".bin" (dot-files
 *    skipped; other files are ignored and counted in
 *    dp_token_data_info.ignored_files, so a nanoGPT or llm.c data
 *    directory holding its input text and scripts is read as is). A name
 *    containing "train" is a training file, "val" a validation file
 *    (nanoGPT's train.bin / val.bin, llm.c's fineweb_train_000001.bin /
 *    fineweb_val_000000.bin); each split is its files' tokens joined in
 *    name order (byte order, strcmp), so the splits come from the files.
 * Each file's format is told by its first 4 bytes: llm.c's magic 20240520
 * makes it an llm.c shard, whose header must say version 1 and a token
 * count agreeing with the file's size (1024 + 2 x count bytes); any other
 * file is raw nanoGPT uint16 (an even size). Every file of a directory
 * must have the same format. The ids must be < vocab_size when read
 * (dp_token_data_read). The files must not change while data is open.
 * Errors (each message names the file and the fix):
 * DP_ERR_INVALID_ARGUMENT (NULL or empty path, NULL out, vocab_size 0 or
 * > INT32_MAX), DP_ERR_IO (missing, unreadable, mmap failed),
 * DP_ERR_FORMAT (not a regular file or directory, e.g. /dev/zero or a
 * FIFO, refused without reading; an empty file; a raw file of odd size;
 * an llm.c header of another version, a negative token count or one that
 * disagrees with the file's size; another llm.c file kind (a tokenizer,
 * an evaluation set, llama-3's uint32 shards); a directory with no *.bin,
 * with training files but no validation files or the reverse, a *.bin
 * name holding neither or both of "train" and "val", a *.bin that is not
 * a regular file, or mixed formats), DP_ERR_OUT_OF_MEMORY. On error *out
 * is NULL and nothing stays mapped. Free with dp_token_data_destroy,
 * which unmaps the files.
 */
DP_API dp_status dp_token_data_open(const char *path, size_t vocab_size, dp_token_data **out);

/* What dp_token_data_open found (for messages and checkpoint metadata). */
typedef struct dp_token_data_info {
    dp_token_format format;
    int split_by_files;           /* 1: each split from its own files; 0: one sequence cut
                                     90/10 (text, an id array, a single file) */
    size_t files[DP_SPLIT_COUNT]; /* files per split (a single file: 1 and 1, the same
                                     one); 0 for data in memory */
    size_t ignored_files;         /* directory entries not read (not *.bin) */
    size_t mapped_bytes;          /* bytes mapped, headers included */
} dp_token_data_info;

/* Fills *info. Errors: DP_ERR_INVALID_ARGUMENT (NULL). */
DP_API dp_status dp_token_data_get_info(const dp_token_data *data, dp_token_data_info *info);

// --- random batches ---------------------------------------------------------

typedef struct dp_sampler dp_sampler;

/*
 * A sampler of random windows of context+1 consecutive tokens from one
 * split of data (borrowed: it must outlive the sampler). Each window start
 * is drawn uniformly from [0, n - context - 1] with dp_rng_below on an rng
 * seeded with dp_rng_seed(seed), one draw per row, so the sequence of
 * windows depends only on the seed (and not on how rows are grouped into
 * batches). Use different seeds for different splits.
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL, bad split, context == 0, or the
 * split shorter than context + 1 tokens: "context 256 is longer than the
 * validation split (120 tokens); use a smaller --context or more data"),
 * DP_ERR_OUT_OF_MEMORY.
 */
DP_API dp_status dp_sampler_create(const dp_token_data *data, dp_split split, size_t context,
                                   uint64_t seed, dp_sampler **out);

/* NULL is a no-op. */
DP_API void dp_sampler_destroy(dp_sampler *s);

/*
 * Draws the next batch of B windows: inputs (B,T) gets tokens [p, p+T) and
 * targets (B,T) tokens [p+1, p+T+1) of each window (T = context), i.e.
 * targets are the inputs shifted left by one. Both host int32 arrays.
 * For data mapped from files only these windows are converted, and their
 * ids checked against the vocabulary (dp_token_data_read).
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL, B == 0, B * T overflowing),
 * DP_ERR_FORMAT (an id out of the vocabulary in a file, named with the
 * file and its index there). The sampler is unchanged on error.
 */
DP_API dp_status dp_sampler_next(dp_sampler *s, int32_t *inputs, int32_t *targets, size_t B);

/* Batches drawn since creation (or restored with the state). */
DP_API uint64_t dp_sampler_batches(const dp_sampler *s);

/* The state: a version tag, the rng state (4 words), batches drawn,
 * windows drawn, the context and the split length. */
#define DP_SAMPLER_STATE_WORDS 9

/* Copies the state out, e.g. to store it in a checkpoint. */
DP_API dp_status dp_sampler_get_state(const dp_sampler *s,
                                      uint64_t state[DP_SAMPLER_STATE_WORDS]);

/*
 * Restores a state from dp_sampler_get_state, so the sampler continues with
 * exactly the batches the saved one would have drawn next. The sampler must
 * have been created with the same context over a split of the same length.
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL; context or split length differ,
 * both named in the message), DP_ERR_FORMAT (unknown version tag, an
 * all-zero rng state). The sampler is unchanged on error.
 */
DP_API dp_status dp_sampler_set_state(dp_sampler *s,
                                      const uint64_t state[DP_SAMPLER_STATE_WORDS]);

/* Characters (with the NUL) of the text form of a state. */
#define DP_SAMPLER_STATE_CHARS (DP_SAMPLER_STATE_WORDS * 17)

/* The state as text for checkpoint metadata: the words in lowercase hex,
 * 16 digits each, separated by ','. Writes DP_SAMPLER_STATE_CHARS bytes
 * with the NUL. Errors: DP_ERR_INVALID_ARGUMENT (NULL, cap too small). */
DP_API dp_status dp_sampler_state_format(const uint64_t state[DP_SAMPLER_STATE_WORDS], char *buf,
                                         size_t cap);

/* Parses the text form back. Errors: DP_ERR_INVALID_ARGUMENT (NULL),
 * DP_ERR_FORMAT (not exactly DP_SAMPLER_STATE_WORDS comma-separated
 * 16-digit hex words). */
DP_API dp_status dp_sampler_state_parse(const char *text,
                                        uint64_t state[DP_SAMPLER_STATE_WORDS]);

// --- fixed validation windows (--eval-only) -----------------------------------

/* Number of windows of context+1 tokens starting at 0, T, 2T, ... (T =
 * context) that fit in the split: (n - 1) / T when n >= T + 1, else 0. The
 * last incomplete window is dropped. Consecutive windows share one token
 * (the target of the last position of window i is the first input of i+1),
 * so every token but the first is a target exactly once. 0 for NULL, a bad
 * split or context 0. */
DP_API size_t dp_eval_window_count(const dp_token_data *data, dp_split split, size_t context);

/*
 * Fills rows r = 0..count-1 of inputs (count,T) and targets (count,T) with
 * windows first + r: inputs = tokens [i T, i T + T), targets = tokens
 * [i T + 1, i T + T + 1) for i = first + r.
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL, bad split, context 0, count 0, or
 * first + count past dp_eval_window_count), DP_ERR_FORMAT (an id out of the
 * vocabulary in a file, as dp_token_data_read).
 */
DP_API dp_status dp_eval_windows(const dp_token_data *data, dp_split split, size_t context,
                                 size_t first, size_t count, int32_t *inputs, int32_t *targets);

#ifdef __cplusplus
}
#endif

#endif /* DP_DATA_H */
