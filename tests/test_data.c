/*
 * Text data: corpus loading from files and directories (skip rules and
 * errors), the 90/10 split, the seeded batch sampler (determinism, bounds,
 * shifted targets, save/restore), and the fixed validation windows.
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dp/data.h"
#include "dp_test.h"
#include "dp_test_fs.h"

// ----------------------------------------------------------------------------
// temp-dir helpers

static char tmpdir[64];

static void make_tmpdir(void)
{
    strcpy(tmpdir, "/tmp/dp_test_data_XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp failed");
}


static void cleanup(void) { dp_test_remove_tree(tmpdir); }

static const char *in_tmp(const char *name) { return dp_test_join(tmpdir, name); }

static void put(const char *name, const void *bytes, size_t n)
{
    FILE *f = fopen(in_tmp(name), "wb");
    cr_assert_not_null(f, "cannot create %s", name);
    if (n) cr_assert_eq(fwrite(bytes, 1, n, f), n);
    fclose(f);
}

TestSuite(data, .init = make_tmpdir, .fini = cleanup);

// ----------------------------------------------------------------------------
// loading

Test(data, load_file)
{
    put("corpus.txt", "abc\nde", 6);
    char *text;
    size_t len, files;
    dp_assert_ok(dp_text_load(in_tmp("corpus.txt"), &text, &len, &files));
    cr_assert_eq(len, 6);
    cr_assert_eq(files, 1);
    cr_assert_str_eq(text, "abc\nde");
    free(text);
}

Test(data, load_directory_skips_index_duplicates_and_dot_files)
{
    cr_assert_eq(mkdir(in_tmp("dir"), 0755), 0);
    put("dir/b", "BBB", 3);
    put("dir/a", "AAA\n", 4);
    put("dir/B", "upper", 5);         // 'B' < 'a' < 'b' in byte order
    put("dir/a.dat", "\0\0\1\2", 4);  // a fortunes index: binary, must be skipped
    put("dir/.hidden", "HIDDEN", 6);
    put("dir/empty", "", 0);          // contributes nothing
    cr_assert_eq(symlink("a", in_tmp("dir/a.u8")), 0);       // skipped by name
    cr_assert_eq(symlink("a.dat", in_tmp("dir/zlink")), 0);  // points at a skipped name
    cr_assert_eq(symlink(".hidden", in_tmp("dir/ylink")), 0);
    cr_assert_eq(symlink("b", in_tmp("dir/c-link")), 0);     // a link to a text file is read
    cr_assert_eq(mkdir(in_tmp("dir/sub"), 0755), 0);         // not recursed into
    put("dir/sub/deep", "DEEP", 4);

    char *text;
    size_t len, files;
    dp_assert_ok(dp_text_load(in_tmp("dir"), &text, &len, &files));
    const char *want = "upper\nAAA\n\nBBB\nBBB";
    cr_assert_str_eq(text, want);
    cr_assert_eq(len, strlen(want));
    cr_assert_eq(files, 4);
    free(text);

    // A trailing slash gives the same corpus.
    char slash[300];
    snprintf(slash, sizeof slash, "%s/", in_tmp("dir"));
    dp_assert_ok(dp_text_load(slash, &text, &len, NULL));
    cr_assert_str_eq(text, want);
    free(text);
}

Test(data, load_errors)
{
    char *text = (char *)1;
    size_t len = 7;
    // Missing path.
    cr_assert_eq(dp_text_load(in_tmp("nope"), &text, &len, NULL), DP_ERR_IO);
    cr_assert_null(text);
    cr_assert_eq(len, 0);
    cr_assert(strstr(dp_last_error(), "nope") && strstr(dp_last_error(), "No such file"), "%s",
              dp_last_error());
    // Empty file.
    put("empty", "", 0);
    cr_assert_eq(dp_text_load(in_tmp("empty"), &text, &len, NULL), DP_ERR_FORMAT);
    cr_assert(strstr(dp_last_error(), "empty"), "%s", dp_last_error());
    // Binary file.
    put("bin", "abc\0def", 7);
    cr_assert_eq(dp_text_load(in_tmp("bin"), &text, &len, NULL), DP_ERR_FORMAT);
    cr_assert(strstr(dp_last_error(), "bin") && strstr(dp_last_error(), "NUL byte at offset 3"),
              "%s", dp_last_error());
    // A binary file inside a directory is named.
    cr_assert_eq(mkdir(in_tmp("d1"), 0755), 0);
    put("d1/good", "text", 4);
    put("d1/zbinary", "x\0", 2);
    cr_assert_eq(dp_text_load(in_tmp("d1"), &text, &len, NULL), DP_ERR_FORMAT);
    cr_assert(strstr(dp_last_error(), "zbinary"), "%s", dp_last_error());
    // Empty directory, and one with only skipped or empty files.
    cr_assert_eq(mkdir(in_tmp("d2"), 0755), 0);
    cr_assert_eq(dp_text_load(in_tmp("d2"), &text, &len, NULL), DP_ERR_FORMAT);
    cr_assert(strstr(dp_last_error(), "no non-empty text files"), "%s", dp_last_error());
    put("d2/x.dat", "x", 1);
    put("d2/.x", "x", 1);
    put("d2/y", "", 0);
    cr_assert_eq(dp_text_load(in_tmp("d2"), &text, &len, NULL), DP_ERR_FORMAT);
    // A broken symlink is an i/o error naming it.
    cr_assert_eq(mkdir(in_tmp("d3"), 0755), 0);
    put("d3/ok", "ok", 2);
    cr_assert_eq(symlink("gone", in_tmp("d3/dangling")), 0);
    cr_assert_eq(dp_text_load(in_tmp("d3"), &text, &len, NULL), DP_ERR_IO);
    cr_assert(strstr(dp_last_error(), "dangling"), "%s", dp_last_error());
    // Unreadable file (only meaningful without root's override of permissions).
    if (geteuid() != 0) {
        put("secret", "s", 1);
        chmod(in_tmp("secret"), 0);
        cr_assert_eq(dp_text_load(in_tmp("secret"), &text, &len, NULL), DP_ERR_IO);
        cr_assert(strstr(dp_last_error(), "Permission denied"), "%s", dp_last_error());
    }
    cr_assert_eq(dp_text_load("", &text, &len, NULL), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_text_load(in_tmp("d3"), NULL, &len, NULL), DP_ERR_INVALID_ARGUMENT);
}

/* Each test runs in its own process: allow it 128 MiB more address space
 * than it has now, so a loader that reads a device or a big binary file
 * whole fails the test instead of taking the host's memory (/dev/zero used
 * to be read for 8-16 GB before the NUL check). */
