/*
 * Pre-tokenized data (dp_token_data_open) and llm.c's token table
 * (dp_tokenizer_load_llmc), on files the tests write byte by byte:
 *
 *  - a single raw (nanoGPT) file splits 90/10 and reads back its ids;
 *  - nanoGPT's directory (train.bin, val.bin beside scripts and text) and
 *    llm.c's shards (joined in name order, ranges across shards) give the
 *    splits of their files;
 *  - bitwise the int32 path: the sampler's batches, its saved state and
 *    the validation windows equal those of dp_token_data_from_tokens over
 *    the same ids, for both formats;
 *  - the files are mapped, not converted: opening a 512 MiB file leaves
 *    the resident size almost unchanged, and a window far into it reads
 *    its ids;
 *  - an id past the vocabulary fails the window that holds it (naming the
 *    file and the index), leaving the sampler unchanged;
 *  - every refusal (odd size, empty, wrong version or magic, counts that
 *    disagree or overflow, directories without a split, mixed formats,
 *    FIFOs and devices refused before reading) names the file;
 *  - the token table decodes, refuses to encode, and refuses truncated,
 *    zero-length, overflowing and inconsistent files.
 */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dp/data.h"
#include "dp/tokenizer.h"
#include "dp_test.h"
#include "dp_test_fs.h"
#include "dp_test_tokens.h"

// ----------------------------------------------------------------------------
// temp dir

static char tmpdir[64];

static void make_tmpdir(void)
{
    strcpy(tmpdir, "/tmp/dp_test_tokens_XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp failed");
}

static void cleanup(void) { dp_test_remove_tree(tmpdir); }

static const char *in_tmp(const char *name) { return dp_test_join(tmpdir, name); }

static void mkdir_tmp(const char *name) { cr_assert_eq(mkdir(in_tmp(name), 0755), 0); }

TestSuite(token_data, .init = make_tmpdir, .fini = cleanup, .timeout = 30);

enum { V = 512, B = 4, T = 16 };

/* n deterministic ids in [0, V): a multiplicative sequence, so windows at
 * different positions differ. */
static int32_t *ids_of(size_t n, uint32_t seed)
{
    int32_t *t = malloc(n * sizeof *t);
    cr_assert_not_null(t);
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        t[i] = (int32_t)((x >> 8) % V);
    }
    return t;
}

static int32_t *read_split(const dp_token_data *d, dp_split s)
{
    size_t n = dp_token_data_size(d, s);
    int32_t *out = malloc(n * sizeof *out);
    cr_assert_not_null(out);
    dp_assert_ok(dp_token_data_read(d, s, 0, n, out));
    return out;
}

/* The sampler over file data draws the batches of the sampler over the
 * same ids in memory, bitwise, for both splits; a state saved from one
 * restores in the other; the validation windows are the same too. */
static void assert_same_windows(const dp_token_data *files, const dp_token_data *mem)
{
    for (int sp = 0; sp < DP_SPLIT_COUNT; sp++) {
        dp_split s = (dp_split)sp;
        cr_assert_eq(dp_token_data_size(files, s), dp_token_data_size(mem, s), "%s split",
                     dp_split_name(s));
        dp_sampler *a, *b;
        dp_assert_ok(dp_sampler_create(files, s, T, 1337 + (uint64_t)sp, &a));
        dp_assert_ok(dp_sampler_create(mem, s, T, 1337 + (uint64_t)sp, &b));
        int32_t xa[B * T], ya[B * T], xb[B * T], yb[B * T];
        for (int it = 0; it < 25; it++) {
            dp_assert_ok(dp_sampler_next(a, xa, ya, B));
            dp_assert_ok(dp_sampler_next(b, xb, yb, B));
            cr_assert_eq(memcmp(xa, xb, sizeof xa), 0, "%s batch %d inputs differ",
                         dp_split_name(s), it);
            cr_assert_eq(memcmp(ya, yb, sizeof ya), 0, "%s batch %d targets differ",
                         dp_split_name(s), it);
        }
        // A state from the file sampler continues the memory sampler identically.
        uint64_t st[DP_SAMPLER_STATE_WORDS];
        dp_assert_ok(dp_sampler_get_state(a, st));
        dp_assert_ok(dp_sampler_set_state(b, st));
        dp_assert_ok(dp_sampler_next(a, xa, ya, B));
        dp_assert_ok(dp_sampler_next(b, xb, yb, B));
        cr_assert_eq(memcmp(xa, xb, sizeof xa), 0, "batch after the state differs");
        dp_sampler_destroy(a);
        dp_sampler_destroy(b);

        size_t W = dp_eval_window_count(files, s, T);
        cr_assert_eq(W, dp_eval_window_count(mem, s, T));
        cr_assert_gt(W, 2);
        for (size_t first = 0; first < W; first += B) {
            size_t rows = W - first < B ? W - first : B;
            dp_assert_ok(dp_eval_windows(files, s, T, first, rows, xa, ya));
            dp_assert_ok(dp_eval_windows(mem, s, T, first, rows, xb, yb));
            cr_assert_eq(memcmp(xa, xb, rows * T * sizeof *xa), 0, "window %zu differs", first);
            cr_assert_eq(memcmp(ya, yb, rows * T * sizeof *ya), 0, "window %zu differs", first);
        }
    }
}

// ----------------------------------------------------------------------------
// reading

