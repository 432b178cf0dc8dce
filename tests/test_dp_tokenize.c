/*
 * dp_tokenize as a user runs it (the built binary, DP_TOKENIZE_PATH) with
 * the BPE fixture of tests/data/bpe/, on text files written here:
 *  - the shard: its header read by a plain reader here (magic, version,
 *    count, zeros, size), its ids those of the library's encoder with each
 *    document preceded by <|endoftext|> (llm.c's fineweb.py), and
 *    dp_token_data_open reads the same ids back;
 *  - --allow-special; an input past the 1 MiB window gives the ids of
 *    encoding it whole; encoder.json gives the same file; without --out
 *    nothing is written;
 *  - bad inputs, options, tokenizers and outputs fail with a non-zero exit
 *    and a "dp_tokenize: ..." line naming the problem, and leave no output
 *    (nor a temporary file; an existing output is left as it was), a
 *    failed write included (a file-size limit makes it fail), and a
 *    SIGINT or SIGTERM while writing (the temporary file removed).
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dp/data.h"
#include "dp_test.h"
#include "dp_test_bpe.h"
#include "dp_test_fs.h"
#include "dp_test_spawn.h"

#ifndef DP_TOKENIZE_PATH
#error "DP_TOKENIZE_PATH (the dp_tokenize binary) must be defined by the build"
#endif

static char tmpdir[64];

/* The fixture's tokenizer.json, for the command lines. */
static char tok_json[4096];

static const char *in_tmp(const char *name) { return dp_test_join(tmpdir, name); }

/* Three documents: mixed text with the special token's text, an empty
 * one, and another. */
static const char DOC_A[] = "First document.\r\nIt's got CRLF line ends, caf\xc3\xa9, "
                            "\xe4\xb8\xad\xe6\x96\x87 and \xf0\x9f\x99\x82.\n"
                            "A <|endoftext|> in the text.\n";
static const char DOC_C[] = "Third:   spaces\tand tabs   \n\n\nthe end";

