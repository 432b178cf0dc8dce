/*
 * tests/fuzz/fuzz_common.h - helpers shared by the libFuzzer harnesses:
 * a scratch directory in memory (/dev/shm when present), writing the input
 * to a file there, and a check that aborts (a finding libFuzzer records)
 * with the reason.
 */
#ifndef DP_FUZZ_COMMON_H
#define DP_FUZZ_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dp/status.h"

/* A broken invariant is a finding: print why and abort. */
#define FUZZ_CHECK(cond, ...)                                                           \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "%s:%d: invariant failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                               \
            fprintf(stderr, " (last dp error: %s)\n", dp_last_error());                 \
            abort();                                                                    \
        }                                                                               \
    } while (0)

/* A failing dp call must leave a message. */
#define FUZZ_CHECK_MESSAGE(st) \
    FUZZ_CHECK(dp_last_error()[0] != '\0', "status %d without a message", (int)(st))

/* The process's scratch directory, created on first use below $DP_FUZZ_TMP
 * (else /dev/shm, else /tmp) and removed at exit (libFuzzer exits through
 * exit(), which runs atexit; after a crash scripts/fuzz removes it). */
static char fuzz_dir_buf[256];

static void fuzz_remove_dir(void)
{
    char cmd[300];
    if (fuzz_dir_buf[0] && snprintf(cmd, sizeof cmd, "rm -rf '%s'", fuzz_dir_buf) < (int)sizeof cmd) {
        int rc = system(cmd);
        (void)rc;
    }
}

static inline const char *fuzz_dir(void)
{
    if (!fuzz_dir_buf[0]) {
        const char *base = getenv("DP_FUZZ_TMP"); // scripts/fuzz's, removed after a crash too
        if (!base || !*base) base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(fuzz_dir_buf, sizeof fuzz_dir_buf, "%s/dp_fuzz_XXXXXX", base);
        if (!mkdtemp(fuzz_dir_buf)) {
            perror("mkdtemp");
            abort();
        }
        atexit(fuzz_remove_dir);
    }
    return fuzz_dir_buf;
}

/* Writes data[0..n) to path (created or truncated); aborts on failure
 * (the harness's environment, not the library, failed). */
static inline void fuzz_write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) {
        perror(path);
        abort();
    }
}

#endif /* DP_FUZZ_COMMON_H */