Test(token_data, a_raw_file_splits_90_10_and_reads_its_ids)
{
    // 1005 ids: train floor(904.5) = 904, val 101 (the remainder goes to val).
    size_t n = 1005;
    int32_t *ids = ids_of(n, 1);
    dp_test_write_raw(in_tmp("tokens.bin"), ids, n);
    dp_token_data *d = NULL;
    dp_assert_ok(dp_token_data_open(in_tmp("tokens.bin"), V, &d));
    cr_assert_eq(dp_token_data_total(d), n);
    cr_assert_eq(dp_token_data_size(d, DP_SPLIT_TRAIN), 904);
    cr_assert_eq(dp_token_data_size(d, DP_SPLIT_VAL), 101);
    cr_assert_eq(dp_token_data_vocab_size(d), V);
    cr_assert_null(dp_token_data_tokens(d, DP_SPLIT_TRAIN), "mapped data have no int32 array");
    dp_token_data_info info;
    dp_assert_ok(dp_token_data_get_info(d, &info));
    cr_assert_eq(info.format, DP_TOKEN_FORMAT_NANOGPT);
    cr_assert_eq(info.split_by_files, 0);
    cr_assert_eq(info.mapped_bytes, 2 * n);
    int32_t *tr = read_split(d, DP_SPLIT_TRAIN), *va = read_split(d, DP_SPLIT_VAL);
    cr_assert_eq(memcmp(tr, ids, 904 * sizeof *ids), 0);
    cr_assert_eq(memcmp(va, ids + 904, 101 * sizeof *ids), 0);
    // A range inside a split, and ranges past its end.
    int32_t x[10];
    dp_assert_ok(dp_token_data_read(d, DP_SPLIT_VAL, 96, 5, x));
    cr_assert_eq(memcmp(x, ids + 1000, 5 * sizeof *x), 0);
    cr_assert_eq(dp_token_data_read(d, DP_SPLIT_VAL, 97, 5, x), DP_ERR_INVALID_ARGUMENT);
    /* the range as asked (it used to print a wrapped "first..last") */
    cr_assert_eq(dp_token_data_read(d, DP_SPLIT_VAL, SIZE_MAX, 2, x), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "2 tokens from token 18446744073709551615 pass the end"),
              "%s", dp_last_error());
    cr_assert_eq(dp_token_data_read(d, DP_SPLIT_VAL, 2, SIZE_MAX, x), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "18446744073709551615 tokens from token 2 pass"), "%s",
              dp_last_error());
    cr_assert_eq(dp_token_data_read(d, DP_SPLIT_TRAIN, 0, 0, x), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_token_data_read(d, DP_SPLIT_COUNT, 0, 1, x), DP_ERR_INVALID_ARGUMENT);

    dp_token_data *m = NULL;
    dp_assert_ok(dp_token_data_from_tokens(ids, n, V, &m));
    assert_same_windows(d, m);
    dp_token_data_destroy(m);
    dp_token_data_destroy(d);
    free(tr);
    free(va);
    free(ids);
}

Test(token_data, nanogpt_directory_splits_by_file_and_ignores_other_files)
{
    // 900 + 100 ids: the 90/10 cut of the same 1000 ids in memory falls
    // where val.bin starts, so the in-memory data has the same splits.
    int32_t *ids = ids_of(1000, 2);
    mkdir_tmp("shakespeare");
    dp_test_write_raw(in_tmp("shakespeare/train.bin"), ids, 900);
    dp_test_write_raw(in_tmp("shakespeare/val.bin"), ids + 900, 100);
    // What nanoGPT's data directories hold besides the ids.
    dp_test_put_file(in_tmp("shakespeare/prepare.py"), "import numpy\n", 13, NULL, 0);
    dp_test_put_file(in_tmp("shakespeare/input.txt"), "First Citizen:\n", 15, NULL, 0);
    dp_test_put_file(in_tmp("shakespeare/meta.pkl"), "\x80\x04\0", 3, NULL, 0);
    dp_test_put_file(in_tmp("shakespeare/.hidden.bin"), "\1", 1, NULL, 0); // a dot-file: skipped
    int is_tokens = 0;
    dp_assert_ok(dp_token_files_probe(in_tmp("shakespeare"), &is_tokens));
    cr_assert_eq(is_tokens, 1);

    dp_token_data *d = NULL;
    dp_assert_ok(dp_token_data_open(in_tmp("shakespeare"), V, &d));
    dp_token_data_info info;
    dp_assert_ok(dp_token_data_get_info(d, &info));
    cr_assert_eq(info.format, DP_TOKEN_FORMAT_NANOGPT);
    cr_assert_eq(info.split_by_files, 1);
    cr_assert(info.files[DP_SPLIT_TRAIN] == 1 && info.files[DP_SPLIT_VAL] == 1);
    cr_assert_eq(info.ignored_files, 3);
    cr_assert_eq(dp_token_data_size(d, DP_SPLIT_TRAIN), 900);
    cr_assert_eq(dp_token_data_size(d, DP_SPLIT_VAL), 100);
    int32_t *tr = read_split(d, DP_SPLIT_TRAIN), *va = read_split(d, DP_SPLIT_VAL);
    cr_assert_eq(memcmp(tr, ids, 900 * sizeof *ids), 0, "train.bin's ids");
    cr_assert_eq(memcmp(va, ids + 900, 100 * sizeof *ids), 0, "val.bin's ids");

    dp_token_data *m = NULL;
    dp_assert_ok(dp_token_data_from_tokens(ids, 1000, V, &m));
    assert_same_windows(d, m);
    dp_token_data_destroy(m);
    dp_token_data_destroy(d);
    free(tr);
    free(va);
    free(ids);
}

