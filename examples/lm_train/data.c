/*
 * examples/lm_train/data.c - what lm_train trains on: text (a file or
 * directory, tokenized by the char or word tokenizer, or the
 * checkpoint's) or token files (nanoGPT's and llm.c's, mapped
 * read-only), the options that apply to one kind only, and the seeded
 * batch samplers of the two splits.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "lm_train.h"

/* Options that apply to one kind of data only, refused for the other. */
static int check_data_options(const run *r, const char *path)
{
    const opts *o = &r->o;
    if (r->is_tokens) {
        if (o->given & G_TOK)
            return cli_fail("--tokenizer %s applies to text, but --data %s holds token ids (already "
                            "tokenized); drop --tokenizer (--tokenizer-file decodes samples)",
                            o->tokenizer, path);
        if ((o->given & G_PROMPT) && !o->tokenizer_file)
            return cli_fail("--prompt takes text, which token data encode with their BPE "
                            "tokenizer: give it with --tokenizer-file (tokenizer.json, or "
                            "encoder.json with vocab.bpe), or the prompt as ids, e.g. --prompt-ids "
                            "%d,464", DP_GPT2_EOT);
        if ((o->given & G_PROMPT) && o->prompt_ids)
            return cli_fail("--prompt and --prompt-ids: give the prompt one way");
        if ((o->given & G_VOCAB) && o->vocab_size > TOKEN_VOCAB_MAX)
            return cli_fail("--vocab-size %ld: token files hold uint16 ids, all below %ld; give at "
                            "most %ld", o->vocab_size, TOKEN_VOCAB_MAX, TOKEN_VOCAB_MAX);
        return 0;
    }
    if (o->tokenizer_file)
        return cli_fail("--tokenizer-file decodes token data's samples, but --data %s is text (its "
                        "tokenizer comes from the text); drop --tokenizer-file", path);
    if (o->prompt_ids)
        return cli_fail("--prompt-ids applies to token data, but --data %s is text; give the "
                        "prompt as --prompt TEXT", path);
    return 0;
}

/* The data's path (--data, else the default corpus) and its kind, text
 * or token files: told by names and at most 4 bytes, nothing read yet. */
int probe_data(run *r, const char **path)
{
    const opts *o = &r->o;
    *path = o->data ? o->data : LM_DEFAULT_CORPUS;
    struct stat sb;
    if (!o->data && stat(*path, &sb) != 0)
        return cli_fail("the default corpus '%s' does not exist: install Debian's fortunes "
                        "package (apt-get install fortunes) or pass --data FILE", *path);
    if (dp_token_files_probe(*path, &r->is_tokens) != DP_OK) return cli_dp_fail("--data");
    return check_data_options(r, *path);
}

/* Text: loads the corpus and builds (or takes the checkpoint's) tokenizer. */
static int load_text(run *r, const char *path)
{
    const opts *o = &r->o;
    char *text = NULL;
    size_t len = 0, files = 0;
    if (dp_text_load(path, &text, &len, &files) != DP_OK) return cli_dp_fail("--data");
    if (!r->tok) {
        dp_tokenizer_kind kind = DP_TOKENIZER_CHAR;
        const char *what = "--tokenizer";
        dp_status s = dp_tokenizer_kind_parse(o->tokenizer, &kind);
        if (s == DP_OK && kind == DP_TOKENIZER_CHAR && (o->given & G_VOCAB)) {
            free(text);
            return cli_fail("--vocab-size applies to --tokenizer word and to token data; the "
                            "char tokenizer's vocabulary is the text's characters: drop "
                            "--vocab-size, or add --tokenizer word");
        }
        if (s == DP_OK) {
            what = "tokenizer";
            s = kind == DP_TOKENIZER_CHAR
                    ? dp_tokenizer_create_char(text, len, &r->tok)
                    : dp_tokenizer_create_word(text, len, (size_t)o->vocab_size, &r->tok);
        }
        if (s != DP_OK) {
            free(text);
            return cli_dp_fail(what);
        }
    }
    dp_status s = dp_token_data_from_text(r->tok, text, len, &r->data);
    free(text);
    if (s == DP_ERR_INVALID_ARGUMENT && o->resume) /* the checkpoint's vocabulary */
        return cli_fail("--data: %s; the checkpoint's tokenizer was built from other text: resume "
                        "with the run's own --data (or start a new run on this one)",
                        dp_last_error());
    if (s == DP_ERR_INVALID_ARGUMENT && o->init_from)
        return cli_fail("--data: %s; --init-from's tokenizer was built from other text: give "
                        "text it covers (or start a new model on this one)", dp_last_error());
    if (s != DP_OK) return cli_dp_fail("--data");
    printf("data: %s (%zu file%s, %zu tokens: %zu train, %zu validation), %s tokenizer, vocab %zu\n",
           path, files, files == 1 ? "" : "s", dp_token_data_total(r->data),
           dp_token_data_size(r->data, DP_SPLIT_TRAIN), dp_token_data_size(r->data, DP_SPLIT_VAL),
           dp_tokenizer_kind_name(dp_tokenizer_kind_of(r->tok)), dp_tokenizer_vocab_size(r->tok));
    return 0;
}

