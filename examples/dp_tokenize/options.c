/*
 * examples/dp_tokenize/options.c - dp_tokenize's options (getopt_long)
 * and --help.
 */
#define _GNU_SOURCE /* getopt_long */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "dp_cli.h"
#include "options.h"
#include "report.h"

static const char USAGE[] =
    "usage: dp_tokenize --tokenizer-file PATH [--out FILE.bin] [options] INPUT...\n"
    "\n"
    "Encodes text files with GPT-2's byte-level BPE into one llm.c token shard: a\n"
    "header of 256 little-endian int32 (magic 20240520, version 1, the token count),\n"
    "then the ids as little-endian uint16. Each INPUT is one document, preceded by\n"
    "the end-of-text token <|endoftext|> (llm.c's dev/data/fineweb.py convention).\n"
    "lm_train and dp_token_data_open read the shard (one file: split 90/10).\n"
    "\n"
    "  --tokenizer-file PATH  Hugging Face's tokenizer.json, OpenAI's encoder.json\n"
    "                         (with vocab.bpe beside it), or a directory holding\n"
    "                         either; a vocabulary past 65536 ids is refused (uint16)\n"
    "  --merges-file PATH     OpenAI's vocab.bpe, when not beside encoder.json\n"
    "  --out FILE.bin         the shard, written atomically (a temporary file in the\n"
    "                         same directory, renamed when complete); an existing file\n"
    "                         that is not such a shard is refused, never replaced;\n"
    "                         without --out the tokens are only counted\n"
    "  --allow-special        encode the text of special tokens (<|endoftext|>) as\n"
    "                         their ids, as llm.c's tinyshakespeare.py does; by\n"
    "                         default it is encoded as ordinary text, as fineweb.py\n"
    "                         does (tiktoken's encode_ordinary)\n"
    "  -h, --help             this text\n"
    "\n"
    "Inputs must be regular files of UTF-8 text (invalid UTF-8 is refused with its\n"
    "file and byte offset); --out must not be one of them, nor a file of the\n"
    "tokenizer (the same file by any path: a link, ./, ..). Progress goes to stderr,\n"
    "the summary (tokens, tokens/s) to stdout. Exit status 0; 2 for a command line\n"
    "it refuses; 1 for any later error. Nothing is written on either.\n";

int tok_options_parse(int argc, char **argv, tok_options *o)
{
    memset(o, 0, sizeof *o);
    enum { OPT_TOKENIZER = 256, OPT_MERGES, OPT_OUT, OPT_SPECIAL };
    static const struct option lo[] = {
        {"tokenizer-file", required_argument, NULL, OPT_TOKENIZER},
        {"merges-file", required_argument, NULL, OPT_MERGES},
        {"out", required_argument, NULL, OPT_OUT},
        {"allow-special", no_argument, NULL, OPT_SPECIAL},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    opterr = 0; // our own messages, one line each
    int c;
    while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
        switch (c) {
        case OPT_TOKENIZER: o->tokenizer_file = optarg; break;
        case OPT_MERGES: o->merges_file = optarg; break;
        case OPT_OUT: o->out = optarg; break;
        case OPT_SPECIAL: o->allow_special = 1; break;
        case 'h': fputs(USAGE, stdout); return -1;
        default: /* ':' a missing value, '?' unknown: named from optopt, not the
                  * argument before (cli_bad_option) */
            return cli_bad_option(argv, "");
        }
    }
    if (o->tokenizer_file && !*o->tokenizer_file)
        return tok_fail("--tokenizer-file needs a file name: a tokenizer.json, or an "
                        "encoder.json with vocab.bpe (see --help)");
    if (!o->tokenizer_file)
        return tok_fail("--tokenizer-file PATH is required: a tokenizer.json, or an encoder.json "
                        "with vocab.bpe (see --help)");
    if (o->merges_file && !*o->merges_file) return tok_fail("--merges-file needs a file name");
    if (o->out && !*o->out) return tok_fail("--out needs a file name");
    if (optind >= argc) return tok_fail("no INPUT file to encode (see --help)");
    o->inputs = argv + optind;
    o->n_inputs = (size_t)(argc - optind);
    return 0;
}
