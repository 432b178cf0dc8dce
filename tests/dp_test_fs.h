/*
 * tests/dp_test_fs.h - temporary directories for tests that write files.
 * Include after defining _POSIX_C_SOURCE (mkdtemp, lstat).
 */
#ifndef DP_TEST_FS_H
#define DP_TEST_FS_H

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
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

#endif /* DP_TEST_FS_H */
