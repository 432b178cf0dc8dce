/*
 * examples/dp_tokenize/main.c - dp_tokenize: text files -> one llm.c token
 * shard, with GPT-2's byte-level BPE (dp_tokenizer_load_bpe).
 *
 *   dp_tokenize --tokenizer-file tokenizer.json --out data_train_000000.bin a.txt b.txt
 *
 * options.c  the command line and --help
 * inputs.c   checking the inputs; encoding each in windows
 * shard.c    the llm.c shard, written atomically
 * report.c   errors, the progress line, the summary
 */
#include <stdio.h>

#include <dp/tokenizer.h>

#include "dp_cli.h"
#include "inputs.h"
#include "options.h"
#include "report.h"
#include "shard.h"

/* The shard stores uint16 ids. */
#define MAX_VOCAB 65536

/* Loads the tokenizer and checks that its ids fit the shard and that it
 * has the end-of-text token that separates documents. */
static int load_tokenizer(const tok_options *o, dp_tokenizer **tok)
{
    dp_status st = o->merges_file
                       ? dp_tokenizer_load_bpe_openai(o->tokenizer_file, o->merges_file, tok)
                       : dp_tokenizer_load_bpe(o->tokenizer_file, tok);
    if (st != DP_OK) return tok_fail("cannot load the tokenizer: %s", dp_last_error());
    size_t V = dp_tokenizer_vocab_size(*tok);
    int rc = 0;
    if (V > MAX_VOCAB)
        rc = tok_fail("'%s' has %zu ids; llm.c's shard stores uint16 ids, so at most %d",
                      o->tokenizer_file, V, MAX_VOCAB);
    else if (dp_tokenizer_eot_id(*tok) < 0)
        rc = tok_fail("'%s' has no <|endoftext|> token to put before each document",
                      o->tokenizer_file);
    if (rc) {
        dp_tokenizer_destroy(*tok);
        *tok = NULL;
    }
    return rc;
}

int main(int argc, char **argv)
{
    /* the name of cli's messages; a reader that quits (| head) fails the
     * summary's write, and the run with its message (nothing written) */
    cli_set_program("dp_tokenize");
    tok_options o;
    int rc = tok_options_parse(argc, argv, &o);
    if (rc < 0) return cli_check_stream(stdout, "the help to standard output"); /* --help */
    if (rc) return 2; /* a refused command line */
    size_t total = 0;
    if (tok_check_inputs(&o, &total)) return 1;
    dp_tokenizer *tok = NULL;
    if (load_tokenizer(&o, &tok)) return 1;
    int32_t eot = dp_tokenizer_eot_id(tok);

    tok_shard *sh = NULL;
    if (o.out && tok_shard_open(o.out, &sh)) {
        dp_tokenizer_destroy(tok);
        return 1;
    }
    tok_progress pg;
    tok_progress_start(&pg, o.n_inputs, total);
    for (size_t i = 0; rc == 0 && i < o.n_inputs; i++)
        rc = tok_encode_input(tok, eot, &o, i, sh, &pg);
    /* The summary first, then the shard: a summary that cannot be written
     * (a full disk, a closed pipe) fails the run with nothing written. */
    if (!rc) {
        tok_progress_finish(&pg, o.out);
        rc = cli_check_stream(stdout, "the summary to standard output");
    }
    if (rc) tok_shard_abort(sh);
    else if (sh) rc = tok_shard_commit(sh);
    dp_tokenizer_destroy(tok);
    return rc ? 1 : 0;
}
