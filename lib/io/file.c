/*
 * io/file.c - reading an input file safely (io/file.h): stat first to name
 * what is not a regular file, then a non-blocking open and fstat on the
 * descriptor, so a FIFO swapped in after stat is refused, not waited on.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "io/file.h"

const char *dp_file_kind(mode_t m)
{
    return S_ISDIR(m)    ? "directory"
           : S_ISCHR(m)  ? "character device"
           : S_ISBLK(m)  ? "block device"
           : S_ISFIFO(m) ? "FIFO"
           : S_ISSOCK(m) ? "socket"
                         : "special file";
}

dp_status dp_file_read(const char *path, const char *what, size_t max_bytes, char **buf,
                       size_t *len)
{
    *buf = NULL;
    *len = 0;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return DP_FAIL(DP_ERR_IO, "cannot read the %s '%s': %s", what, path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return DP_FAIL(DP_ERR_FORMAT, "the %s '%s' is not a regular file (it is a %s)", what, path,
                       dp_file_kind(sb.st_mode));
    // Non-blocking, so a FIFO swapped in after stat is refused, not waited on.
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return DP_FAIL(DP_ERR_IO, "cannot open the %s '%s': %s", what, path, strerror(errno));
    dp_status st = DP_OK;
    char *b = NULL;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = DP_FAIL(DP_ERR_FORMAT, "the %s '%s' is not a regular file", what, path);
        goto done;
    }
    if ((uintmax_t)sb.st_size > max_bytes) {
        st = DP_FAIL(DP_ERR_FORMAT, "the %s '%s' has %jd bytes, more than the %zu such a file "
                     "may have",
                     what, path, (intmax_t)sb.st_size, max_bytes);
        goto done;
    }
    size_t n = (size_t)sb.st_size;
    if (n == 0) {
        st = DP_FAIL(DP_ERR_FORMAT, "the %s '%s' is empty", what, path);
        goto done;
    }
    b = malloc(n + 1);
    if (!b) {
        st = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes for '%s'", n + 1, path);
        goto done;
    }
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, b + got, n - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            st = DP_FAIL(DP_ERR_IO, "reading the %s '%s' failed: %s", what, path,
                         k < 0 ? strerror(errno) : "the file shrank while read");
            goto done;
        }
        got += (size_t)k;
    }
    b[n] = '\0';
    *buf = b;
    *len = n;
    b = NULL;
done:
    close(fd);
    free(b);
    return st;
}
