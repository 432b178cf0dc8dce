/*
 * examples/dp_tokenize/inputs.h - the input files: checked before any
 * work, then each encoded window by window into the shard.
 */
#ifndef DP_TOKENIZE_INPUTS_H
#define DP_TOKENIZE_INPUTS_H

#include <stddef.h>

#include <dp/tokenizer.h>

#include "options.h"
#include "report.h"
#include "shard.h"

/* Every input is a regular file, and --out (when it exists) is a regular
 * file; --out is none of the files read: the inputs, the tokenizer's
 * files (cli_check_overlaps: device and inode, so another path to the
 * same file is caught, or the resolved path). *total_bytes: the inputs'
 * sizes summed. 0, or 1 after printing why. */
int tok_check_inputs(const tok_options *o, size_t *total_bytes);

/* Encodes input i as one document: the end-of-text id eot, then its
 * text, appended to sh (NULL: only counted). 0, or 1 after printing why
 * (unreadable, invalid UTF-8 with its byte offset, a failed write). */
int tok_encode_input(const dp_tokenizer *tok, int32_t eot, const tok_options *o, size_t i,
                     tok_shard *sh, tok_progress *pg);

#endif /* DP_TOKENIZE_INPUTS_H */