Test(token_data, llmc_shards_join_in_name_order)
{
    // Train 900 ids over three shards written out of name order (and one
    // name sorting after the others only in byte order), val 100 over two.
    int32_t *ids = ids_of(1000, 3);
    mkdir_tmp("fw");
    dp_test_write_llmc(in_tmp("fw/fineweb_train_000010.bin"), ids + 700, 200);
    dp_test_write_llmc(in_tmp("fw/fineweb_train_000001.bin"), ids, 300);
    dp_test_write_llmc(in_tmp("fw/fineweb_train_000002.bin"), ids + 300, 400);
    dp_test_write_llmc(in_tmp("fw/fineweb_val_000001.bin"), ids + 960, 40);
    dp_test_write_llmc(in_tmp("fw/fineweb_val_000000.bin"), ids + 900, 60);
    dp_test_put_file(in_tmp("fw/README"), "shards\n", 7, NULL, 0);
    dp_token_data *d = NULL;
    dp_assert_ok(dp_token_data_open(in_tmp("fw"), V, &d));
    dp_token_data_info info;
    dp_assert_ok(dp_token_data_get_info(d, &info));
    cr_assert_eq(info.format, DP_TOKEN_FORMAT_LLMC);
    cr_assert(info.split_by_files && info.files[DP_SPLIT_TRAIN] == 3 &&
              info.files[DP_SPLIT_VAL] == 2 && info.ignored_files == 1);
    cr_assert_eq(info.mapped_bytes, 5 * (size_t)DP_LLMC_HEADER_BYTES + 2 * 1000);
    cr_assert_eq(dp_token_data_size(d, DP_SPLIT_TRAIN), 900);
    cr_assert_eq(dp_token_data_size(d, DP_SPLIT_VAL), 100);
    int32_t *tr = read_split(d, DP_SPLIT_TRAIN), *va = read_split(d, DP_SPLIT_VAL);
    cr_assert_eq(memcmp(tr, ids, 900 * sizeof *ids), 0, "train: the shards in name order");
    cr_assert_eq(memcmp(va, ids + 900, 100 * sizeof *ids), 0, "val: the shards in name order");
    // Ranges across shard boundaries, from each side.
    int32_t x[50];
    dp_assert_ok(dp_token_data_read(d, DP_SPLIT_TRAIN, 290, 50, x));
    cr_assert_eq(memcmp(x, ids + 290, sizeof x), 0);
    dp_assert_ok(dp_token_data_read(d, DP_SPLIT_TRAIN, 0, 1, x));
    cr_assert_eq(x[0], ids[0]);
    dp_assert_ok(dp_token_data_read(d, DP_SPLIT_TRAIN, 699, 2, x));
    cr_assert(x[0] == ids[699] && x[1] == ids[700]);
    dp_assert_ok(dp_token_data_read(d, DP_SPLIT_VAL, 59, 2, x));
    cr_assert(x[0] == ids[959] && x[1] == ids[960]);

    dp_token_data *m = NULL;
    dp_assert_ok(dp_token_data_from_tokens(ids, 1000, V, &m));
    assert_same_windows(d, m);
    dp_token_data_destroy(m);
    dp_token_data_destroy(d);
    free(tr);
    free(va);
    free(ids);
}

Test(token_data, a_single_llmc_file_and_an_llmc_shard_under_another_name)
{
    int32_t *ids = ids_of(500, 4);
    dp_test_write_llmc(in_tmp("tiny_shakespeare_val.bin"), ids, 500);
    dp_test_write_llmc(in_tmp("shard.data"), ids, 500); // told by its magic, not its name
    dp_test_put_file(in_tmp("notes.txt"), "text", 4, NULL, 0);
    int is_tokens = -1;
    dp_assert_ok(dp_token_files_probe(in_tmp("shard.data"), &is_tokens));
    cr_assert_eq(is_tokens, 1);
    dp_assert_ok(dp_token_files_probe(in_tmp("notes.txt"), &is_tokens));
    cr_assert_eq(is_tokens, 0);
    for (int k = 0; k < 2; k++) {
        dp_token_data *d = NULL;
        dp_assert_ok(dp_token_data_open(in_tmp(k ? "shard.data" : "tiny_shakespeare_val.bin"), V,
                                        &d));
        cr_assert_eq(dp_token_data_size(d, DP_SPLIT_TRAIN), 450);
        int32_t *tr = read_split(d, DP_SPLIT_TRAIN);
        cr_assert_eq(memcmp(tr, ids, 450 * sizeof *ids), 0, "the ids after the header");
        free(tr);
        dp_token_data_destroy(d);
    }
    // A text directory stays text; one *.bin makes it token data.
    mkdir_tmp("txt");
    dp_test_put_file(in_tmp("txt/a"), "text", 4, NULL, 0);
    dp_assert_ok(dp_token_files_probe(in_tmp("txt"), &is_tokens));
    cr_assert_eq(is_tokens, 0);
    dp_test_put_file(in_tmp("txt/x.bin"), "ab", 2, NULL, 0);
    dp_assert_ok(dp_token_files_probe(in_tmp("txt"), &is_tokens));
    cr_assert_eq(is_tokens, 1);
    free(ids);
}

