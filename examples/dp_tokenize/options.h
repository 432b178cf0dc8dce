/*
 * examples/dp_tokenize/options.h - dp_tokenize's command line.
 */
#ifndef DP_TOKENIZE_OPTIONS_H
#define DP_TOKENIZE_OPTIONS_H

#include <stddef.h>

typedef struct tok_options {
    const char *tokenizer_file; /* tokenizer.json, encoder.json or a directory */
    const char *merges_file;    /* vocab.bpe for an encoder.json; NULL: found beside it */
    const char *out;            /* the llm.c shard to write; NULL: count only */
    int allow_special;          /* special tokens' text becomes their ids */
    char *const *inputs;        /* the documents, in order */
    size_t n_inputs;
} tok_options;

/* Parses argv. Returns 0 to run, 1 after printing an error (exit 2), -1
 * after printing --help (exit 0). */
int tok_options_parse(int argc, char **argv, tok_options *o);

#endif /* DP_TOKENIZE_OPTIONS_H */
