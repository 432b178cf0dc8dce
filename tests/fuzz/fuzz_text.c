/*
 * tests/fuzz/fuzz_text.c - libFuzzer harness for the text corpus loader
 * (dp_text_load on a file or a directory), training tokenizers on fuzzed
 * text, token datasets, the batch sampler with its saved state, and the
 * validation windows.
 *
 * Input: byte 0 picks the mode and sizes, the rest is the corpus.
 *   bit 7 of byte 0 set: a directory; the corpus is split at each "\n%%\n"
 *     into at most 8 files with fixed names, some of which the loader must
 *     skip (a dot-file, *.dat, *.u8) and one a subdirectory; with bit 6 also
 *     set, two symlinks: "w" -> "a" (read; when the input is too short to
 *     make "a", a broken link, which is an i/o error) and "y" -> "b.dat"
 *     (skipped by its target's name, even when that does not exist);
 *   bits 0..6: the word tokenizer's vocab_size (1 + bits * 3), the
 *     sampler's context (1 + bits % 16) and the vocabulary size for the
 *     corpus's bytes taken as token ids (1 + bits * 2).
 * The corpus is also parsed as a sampler state text (dp_sampler_state_parse):
 * a state that parses formats back to the same words, and is accepted by
 * dp_sampler_set_state exactly when its tag, rng and sizes fit the sampler.
 * Checks: the loaded text is exactly the expected bytes (the file, or the
 * non-empty usable files in name order joined by '\n'); rejected corpora
 * are the empty and the NUL-holding ones; char and word tokenizers
 * trained on the text encode it and decode it back exactly (word: when
 * nothing is unknown; the tokenizer's own corpus has unknowns only when the
 * vocabulary is cut); the train/validation split is floor(0.9 n) / rest;
 * sampled windows are slices of the split with targets shifted by one; a
 * sampler restored from the text form of its state draws the same batch;
 * eval windows are the consecutive slices.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "dp/data.h"
#include "dp/tokenizer.h"
#include "fuzz_common.h"

enum { MAX_FILES = 8, MAX_ENTRIES = 10 };

// The regular files (and one subdirectory) the corpus is split into.
static const char *const file_names[MAX_FILES] = {
    ".hidden", "a", "b.dat", "c", "d.u8", "e", "sub", "z",
};

// Every entry in byte order, symlinks included: the order the loader joins.
static const char *const entry_names[MAX_ENTRIES] = {
    ".hidden", "a", "b.dat", "c", "d.u8", "e", "sub", "w", "y", "z",
};

static int skipped(const char *name)
{
    return name[0] == '.' || strstr(name, ".dat") || strstr(name, ".u8") ||
           strcmp(name, "sub") == 0 || strcmp(name, "y") == 0;
}

// The sampler state parsed from the corpus text, if it parses.
static int have_fuzz_state;
static uint64_t fuzz_state[DP_SAMPLER_STATE_WORDS];

// Removes the directory a previous input made (its layout is known).
static void remove_corpus_dir(const char *path)
{
    char fp[700];
    snprintf(fp, sizeof fp, "%s/sub/inner", path);
    unlink(fp);
    for (int i = 0; i < MAX_ENTRIES; i++) {
        snprintf(fp, sizeof fp, "%s/%s", path, entry_names[i]);
        if (unlink(fp) != 0 && errno == EISDIR) rmdir(fp);
    }
    if (rmdir(path) != 0 && errno != ENOENT) {
        perror(path);
        abort();
    }
}

static void check_data(const dp_tokenizer *tok, const char *text, size_t len, size_t context)
{
    dp_token_data *d = NULL;
    dp_status st = dp_token_data_from_text(tok, text, len, &d);
    FUZZ_CHECK(st == DP_OK, "token data from the tokenizer's own corpus");
    size_t n = dp_token_data_total(d), ntr = dp_token_data_size(d, DP_SPLIT_TRAIN);
    size_t nva = dp_token_data_size(d, DP_SPLIT_VAL);
    FUZZ_CHECK(n >= 1 && n <= len, "%zu tokens for %zu bytes", n, len);
    FUZZ_CHECK(ntr == (size_t)((unsigned long long)n * 9 / 10) && ntr + nva == n,
               "split %zu + %zu of %zu", ntr, nva, n);
    if (dp_tokenizer_kind_of(tok) == DP_TOKENIZER_CHAR)
        FUZZ_CHECK(n == len && dp_token_data_unknown_count(d) == 0, "char data");

    for (int sp = 0; sp < DP_SPLIT_COUNT; sp++) {
        const int32_t *toks = dp_token_data_tokens(d, (dp_split)sp);
        size_t ns = dp_token_data_size(d, (dp_split)sp);
        dp_sampler *s = NULL;
        st = dp_sampler_create(d, (dp_split)sp, context, 1234 + (uint64_t)sp, &s);
        if (ns < context + 1) {
            FUZZ_CHECK(st == DP_ERR_INVALID_ARGUMENT && !s, "short split accepted");
            FUZZ_CHECK(dp_eval_window_count(d, (dp_split)sp, context) == 0, "windows");
            continue;
        }
        FUZZ_CHECK(st == DP_OK, "sampler on a split of %zu tokens, context %zu", ns, context);
        enum { B = 3 };
        int32_t in[B * 16], tg[B * 16], in2[B * 16], tg2[B * 16];
        uint64_t state[DP_SAMPLER_STATE_WORDS], back[DP_SAMPLER_STATE_WORDS];
        char text_state[DP_SAMPLER_STATE_CHARS];
        FUZZ_CHECK(dp_sampler_get_state(s, state) == DP_OK, "get_state");
        FUZZ_CHECK(dp_sampler_state_format(state, text_state, sizeof text_state) == DP_OK,
                   "format");
        FUZZ_CHECK(dp_sampler_state_parse(text_state, back) == DP_OK &&
                       memcmp(state, back, sizeof state) == 0,
                   "state text round trip");
        FUZZ_CHECK(dp_sampler_next(s, in, tg, B) == DP_OK, "next");
        for (int b = 0; b < B; b++) {
            const int32_t *x = in + b * context, *y = tg + b * context;
            // Find the window: x must be a slice of the split and y the next one.
            int found = 0;
            for (size_t p = 0; !found && p + context < ns; p++)
                found = memcmp(toks + p, x, context * sizeof *x) == 0 &&
                        memcmp(toks + p + 1, y, context * sizeof *y) == 0;
            FUZZ_CHECK(found, "row %d is not a window of the split", b);
        }
        dp_sampler *s2 = NULL;
        FUZZ_CHECK(dp_sampler_create(d, (dp_split)sp, context, 99, &s2) == DP_OK, "sampler 2");
        FUZZ_CHECK(dp_sampler_set_state(s2, back) == DP_OK, "set_state");
        FUZZ_CHECK(dp_sampler_next(s2, in2, tg2, B) == DP_OK, "next 2");
        FUZZ_CHECK(memcmp(in, in2, B * context * sizeof *in) == 0 &&
                       memcmp(tg, tg2, B * context * sizeof *tg) == 0,
                   "restored sampler drew a different batch");
        if (have_fuzz_state) {
            // Accepted exactly when tag, rng and sizes fit; refused leaves it unchanged.
            int fits = fuzz_state[0] == back[0] &&
                       (fuzz_state[1] | fuzz_state[2] | fuzz_state[3] | fuzz_state[4]) != 0 &&
                       fuzz_state[7] == back[7] && fuzz_state[8] == back[8];
            uint64_t before[DP_SAMPLER_STATE_WORDS], after[DP_SAMPLER_STATE_WORDS];
            dp_sampler_get_state(s2, before);
            st = dp_sampler_set_state(s2, fuzz_state);
            dp_sampler_get_state(s2, after);
            FUZZ_CHECK((st == DP_OK) == fits, "set_state status %d, fits %d", (int)st, fits);
            if (st == DP_OK) {
                FUZZ_CHECK(memcmp(after, fuzz_state, sizeof after) == 0, "state not restored");
                FUZZ_CHECK(dp_sampler_next(s2, in2, tg2, B) == DP_OK, "next after set_state");
            } else {
                FUZZ_CHECK(memcmp(after, before, sizeof after) == 0, "refused state changed it");
            }
        }
        dp_sampler_destroy(s2);
        dp_sampler_destroy(s);

        size_t nw = dp_eval_window_count(d, (dp_split)sp, context);
        FUZZ_CHECK(nw == (ns - 1) / context, "window count %zu for %zu tokens", nw, ns);
        size_t first = nw / 2, count = nw - first < B ? nw - first : B;
        FUZZ_CHECK(dp_eval_windows(d, (dp_split)sp, context, first, count, in, tg) == DP_OK,
                   "eval windows");
        for (size_t r = 0; r < count; r++)
            FUZZ_CHECK(memcmp(in + r * context, toks + (first + r) * context,
                              context * sizeof *in) == 0 &&
                           memcmp(tg + r * context, toks + (first + r) * context + 1,
                                  context * sizeof *tg) == 0,
                       "eval window %zu", first + r);
        FUZZ_CHECK(dp_eval_windows(d, (dp_split)sp, context, nw, 1, in, tg) ==
                       DP_ERR_INVALID_ARGUMENT,
                   "window past the end accepted");
    }
    dp_token_data_destroy(d);
}

static void check_tokenizers(const char *text, size_t len, size_t vocab, size_t context)
{
    dp_tokenizer *c = NULL;
    FUZZ_CHECK(dp_tokenizer_create_char(text, len, &c) == DP_OK, "char tokenizer");
    check_data(c, text, len, context);
    dp_tokenizer_destroy(c);

    dp_tokenizer *w = NULL;
    dp_status st = dp_tokenizer_create_word(text, len, vocab, &w);
    if (st != DP_OK) {
        FUZZ_CHECK(st == DP_ERR_INVALID_ARGUMENT && !w, "word tokenizer status %d", (int)st);
        // Only a vocabulary too small for the separators (+ <unk> + a word) is refused.
        FUZZ_CHECK(vocab < 258, "vocab_size %zu refused", vocab);
        return;
    }
    size_t V = dp_tokenizer_vocab_size(w);
    FUZZ_CHECK(V >= 1 && V <= vocab, "word vocab %zu for vocab_size %zu", V, vocab);
    // Serialized and reparsed, it is the same tokenizer.
    char *json = NULL;
    dp_tokenizer *w2 = NULL;
    FUZZ_CHECK(dp_tokenizer_serialize(w, &json) == DP_OK, "serialize");
    FUZZ_CHECK(dp_tokenizer_parse(json, &w2) == DP_OK, "parse of a trained tokenizer: %s", json);
    int32_t *ids = malloc(len * sizeof *ids), *ids2 = malloc(len * sizeof *ids2);
    FUZZ_CHECK(ids && ids2, "out of memory");
    size_t n = 0, n2 = 0, unk = 0, unk2 = 0;
    FUZZ_CHECK(dp_tokenizer_encode(w, text, len, ids, len, &n, &unk) == DP_OK, "word encode");
    FUZZ_CHECK(dp_tokenizer_encode(w2, text, len, ids2, len, &n2, &unk2) == DP_OK &&
                   n == n2 && unk == unk2 && memcmp(ids, ids2, n * sizeof *ids) == 0,
               "reparsed tokenizer encodes differently");
    if (unk == 0) {
        char *back = NULL;
        size_t blen = 0;
        FUZZ_CHECK(dp_tokenizer_decode(w, ids, n, &back, &blen) == DP_OK && blen == len &&
                       memcmp(back, text, len) == 0,
                   "word decode(encode(corpus)) differs");
        free(back);
    }
    free(ids);
    free(ids2);
    free(json);
    dp_tokenizer_destroy(w2);
    check_data(w, text, len, context);
    dp_tokenizer_destroy(w);
}

// The corpus as a sampler state text: what parses formats back to the same words.
static void check_state_text(const char *body, size_t blen)
{
    char *t = malloc(blen + 1);
    FUZZ_CHECK(t, "out of memory");
    memcpy(t, body, blen);
    t[blen] = '\0';
    uint64_t w[DP_SAMPLER_STATE_WORDS], w2[DP_SAMPLER_STATE_WORDS];
    memset(w, 0xa5, sizeof w);
    memcpy(w2, w, sizeof w);
    dp_status st = dp_sampler_state_parse(t, w);
    have_fuzz_state = st == DP_OK;
    if (st == DP_OK) {
        char f[DP_SAMPLER_STATE_CHARS];
        FUZZ_CHECK(strlen(t) == DP_SAMPLER_STATE_CHARS - 1, "state text of %zu chars parsed",
                   strlen(t));
        FUZZ_CHECK(dp_sampler_state_format(w, f, sizeof f) == DP_OK && strcasecmp(f, t) == 0,
                   "state text does not format back: %s vs %s", f, t);
        memcpy(fuzz_state, w, sizeof w);
    } else {
        FUZZ_CHECK(st == DP_ERR_FORMAT && memcmp(w, w2, sizeof w) == 0,
                   "refused state text changed the output (status %d)", (int)st);
        FUZZ_CHECK_MESSAGE(st);
    }
    free(t);
}

// The corpus's bytes as token ids with a vocabulary of vocab ids.
static void check_token_ids(const uint8_t *b, size_t n, size_t vocab)
{
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    FUZZ_CHECK(ids, "out of memory");
    size_t bad = n;
    for (size_t i = 0; i < n; i++) {
        ids[i] = b[i];
        if (bad == n && (size_t)b[i] >= vocab) bad = i;
    }
    dp_token_data *d = NULL;
    dp_status st = dp_token_data_from_tokens(n ? ids : NULL, n, vocab, &d);
    if (n == 0 || bad < n) {
        FUZZ_CHECK(st == DP_ERR_INVALID_ARGUMENT && !d, "bad ids accepted (status %d)", (int)st);
        FUZZ_CHECK_MESSAGE(st);
    } else {
        FUZZ_CHECK(st == DP_OK && dp_token_data_total(d) == n &&
                       dp_token_data_vocab_size(d) == vocab,
                   "token data from ids");
        size_t ntr = dp_token_data_size(d, DP_SPLIT_TRAIN);
        FUZZ_CHECK(memcmp(dp_token_data_tokens(d, DP_SPLIT_TRAIN), ids, ntr * sizeof *ids) == 0 &&
                       memcmp(dp_token_data_tokens(d, DP_SPLIT_VAL), ids + ntr,
                              (n - ntr) * sizeof *ids) == 0,
                   "token data differs from the ids");
    }
    dp_token_data_destroy(d);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    uint8_t mode = data[0];
    const char *body = (const char *)data + 1;
    size_t blen = size - 1;
    size_t vocab = 1 + (size_t)(mode & 0x7f) * 3;
    size_t context = 1 + (size_t)(mode & 0x7f) % 16;
    const char *dir = fuzz_dir();
    char path[600];
    // The expected text: built as the loader should build it.
    char *expect = malloc(2 * blen + MAX_ENTRIES + 1); // "w" repeats "a"
    size_t elen = 0;
    int expect_nul = 0, files = 0, broken_link = 0;
    FUZZ_CHECK(expect, "out of memory");

    if (mode & 0x80) {
        snprintf(path, sizeof path, "%s/corpus", dir);
        remove_corpus_dir(path);
        if (mkdir(path, 0755) != 0) abort();
        const char *seg[MAX_FILES] = {0};
        size_t seglen[MAX_FILES] = {0};
        const char *p = body, *end = body + blen;
        for (int i = 0; i < MAX_FILES && p <= end; i++) {
            const char *sep = NULL;
            for (const char *q = p; q + 4 <= end; q++)
                if (memcmp(q, "\n%%\n", 4) == 0) {
                    sep = q;
                    break;
                }
            const char *e = sep && i + 1 < MAX_FILES ? sep : end;
            char fp[700];
            snprintf(fp, sizeof fp, "%s/%s", path, file_names[i]);
            if (strcmp(file_names[i], "sub") == 0) {
                if (mkdir(fp, 0755) != 0) abort();
                snprintf(fp, sizeof fp, "%s/sub/inner", path);
            }
            fuzz_write_file(fp, p, (size_t)(e - p));
            seg[i] = p;
            seglen[i] = (size_t)(e - p);
            if (e == end) break;
            p = e + 4;
        }
        int links = (mode & 0x40) != 0;
        broken_link = links && !seg[1]; // file_names[1] is "a"
        if (links) {
            char fp[700];
            snprintf(fp, sizeof fp, "%s/w", path);
            if (symlink("a", fp) != 0) abort();
            snprintf(fp, sizeof fp, "%s/y", path);
            if (symlink("b.dat", fp) != 0) abort();
        }
        for (int k = 0; k < MAX_ENTRIES; k++) {
            const char *name = entry_names[k];
            if (skipped(name)) continue;
            if (name[0] == 'w' && !links) continue;
            // The content: its own segment, or (w) the one of "a", whose index is 1.
            int i = 0;
            while (i < MAX_FILES && strcmp(file_names[i], name[0] == 'w' ? "a" : name) != 0) i++;
            if (!seg[i] || seglen[i] == 0) continue; // never written, or empty
            if (memchr(seg[i], '\0', seglen[i])) expect_nul = 1;
            if (files++) expect[elen++] = '\n';
            memcpy(expect + elen, seg[i], seglen[i]);
            elen += seglen[i];
        }
    } else {
        snprintf(path, sizeof path, "%s/corpus.txt", dir);
        fuzz_write_file(path, body, blen);
        memcpy(expect, body, blen);
        elen = blen;
        files = blen > 0;
        expect_nul = memchr(body, '\0', blen) != NULL;
    }

    check_state_text(body, blen);
    check_token_ids(data + 1, blen, 1 + (size_t)(mode & 0x7f) * 2);

    dp_clear_error();
    char *text = (char *)1;
    size_t len = 7, nf = 7;
    dp_status st = dp_text_load(path, &text, &len, &nf);
    if (broken_link) {
        // "w" -> "a" when "a" was never written: a broken symlink, an i/o error naming it.
        FUZZ_CHECK(st == DP_ERR_IO && text == NULL && len == 0 && strstr(dp_last_error(), "/w'"),
                   "a broken symlink gave status %d", (int)st);
        free(expect);
        return 0;
    }
    if (files == 0 || expect_nul) {
        FUZZ_CHECK(st == DP_ERR_FORMAT && text == NULL && len == 0,
                   "an empty or binary corpus gave status %d", (int)st);
        FUZZ_CHECK_MESSAGE(st);
        free(expect);
        return 0;
    }
    FUZZ_CHECK(st == DP_OK, "loading a valid corpus failed");
    FUZZ_CHECK(nf == (size_t)files, "%zu files read, expected %d", nf, files);
    FUZZ_CHECK(len == elen && memcmp(text, expect, len) == 0 && text[len] == '\0',
               "loaded %zu bytes, expected %zu", len, elen);
    check_tokenizers(text, len, vocab, context);
    free(text);
    free(expect);
    return 0;
}
