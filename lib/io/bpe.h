/*
 * io/bpe.h - GPT-2's byte-level BPE, the engine behind DP_TOKENIZER_BPE:
 * tokenizer.c dispatches to these for a BPE tokenizer (dp/tokenizer.h
 * documents the behaviour; this header only the division of work).
 *
 * A bpe is immutable after loading and may be used by several threads at
 * once: encoding keeps its cache and scratch in the call.
 */
#ifndef DP_IO_BPE_H
#define DP_IO_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "dp/status.h"

typedef struct bpe bpe;

/* Hugging Face's tokenizer.json (a byte-level BPE model). */
dp_status bpe_load_hf(const char *path, bpe **out);

/* OpenAI's encoder.json + vocab.bpe. */
dp_status bpe_load_openai(const char *encoder_json, const char *vocab_bpe, bpe **out);

/* Either format, told by the path: a directory holding tokenizer.json or
 * encoder.json + vocab.bpe; a tokenizer.json; an encoder.json with
 * vocab.bpe beside it. */
dp_status bpe_load(const char *path, bpe **out);

void bpe_destroy(bpe *b);

size_t bpe_vocab_size(const bpe *b);

/* The id of <|endoftext|>, or -1. */
int32_t bpe_eot(const bpe *b);

/* The bytes of id (in [0, vocab), checked by the caller). */
void bpe_token(const bpe *b, int32_t id, const char **bytes, size_t *len);

/* Encodes text[0..len) into ids[0..min(*n, cap)), *n the number of ids
 * (even past cap; the caller reports a short buffer). with_special: split out
 * the added (special) tokens first; 0 encodes their text as any other. */
dp_status bpe_encode(const bpe *b, const char *text, size_t len, int with_special, int32_t *ids,
                     size_t cap, size_t *n);

/* The largest cut in text[0..len) that changes no id (0 if none). */
size_t bpe_cut_point(const bpe *b, const char *text, size_t len);

#endif /* DP_IO_BPE_H */