static void setup(void)
{
    strcpy(tmpdir, "/tmp/dp_test_tokenize_XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir));
    dp_test_write_file(in_tmp("a.txt"), DOC_A, strlen(DOC_A));
    dp_test_write_file(in_tmp("b.txt"), "", 0);
    dp_test_write_file(in_tmp("c.txt"), DOC_C, strlen(DOC_C));
    snprintf(tok_json, sizeof tok_json, "%s", bpe_data("tokenizer.json"));
}

static void teardown(void) { dp_test_remove_tree(tmpdir); }

TestSuite(dp_tokenize, .init = setup, .fini = teardown, .timeout = 60);

typedef dp_test_result result;

/* dp_tokenize with args[0..n); an argument starting with '@' names a file
 * in tmpdir. */
static result run(const char *const *args, size_t n)
{
    char *argv[40];
    size_t argc = dp_test_argv(argv, 40, 0, NULL, DP_TOKENIZE_PATH, NULL, 0, args, n, tmpdir);
    char out[300], err[300];
    snprintf(out, sizeof out, "%s/.stdout", tmpdir);
    snprintf(err, sizeof err, "%s/.stderr", tmpdir);
    result r = dp_test_collect(dp_test_spawn(argv, out, err), out, err);
    dp_test_argv_free(argv, argc);
    return r;
}

#define RUN(...)                                                 \
    run((const char *const[]){__VA_ARGS__},                       \
        sizeof((const char *const[]){__VA_ARGS__}) / sizeof(const char *))

static dp_tokenizer *fixture(void)
{
    dp_tokenizer *t;
    dp_assert_ok(dp_tokenizer_load_bpe(bpe_data("tokenizer.json"), &t));
    return t;
}

/* Appends EOT and the encoding of the file at path to ids[*n..). */
static void expect_doc(const dp_tokenizer *t, const char *path, int special, int32_t **ids,
                       size_t *n)
{
    size_t len, m;
    unsigned char *text = dp_test_read_file(path, &len);
    int32_t *d = bpe_encode_all(t, (const char *)text, len, !special, &m);
    *ids = realloc(*ids, (*n + 1 + m) * sizeof **ids);
    cr_assert_not_null(*ids);
    (*ids)[(*n)++] = BPE_EOT;
    memcpy(*ids + *n, d, m * sizeof *d);
    *n += m;
    free(d);
    free(text);
}

static uint32_t le32(const unsigned char *b)
{
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

/* Reads the shard at path with no help from dp: checks the header and
 * returns the ids (*n of them). */
static int32_t *read_shard(const char *path, size_t *n)
{
    size_t len;
    unsigned char *b = dp_test_read_file(path, &len);
    cr_assert_geq(len, 1024, "%s: %zu bytes, shorter than the header", path, len);
    cr_assert_eq(le32(b), 20240520, "magic");
    cr_assert_eq(le32(b + 4), 1, "version");
    uint32_t count = le32(b + 8);
    for (size_t i = 3; i < 256; i++) cr_assert_eq(le32(b + 4 * i), 0, "header[%zu]", i);
    cr_assert_eq(len, 1024 + 2 * (size_t)count, "%s: %zu bytes for %u tokens", path, len, count);
    int32_t *ids = malloc((count ? count : 1) * sizeof *ids);
    for (size_t i = 0; i < count; i++)
        ids[i] = (int32_t)(b[1024 + 2 * i] | (unsigned)b[1025 + 2 * i] << 8);
    free(b);
    *n = count;
    return ids;
}

/* The ids dp_token_data_open reads from the single-file shard (both splits). */
static int32_t *read_with_dp(const char *path, size_t *n)
{
    dp_token_data *d;
    dp_assert_ok(dp_token_data_open(path, BPE_V, &d));
    dp_token_data_info info;
    dp_assert_ok(dp_token_data_get_info(d, &info));
    cr_assert_eq(info.format, DP_TOKEN_FORMAT_LLMC);
    size_t nt = dp_token_data_size(d, DP_SPLIT_TRAIN), nv = dp_token_data_size(d, DP_SPLIT_VAL);
    int32_t *ids = malloc((nt + nv) * sizeof *ids);
    dp_assert_ok(dp_token_data_read(d, DP_SPLIT_TRAIN, 0, nt, ids));
    dp_assert_ok(dp_token_data_read(d, DP_SPLIT_VAL, 0, nv, ids + nt));
    dp_token_data_destroy(d);
    *n = nt + nv;
    return ids;
}

static void assert_ids(const int32_t *got, size_t n, const int32_t *want, size_t m,
                       const char *what)
{
    size_t i = 0;
    while (i < n && i < m && got[i] == want[i]) i++;
    cr_assert(n == m && i == n, "%s: %zu ids, expected %zu; first difference at %zu", what, n, m,
              i);
}

/* Asserts that the shard at path holds, read by the plain reader, EOT and
 * the library's encoding of each of docs[0..n) (files in tmpdir) in turn;
 * returns its ids (malloc'd), *count of them. */
static int32_t *assert_shard_of(const char *path, const char *const *docs, size_t n, int special,
                                const char *what, size_t *count)
{
    dp_tokenizer *t = fixture();
    int32_t *want = NULL;
    size_t m = 0, k;
    for (size_t i = 0; i < n; i++) expect_doc(t, in_tmp(docs[i]), special, &want, &m);
    int32_t *got = read_shard(path, &k);
    assert_ids(got, k, want, m, what);
    free(want);
    dp_tokenizer_destroy(t);
    *count = k;
    return got;
}

static int exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* No temporary file of the atomic writer is left in tmpdir. */
static void assert_no_temp(void)
{
    DIR *d = opendir(tmpdir);
    cr_assert_not_null(d);
    struct dirent *e;
    while ((e = readdir(d))) cr_assert_null(strstr(e->d_name, ".tmp."), "left: %s", e->d_name);
    closedir(d);
}

// --- the shard -------------------------------------------------------------------------

Test(dp_tokenize, writes_a_shard_the_reader_reads)
{
    result r = RUN("--tokenizer-file", tok_json, "--out", "@out.bin", "@a.txt", "@b.txt", "@c.txt");
    dp_test_assert_success(&r, "dp_tokenize");
    cr_assert(strstr(r.out, "3 files") && strstr(r.out, "tokens/s") && strstr(r.out, "out.bin"),
              "stdout: %s", r.out);
    cr_assert(strstr(r.err, "[3/3]"), "stderr: %s", r.err);
    dp_test_result_free(&r);

    const char *docs[] = {"a.txt", "b.txt", "c.txt"};
    size_t n, m;
    int32_t *want = assert_shard_of(in_tmp("out.bin"), docs, 3, 0, "the shard (plain reader)", &n);
    cr_assert(want[0] == BPE_EOT && want[n - 1] != BPE_EOT, "EOT precedes each document");
    int32_t *got = read_with_dp(in_tmp("out.bin"), &m);
    assert_ids(got, m, want, n, "the shard (dp_token_data_open)");
    free(got);
    free(want);
    assert_no_temp();
}

Test(dp_tokenize, allow_special_and_openai_files)
{
    result r = RUN("--tokenizer-file", tok_json, "--allow-special", "--out", "@out.bin", "@a.txt");
    dp_test_assert_success(&r, "dp_tokenize --allow-special");
    dp_test_result_free(&r);
    const char *doc[] = {"a.txt"};
    size_t n;
    int32_t *got = assert_shard_of(in_tmp("out.bin"), doc, 1, 1, "--allow-special", &n);
    size_t eots = 0;
    for (size_t i = 0; i < n; i++) eots += got[i] == BPE_EOT;
    cr_assert_eq(eots, 2, "the document's EOT and the one in its text");
    free(got);

    // OpenAI's encoder.json (vocab.bpe beside it) writes the same bytes.
    r = RUN("--tokenizer-file", tok_json, "--out", "@hf.bin", "@a.txt", "@c.txt");
    dp_test_assert_success(&r, "tokenizer.json");
    dp_test_result_free(&r);
    char enc[4096], merges[4096];
    snprintf(enc, sizeof enc, "%s", bpe_data("encoder.json"));
    snprintf(merges, sizeof merges, "%s", bpe_data("vocab.bpe"));
    r = RUN("--tokenizer-file", enc, "--out", "@openai.bin", "@a.txt", "@c.txt");
    dp_test_assert_success(&r, "encoder.json");
    dp_test_result_free(&r);
    r = RUN("--tokenizer-file", enc, "--merges-file", merges, "--out", "@openai2.bin", "@a.txt",
            "@c.txt");
    dp_test_assert_success(&r, "encoder.json --merges-file");
    dp_test_result_free(&r);
    size_t la, lb, lc;
    unsigned char *a = dp_test_read_file(in_tmp("hf.bin"), &la);
    unsigned char *b = dp_test_read_file(in_tmp("openai.bin"), &lb);
    unsigned char *c = dp_test_read_file(in_tmp("openai2.bin"), &lc);
    cr_assert(la == lb && memcmp(a, b, la) == 0 && la == lc && memcmp(a, c, la) == 0);
    free(a);
    free(b);
    free(c);
}

/* About 3 MB of text (several 1 MiB windows) from the reference strings
 * without special tokens. */
static void write_large(const char *path, size_t *len)
{
    char *text = dp_test_bpe_joined_refs('\n', 1 << 20, 1, 3u << 20, len);
    dp_test_write_file(path, text, *len);
    free(text);
}

Test(dp_tokenize, large_input_is_encoded_as_a_whole)
{
    size_t len;
    write_large(in_tmp("large.txt"), &len);
    result r = RUN("--tokenizer-file", tok_json, "--out", "@out.bin", "@large.txt");
    dp_test_assert_success(&r, "dp_tokenize large.txt");
    dp_test_result_free(&r);
    const char *doc[] = {"large.txt"};
    size_t m;
    free(assert_shard_of(in_tmp("out.bin"), doc, 1, 0, "3 MB in windows", &m));

    // Without --out: counted, nothing written.
    r = RUN("--tokenizer-file", tok_json, "@large.txt");
    dp_test_assert_success(&r, "dp_tokenize without --out");
    char want_count[64];
    snprintf(want_count, sizeof want_count, "%zu bytes -> %zu tokens", len, m);
    cr_assert(strstr(r.out, want_count) && !strstr(r.out, "shard"), "stdout: %s", r.out);
    dp_test_result_free(&r);
}

Test(dp_tokenize, help)
{
    result r = RUN("--help");
    dp_test_assert_success(&r, "dp_tokenize --help");
    cr_assert(strstr(r.out, "usage: dp_tokenize") && strstr(r.out, "--tokenizer-file"), "%s",
              r.out);
    dp_test_result_free(&r);
}

// --- failures ----------------------------------------------------------------------------

/* Asserts a failed run: exit status `status` (2: a refused command line,
 * 1: a later failure), the words on stderr, no out.bin and no temporary
 * file. */
static void assert_failed_with(result *r, int status, const char *w1, const char *w2)
{
    cr_assert(WIFEXITED(r->status) && WEXITSTATUS(r->status) == status,
              "exit status %d (want %d); stderr: %s", WEXITSTATUS(r->status), status, r->err);
    cr_assert(strstr(r->err, "dp_tokenize: ") && strstr(r->err, w1) && (!w2 || strstr(r->err, w2)),
              "stderr lacks \"%s\"/\"%s\": %s", w1, w2 ? w2 : "", r->err);
    cr_assert_not(exists(in_tmp("out.bin")), "out.bin was written");
    assert_no_temp();
    dp_test_result_free(r);
}

/* A failure after the command line was accepted. */
static void assert_failed(result *r, const char *w1, const char *w2)
{
    assert_failed_with(r, 1, w1, w2);
}

Test(dp_tokenize, bad_inputs_and_options_fail_cleanly)
{
    result r = RUN("--tokenizer-file", tok_json, "--out", "@out.bin", "@a.txt", "@missing.txt");
    assert_failed(&r, "missing.txt", "No such file");
    cr_assert_eq(mkdir(in_tmp("dir"), 0755), 0);
    r = RUN("--tokenizer-file", tok_json, "--out", "@out.bin", "@dir");
    assert_failed(&r, "dir' is a directory", NULL);
    cr_assert_eq(mkfifo(in_tmp("fifo"), 0600), 0);
    r = RUN("--tokenizer-file", tok_json, "--out", "@out.bin", "@fifo");
    assert_failed(&r, "fifo' is a FIFO", NULL);
    // The tokenizer's files on a FIFO: refused unread, not waited on.
    r = RUN("--tokenizer-file", "@fifo", "--out", "@out.bin", "@a.txt");
    assert_failed(&r, "fifo", "not a regular file");
    char enc[4096];
    snprintf(enc, sizeof enc, "%s", bpe_data("encoder.json"));
    r = RUN("--tokenizer-file", enc, "--merges-file", "@fifo", "--out", "@out.bin", "@a.txt");
    assert_failed(&r, "fifo", "not a regular file");

    // Invalid UTF-8 past the first window: named with its file and byte offset.
    size_t len;
    write_large(in_tmp("bad.txt"), &len);
    FILE *f = fopen(in_tmp("bad.txt"), "ab");
    cr_assert_not_null(f);
    fputs("ok\n\xc3(\nmore\n", f);
    fclose(f);
    char offset[64];
    snprintf(offset, sizeof offset, "byte offset %zu", len + 3);
    r = RUN("--tokenizer-file", tok_json, "--out", "@out.bin", "@a.txt", "@bad.txt");
    assert_failed(&r, "bad.txt' is not UTF-8", offset);

    r = RUN("--out", "@out.bin", "@a.txt");
    assert_failed_with(&r, 2, "--tokenizer-file PATH is required", NULL);
    /* empty paths are the command line's fault (2), named as such */
    r = RUN("--tokenizer-file", "", "--out", "@out.bin", "@a.txt");
    assert_failed_with(&r, 2, "--tokenizer-file needs a file name", NULL);
    r = RUN("--tokenizer-file", tok_json, "--merges-file", "", "--out", "@out.bin", "@a.txt");
    assert_failed_with(&r, 2, "--merges-file needs a file name", NULL);
    r = RUN("--tokenizer-file", "@none.json", "--out", "@out.bin", "@a.txt");
    assert_failed(&r, "cannot load the tokenizer", "none.json");
    r = RUN("--tokenizer-file", tok_json, "--out", "@out.bin", "--bogus", "@a.txt");
    assert_failed_with(&r, 2, "unknown option \"--bogus\"", NULL);
    /* a grouped short option is named itself, not the argument before it */
    r = RUN("--tokenizer-file", tok_json, "-xyz", "@a.txt");
    assert_failed_with(&r, 2, "unknown option \"-x\"", NULL);
    r = RUN("--tokenizer-file", tok_json, "--out", "@out.bin");
    assert_failed_with(&r, 2, "no INPUT", NULL);
    r = RUN("--tokenizer-file", tok_json, "--out");
    assert_failed_with(&r, 2, "--out needs a value", NULL);
}

Test(dp_tokenize, bad_outputs_fail_cleanly)
{
    result r = RUN("--tokenizer-file", tok_json, "--out", "@no/such/dir/out.bin", "@a.txt");
    assert_failed(&r, "--out: cannot write", "does not exist");
    cr_assert_eq(mkdir(in_tmp("outdir"), 0755), 0);
    r = RUN("--tokenizer-file", tok_json, "--out", "@outdir", "@a.txt");
    assert_failed(&r, "outdir\" is a directory", NULL);
    r = RUN("--tokenizer-file", tok_json, "--out", "/dev/full", "@a.txt");
    assert_failed(&r, "\"/dev/full\" is a character device", NULL);
    /* a legal name whose temporary file's name would be too long */
    char longname[260];
    memset(longname, 'n', 249);
    longname[0] = '@';
    longname[249] = '\0';
    r = RUN("--tokenizer-file", tok_json, "--out", longname, "@a.txt");
    assert_failed(&r, "its temporary file", NULL);

    // The output is an input, by its own name or another (a hard link): refused, text intact.
    r = RUN("--tokenizer-file", tok_json, "--out", "@c.txt", "@a.txt", "@c.txt");
    assert_failed(&r, "is the same file as INPUT", "c.txt");
    cr_assert_eq(link(in_tmp("a.txt"), in_tmp("alias.txt")), 0);
    r = RUN("--tokenizer-file", tok_json, "--out", "@alias.txt", "@a.txt");
    assert_failed(&r, "--out \"", "is the same file as INPUT");
    r = RUN("--tokenizer-file", tok_json, "--out", "@./a.txt", "@a.txt");
    assert_failed(&r, "--out \"", "is the same file as INPUT");
    size_t len;
    unsigned char *a = dp_test_read_file(in_tmp("a.txt"), &len);
    cr_assert(len == strlen(DOC_A) && memcmp(a, DOC_A, len) == 0, "a.txt was changed");
    free(a);
}

/* The tokenizer's files are kept like inputs: --tokenizer-file, the
 * files a tokenizer directory holds, the tokenizer files beside a given
 * one (the vocab.bpe an encoder.json reads; the encoder.json beside a
 * tokenizer.json, another tokenizer's), --merges-file. An --out onto one
 * is refused, the file intact. */
Test(dp_tokenize, output_onto_a_tokenizer_file_fails_cleanly)
{
    static const char *const names[] = {"tokenizer.json", "encoder.json", "vocab.bpe"};
    cr_assert_eq(mkdir(in_tmp("tok"), 0755), 0);
    size_t lens[3];
    unsigned char *bytes[3];
    for (int i = 0; i < 3; i++) {
        bytes[i] = dp_test_read_file(bpe_data(names[i]), &lens[i]);
        cr_assert_not_null(bytes[i]);
        char p[300];
        snprintf(p, sizeof p, "tok/%s", names[i]);
        dp_test_write_file(in_tmp(p), bytes[i], lens[i]);
    }
    result r = RUN("--tokenizer-file", "@tok/tokenizer.json", "--out", "@tok/tokenizer.json",
                   "@a.txt");
    assert_failed(&r, "is the same file as --tokenizer-file", NULL);
    r = RUN("--tokenizer-file", "@tok", "--out", "@tok/tokenizer.json", "@a.txt");
    assert_failed(&r, "is the same file as --tokenizer-file", "tokenizer.json");
    r = RUN("--tokenizer-file", "@tok/encoder.json", "--out", "@tok/vocab.bpe", "@a.txt");
    assert_failed(&r, "is the same file as --tokenizer-file", "vocab.bpe");
    r = RUN("--tokenizer-file", "@tok/tokenizer.json", "--out", "@tok/encoder.json", "@a.txt");
    assert_failed(&r, "is the same file as --tokenizer-file", "encoder.json");
    r = RUN("--tokenizer-file", "@tok/encoder.json", "--merges-file", "@tok/vocab.bpe", "--out",
            "@./tok/vocab.bpe", "@a.txt");
    assert_failed(&r, "--out \"", "vocab.bpe");
    for (int i = 0; i < 3; i++) {
        char p[300];
        snprintf(p, sizeof p, "tok/%s", names[i]);
        size_t n;
        unsigned char *b = dp_test_read_file(in_tmp(p), &n);
        cr_assert(n == lens[i] && memcmp(b, bytes[i], n) == 0, "%s was changed", names[i]);
        free(b);
        free(bytes[i]);
    }
}

/* The summary on a full standard output (/dev/full) is lost: the run
 * fails, naming it, and writes no shard (--help: nothing written on an
 * error); an older shard stays as it was. */
/* An earlier output at out.bin (a shard of a.txt, which a run may
 * replace); its bytes, *n of them. */
static unsigned char *earlier_shard(size_t *n)
{
    result r = RUN("--tokenizer-file", tok_json, "--out", "@out.bin", "@a.txt");
    cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0, "stderr: %s", r.err);
    dp_test_result_free(&r);
    return dp_test_read_file(in_tmp("out.bin"), n);
}

Test(dp_tokenize, a_full_standard_output_fails_the_run)
{
    size_t old_len;
    unsigned char *old = earlier_shard(&old_len);
    const char *args[] = {"--tokenizer-file", tok_json, "--out", "@out.bin", "@a.txt"};
    char *argv[40];
    size_t argc = dp_test_argv(argv, 40, 0, NULL, DP_TOKENIZE_PATH, NULL, 0, args, 5, tmpdir);
    char err[300];
    snprintf(err, sizeof err, "%s/.stderr", tmpdir);
    result r = dp_test_collect_err(dp_test_spawn(argv, "/dev/full", err), err);
    dp_test_argv_free(argv, argc);
    cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 1, "status %d; stderr: %s",
              r.status, r.err);
    cr_assert(strstr(r.err, "dp_tokenize: cannot write the summary to standard output: No space"),
              "stderr: %s", r.err);
    dp_test_result_free(&r);
    size_t len;
    unsigned char *b = dp_test_read_file(in_tmp("out.bin"), &len);
    cr_assert(b && len == old_len && memcmp(b, old, len) == 0, "out.bin was replaced");
    free(b);
    free(old);
    assert_no_temp();
}