Test(token_data, the_files_are_mapped_not_converted)
{
    // 256M zero ids (512 MiB, sparse) and a few known ids near the end.
    // Converted to int32 they would take 1 GiB; mapped, opening them
    // touches no page of ids, and a window reads only its own pages.
    size_t n = (size_t)256 << 20;
    const char *path = in_tmp("big.bin");
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    cr_assert(fd >= 0);
    cr_assert_eq(ftruncate(fd, (off_t)(2 * n)), 0);
    unsigned char tail[8] = {7, 0, 8, 1, 0xff, 0x01, 0x34, 0x12}; // 7, 264, 511, 0x1234
    cr_assert_eq(pwrite(fd, tail, sizeof tail, (off_t)(2 * n - sizeof tail)), (ssize_t)sizeof tail);
    close(fd);
    long page = sysconf(_SC_PAGESIZE);
    long rss0 = 0, rss1 = 0, dummy = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    cr_assert_not_null(f);
    cr_assert_eq(fscanf(f, "%ld %ld", &dummy, &rss0), 2);
    fclose(f);
    dp_token_data *d = NULL;
    dp_assert_ok(dp_token_data_open(path, 0x2000, &d));
    int32_t x[4];
    size_t nv = dp_token_data_size(d, DP_SPLIT_VAL);
    dp_assert_ok(dp_token_data_read(d, DP_SPLIT_VAL, nv - 4, 4, x));
    cr_assert(x[0] == 7 && x[1] == 264 && x[2] == 511 && x[3] == 0x1234, "%d %d %d %d", x[0],
              x[1], x[2], x[3]);
    dp_assert_ok(dp_token_data_read(d, DP_SPLIT_TRAIN, 12345678, 4, x));
    cr_assert(x[0] == 0 && x[3] == 0);
    f = fopen("/proc/self/statm", "r");
    cr_assert_not_null(f);
    cr_assert_eq(fscanf(f, "%ld %ld", &dummy, &rss1), 2);
    fclose(f);
    long grew = (rss1 - rss0) * page;
    cr_assert_lt(grew, 32L << 20, "opening and reading 512 MiB of ids grew the resident size by "
                 "%ld bytes", grew);
    dp_token_data_info info;
    dp_assert_ok(dp_token_data_get_info(d, &info));
    cr_assert_eq(info.mapped_bytes, 2 * n);
    cr_assert_eq(dp_token_data_total(d), n);
    dp_token_data_destroy(d);
}

Test(token_data, an_id_past_the_vocabulary_fails_its_window_and_leaves_the_sampler_unchanged)
{
    // Id 600 (>= V) every 7th token: any window of T + 1 = 17 holds one.
    size_t n = 400;
    int32_t *ids = ids_of(n, 5);
    for (size_t i = 3; i < n; i += 7) ids[i] = 600;
    dp_test_write_raw(in_tmp("bad.bin"), ids, n);
    dp_token_data *d = NULL;
    dp_assert_ok(dp_token_data_open(in_tmp("bad.bin"), V, &d)); // nothing scanned at open
    int32_t x[B * T], y[B * T];
    cr_assert_eq(dp_token_data_read(d, DP_SPLIT_TRAIN, 0, 3, x), DP_OK, "ids 0..2 are fine");
    cr_assert_eq(dp_token_data_read(d, DP_SPLIT_TRAIN, 0, 4, x), DP_ERR_FORMAT);
    cr_assert(strstr(dp_last_error(), "bad.bin") && strstr(dp_last_error(), "token 3 ") &&
                  strstr(dp_last_error(), "id 600") && strstr(dp_last_error(), "[0, 512)"),
              "%s", dp_last_error());
    dp_sampler *s;
    dp_assert_ok(dp_sampler_create(d, DP_SPLIT_TRAIN, T, 1, &s));
    uint64_t before[DP_SAMPLER_STATE_WORDS], after[DP_SAMPLER_STATE_WORDS];
    dp_assert_ok(dp_sampler_get_state(s, before));
    cr_assert_eq(dp_sampler_next(s, x, y, B), DP_ERR_FORMAT);
    cr_assert(strstr(dp_last_error(), "bad.bin"), "%s", dp_last_error());
    dp_assert_ok(dp_sampler_get_state(s, after));
    cr_assert_eq(memcmp(before, after, sizeof before), 0, "a failed batch moved the sampler");
    cr_assert_eq(dp_eval_windows(d, DP_SPLIT_VAL, T, 0, 1, x, y), DP_ERR_FORMAT);
    dp_sampler_destroy(s);
    dp_token_data_destroy(d);
    free(ids);
}

/* The bound itself: V - 1 is the largest id a vocabulary of V holds, V
 * the first one past it, in both file formats and for tokens in memory. */
Test(token_data, the_largest_id_is_the_vocabulary_minus_one)
{
    size_t n = 300;
    int32_t *ids = ids_of(n, 9);
    ids[5] = (int32_t)V - 1;
    dp_test_write_raw(in_tmp("edge.bin"), ids, n);
    ids[5] = (int32_t)V;
    dp_test_write_raw(in_tmp("past.bin"), ids, n);
    dp_test_write_llmc(in_tmp("past_llmc.bin"), ids, n);
    int32_t x[8];
    dp_token_data *d = NULL;
    dp_assert_ok(dp_token_data_open(in_tmp("edge.bin"), V, &d));
    dp_assert_ok(dp_token_data_read(d, DP_SPLIT_TRAIN, 0, 8, x));
    cr_assert_eq(x[5], (int32_t)V - 1);
    dp_token_data_destroy(d);
    const char *past[] = {"past.bin", "past_llmc.bin"};
    for (size_t f = 0; f < 2; f++) {
        d = NULL;
        dp_assert_ok(dp_token_data_open(in_tmp(past[f]), V, &d));
        cr_assert_eq(dp_token_data_read(d, DP_SPLIT_TRAIN, 0, 5, x), DP_OK, "%s", past[f]);
        cr_assert_eq(dp_token_data_read(d, DP_SPLIT_TRAIN, 0, 6, x), DP_ERR_FORMAT,
                     "%s: id %d (= the vocabulary) was accepted", past[f], (int)V);
        cr_assert(strstr(dp_last_error(), "[0, 512)"), "%s", dp_last_error());
        dp_token_data_destroy(d);
    }
    d = (dp_token_data *)1;
    cr_assert_eq(dp_token_data_from_tokens(ids, n, V, &d), DP_ERR_INVALID_ARGUMENT,
                 "tokens in memory: id %d (= the vocabulary) was accepted", (int)V);
    ids[5] = (int32_t)V - 1;
    dp_assert_ok(dp_token_data_from_tokens(ids, n, V, &d));
    dp_token_data_destroy(d);
    free(ids);
}

