/*
 * bench/token_data_bench.c - what mapping token files saves: writes a
 * nanoGPT-style directory of N uint16 ids (train.bin, and val.bin with N /
 * 100), then in two child processes, one after the other, opens it
 *   mmap:  dp_token_data_open (the files mapped, windows converted as drawn)
 *   int32: the files read whole into an int32 array and given to
 *          dp_token_data_from_tokens (what loading a corpus into memory costs)
 * and prints for each the seconds to open, the seconds to draw the batches,
 * the process's resident set before opening and its peak (VmRSS, VmHWM),
 * and at the end its anonymous and file-backed parts (RssAnon, RssFile in
 * /proc/self/status: mapped ids are page cache, shared and reclaimable,
 * not the process's own memory), and whether both drew the same batches
 * (a hash of every window).
 *
 *   token_data_bench DIR [TOKENS] [BATCHES]   (defaults 200000000 and 200)
 *
 * The files are written once and kept (a second run reuses them when their
 * sizes match; other files of those names are refused, never overwritten,
 * and so is a DIR with other *.bin, which only the mmap path would read);
 * remove DIR afterwards. The page cache is warm for both
 * children (the files were just written or read), so open times compare
 * work done, not disk speed.
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <dp/dp.h>

#include "dp_cli.h"

enum { B = 8, T = 1024 };

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A failed system call (errno) or dp call (its message). */
static int die(const char *what)
{
    fprintf(stderr, "token_data_bench: %s: %s\n", what, strerror(errno));
    return 1;
}

static int die_dp(const char *what)
{
    fprintf(stderr, "token_data_bench: %s: %s\n", what, dp_last_error());
    return 1;
}

/* Writes n pseudo-random GPT-2 ids (< 50257) to path unless it already
 * has 2n bytes (an earlier run's): through the atomic writer, so an
 * interrupted run leaves no part of a file. Any other file already there
 * is refused, not overwritten (DIR may be a user's dataset). */
static int write_ids(const char *path, size_t n, uint64_t seed)
{
    struct stat sb;
    if (stat(path, &sb) == 0) {
        if (S_ISREG(sb.st_mode) && (size_t)sb.st_size == 2 * n) return 0;
        return cli_fail("%s exists and is not the %zu ids this run writes (%lld bytes, not "
                        "%zu); give a new or empty DIR", path, n, (long long)sb.st_size, 2 * n);
    }
    dp_atomic_file *af = NULL;
    if (dp_atomic_file_open(path, &af) != DP_OK) return die_dp(path);
    cli_guard_temp(af, path); /* a signal removes the temporary file */
    enum { CHUNK = 1 << 20 };
    static unsigned char buf[2 * CHUNK];
    dp_rng rng;
    dp_rng_seed(&rng, seed);
    for (size_t done = 0; done < n;) {
        size_t k = n - done < CHUNK ? n - done : CHUNK;
        for (size_t i = 0; i < k; i++) {
            uint32_t id = (uint32_t)dp_rng_below(&rng, 50257);
            buf[2 * i] = (unsigned char)(id & 0xff);
            buf[2 * i + 1] = (unsigned char)(id >> 8);
        }
        if (dp_atomic_file_write(af, buf, 2 * k) != DP_OK) {
            dp_atomic_file_abort(af);
            cli_guard_temp(NULL, NULL);
            return die_dp(path);
        }
        done += k;
    }
    int rc = dp_atomic_file_commit(af) != DP_OK ? die_dp(path) : 0;
    cli_guard_temp(NULL, NULL);
    return rc;
}

/* DIR must hold no token file but the two this bench writes: the mmap
 * path (dp_token_data_open) reads every "*.bin" of it, the int32 path
 * train.bin and val.bin alone, and their batches would differ. */
static int check_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return die(dir);
    struct dirent *e;
    int rc = 0;
    while (!rc && (e = readdir(d))) {
        const char *name = e->d_name;
        size_t len = strlen(name);
        if (name[0] == '.' || len < 4 || strcmp(name + len - 4, ".bin") != 0) continue;
        if (strcmp(name, "train.bin") != 0 && strcmp(name, "val.bin") != 0)
            rc = cli_fail("%s holds %s, which dp_token_data_open would read beside train.bin and "
                          "val.bin (the in-memory path reads those two alone); give a new or "
                          "empty DIR", dir, name);
    }
    closedir(d);
    return rc;
}

