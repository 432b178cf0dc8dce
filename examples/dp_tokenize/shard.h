/*
 * examples/dp_tokenize/shard.h - writing one llm.c token shard (the layout
 * of llm.c's dev/data/data_common.py, GPT-2 kind, which dp_token_data_open
 * reads): a header of 256 little-endian int32 [magic 20240520, version 1,
 * token count, 0...], then the ids as little-endian uint16.
 *
 * The file goes through dp's atomic writer: the ids stream into a
 * temporary file beside the target, the header is written last (its count
 * known), and only a complete file is renamed into place; on any failure
 * the target is left as it was, and a run stopped by a signal removes
 * the temporary file before it dies (cli_guard_temp).
 */
#ifndef DP_TOKENIZE_SHARD_H
#define DP_TOKENIZE_SHARD_H

#include <stddef.h>
#include <stdint.h>

typedef struct tok_shard tok_shard;

/* Creates the temporary file for path. 0, or 1 after printing why. */
int tok_shard_open(const char *path, tok_shard **out);

/* Appends ids[0..n) (each in [0, 65535]: the caller checked the vocabulary).
 * 0, or 1 after printing why (a failed write; more than INT32_MAX tokens,
 * which the header's int32 count cannot hold). */
int tok_shard_append(tok_shard *s, const int32_t *ids, size_t n);

/* Writes the header and renames the file into place; frees s. 0, or 1
 * after printing why (the target then untouched). */
int tok_shard_commit(tok_shard *s);

/* Removes the temporary file and frees s; NULL is a no-op. */
void tok_shard_abort(tok_shard *s);

#endif /* DP_TOKENIZE_SHARD_H */