/* --tokenizer-file: GPT-2's BPE (a directory, or tokenizer.json or
 * encoder.json with vocab.bpe beside it: it encodes --prompt and decodes
 * samples), else llm.c's gpt2_tokenizer.bin (decodes only). */
static dp_status load_tokenizer_file(const char *path, dp_tokenizer **out)
{
    struct stat sb;
    size_t n = strlen(path);
    int json = n >= 5 && strcmp(path + n - 5, ".json") == 0;
    if (json || (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)))
        return dp_tokenizer_load_bpe(path, out);
    return dp_tokenizer_load_llmc(path, out);
}

/* Token data: maps the files (nothing is converted), loads
 * --tokenizer-file, and says what was found. */
static int load_tokens(run *r, const char *path)
{
    const opts *o = &r->o; /* resolve_options set the vocabulary */
    size_t V = (size_t)o->vocab_size;
    catch_bus_errors(r, path);
    if (dp_token_data_open(path, V, &r->data) != DP_OK) return cli_dp_fail("--data");
    if (o->tokenizer_file) {
        if (load_tokenizer_file(o->tokenizer_file, &r->tok) != DP_OK)
            return cli_dp_fail("--tokenizer-file");
        if ((o->given & G_PROMPT) && dp_tokenizer_kind_of(r->tok) != DP_TOKENIZER_BPE)
            return cli_fail("--prompt: --tokenizer-file %s is llm.c's table, which decodes but "
                            "cannot encode; give the BPE tokenizer (tokenizer.json, or "
                            "encoder.json with vocab.bpe) or --prompt-ids", o->tokenizer_file);
        size_t tv = dp_tokenizer_vocab_size(r->tok);
        if (tv > V)
            return cli_fail("--tokenizer-file %s has %zu tokens, more than the model's vocabulary "
                            "of %zu: ids past it could never be trained; give --vocab-size %zu or "
                            "more (or the tokenizer the data was made with)", o->tokenizer_file,
                            tv, V, tv);
    }
    dp_token_data_info info;
    if (dp_token_data_get_info(r->data, &info) != DP_OK) return cli_dp_fail("--data");
    const char *kind = info.format == DP_TOKEN_FORMAT_LLMC ? "llm.c" : "nanoGPT raw uint16";
    char files[160];
    if (info.split_by_files)
        snprintf(files, sizeof files, "%s files: %zu train, %zu validation%s", kind,
                 info.files[DP_SPLIT_TRAIN], info.files[DP_SPLIT_VAL],
                 info.ignored_files ? ", other files ignored" : "");
    else
        snprintf(files, sizeof files, "one %s file, split 90/10", kind);
    char mapped[32];
    human_bytes(info.mapped_bytes, mapped, sizeof mapped);
    printf("data: %s (%s; %zu tokens: %zu train, %zu validation; %s mapped read-only), token ids, "
           "vocab %zu%s\n", path, files, dp_token_data_total(r->data),
           dp_token_data_size(r->data, DP_SPLIT_TRAIN), dp_token_data_size(r->data, DP_SPLIT_VAL),
           mapped, V, o->sample && !r->tok ? " (samples print as ids: --tokenizer-file "
                                            "decodes them)" : "");
    return check_resume_data(r, path);
}

/* Text or token files, as probe_data found them. */
int load_data(run *r, const char *path)
{
    return r->is_tokens ? load_tokens(r, path) : load_text(r, path);
}

/* The batch samplers: training, and evaluation on each split; none for
 * --eval-only, which reads the validation split's windows alone (so a
 * training split shorter than the context does not stop it). */
int make_samplers(run *r)
{
    const opts *o = &r->o;
    size_t T = (size_t)o->context;
    if (o->eval_only) return 0;
    if (dp_sampler_create(r->data, DP_SPLIT_TRAIN, T, o->seed, &r->train) != DP_OK ||
        dp_sampler_create(r->data, DP_SPLIT_TRAIN, T, o->seed + 1, &r->eval_train) != DP_OK ||
        dp_sampler_create(r->data, DP_SPLIT_VAL, T, o->seed + 2, &r->eval_val) != DP_OK)
        return cli_dp_fail("--context");
    /* The sampler's state belongs to the training corpus: restored for a
     * run that trains. */
    if (r->ck && r->ck->has_sampler &&
        dp_sampler_set_state(r->train, r->ck->sampler) != DP_OK)
        return cli_dp_fail("--resume sampler state");
    return 0;
}