/* A reader that quits (| head) closes standard output: the summary's write
 * fails with EPIPE and the run exits 1 naming it, nothing written (--help's
 * statuses); it used to die of SIGPIPE, status 141. */
Test(dp_tokenize, a_closed_standard_output_fails_the_run)
{
    char fifo[300];
    snprintf(fifo, sizeof fifo, "%s/pipe", tmpdir);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    int reader = open(fifo, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* the child's open needs it */
    cr_assert_geq(reader, 0);
    /* 3 MiB to encode: the summary comes long after the reader quit */
    size_t len;
    write_large(in_tmp("large.txt"), &len);
    const char *args[] = {"--tokenizer-file", tok_json, "--out", "@out.bin", "@large.txt"};
    char *argv[40];
    size_t argc = dp_test_argv(argv, 40, 0, NULL, DP_TOKENIZE_PATH, NULL, 0, args, 5, tmpdir);
    char err[300];
    snprintf(err, sizeof err, "%s/.stderr", tmpdir);
    pid_t pid = dp_test_spawn(argv, fifo, err);
    close(reader); /* the reader quits before the summary */
    result r = dp_test_collect_err(pid, err);
    dp_test_argv_free(argv, argc);
    cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 1, "status %d; stderr: %s",
              r.status, r.err);
    cr_assert(strstr(r.err, "cannot write the summary to standard output: Broken pipe"),
              "stderr: %s", r.err);
    dp_test_result_free(&r);
    cr_assert_neq(access(in_tmp("out.bin"), F_OK), 0, "out.bin was written");
    assert_no_temp();
}