/* Appends the ids of path to out[*n..) as int32. */
static int read_int32(const char *path, int32_t *out, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return die(path);
    static unsigned char buf[1 << 21];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, f)) > 0)
        for (size_t i = 0; i + 1 < k; i += 2) out[(*n)++] = buf[i] | buf[i + 1] << 8;
    fclose(f);
    return 0;
}

/* FNV-1a over the ids drawn. */
static uint64_t hash_ids(uint64_t h, const int32_t *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h ^= (uint32_t)x[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

/* One child's measurement, sent to the parent: seconds, KiB of memory
 * (/proc/self/status), the batches' hash. */
typedef struct result {
    double open_s, draw_s;
    long base_kib, peak_kib, anon_kib, file_kib;
    uint64_t hash;
    int ok;
} result;

/* The value in KiB of a "Key:   123 kB" line of /proc/self/status, or -1. */
static long status_kib(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long v = -1;
    size_t k = strlen(key);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, k) == 0 && line[k] == ':') {
            v = strtol(line + k + 1, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

static result measure(const char *dir, int mmap_path, size_t n_train, size_t n_val, long batches)
{
    result r = {0, 0, 0, 0, 0, 0, 0xcbf29ce484222325ULL, 0};
    r.base_kib = status_kib("VmRSS");
    char train[4096], val[4096];
    snprintf(train, sizeof train, "%s/train.bin", dir);
    snprintf(val, sizeof val, "%s/val.bin", dir);
    double t0 = now();
    dp_token_data *d = NULL;
    if (mmap_path) {
        if (dp_token_data_open(dir, 50257, &d) != DP_OK) { die_dp("open"); return r; }
    } else {
        size_t n = 0, total = n_train + n_val;
        int32_t *ids = malloc(total * sizeof *ids);
        if (!ids) { die("malloc"); return r; }
        if (read_int32(train, ids, &n) || read_int32(val, ids, &n)) return r;
        /* from_tokens cuts 90/10: val.bin's ceil(N / 9) ids put the cut
         * at train.bin's end, so both paths have the same splits. */
        dp_status s = dp_token_data_from_tokens(ids, n, 50257, &d);
        free(ids);
        if (s != DP_OK) { die_dp("from_tokens"); return r; }
    }
    double t1 = now();
    dp_sampler *s = NULL;
    if (dp_sampler_create(d, DP_SPLIT_TRAIN, T, 1337, &s) != DP_OK) { die_dp("sampler"); return r; }
    static int32_t x[B * T], y[B * T];
    for (long i = 0; i < batches; i++) {
        if (dp_sampler_next(s, x, y, B) != DP_OK) { die_dp("batch"); return r; }
        r.hash = hash_ids(r.hash, x, B * T);
    }
    size_t W = dp_eval_window_count(d, DP_SPLIT_VAL, T);
    for (size_t w = 0; w < W && w < 64; w += B) {
        size_t rows = W - w < B ? W - w : B;
        if (dp_eval_windows(d, DP_SPLIT_VAL, T, w, rows, x, y) != DP_OK) { die_dp("eval"); return r; }
        r.hash = hash_ids(r.hash, x, rows * T);
    }
    double t2 = now();
    r.open_s = t1 - t0;
    r.draw_s = t2 - t1;
    r.peak_kib = status_kib("VmHWM");
    r.anon_kib = status_kib("RssAnon");
    r.file_kib = status_kib("RssFile");
    r.ok = 1;
    dp_sampler_destroy(s);
    dp_token_data_destroy(d);
    return r;
}

/* Runs measure in a child (so each path's peak RSS is its own). */
static result in_child(const char *dir, int mmap_path, size_t n_train, size_t n_val, long batches)
{
    int fd[2];
    result r;
    memset(&r, 0, sizeof r);
    if (pipe(fd) != 0) { die("pipe"); return r; }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        result c = measure(dir, mmap_path, n_train, n_val, batches);
        ssize_t w = write(fd[1], &c, sizeof c);
        _exit(w == (ssize_t)sizeof c && c.ok ? 0 : 1);
    }
    close(fd[1]);
    ssize_t got = read(fd[0], &r, sizeof r);
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    if (got != (ssize_t)sizeof r) r.ok = 0;
    return r;
}

#define USAGE                                                                               \
    "usage: token_data_bench DIR [TOKENS] [BATCHES]   (defaults 200000000 and 200)\n"           \
    "Creates DIR if needed and writes TOKENS random GPT-2 ids into DIR/train.bin and\n"        \
    "DIR/val.bin (kept for a later run; other files of those names, and a DIR with\n"         \
    "other *.bin, are refused), then times opening them mapped against read into\n"          \
    "memory. Remove DIR afterwards.\n"

int main(int argc, char **argv)
{
    cli_set_program("token_data_bench");
    if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        fputs(USAGE, stdout);
        return cli_check_stream(stdout, "the help to standard output");
    }
    if (argc > 4)
        return cli_fail("\"%s\": one operand too many (DIR, TOKENS and BATCHES at most; see "
                        "--help)", argv[4]) + 1;
    if (argc < 2) {
        fputs(USAGE, stderr);
        return 2;
    }
    if (!argv[1][0]) return cli_fail("DIR is empty; give a directory to write the files in") + 1;
    if (argv[1][0] == '-')
        return cli_fail("\"%s\": no options but --help; a DIR starting with '-' is written "
                        "./%s", argv[1], argv[1]) + 1;
    const char *dir = argv[1];
    /* at most 4e9 ids: 8 GB of train.bin */
    long n = 200000000, batches = 200;
    if ((argc > 2 && cli_parse_long("TOKENS", argv[2], 10 * T, 4000000000L, &n)) ||
        (argc > 3 && cli_parse_long("BATCHES", argv[3], 1, 1000000, &batches)))
        return 2;
    size_t n_train = (size_t)n;
    /* floor(0.9 (train + val)) = train: the int32 path's 90/10 cut falls
     * where val.bin starts. */
    size_t n_val = (n_train + 8) / 9;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        if (errno != ENOENT) return die(dir);
        return cli_fail("cannot create %s: its parent directory does not exist; create it "
                        "first", dir);
    }
    if (check_dir(dir)) return 1;
    char path[4096];
    snprintf(path, sizeof path, "%s/train.bin", dir);
    if (write_ids(path, n_train, 1)) return 1;
    snprintf(path, sizeof path, "%s/val.bin", dir);
    if (write_ids(path, n_val, 2)) return 1;
    printf("%zu train + %zu val uint16 ids (%.2f GB on disk), %ld batches of %d x %d, 64 val "
           "windows\n",
           n_train, n_val, 2e-9 * (double)(n_train + n_val), batches, B, T);
    printf("%-6s %8s %8s %10s %10s %10s %10s  %s\n", "path", "open s", "draw s", "RSS before",
           "peak RSS", "anon end", "file end", "batches hash");
    result m = in_child(dir, 1, n_train, n_val, batches);
    result c = in_child(dir, 0, n_train, n_val, batches);
    const result *rs[2] = {&m, &c};
    const char *names[2] = {"mmap", "int32"};
    for (int i = 0; i < 2; i++) {
        if (!rs[i]->ok) {
            printf("%-6s failed\n", names[i]);
            continue;
        }
        printf("%-6s %8.4f %8.3f %6.0f MiB %6.0f MiB %6.0f MiB %6.0f MiB  %016" PRIx64 "\n",
               names[i], rs[i]->open_s, rs[i]->draw_s, (double)rs[i]->base_kib / 1024.0,
               (double)rs[i]->peak_kib / 1024.0, (double)rs[i]->anon_kib / 1024.0,
               (double)rs[i]->file_kib / 1024.0, rs[i]->hash);
    }
    if (m.ok && c.ok)
        printf("same batches: %s\n", m.hash == c.hash ? "yes"
                                                      : "NO (the two paths read other tokens)");
    if (cli_check_stream(stdout, "the figures to standard output")) return 1;
    return m.ok && c.ok && m.hash == c.hash ? 0 : 1;
}
