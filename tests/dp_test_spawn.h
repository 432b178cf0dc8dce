/*
 * tests/dp_test_spawn.h - run one of the project's programs as a user
 * would: posix_spawn with stdin from /dev/null and stdout/stderr into
 * files, then collect the exit status and both outputs.
 */
#ifndef DP_TEST_SPAWN_H
#define DP_TEST_SPAWN_H

#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "dp_test.h"
#include "dp_test_fs.h"

extern char **environ;

typedef struct dp_test_result {
    int status; /* from waitpid */
    char *out, *err;
} dp_test_result;

static inline void dp_test_result_free(dp_test_result *r)
{
    free(r->out);
    free(r->err);
}

/* Starts argv[0] (a path) with argv; stdout and stderr go to the files. */
static inline pid_t dp_test_spawn(char *const argv[], const char *out_path, const char *err_path)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    /* One OpenBLAS thread in every spawned program: a pool started when the
     * library loads can still be starting while a short run exits, which
     * LeakSanitizer reports as a leak about one run in five. */
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    pid_t pid;
    int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    cr_assert_eq(rc, 0, "cannot run %s: %s", argv[0], strerror(rc));
    return pid;
}

/* Waits for pid and reads back what it wrote (NUL-terminated). */
static inline dp_test_result dp_test_collect(pid_t pid, const char *out_path, const char *err_path)
{
    dp_test_result r;
    cr_assert_eq(waitpid(pid, &r.status, 0), pid);
    size_t n;
    r.out = (char *)dp_test_read_file(out_path, &n);
    r.err = (char *)dp_test_read_file(err_path, &n);
    return r;
}

/* Waits for pid, whose stdout went to a device that is not read back
 * (/dev/full), and reads its stderr (r.out is ""). */
static inline dp_test_result dp_test_collect_err(pid_t pid, const char *err_path)
{
    dp_test_result r;
    cr_assert_eq(waitpid(pid, &r.status, 0), pid);
    size_t n;
    r.out = (char *)calloc(1, 1);
    r.err = (char *)dp_test_read_file(err_path, &n);
    return r;
}

/* Asserts that the process r describes exited with status 0, showing its stderr. */
static inline void dp_test_assert_success(const dp_test_result *r, const char *what)
{
    cr_assert(WIFEXITED(r->status) && WEXITSTATUS(r->status) == 0,
              "%s: %s %d; stderr:\n%s", what,
              WIFEXITED(r->status) ? "exited with" : "was killed by signal",
              WIFEXITED(r->status) ? WEXITSTATUS(r->status) : WTERMSIG(r->status), r->err);
}

/* Occurrences of needle in text (overlapping ones too). */
static inline size_t dp_test_count(const char *text, const char *needle)
{
    size_t n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p++) n++;
    return n;
}

/* Under mpiexec (the mpi tests): Open MPI refuses root unless told, the
 * ranks outnumber this machine's cores, and shared memory goes by copy
 * (cross-process copies, CMA, are often denied in containers). Call it in
 * the test's own process: it reaches only the mpiexec that test starts. */
static inline void dp_test_mpi_env(void)
{
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 1);
    setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 1);
}

/* Appends prog, base[0..nb) and extra[0..n) to argv at *argc, each
 * strdup'd; an argument starting with '@' names a file in dir. */
static inline void dp_test_argv_add(char **argv, size_t *argc, size_t cap, const char *prog,
                                    const char *const *base, size_t nb,
                                    const char *const *extra, size_t n, const char *dir)
{
    cr_assert_lt(*argc + nb + n + 2, cap, "too many arguments");
    argv[(*argc)++] = strdup(prog);
    for (size_t i = 0; i < nb + n; i++) {
        const char *a = i < nb ? base[i] : extra[i - nb];
        char p[512];
        if (a[0] == '@') snprintf(p, sizeof p, "%s/%s", dir, a + 1);
        argv[(*argc)++] = strdup(a[0] == '@' ? p : a);
    }
    argv[*argc] = NULL;
}

/* The command line of prog with base[0..nb) then extra[0..n), under
 * `mpiexec -n ranks` when ranks > 0; an argument starting with '@' names
 * a file in dir. Fills argv (cap entries, NULL-terminated, each strdup'd:
 * dp_test_argv_free) and returns the count. */
static inline size_t dp_test_argv(char **argv, size_t cap, int ranks, const char *mpiexec,
                                  const char *prog, const char *const *base, size_t nb,
                                  const char *const *extra, size_t n, const char *dir)
{
    size_t argc = 0;
    char np[16];
    snprintf(np, sizeof np, "%d", ranks);
    if (ranks > 0) {
        argv[argc++] = strdup(mpiexec);
        argv[argc++] = strdup("-n");
        argv[argc++] = strdup(np);
    }
    dp_test_argv_add(argv, &argc, cap, prog, base, nb, extra, n, dir);
    return argc;
}

/* One rank of an MPMD job: what runs before prog (pre[0..npre), e.g.
 * {"sh", "-c", "exec \"$0\" \"$@\" > fifo"}; none when npre is 0), and
 * the options after the common base. */
typedef struct dp_test_rank_cmd {
    const char *const *pre;
    size_t npre;
    const char *const *extra;
    size_t n;
} dp_test_rank_cmd;

/* The command line of an MPMD job of two ranks under `mpiexec` (`mpiexec
 * -n 1 [pre] prog base extra : -n 1 ...`), rank r as rk[r] says, '@'
 * naming a file in dir as above. Fills argv (cap entries,
 * NULL-terminated, strdup'd) and returns the count. */
static inline size_t dp_test_argv_mpmd(char **argv, size_t cap, const char *mpiexec,
                                       const char *prog, const char *const *base, size_t nb,
                                       const dp_test_rank_cmd rk[2], const char *dir)
{
    size_t argc = 0;
    argv[argc++] = strdup(mpiexec);
    for (int r = 0; r < 2; r++) {
        cr_assert_lt(argc + rk[r].npre + 4, cap, "too many arguments");
        if (r) argv[argc++] = strdup(":");
        argv[argc++] = strdup("-n");
        argv[argc++] = strdup("1");
        for (size_t i = 0; i < rk[r].npre; i++) argv[argc++] = strdup(rk[r].pre[i]);
        dp_test_argv_add(argv, &argc, cap, prog, base, nb, rk[r].extra, rk[r].n, dir);
    }
    return argc;
}

static inline void dp_test_argv_free(char **argv, size_t argc)
{
    for (size_t i = 0; i < argc; i++) free(argv[i]);
}

/* Runs prog with base[0..nb) then extra[0..n) ('@name' is dir/name), its
 * stdout and stderr into dir/stdout.txt and dir/stderr.txt, and collects
 * them. */
static inline dp_test_result dp_test_run(const char *prog, const char *const *base, size_t nb,
                                         const char *const *extra, size_t n, const char *dir)
{
    char *argv[128], out[512], err[512];
    size_t argc = dp_test_argv(argv, sizeof argv / sizeof *argv, 0, NULL, prog, base, nb, extra,
                               n, dir);
    snprintf(out, sizeof out, "%s/stdout.txt", dir);
    snprintf(err, sizeof err, "%s/stderr.txt", dir);
    pid_t pid = dp_test_spawn(argv, out, err);
    dp_test_argv_free(argv, argc);
    return dp_test_collect(pid, out, err);
}

#endif /* DP_TEST_SPAWN_H */
