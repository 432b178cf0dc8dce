/*
 * dp/atomic_file.h: the one atomic file writer. The temporary file is
 * named "<path>.tmp.<pid>.<counter>.<host>" next to path (the stale-temp
 * clean-up relies on it, and removes only this host's of dead processes),
 * commit replaces path whole, abort leaves path as it was and no
 * temporary file, and errors name the path.
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dp/atomic_file.h"
#include "dp_test.h"
#include "dp_test_fs.h"

static char tmpdir[64];

static void setup(void)
{
    strcpy(tmpdir, "/tmp/dp_test_atomic_XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp failed");
}

static void teardown(void) { dp_test_remove_tree(tmpdir); }

TestSuite(atomic_file, .init = setup, .fini = teardown);

static int n_entries(void)
{
    DIR *d = opendir(tmpdir);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) n += de->d_name[0] != '.';
    closedir(d);
    return n;
}

static void expect_contents(const char *path, const char *want)
{
    size_t n;
    char *got = (char *)dp_test_read_file(path, &n);
    cr_assert(n == strlen(want) && memcmp(got, want, n) == 0, "%s holds \"%.*s\"", path, (int)n,
              got);
    free(got);
}

Test(atomic_file, temp_name_commit_and_abort)
{
    char path[256], prefix[300];
    snprintf(path, sizeof path, "%s/out.json", tmpdir);
    dp_test_write_file(path, "old", 3);
    snprintf(prefix, sizeof prefix, "%s.tmp.%ld.", path, (long)getpid());

    dp_atomic_file *a, *b;
    dp_assert_ok(dp_atomic_file_open(path, &a));
    dp_assert_ok(dp_atomic_file_open(path, &b));
    const char *ta = dp_atomic_file_temp_path(a), *tb = dp_atomic_file_temp_path(b);
    cr_assert_eq(strncmp(ta, prefix, strlen(prefix)), 0, "temp name %s", ta);
    cr_assert_eq(strncmp(tb, prefix, strlen(prefix)), 0, "temp name %s", tb);
    cr_assert_str_neq(ta, tb, "two writers share a temporary file");
    /* the counter, then the host: 8 hex digits, the same for both */
    const char *digits = ta + strlen(prefix);
    size_t nd = strspn(digits, "0123456789");
    cr_assert(nd > 0 && digits[nd] == '.', "counter in %s", ta);
    const char *host = digits + nd + 1;
    cr_assert(strlen(host) == 8 && strspn(host, "0123456789abcdef") == 8, "host in %s", ta);
    cr_assert_str_eq(host, strrchr(tb, '.') + 1, "two hosts in one process: %s, %s", ta, tb);
    cr_assert_leq(strlen(ta) - strlen(path), dp_atomic_file_temp_extra(),
                  "%s adds more than dp_atomic_file_temp_extra()", ta);
    struct stat sb;
    cr_assert_eq(stat(ta, &sb), 0, "the temporary file exists while writing");

    dp_assert_ok(dp_atomic_file_write(a, "new ", 4));
    dp_assert_ok(dp_atomic_file_write(a, "text", 4));
    expect_contents(path, "old"); /* nothing visible before the commit */
    dp_assert_ok(dp_atomic_file_sync(a));
    cr_assert_eq(dp_atomic_file_write(a, "x", 1), DP_ERR_INVALID_ARGUMENT, "write after sync");
    expect_contents(path, "old");
    dp_assert_ok(dp_atomic_file_commit(a));
    expect_contents(path, "new text");

    dp_assert_ok(dp_atomic_file_write(b, "discarded", 9));
    dp_atomic_file_abort(b);
    dp_atomic_file_abort(NULL);
    expect_contents(path, "new text");
    cr_assert_eq(n_entries(), 1, "a temporary file was left behind");
}