Test(dp_tokenize, failed_write_leaves_the_old_output)
{
    // An existing out.bin (a shard of a.txt), then a run whose writes fail
    // past 256 KiB (EFBIG: a file-size limit, inherited by dp_tokenize;
    // SIGXFSZ ignored, so it sees the error instead of being killed).
    size_t len, shard_len;
    write_large(in_tmp("large.txt"), &len);
    unsigned char *shard = earlier_shard(&shard_len);
    struct rlimit old;
    dp_test_limit_file_size(256 << 10, &old);
    result r = RUN("--tokenizer-file", tok_json, "--out", "@out.bin", "@large.txt");
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
    cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) != 0, "stderr: %s", r.err);
    cr_assert(strstr(r.err, "dp_tokenize: writing") && strstr(r.err, "File too large"),
              "stderr: %s", r.err);
    dp_test_result_free(&r);
    unsigned char *b = dp_test_read_file(in_tmp("out.bin"), &len);
    cr_assert(len == shard_len && memcmp(b, shard, len) == 0, "out.bin was changed");
    free(b);
    free(shard);
    assert_no_temp();
}

/* An existing --out that is not an llm.c shard (another program's file)
 * is refused before any encoding and kept; an empty one is replaced. */
Test(dp_tokenize, an_output_that_is_not_a_shard_is_kept)
{
    static const char notes[] = "my notes\n";
    dp_test_write_file(in_tmp("notes.bin"), notes, sizeof notes - 1);
    result r = RUN("--tokenizer-file", tok_json, "--out", "@notes.bin", "@a.txt");
    assert_failed(&r, "--out", "exists and is not an llm.c token shard");
    size_t len;
    unsigned char *b = dp_test_read_file(in_tmp("notes.bin"), &len);
    cr_assert(len == sizeof notes - 1 && memcmp(b, notes, len) == 0, "notes.bin was changed");
    free(b);
    dp_test_write_file(in_tmp("empty.bin"), "", 0);
    r = RUN("--tokenizer-file", tok_json, "--out", "@empty.bin", "@a.txt");
    cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0, "stderr: %s", r.err);
    dp_test_result_free(&r);
}