// ----------------------------------------------------------------------------
// refusals

/* open must fail with want, leaving *out NULL, the message naming
 * `name` (a file) and holding `what`. */
static void assert_refused(const char *path, dp_status want, const char *name, const char *what)
{
    dp_token_data *d = (dp_token_data *)1;
    dp_status st = dp_token_data_open(path, V, &d);
    cr_assert_eq(st, want, "%s: status %d, want %d: %s", path, (int)st, (int)want,
                 dp_last_error());
    cr_assert_null(d);
    cr_assert(strstr(dp_last_error(), name) && strstr(dp_last_error(), what),
              "%s: the message lacks \"%s\" or \"%s\": %s", path, name, what, dp_last_error());
}

Test(token_data, bad_files_are_refused_naming_the_file)
{
    int32_t ids[40];
    for (int i = 0; i < 40; i++) ids[i] = i;
    // Raw: odd size (and not text: it holds a NUL byte), empty.
    dp_test_put_file(in_tmp("odd.bin"), "\1\0\2", 3, NULL, 0);
    assert_refused(in_tmp("odd.bin"), DP_ERR_FORMAT, "odd.bin", "odd size");
    cr_assert(strstr(dp_last_error(), "NUL byte at offset 1"), "%s", dp_last_error());
    dp_test_put_file(in_tmp("textlike.bin"), "abc", 3, NULL, 0);
    assert_refused(in_tmp("textlike.bin"), DP_ERR_FORMAT, "textlike.bin", "rename it");
    dp_test_put_file(in_tmp("empty.bin"), "", 0, NULL, 0);
    assert_refused(in_tmp("empty.bin"), DP_ERR_FORMAT, "empty.bin", "empty");
    // llm.c headers: version, counts, truncation, other llm.c files.
    dp_test_write_llmc_header(in_tmp("v2.bin"), DP_LLMC_DATA_MAGIC, 2, 40, ids, 40);
    assert_refused(in_tmp("v2.bin"), DP_ERR_FORMAT, "v2.bin", "version 2");
    dp_test_write_llmc_header(in_tmp("short.bin"), DP_LLMC_DATA_MAGIC, 1, 41, ids, 40);
    assert_refused(in_tmp("short.bin"), DP_ERR_FORMAT, "short.bin", "says 41 tokens");
    cr_assert(strstr(dp_last_error(), "cut short"), "%s", dp_last_error());
    dp_test_write_llmc_header(in_tmp("long.bin"), DP_LLMC_DATA_MAGIC, 1, 39, ids, 40);
    assert_refused(in_tmp("long.bin"), DP_ERR_FORMAT, "long.bin", "bytes past its tokens");
    dp_test_write_llmc_header(in_tmp("neg.bin"), DP_LLMC_DATA_MAGIC, 1, 0x80000000u, ids, 40);
    assert_refused(in_tmp("neg.bin"), DP_ERR_FORMAT, "neg.bin", "negative");
    dp_test_write_llmc_header(in_tmp("max.bin"), DP_LLMC_DATA_MAGIC, 1, 0x7fffffffu, ids, 40);
    assert_refused(in_tmp("max.bin"), DP_ERR_FORMAT, "max.bin", "4294968318 bytes");
    dp_test_write_llmc_header(in_tmp("zero.bin"), DP_LLMC_DATA_MAGIC, 1, 0, NULL, 0);
    assert_refused(in_tmp("zero.bin"), DP_ERR_FORMAT, "zero.bin", "no tokens");
    unsigned char h[100] = {0};
    dp_test_put_le32(h, DP_LLMC_DATA_MAGIC);
    dp_test_put_file(in_tmp("cut.bin"), h, sizeof h, NULL, 0);
    assert_refused(in_tmp("cut.bin"), DP_ERR_FORMAT, "cut.bin", "1024-byte header");
    dp_test_write_llmc_header(in_tmp("llama.bin"), 20240801, 7, 20, ids, 40);
    assert_refused(in_tmp("llama.bin"), DP_ERR_FORMAT, "llama.bin", "llama-3");
    dp_test_write_llmc_header(in_tmp("hellaswag_val.bin"), 20240522, 1, 3, ids, 40);
    assert_refused(in_tmp("hellaswag_val.bin"), DP_ERR_FORMAT, "hellaswag_val.bin", "evaluation");
    dp_test_write_llmc_tokenizer(in_tmp("gpt2_tokenizer.bin"), 8);
    assert_refused(in_tmp("gpt2_tokenizer.bin"), DP_ERR_FORMAT, "gpt2_tokenizer.bin",
                   "tokenizer");
    /* a shard's header but for one bit of its magic: it was read as raw
     * tokens, the header 512 of them */
    dp_test_write_llmc_header(in_tmp("flipped.bin"), DP_LLMC_DATA_MAGIC ^ 1, 1, 40, ids, 40);
    assert_refused(in_tmp("flipped.bin"), DP_ERR_FORMAT, "flipped.bin", "the header is corrupt");
    // Bad arguments.
    dp_token_data *d = (dp_token_data *)1;
    dp_test_write_raw(in_tmp("good.bin"), ids, 40);
    cr_assert_eq(dp_token_data_open(in_tmp("good.bin"), 0, &d), DP_ERR_INVALID_ARGUMENT);
    cr_assert_null(d);
    cr_assert_eq(dp_token_data_open("", V, &d), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_token_data_open(in_tmp("good.bin"), V, NULL), DP_ERR_INVALID_ARGUMENT);
    assert_refused(in_tmp("missing.bin"), DP_ERR_IO, "missing.bin", "No such file");
}