static void limit_memory(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    cr_assert_not_null(f);
    char line[256];
    unsigned long long vm_kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmSize: %llu kB", &vm_kb) == 1) break;
    fclose(f);
    cr_assert_gt(vm_kb, 0);
    rlim_t cap = (rlim_t)(vm_kb << 10) + ((rlim_t)128 << 20);
    struct rlimit lim = {cap, cap};
    cr_assert_eq(setrlimit(RLIMIT_AS, &lim), 0);
}

Test(data, devices_and_fifos_are_refused_before_reading, .timeout = 10)
{
    limit_memory();
    char *text = (char *)1;
    size_t len = 7;
    const char *devs[] = {"/dev/zero", "/dev/urandom", "/dev/null"};
    for (size_t i = 0; i < 3; i++) {
        cr_assert_eq(dp_text_load(devs[i], &text, &len, NULL), DP_ERR_FORMAT, "%s: %s", devs[i],
                     dp_last_error());
        cr_assert(strstr(dp_last_error(), devs[i]) &&
                      strstr(dp_last_error(), "not a regular file or a directory") &&
                      strstr(dp_last_error(), "character device"),
                  "%s", dp_last_error());
        cr_assert_null(text);
        cr_assert_eq(len, 0);
    }
    /* A FIFO with no writer would block a reader forever: refused at once. */
    cr_assert_eq(mkfifo(in_tmp("fifo"), 0600), 0);
    cr_assert_eq(dp_text_load(in_tmp("fifo"), &text, &len, NULL), DP_ERR_FORMAT);
    cr_assert(strstr(dp_last_error(), "FIFO"), "%s", dp_last_error());
    /* A device inside a directory is skipped like any non-regular entry. */
    cr_assert_eq(mkdir(in_tmp("dd"), 0755), 0);
    put("dd/a", "text", 4);
    cr_assert_eq(symlink("/dev/zero", in_tmp("dd/zero")), 0);
    size_t files = 0;
    dp_assert_ok(dp_text_load(in_tmp("dd"), &text, &len, &files));
    cr_assert(len == 4 && files == 1);
    free(text);
}