Test(dp_tokenize, tokenizers_it_cannot_use)
{
    // 65537 ids: past what uint16 holds. The 256 byte tokens, then two-character ones.
    json_t *root = json_object(), *model = json_object(), *vocab = json_object();
    size_t id = 0;
    char s[8];
    unsigned other = 0x100; // GPT-2's alphabet: the 68 unprintable bytes are U+0100..
    for (unsigned c = 0; c < 256; c++) {
        int printable = (c >= 0x21 && c <= 0x7e) || (c >= 0xa1 && c <= 0xac) || c >= 0xae;
        unsigned cp = printable ? c : other++;
        s[0] = cp < 0x80 ? (char)cp : (char)(0xc0 | cp >> 6);
        s[1] = cp < 0x80 ? '\0' : (char)(0x80 | (cp & 0x3f));
        s[2] = '\0';
        json_object_set_new(vocab, s, json_integer((json_int_t)id++));
    }
    for (unsigned x = 'A'; id < 65537; x++)
        for (unsigned y = 'A'; y <= 'z' && id < 65537; y++)
            for (unsigned z = 'A'; z <= 'z' && id < 65537; z++) {
                snprintf(s, sizeof s, "%c%c%c", x, y, z);
                json_object_set_new(vocab, s, json_integer((json_int_t)id++));
            }
    json_object_set_new(model, "type", json_string("BPE"));
    json_object_set_new(model, "vocab", vocab);
    json_object_set_new(model, "merges", json_array());
    json_object_set_new(root, "model", model);
    json_object_set_new(root, "pre_tokenizer", json_pack("{s:s}", "type", "ByteLevel"));
    cr_assert_eq(json_dump_file(root, in_tmp("big.json"), JSON_COMPACT), 0);
    json_decref(root);
    result r = RUN("--tokenizer-file", "@big.json", "--out", "@out.bin", "@a.txt");
    assert_failed(&r, "65537 ids", "uint16");

    // No <|endoftext|> to put before each document.
    json_error_t e;
    json_t *j = json_load_file(bpe_data("tokenizer.json"), 0, &e);
    cr_assert_not_null(j);
    json_t *v = json_object_get(json_object_get(j, "model"), "vocab");
    json_object_del(v, "<|endoftext|>");
    json_object_set_new(v, "<|end|>", json_integer(0));
    json_object_set_new(json_array_get(json_object_get(j, "added_tokens"), 0), "content",
                        json_string("<|end|>"));
    cr_assert_eq(json_dump_file(j, in_tmp("noeot.json"), JSON_COMPACT), 0);
    json_decref(j);
    r = RUN("--tokenizer-file", "@noeot.json", "--out", "@out.bin", "@a.txt");
    assert_failed(&r, "no <|endoftext|>", NULL);
}