Test(atomic_file, errors_name_the_path_and_leave_nothing)
{
    char path[256];
    dp_atomic_file *af = (dp_atomic_file *)1;
    snprintf(path, sizeof path, "%s/nodir/x.csv", tmpdir);
    cr_assert_eq(dp_atomic_file_open(path, &af), DP_ERR_IO);
    cr_assert_null(af);
    cr_assert(strstr(dp_last_error(), "nodir/x.csv") && strstr(dp_last_error(), "No such file"),
              "%s", dp_last_error());
    cr_assert_eq(dp_atomic_file_open("", &af), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_atomic_file_open(path, NULL), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_atomic_file_commit(NULL), DP_ERR_INVALID_ARGUMENT);

    /* The target is a non-empty directory: refused at open, nothing made. */
    snprintf(path, sizeof path, "%s/target", tmpdir);
    cr_assert_eq(mkdir(path, 0755), 0);
    char inner[300];
    snprintf(inner, sizeof inner, "%s/keep", path);
    dp_test_write_file(inner, "k", 1);
    cr_assert_eq(dp_atomic_file_open(path, &af), DP_ERR_IO);
    cr_assert(strstr(dp_last_error(), "is a directory"), "%s", dp_last_error());
    cr_assert_null(af);
    cr_assert_eq(n_entries(), 1, "only the directory 'target' may exist");

    /* It becomes one after the open: the rename fails, the temporary file
     * goes, the directory is untouched. */
    snprintf(path, sizeof path, "%s/later", tmpdir);
    dp_assert_ok(dp_atomic_file_open(path, &af));
    dp_assert_ok(dp_atomic_file_write(af, "abc", 3));
    cr_assert_eq(mkdir(path, 0755), 0);
    snprintf(inner, sizeof inner, "%s/keep", path);
    dp_test_write_file(inner, "k", 1);
    cr_assert_eq(dp_atomic_file_commit(af), DP_ERR_IO);
    cr_assert(strstr(dp_last_error(), "rename"), "%s", dp_last_error());
    cr_assert_eq(n_entries(), 2, "only the directories 'target' and 'later' may exist");
    struct stat sb;
    cr_assert(stat(inner, &sb) == 0 && sb.st_size == 1);
}

/* A FIFO or a device in the target's place is refused before anything is
 * written: the rename would replace it with a regular file (as root,
 * /dev/null itself). */
Test(atomic_file, special_files_are_refused_and_kept)
{
    char path[256];
    snprintf(path, sizeof path, "%s/fifo", tmpdir);
    cr_assert_eq(mkfifo(path, 0644), 0);
    dp_atomic_file *af = (dp_atomic_file *)1;
    cr_assert_eq(dp_atomic_file_open(path, &af), DP_ERR_IO);
    cr_assert_null(af);
    cr_assert(strstr(dp_last_error(), "is a FIFO") && strstr(dp_last_error(), "/fifo"), "%s",
              dp_last_error());
    struct stat sb;
    cr_assert(stat(path, &sb) == 0 && S_ISFIFO(sb.st_mode), "the FIFO is still a FIFO");
    cr_assert_eq(n_entries(), 1, "no temporary file beside it");
    cr_assert_eq(dp_atomic_file_open("/dev/null", &af), DP_ERR_IO);
    cr_assert(strstr(dp_last_error(), "is a character device"), "%s", dp_last_error());
    cr_assert(stat("/dev/null", &sb) == 0 && S_ISCHR(sb.st_mode));
}

/* A path that is a symbolic link writes the file it leads to, existing
 * or not yet (relative links resolved from the link's directory, chains
 * followed): the link stays a link (it used to become a regular file,
 * and the file it named went stale). A loop is refused, nothing written. */