Test(data, a_large_binary_file_is_refused_at_its_first_piece, .timeout = 10)
{
    /* 512 MiB of NUL bytes (sparse) under the 128 MiB margin: the NUL
     * check must run on each piece as it is read, not after the whole file. */
    int fd = open(in_tmp("big.bin"), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    cr_assert(fd >= 0);
    cr_assert_eq(ftruncate(fd, (off_t)512 << 20), 0);
    close(fd);
    limit_memory();
    char *text;
    size_t len;
    cr_assert_eq(dp_text_load(in_tmp("big.bin"), &text, &len, NULL), DP_ERR_FORMAT, "%s",
                 dp_last_error());
    cr_assert(strstr(dp_last_error(), "NUL byte at offset 0"), "%s", dp_last_error());
}

/* lm_train's default corpus, the fortunes package's directory. */
#define FORTUNES_DIR "/usr/share/games/fortunes"

Test(data, fortunes_directory)
{
    struct stat sb;
    if (stat(FORTUNES_DIR, &sb) != 0) {
        cleanup(); // .fini does not run for a skipped test
        cr_skip_test("%s is not installed", FORTUNES_DIR);
    }
    char *text;
    size_t len, files;
    cr_assert_eq(dp_text_load(NULL, &text, &len, &files), DP_ERR_INVALID_ARGUMENT);
    dp_assert_ok(dp_text_load(FORTUNES_DIR, &text, &len, &files));
    cr_assert_gt(files, 1);
    cr_assert_gt(len, 100000, "fortunes corpus is only %zu bytes", len);
    cr_assert_null(memchr(text, '\0', len), "corpus holds a NUL");
    cr_assert_eq(text[len], '\0');
    // Index files start with a binary version word: none may have been read.
    dp_tokenizer *tok;
    dp_assert_ok(dp_tokenizer_create_char(text, len, &tok));
    cr_assert_lt(dp_tokenizer_vocab_size(tok), 256);
    dp_tokenizer_destroy(tok);
    free(text);
}

// ----------------------------------------------------------------------------
// token data and the split

static dp_token_data *iota_data(size_t n)
{
    int32_t *t = malloc(n * sizeof *t);
    for (size_t i = 0; i < n; i++) t[i] = (int32_t)i;
    dp_token_data *d;
    dp_assert_ok(dp_token_data_from_tokens(t, n, n, &d));
    free(t);
    return d;
}

Test(data, split_sizes)
{
    // train = floor(0.9 n), val = the rest.
    size_t ns[] = {1, 9, 10, 15, 19, 100, 1001, 12345};
    size_t train[] = {0, 8, 9, 13, 17, 90, 900, 11110};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        dp_token_data *d = iota_data(ns[i]);
        cr_assert_eq(dp_token_data_total(d), ns[i]);
        cr_assert_eq(dp_token_data_size(d, DP_SPLIT_TRAIN), train[i], "n = %zu", ns[i]);
        cr_assert_eq(dp_token_data_size(d, DP_SPLIT_VAL), ns[i] - train[i], "n = %zu", ns[i]);
        const int32_t *v = dp_token_data_tokens(d, DP_SPLIT_VAL);
        cr_assert_eq(v[0], (int32_t)train[i], "validation must start after the training split");
        cr_assert_eq(dp_token_data_tokens(d, DP_SPLIT_TRAIN)[0], 0);
        cr_assert_eq(dp_token_data_size(d, DP_SPLIT_COUNT), 0);
        cr_assert_null(dp_token_data_tokens(d, DP_SPLIT_COUNT));
        dp_token_data_destroy(d);
    }
}