/* Entries of tmpdir whose names hold ".tmp." (the atomic writer's); with
 * written, only those holding bytes already (the shard's header, not the
 * empty file with which the output check probes the directory). */
static int temp_files_of(int written)
{
    DIR *d = opendir(tmpdir);
    cr_assert_not_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        struct stat sb;
        if (!strstr(e->d_name, ".tmp.")) continue;
        n += !written || (stat(in_tmp(e->d_name), &sb) == 0 && sb.st_size > 0);
    }
    closedir(d);
    return n;
}

static int temp_files(void) { return temp_files_of(0); }

/* A fatal signal while the shard is being written: the process dies of
 * the signal after one line, its temporary file removed (nothing else
 * would remove it: its name holds the dead pid), the earlier output kept.
 * The signal is sent once the shard's temporary file holds its header, so
 * the case does not depend on the machine's speed. */
Test(dp_tokenize, a_signal_removes_the_temporary_file, .timeout = 120)
{
    /* 48 MiB of text: a second or more of encoding */
    size_t len = (size_t)48 << 20;
    char *text = malloc(len);
    cr_assert_not_null(text);
    for (size_t i = 0; i < len; i++) text[i] = DOC_C[i % (sizeof DOC_C - 1)];
    dp_test_write_file(in_tmp("big.txt"), text, len);
    free(text);
    size_t earlier_len;
    unsigned char *earlier = earlier_shard(&earlier_len);
    /* a file-size limit kills by signal too (a closed pipe does not: SIGPIPE
     * is ignored, the write fails: a_closed_standard_output_fails_the_run) */
    const int sigs[] = {SIGINT, SIGTERM, SIGQUIT, SIGXFSZ};
    for (int s = 0; s < 4; s++) {
        const char *args[] = {"--tokenizer-file", tok_json, "--out", "@out.bin", "@big.txt"};
        char *argv[16], err[300];
        size_t argc = dp_test_argv(argv, 16, 0, NULL, DP_TOKENIZE_PATH, NULL, 0, args, 5, tmpdir);
        snprintf(err, sizeof err, "%s/.stderr", tmpdir);
        pid_t pid = dp_test_spawn(argv, "/dev/null", err);
        dp_test_argv_free(argv, argc);
        int seen = 0;
        const struct timespec tick = {0, 500000}; /* 0.5 ms */
        for (int t = 0; t < 20000 && !(seen = temp_files_of(1)); t++) nanosleep(&tick, NULL);
        cr_assert(seen, "no temporary file appeared within 10 s");
        kill(pid, sigs[s]);
        result r = dp_test_collect_err(pid, err);
        cr_assert(WIFSIGNALED(r.status) && WTERMSIG(r.status) == sigs[s],
                  "status %d; stderr:\n%s", r.status, r.err);
        cr_assert(strstr(r.err, "dp_tokenize: stopped by a signal; --out was left as it was"),
                  "stderr:\n%s", r.err);
        dp_test_result_free(&r);
        cr_assert_eq(temp_files(), 0, "the temporary file was left");
        size_t n = 0;
        unsigned char *kept = dp_test_read_file(in_tmp("out.bin"), &n);
        cr_assert(n == earlier_len && memcmp(kept, earlier, n) == 0,
                  "the earlier output changed");
        free(kept);
    }
    free(earlier);
}