Test(token_data, bad_directories_are_refused_naming_the_file)
{
    int32_t ids[40];
    for (int i = 0; i < 40; i++) ids[i] = i;
    mkdir_tmp("only_train");
    dp_test_write_llmc(in_tmp("only_train/x_train_000001.bin"), ids, 40);
    dp_test_write_llmc(in_tmp("only_train/x_train_000002.bin"), ids, 40);
    assert_refused(in_tmp("only_train"), DP_ERR_FORMAT, "x_train_000001.bin",
                   "no validation file");
    mkdir_tmp("only_val");
    dp_test_write_raw(in_tmp("only_val/val.bin"), ids, 40);
    assert_refused(in_tmp("only_val"), DP_ERR_FORMAT, "val.bin", "no training file");
    mkdir_tmp("neither");
    dp_test_write_raw(in_tmp("neither/train.bin"), ids, 40);
    dp_test_write_raw(in_tmp("neither/val.bin"), ids, 40);
    dp_test_write_raw(in_tmp("neither/test.bin"), ids, 40);
    assert_refused(in_tmp("neither"), DP_ERR_FORMAT, "test.bin", "neither");
    mkdir_tmp("both");
    dp_test_write_raw(in_tmp("both/train_and_val.bin"), ids, 40);
    assert_refused(in_tmp("both"), DP_ERR_FORMAT, "train_and_val.bin", "both");
    mkdir_tmp("mixed");
    dp_test_write_llmc(in_tmp("mixed/d_train_000001.bin"), ids, 40);
    dp_test_write_raw(in_tmp("mixed/d_train_000002.bin"), ids, 40);
    dp_test_write_llmc(in_tmp("mixed/d_val_000000.bin"), ids, 40);
    assert_refused(in_tmp("mixed"), DP_ERR_FORMAT, "d_train_000002.bin", "one format");
    mkdir_tmp("badshard");
    dp_test_write_llmc(in_tmp("badshard/d_train_000001.bin"), ids, 40);
    dp_test_write_llmc_header(in_tmp("badshard/d_val_000000.bin"), DP_LLMC_DATA_MAGIC, 1, 50, ids,
                              40);
    assert_refused(in_tmp("badshard"), DP_ERR_FORMAT, "d_val_000000.bin", "cut short");
    mkdir_tmp("subdir");
    dp_test_write_raw(in_tmp("subdir/train.bin"), ids, 40);
    mkdir_tmp("subdir/val.bin");
    assert_refused(in_tmp("subdir"), DP_ERR_FORMAT, "val.bin", "not a regular file");
    mkdir_tmp("fifo");
    dp_test_write_raw(in_tmp("fifo/train.bin"), ids, 40);
    cr_assert_eq(mkfifo(in_tmp("fifo/val.bin"), 0600), 0);
    assert_refused(in_tmp("fifo"), DP_ERR_FORMAT, "val.bin", "FIFO");
}

/* A FIFO with no writer would block a reader forever, and /dev/zero never
 * ends: both are refused without being read (the test's timeout catches
 * a read). */
Test(token_data, fifos_and_devices_are_refused_before_reading, .timeout = 10)
{
    cr_assert_eq(mkfifo(in_tmp("pipe.bin"), 0600), 0);
    const char *paths[] = {in_tmp("pipe.bin"), "/dev/zero", "/dev/null"};
    const char *kinds[] = {"FIFO", "character device", "character device"};
    for (int i = 0; i < 3; i++) {
        assert_refused(paths[i], DP_ERR_FORMAT, paths[i], kinds[i]);
        int is_tokens = -1;
        cr_assert_eq(dp_token_files_probe(paths[i], &is_tokens), DP_ERR_FORMAT);
        cr_assert(strstr(dp_last_error(), kinds[i]), "%s", dp_last_error());
        dp_tokenizer *t = (dp_tokenizer *)1;
        cr_assert_eq(dp_tokenizer_load_llmc(paths[i], &t), DP_ERR_FORMAT);
        cr_assert_null(t);
        cr_assert(strstr(dp_last_error(), kinds[i]), "%s", dp_last_error());
    }
    int is_tokens = -1;
    cr_assert_eq(dp_token_files_probe(in_tmp("nope"), &is_tokens), DP_ERR_IO);
    cr_assert(strstr(dp_last_error(), "nope"), "%s", dp_last_error());
    cr_assert_str_eq(dp_token_format_name(DP_TOKEN_FORMAT_LLMC), "llmc");
    cr_assert_str_eq(dp_token_format_name(DP_TOKEN_FORMAT_NANOGPT), "nanogpt");
    cr_assert_str_eq(dp_token_format_name(DP_TOKEN_FORMAT_COUNT), "invalid token format");
}

// ----------------------------------------------------------------------------
// llm.c's token table