Test(data, token_data_from_text_and_errors)
{
    const char *text = "hello hello world";
    dp_tokenizer *tok;
    dp_assert_ok(dp_tokenizer_create_word(text, strlen(text), 10, &tok));
    dp_token_data *d;
    dp_assert_ok(dp_token_data_from_text(tok, text, strlen(text), &d));
    cr_assert_eq(dp_token_data_total(d), 5);
    cr_assert_eq(dp_token_data_vocab_size(d), dp_tokenizer_vocab_size(tok));
    cr_assert_eq(dp_token_data_unknown_count(d), 0);
    const int32_t *t = dp_token_data_tokens(d, DP_SPLIT_TRAIN);
    int32_t want[5] = {2, 1, 2, 1, 3}; // <unk>, ' ', hello, world
    cr_assert_eq(memcmp(t, want, 4 * sizeof *t), 0);
    cr_assert_eq(dp_token_data_tokens(d, DP_SPLIT_VAL)[0], want[4]);
    dp_token_data_destroy(d);
    dp_tokenizer_destroy(tok);

    int32_t bad[3] = {0, 5, 1};
    cr_assert_eq(dp_token_data_from_tokens(bad, 3, 5, &d), DP_ERR_INVALID_ARGUMENT);
    cr_assert_null(d);
    cr_assert(strstr(dp_last_error(), "token 5 at position 1"), "%s", dp_last_error());
    bad[1] = -2;
    cr_assert_eq(dp_token_data_from_tokens(bad, 3, 5, &d), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_token_data_from_tokens(bad, 0, 5, &d), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_token_data_from_tokens(bad, 1, 0, &d), DP_ERR_INVALID_ARGUMENT);
    dp_assert_ok(dp_tokenizer_create_char("ab", 2, &tok));
    cr_assert_eq(dp_token_data_from_text(tok, "abc", 3, &d), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_token_data_from_text(tok, "", 0, &d), DP_ERR_INVALID_ARGUMENT);
    dp_tokenizer_destroy(tok);
    dp_token_data_destroy(NULL);
}

// ----------------------------------------------------------------------------
// sampler

enum { B = 4, T = 16 };

Test(data, sampler_windows_are_in_bounds_and_shifted)
{
    // Tokens 0..n-1, so a window's tokens are its positions.
    size_t n = 1000;
    dp_token_data *d = iota_data(n);
    for (int split = 0; split < 2; split++) {
        size_t ns = dp_token_data_size(d, (dp_split)split);
        int32_t base = dp_token_data_tokens(d, (dp_split)split)[0];
        dp_sampler *s;
        dp_assert_ok(dp_sampler_create(d, (dp_split)split, T, 7, &s));
        int32_t x[B * T], y[B * T];
        for (int it = 0; it < 50; it++) {
            dp_assert_ok(dp_sampler_next(s, x, y, B));
            for (int b = 0; b < B; b++) {
                int32_t p = x[b * T] - base;
                cr_assert(p >= 0 && (size_t)p + T + 1 <= ns, "window at %d leaves the split", p);
                for (int t = 0; t < T; t++) {
                    cr_assert_eq(x[b * T + t], base + p + t);
                    cr_assert_eq(y[b * T + t], x[b * T + t] + 1, "targets are not shifted by one");
                }
            }
        }
        cr_assert_eq(dp_sampler_batches(s), 50);
        dp_sampler_destroy(s);
    }
    dp_token_data_destroy(d);
}