Test(atomic_file, a_symbolic_link_writes_its_target_and_stays)
{
    char dir[128], target[160], link1[160], link2[160], dangling[160], to[160];
    snprintf(dir, sizeof dir, "%s/real", tmpdir);
    cr_assert_eq(mkdir(dir, 0755), 0);
    snprintf(target, sizeof target, "%s/ck.st", dir);
    dp_test_write_file(target, "old", 3);
    snprintf(link1, sizeof link1, "%s/link1", tmpdir);
    snprintf(link2, sizeof link2, "%s/link2", tmpdir);
    cr_assert_eq(symlink("real/ck.st", link1), 0);
    cr_assert_eq(symlink("link1", link2), 0);
    char *to_target = NULL; /* what the programs' checks compare: the same file */
    dp_assert_ok(dp_atomic_file_target(link2, &to_target));
    cr_assert_str_eq(to_target, target);
    free(to_target);
    dp_atomic_file *af = NULL;
    dp_assert_ok(dp_atomic_file_open(link2, &af));
    cr_assert(strncmp(dp_atomic_file_temp_path(af), target, strlen(target)) == 0,
              "the temporary file %s is not beside the target", dp_atomic_file_temp_path(af));
    dp_assert_ok(dp_atomic_file_write(af, "new", 3));
    dp_assert_ok(dp_atomic_file_commit(af));
    struct stat lb;
    cr_assert_eq(lstat(link1, &lb), 0);
    cr_assert(S_ISLNK(lb.st_mode), "link1 was replaced by a regular file");
    cr_assert_eq(lstat(link2, &lb), 0);
    cr_assert(S_ISLNK(lb.st_mode), "link2 was replaced by a regular file");
    expect_contents(target, "new");

    /* a link to a file that does not exist yet creates it */
    snprintf(dangling, sizeof dangling, "%s/dangling", tmpdir);
    cr_assert_eq(symlink("real/fresh.st", dangling), 0);
    dp_assert_ok(dp_atomic_file_open(dangling, &af));
    dp_assert_ok(dp_atomic_file_write(af, "fresh", 5));
    dp_assert_ok(dp_atomic_file_commit(af));
    cr_assert_eq(lstat(dangling, &lb), 0);
    cr_assert(S_ISLNK(lb.st_mode));
    snprintf(to, sizeof to, "%s/fresh.st", dir);
    expect_contents(to, "fresh");

    /* a loop */
    char a[160], b[160];
    snprintf(a, sizeof a, "%s/loop_a", tmpdir);
    snprintf(b, sizeof b, "%s/loop_b", tmpdir);
    cr_assert_eq(symlink("loop_b", a), 0);
    cr_assert_eq(symlink("loop_a", b), 0);
    int before = n_entries();
    cr_assert_eq(dp_atomic_file_open(a, &af), DP_ERR_IO);
    cr_assert_null(af);
    cr_assert(strstr(dp_last_error(), "symbolic links in a row"), "%s", dp_last_error());
    cr_assert_eq(n_entries(), before);
}

/* Every writer removes what a killed writer of the same path left (a
 * temporary file of a process that no longer exists, on this host), not
 * the checkpoint's alone; nothing else is touched. */
Test(atomic_file, open_removes_a_dead_writers_temporary_file)
{
    pid_t dead = dp_test_dead_pid();
    cr_assert_gt(dead, 0);
    char path[128], stale[256], live[256];
    snprintf(path, sizeof path, "%s/trace.json", tmpdir);
    dp_atomic_file *af = NULL;
    dp_assert_ok(dp_atomic_file_open(path, &af));
    char host[16];
    snprintf(host, sizeof host, "%s", strrchr(dp_atomic_file_temp_path(af), '.') + 1);
    dp_atomic_file_abort(af);
    snprintf(stale, sizeof stale, "%s.tmp.%ld.7.%s", path, (long)dead, host);
    snprintf(live, sizeof live, "%s.tmp.%ld.7.%s", path, (long)getpid(), host);
    dp_test_write_file(stale, "partial", 7);
    dp_test_write_file(live, "partial", 7);
    dp_assert_ok(dp_atomic_file_open(path, &af));
    cr_assert_eq(access(stale, F_OK), -1, "the dead writer's %s was left", stale);
    cr_assert_eq(access(live, F_OK), 0, "a live writer's temporary file was removed");
    dp_atomic_file_abort(af);
}
