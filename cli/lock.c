/*
 * cli/lock.c - an output that one run at a time may write (cli/dp_cli.h):
 * an advisory lock (flock) on a companion file "<path>.lock", held for
 * the run's life. The output itself cannot carry the lock: it is replaced
 * by a rename at every atomic write, and a lock follows the old inode.
 */
#define _DEFAULT_SOURCE /* flock */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_internal.h"
#include "dp_cli.h"

/* What a lock file holds: this line, then the holder's pid. */
#define LOCK_MARK "dp output lock\n"

/* The holder's pid as the lock file says, or 0. */
static long holder_pid(int fd)
{
    char buf[64] = "";
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return 0;
    buf[n] = '\0';
    const char *p = strstr(buf, "pid ");
    return p ? strtol(p + 4, NULL, 10) : 0;
}

/* 1 when fd's file is empty or holds LOCK_MARK first: ours to take. */
static int is_lock_file(int fd)
{
    char buf[sizeof LOCK_MARK] = "";
    ssize_t n = pread(fd, buf, sizeof LOCK_MARK - 1, 0);
    return n == 0 ||
           (n == (ssize_t)(sizeof LOCK_MARK - 1) && memcmp(buf, LOCK_MARK, (size_t)n) == 0);
}

char *cli_lock_name(const char *path)
{
    /* Of the file the path reaches, however spelled: "x", "./x", a link
     * to x and "dir/." must all meet at one lock. */
    char *real = cli_resolved_path(path);
    size_t len = real ? strlen(real) : 0;
    char *name = real ? malloc(len + sizeof ".lock") : NULL;
    if (name) {
        memcpy(name, real, len);
        memcpy(name + len, ".lock", sizeof ".lock");
    }
    free(real);
    return name;
}

int cli_lock_output(const char *flag, const char *path, cli_lock *lk)
{
    lk->fd = -1;
    lk->path = NULL;
    char *name = cli_lock_name(path);
    if (!name) return cli_fail("out of host memory");
    /* A holder that removes the file between our open and our lock leaves
     * us a lock on a file no other run can find: the name must still be
     * the file locked, else try again. */
    for (int attempt = 0; attempt < 100; attempt++) {
        int fd = open(name, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
        if (fd < 0) {
            int e = errno;
            cli_fail("%s %s: cannot create its lock file %s (which keeps a second run from "
                     "writing the same file): %s; give %s %s", flag, path, name, strerror(e),
                     flag, e == ENAMETOOLONG ? "a shorter name (the lock adds 5 bytes)"
                                             : "a path where files can be created");
            free(name);
            return 1;
        }
        struct stat fs, ns;
        if (fstat(fd, &fs) != 0 || !S_ISREG(fs.st_mode) || !is_lock_file(fd)) {
            close(fd);
            cli_fail("%s %s needs the lock file %s, which exists and is not one (it is left "
                     "as it is); move it away or give another %s path", flag, path, name, flag);
            free(name);
            return 1;
        }
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int e = errno;
            long pid = e == EWOULDBLOCK ? holder_pid(fd) : 0;
            close(fd);
            if (e != EWOULDBLOCK) { /* a file system without locks: unguarded, as before */
                free(name);
                return 0;
            }
            char who[48] = "";
            if (pid > 0) snprintf(who, sizeof who, " (process %ld)", pid);
            cli_fail("%s %s is being written by another run%s, which holds %s; give each run "
                     "its own %s path", flag, path, who, name, flag);
            free(name);
            return 1;
        }
        if (stat(name, &ns) != 0 || ns.st_dev != fs.st_dev || ns.st_ino != fs.st_ino) {
            close(fd); /* removed by its holder as it finished: take the new one */
            continue;
        }
        char line[96];
        int n = snprintf(line, sizeof line, LOCK_MARK "pid %ld %s\n", (long)getpid(),
                         cli_program());
        /* The pid is for the message above: a lock without it still locks. */
        int noted = ftruncate(fd, 0) == 0 && n > 0 && pwrite(fd, line, (size_t)n, 0) == n;
        (void)noted;
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
        /* a fatal signal removes it too (a full guard set leaves it for
         * the next run, which takes a lock nobody holds) */
        cli_guard_lock(name);
        lk->fd = fd;
        lk->path = name;
        return 0;
    }
    cli_fail("%s %s: its lock file %s keeps being replaced by other runs; give each run its "
             "own %s path", flag, path, name, flag);
    free(name);
    return 1;
}

void cli_unlock_output(cli_lock *lk)
{
    if (!lk->path) return;
    /* Removed while still locked, so no run takes a file about to vanish
     * (one that opened it already sees the name gone and retries). */
    cli_unguard_path(lk->path);
    unlink(lk->path);
    close(lk->fd);
    free(lk->path);
    lk->fd = -1;
    lk->path = NULL;
}