Test(data, sampler_reaches_both_ends)
{
    // A split of T + 2 tokens has exactly two windows: both must occur.
    dp_token_data *d = iota_data((T + 2) * 10 / 9 + 1);
    cr_assert_eq(dp_token_data_size(d, DP_SPLIT_TRAIN), T + 2);
    dp_sampler *s;
    dp_assert_ok(dp_sampler_create(d, DP_SPLIT_TRAIN, T, 3, &s));
    int seen[2] = {0, 0};
    int32_t x[T], y[T];
    for (int i = 0; i < 200; i++) {
        dp_assert_ok(dp_sampler_next(s, x, y, 1));
        cr_assert(x[0] == 0 || x[0] == 1, "start %d", x[0]);
        seen[x[0]]++;
    }
    // P(one start missing in 200 fair draws) = 2^-199.
    cr_assert(seen[0] > 0 && seen[1] > 0, "starts seen: %d, %d", seen[0], seen[1]);
    dp_sampler_destroy(s);
    dp_token_data_destroy(d);
}

Test(data, sampler_is_deterministic_for_a_seed)
{
    dp_token_data *d = iota_data(5000);
    dp_sampler *a, *b, *c;
    dp_assert_ok(dp_sampler_create(d, DP_SPLIT_TRAIN, T, 42, &a));
    dp_assert_ok(dp_sampler_create(d, DP_SPLIT_TRAIN, T, 42, &b));
    dp_assert_ok(dp_sampler_create(d, DP_SPLIT_TRAIN, T, 43, &c));
    int32_t xa[2 * B * T], ya[2 * B * T], xb[2 * B * T], yb[2 * B * T], xc[B * T], yc[B * T];
    int differ = 0;
    for (int it = 0; it < 10; it++) {
        // a draws two batches of B; b one batch of 2B: the same windows.
        dp_assert_ok(dp_sampler_next(a, xa, ya, B));
        dp_assert_ok(dp_sampler_next(a, xa + B * T, ya + B * T, B));
        dp_assert_ok(dp_sampler_next(b, xb, yb, 2 * B));
        cr_assert_eq(memcmp(xa, xb, sizeof xa), 0, "batch %d differs for the same seed", it);
        cr_assert_eq(memcmp(ya, yb, sizeof ya), 0);
        dp_assert_ok(dp_sampler_next(c, xc, yc, B));
        differ |= memcmp(xa, xc, sizeof xc) != 0;
    }
    cr_assert(differ, "seeds 42 and 43 gave the same batches");
    dp_sampler_destroy(a);
    dp_sampler_destroy(b);
    dp_sampler_destroy(c);
    dp_token_data_destroy(d);
}

Test(data, sampler_state_restores_the_sequence)
{
    dp_token_data *d = iota_data(5000);
    dp_sampler *a, *r;
    dp_assert_ok(dp_sampler_create(d, DP_SPLIT_TRAIN, T, 9, &a));
    int32_t x[B * T], y[B * T];
    for (int i = 0; i < 3; i++) dp_assert_ok(dp_sampler_next(a, x, y, B));
    uint64_t st[DP_SAMPLER_STATE_WORDS];
    dp_assert_ok(dp_sampler_get_state(a, st));
    char text[DP_SAMPLER_STATE_CHARS];
    dp_assert_ok(dp_sampler_state_format(st, text, sizeof text));
    cr_assert_eq(strlen(text), DP_SAMPLER_STATE_CHARS - 1);
    int32_t ax[5][B * T], ay[5][B * T];
    for (int i = 0; i < 5; i++) dp_assert_ok(dp_sampler_next(a, ax[i], ay[i], B));

    // A fresh sampler with another seed, restored from the text form.
    uint64_t st2[DP_SAMPLER_STATE_WORDS];
    dp_assert_ok(dp_sampler_state_parse(text, st2));
    cr_assert_eq(memcmp(st, st2, sizeof st), 0);
    dp_assert_ok(dp_sampler_create(d, DP_SPLIT_TRAIN, T, 12345, &r));
    dp_assert_ok(dp_sampler_set_state(r, st2));
    cr_assert_eq(dp_sampler_batches(r), 3);
    for (int i = 0; i < 5; i++) {
        dp_assert_ok(dp_sampler_next(r, x, y, B));
        cr_assert_eq(memcmp(x, ax[i], sizeof x), 0, "batch %d after restore differs", i);
        cr_assert_eq(memcmp(y, ay[i], sizeof y), 0);
    }
    cr_assert_eq(dp_sampler_batches(r), 8);
    dp_sampler_destroy(a);
    dp_sampler_destroy(r);
    dp_token_data_destroy(d);
}

