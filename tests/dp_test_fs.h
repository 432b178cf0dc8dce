/*
 * tests/dp_test_fs.h - temporary directories for tests that write files,
 * and a file size limit that makes writes fail as a full disk would.
 * Include after defining _POSIX_C_SOURCE (mkdtemp, lstat).
 */
#ifndef DP_TEST_FS_H
#define DP_TEST_FS_H

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Removes dir and everything below it (making read-only subdirectories
 * writable first, for tests that take permissions away). */
static inline void dp_test_remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char p[4096];
        if (snprintf(p, sizeof p, "%s/%s", dir, de->d_name) >= (int)sizeof p) continue;
        struct stat sb;
        if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            chmod(p, 0755);
            dp_test_remove_tree(p);
        } else {
            unlink(p);
        }
    }
    closedir(d);
    rmdir(dir);
}

/* A pid that no longer exists: a child that has exited and been reaped;
 * -1 when none could be made. */
static inline pid_t dp_test_dead_pid(void)
{
    pid_t pid = fork();
    if (pid == 0) _exit(0);
    int status;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1;
    return pid;
}

/* The entries of dir other than "." and ".."; -1 when it cannot be read. */
static inline int dp_test_count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) n += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
    closedir(d);
    return n;
}

/* dir/name, in one of 8 static buffers used in turn (a result stays
 * valid through the next 7 calls). */
static inline const char *dp_test_join(const char *dir, const char *name)
{
    static char buf[8][4096];
    static int k;
    char *p = buf[k++ % 8], tmp[sizeof buf[0]];
    /* via tmp: dir may be an earlier result, another of the buffers (the
     * compiler cannot tell which, and warns of an overlap) */
    snprintf(tmp, sizeof tmp, "%s/%s", dir, name);
    memcpy(p, tmp, sizeof tmp);
    return p;
}

/* The whole file at path (malloc'd, NUL-terminated); *len its size. */
static inline unsigned char *dp_test_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    cr_assert_not_null(b);
    cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    b[n] = 0;
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* Writes n bytes to path (created or truncated). */
static inline void dp_test_write_file(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot create %s", path);
    cr_assert_eq(fwrite(b, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
}

/* Limits the size of any file this process and the programs it starts
 * write to `bytes` (RLIMIT_FSIZE), as a full disk would: a write past it
 * fails with EFBIG (SIGXFSZ ignored, which the programs inherit, so they
 * see the error instead of being killed). *old gets the limit to restore
 * (setrlimit(RLIMIT_FSIZE, old)). */
static inline void dp_test_limit_file_size(rlim_t bytes, struct rlimit *old)
{
    cr_assert_eq(getrlimit(RLIMIT_FSIZE, old), 0);
    struct rlimit lim = *old;
    lim.rlim_cur = bytes;
    signal(SIGXFSZ, SIG_IGN);
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
}

#endif /* DP_TEST_FS_H */