Test(token_data, the_llmc_token_table_decodes)
{
    dp_test_write_llmc_tokenizer(in_tmp("tok.bin"), 300);
    dp_tokenizer *t = NULL;
    dp_assert_ok(dp_tokenizer_load_llmc(in_tmp("tok.bin"), &t));
    cr_assert_eq(dp_tokenizer_kind_of(t), DP_TOKENIZER_LLMC);
    cr_assert_str_eq(dp_tokenizer_kind_name(DP_TOKENIZER_LLMC), "llmc");
    cr_assert_eq(dp_tokenizer_vocab_size(t), 300);
    cr_assert_eq(dp_tokenizer_eot_id(t), 299);
    cr_assert_eq(dp_tokenizer_unk_id(t), -1);
    for (int32_t i = 0; i < 300; i += 37) {
        const char *b;
        size_t n;
        char want[32];
        size_t wn = dp_test_token_text((size_t)i, want, sizeof want);
        dp_assert_ok(dp_tokenizer_token(t, i, &b, &n));
        cr_assert(n == wn && memcmp(b, want, n) == 0, "token %d", (int)i);
    }
    int32_t ids[3] = {5, 299, 0};
    char *text = NULL;
    size_t len = 0;
    dp_assert_ok(dp_tokenizer_decode(t, ids, 3, &text, &len));
    cr_assert_str_eq(text, " w5 w299 w0");
    free(text);
    int32_t out[4];
    size_t n = 0;
    cr_assert_eq(dp_tokenizer_encode(t, "w5", 2, out, 4, &n, NULL), DP_ERR_UNSUPPORTED);
    char *json = NULL;
    cr_assert_eq(dp_tokenizer_serialize(t, &json), DP_ERR_UNSUPPORTED);
    cr_assert_null(json);
    dp_tokenizer_destroy(t);

    // Version 1: no EOT field; GPT-2's 50257 tokens, EOT 50256.
    size_t blen = 0;
    unsigned char *b = dp_test_llmc_tokenizer_bytes(1, DP_GPT2_VOCAB_SIZE, DP_GPT2_VOCAB_SIZE, 0,
                                                    &blen);
    dp_test_put_file(in_tmp("v1.bin"), b, blen, NULL, 0);
    free(b);
    dp_assert_ok(dp_tokenizer_load_llmc(in_tmp("v1.bin"), &t));
    cr_assert_eq(dp_tokenizer_vocab_size(t), DP_GPT2_VOCAB_SIZE);
    cr_assert_eq(dp_tokenizer_eot_id(t), DP_GPT2_EOT);
    dp_tokenizer_destroy(t);
    cr_assert_eq(dp_tokenizer_eot_id(NULL), -1);
}

/* A version-2 table of V tokens of `len` bytes each (token i's bytes all
 * 'a' + i % 26), header V_header and EOT eot, extra bytes 'x' after the
 * records, into name; loads it: the status, *t the table or NULL. */
static dp_status table_of(const char *name, uint32_t V_header, size_t V, size_t len,
                          uint32_t eot, size_t extra, dp_tokenizer **t)
{
    size_t n = DP_LLMC_TOKENIZER_HEADER_BYTES + V * (1 + len) + extra;
    unsigned char *b = calloc(1, n);
    cr_assert_not_null(b);
    dp_test_put_le32(b, DP_LLMC_TOKENIZER_MAGIC);
    dp_test_put_le32(b + 4, 2);
    dp_test_put_le32(b + 8, V_header);
    dp_test_put_le32(b + 12, eot);
    unsigned char *p = b + DP_LLMC_TOKENIZER_HEADER_BYTES;
    for (size_t i = 0; i < V; i++) {
        *p++ = (unsigned char)len;
        memset(p, 'a' + (int)(i % 26), len);
        p += len;
    }
    memset(p, 'x', extra);
    dp_test_put_file(in_tmp(name), b, n, NULL, 0);
    free(b);
    *t = (dp_tokenizer *)1;
    return dp_tokenizer_load_llmc(in_tmp(name), t);
}

/* A tokenizer.json under another name (it is told from llm.c's table by
 * its name): named as JSON, with the fix, not by a number as magic. */
Test(token_data, a_json_tokenizer_without_its_name_is_named)
{
    static const char json[] = "{\"model\": {\"type\": \"BPE\", \"vocab\": {}}} and more bytes "
                               "to pass the header's size ....................................";
    char *b = calloc(1, 2048);
    memcpy(b, json, sizeof json - 1);
    dp_test_put_file(in_tmp("mytok"), b, 2048, NULL, 0);
    free(b);
    dp_tokenizer *t = (dp_tokenizer *)1;
    cr_assert_eq(dp_tokenizer_load_llmc(in_tmp("mytok"), &t), DP_ERR_FORMAT);
    cr_assert_null(t);
    cr_assert(strstr(dp_last_error(), "starts as JSON") &&
                  strstr(dp_last_error(), "a name ending in .json"),
              "%s", dp_last_error());
}

/* The bounds of the header against the file, by what loads and what
 * does not (not by the messages' words): the shortest records (1 byte:
 * 2 bytes a token, the file exactly 2V bytes past the header) and the
 * longest (255 bytes: exactly 256V) load and decode; one token more in
 * the header than the records hold, one byte past the longest, an EOT id
 * of V are refused; the EOT id V - 1 is the last one taken. An
 * off-by-one in any of these bounds fails a line here. */