Test(data, sampler_state_errors)
{
    dp_token_data *d = iota_data(5000);
    dp_sampler *a, *b;
    dp_assert_ok(dp_sampler_create(d, DP_SPLIT_TRAIN, T, 1, &a));
    dp_assert_ok(dp_sampler_create(d, DP_SPLIT_TRAIN, T + 1, 1, &b));
    uint64_t st[DP_SAMPLER_STATE_WORDS], keep[DP_SAMPLER_STATE_WORDS];
    dp_assert_ok(dp_sampler_get_state(a, st));
    dp_assert_ok(dp_sampler_get_state(b, keep));
    cr_assert_eq(dp_sampler_set_state(b, st), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "context 16") && strstr(dp_last_error(), "context 17"), "%s",
              dp_last_error());
    uint64_t now[DP_SAMPLER_STATE_WORDS];
    dp_assert_ok(dp_sampler_get_state(b, now));
    cr_assert_eq(memcmp(now, keep, sizeof now), 0, "a failed restore changed the sampler");
    uint64_t bad[DP_SAMPLER_STATE_WORDS];
    memcpy(bad, st, sizeof bad);
    bad[0] ^= 1;
    cr_assert_eq(dp_sampler_set_state(a, bad), DP_ERR_FORMAT);
    memcpy(bad, st, sizeof bad);
    bad[1] = bad[2] = bad[3] = bad[4] = 0;
    cr_assert_eq(dp_sampler_set_state(a, bad), DP_ERR_FORMAT);
    // A sampler over the validation split has another length.
    dp_sampler *v;
    dp_assert_ok(dp_sampler_create(d, DP_SPLIT_VAL, T, 1, &v));
    cr_assert_eq(dp_sampler_set_state(v, st), DP_ERR_INVALID_ARGUMENT);

    char text[DP_SAMPLER_STATE_CHARS];
    cr_assert_eq(dp_sampler_state_format(st, text, sizeof text - 1), DP_ERR_INVALID_ARGUMENT);
    dp_assert_ok(dp_sampler_state_format(st, text, sizeof text));
    char mod[DP_SAMPLER_STATE_CHARS + 8];
    uint64_t out[DP_SAMPLER_STATE_WORDS];
    strcpy(mod, text);
    mod[5] = 'g';
    cr_assert_eq(dp_sampler_state_parse(mod, out), DP_ERR_FORMAT);
    strcpy(mod, text);
    mod[strlen(mod) - 1] = '\0'; // one digit short
    cr_assert_eq(dp_sampler_state_parse(mod, out), DP_ERR_FORMAT);
    snprintf(mod, sizeof mod, "%s,", text); // trailing garbage
    cr_assert_eq(dp_sampler_state_parse(mod, out), DP_ERR_FORMAT);
    cr_assert_eq(dp_sampler_state_parse("", out), DP_ERR_FORMAT);
    dp_sampler_destroy(a);
    dp_sampler_destroy(b);
    dp_sampler_destroy(v);
    dp_token_data_destroy(d);
}

Test(data, sampler_rejects_a_short_split)
{
    dp_token_data *d = iota_data(1200); // validation: 120 tokens
    dp_sampler *s = (dp_sampler *)1;
    cr_assert_eq(dp_sampler_create(d, DP_SPLIT_VAL, 256, 1, &s), DP_ERR_INVALID_ARGUMENT);
    cr_assert_null(s);
    cr_assert(strstr(dp_last_error(), "context 256 is longer than the validation split (120 tokens") &&
                  strstr(dp_last_error(), "use a smaller context or more data"),
              "%s", dp_last_error());
    // A window needs context + 1 tokens: 120 fails, 119 fits.
    cr_assert_eq(dp_sampler_create(d, DP_SPLIT_VAL, 120, 1, &s), DP_ERR_INVALID_ARGUMENT);
    dp_assert_ok(dp_sampler_create(d, DP_SPLIT_VAL, 119, 1, &s));
    int32_t x[119], y[119];
    dp_assert_ok(dp_sampler_next(s, x, y, 1));
    cr_assert(x[0] == 1080 && y[118] == 1199, "the only window must be the whole split");
    cr_assert_eq(dp_sampler_next(s, x, y, 0), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_sampler_next(s, NULL, y, 1), DP_ERR_INVALID_ARGUMENT);
    dp_sampler_destroy(s);
    cr_assert_eq(dp_sampler_create(d, DP_SPLIT_TRAIN, 0, 1, &s), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_sampler_create(d, DP_SPLIT_COUNT, 8, 1, &s), DP_ERR_INVALID_ARGUMENT);
    dp_token_data_destroy(d);
}

// ----------------------------------------------------------------------------
// validation windows

Test(data, eval_windows)
{
    dp_token_data *d = iota_data(100); // validation: tokens 90..99 (10 tokens)
    // (n - 1) / T windows of T + 1 tokens starting at multiples of T.
    size_t ctx[] = {1, 3, 4, 9, 10, 11};
    size_t want[] = {9, 3, 2, 1, 0, 0};
    for (size_t i = 0; i < 6; i++)
        cr_assert_eq(dp_eval_window_count(d, DP_SPLIT_VAL, ctx[i]), want[i], "context %zu",
                     ctx[i]);
    cr_assert_eq(dp_eval_window_count(d, DP_SPLIT_TRAIN, 4), 22); // 90 tokens: 89 / 4
    cr_assert_eq(dp_eval_window_count(d, DP_SPLIT_VAL, 0), 0);
    cr_assert_eq(dp_eval_window_count(NULL, DP_SPLIT_VAL, 3), 0);

    // T = 3: windows [90..93], [93..96], [96..99]; fill windows 1 and 2.
    int32_t x[6], y[6];
    dp_assert_ok(dp_eval_windows(d, DP_SPLIT_VAL, 3, 1, 2, x, y));
    int32_t wx[6] = {93, 94, 95, 96, 97, 98}, wy[6] = {94, 95, 96, 97, 98, 99};
    cr_assert_eq(memcmp(x, wx, sizeof x), 0);
    cr_assert_eq(memcmp(y, wy, sizeof y), 0);
    dp_assert_ok(dp_eval_windows(d, DP_SPLIT_VAL, 3, 0, 1, x, y));
    cr_assert(x[0] == 90 && y[2] == 93);
    cr_assert_eq(dp_eval_windows(d, DP_SPLIT_VAL, 3, 2, 2, x, y), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "2 windows from window 2 pass the 3 windows"), "%s",
              dp_last_error());
    cr_assert(strstr(dp_last_error(), "3 windows"), "%s", dp_last_error());
    cr_assert_eq(dp_eval_windows(d, DP_SPLIT_VAL, 3, 3, 1, x, y), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_eval_windows(d, DP_SPLIT_VAL, 3, 0, 0, x, y), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_eval_windows(d, DP_SPLIT_VAL, 10, 0, 1, x, y), DP_ERR_INVALID_ARGUMENT);
    dp_token_data_destroy(d);
}