Test(token_data, token_tables_at_their_bounds)
{
    const size_t V = 40;
    dp_tokenizer *t = NULL;
    for (int pass = 0; pass < 2; pass++) {
        size_t len = pass ? 255 : 1;
        const char *name = pass ? "longest.bin" : "shortest.bin";
        dp_status s = table_of(name, (uint32_t)V, V, len, (uint32_t)(V - 1), 0, &t);
        cr_assert_eq(s, DP_OK, "%s (%zu bytes a token): %s", name, len, dp_last_error());
        cr_assert_eq(dp_tokenizer_vocab_size(t), V);
        cr_assert_eq(dp_tokenizer_eot_id(t), (int32_t)(V - 1));
        for (int32_t i = 0; i < (int32_t)V; i++) {
            const char *b;
            size_t n;
            dp_assert_ok(dp_tokenizer_token(t, i, &b, &n));
            cr_assert_eq(n, len, "%s: token %d has %zu bytes", name, (int)i, n);
            for (size_t k = 0; k < n; k++)
                cr_assert_eq(b[k], 'a' + (int)(i % 26), "%s: token %d byte %zu", name, (int)i, k);
        }
        dp_tokenizer_destroy(t);
        /* one token more in the header than the records hold */
        s = table_of(name, (uint32_t)(V + 1), V, len, (uint32_t)(V - 1), 0, &t);
        cr_assert(s == DP_ERR_FORMAT && !t, "%s with V + 1 in the header: %d", name, (int)s);
        /* one byte past the records */
        s = table_of(name, (uint32_t)V, V, len, (uint32_t)(V - 1), 1, &t);
        cr_assert(s == DP_ERR_FORMAT && !t, "%s with a byte more: %d", name, (int)s);
    }
    /* a file that holds V tokens of the shortest records in 2V bytes loads
     * with any EOT below V, not with V */
    cr_assert_eq(table_of("eot0.bin", (uint32_t)V, V, 1, 0, 0, &t), DP_OK);
    cr_assert_eq(dp_tokenizer_eot_id(t), 0);
    dp_tokenizer_destroy(t);
    cr_assert(table_of("eotV.bin", (uint32_t)V, V, 1, (uint32_t)V, 0, &t) == DP_ERR_FORMAT && !t);
    /* one token: the smallest table (a 1-byte record, EOT 0) */
    cr_assert_eq(table_of("one.bin", 1, 1, 1, 0, 0, &t), DP_OK);
    cr_assert_eq(dp_tokenizer_vocab_size(t), 1);
    dp_tokenizer_destroy(t);
}

/* The table file made by dp_test_llmc_tokenizer_bytes, changed by edit,
 * must be refused naming the file with `what`. */
static void assert_table_refused(const char *name, uint32_t version, uint32_t v_header, size_t v,
                                 uint32_t eot, void (*edit)(unsigned char *, size_t *),
                                 const char *what)
{
    size_t len = 0;
    unsigned char *b = dp_test_llmc_tokenizer_bytes(version, v_header, v, eot, &len);
    if (edit) edit(b, &len);
    dp_test_put_file(in_tmp(name), b, len, NULL, 0);
    free(b);
    dp_tokenizer *t = (dp_tokenizer *)1;
    dp_status st = dp_tokenizer_load_llmc(in_tmp(name), &t);
    cr_assert_eq(st, DP_ERR_FORMAT, "%s: status %d: %s", name, (int)st, dp_last_error());
    cr_assert_null(t);
    cr_assert(strstr(dp_last_error(), name) && strstr(dp_last_error(), what),
              "%s: the message lacks \"%s\": %s", name, what, dp_last_error());
}

static void cut_last_byte(unsigned char *b, size_t *len) { (void)b; (*len)--; }
static void zero_length(unsigned char *b, size_t *len)
{
    (void)len;
    b[DP_LLMC_TOKENIZER_HEADER_BYTES + 4] = 0; // token 1's length byte (token 0 is " w0")
}
static void add_bytes(unsigned char *b, size_t *len)
{
    memset(b + *len, 'x', 3);
    *len += 3;
}
static void data_magic(unsigned char *b, size_t *len)
{
    (void)len;
    dp_test_put_le32(b, DP_LLMC_DATA_MAGIC);
}
static void header_only(unsigned char *b, size_t *len)
{
    (void)b;
    *len = 600;
}

Test(token_data, bad_token_tables_are_refused_naming_the_file)
{
    assert_table_refused("truncated.bin", 2, 20, 20, 19, cut_last_byte, "cut short");
    assert_table_refused("zerolen.bin", 2, 20, 20, 19, zero_length, "zero length byte");
    assert_table_refused("trailing.bin", 2, 20, 20, 19, add_bytes, "bytes past its last token");
    assert_table_refused("fewer.bin", 2, 19, 20, 18, NULL, "bytes past its last token");
    assert_table_refused("more.bin", 2, 21, 20, 19, NULL, "cut short");
    assert_table_refused("overflow.bin", 2, 0xffffffffu, 20, 19, NULL, "overflows");
    assert_table_refused("toobig.bin", 2, 100000, 20, 19, NULL, "cannot fit");
    assert_table_refused("empty_vocab.bin", 2, 0, 0, 0, NULL, "is zero");
    assert_table_refused("eot.bin", 2, 20, 20, 20, NULL, "end-of-text id 20");
    assert_table_refused("v3.bin", 3, 20, 20, 19, NULL, "version 3");
    assert_table_refused("v1small.bin", 1, 20, 20, 0, NULL, "version 1");
    assert_table_refused("shard.bin", 2, 20, 20, 19, data_magic, "token file");
    assert_table_refused("header.bin", 2, 20, 20, 19, header_only, "1024-byte header");
    dp_tokenizer *t = (dp_tokenizer *)1;
    cr_assert_eq(dp_tokenizer_load_llmc(in_tmp("missing.bin"), &t), DP_ERR_IO);
    cr_assert_null(t);
    cr_assert_eq(dp_tokenizer_load_llmc(tmpdir, &t), DP_ERR_FORMAT);
    cr_assert(strstr(dp_last_error(), "directory"), "%s", dp_last_error());
}
