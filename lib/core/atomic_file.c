/*
 * core/atomic_file.c - temporary file, fsync, rename, fsync of the
 * directory: the one atomic file writer (see atomic_file.h).
 */
#include "dp/atomic_file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dp/checked.h"
#include "dp/file.h"
#include "core/error.h"

struct dp_atomic_file {
    char *path;
    char *tmp;
    int fd;     // -1 once synced and closed
    int synced;
    int slot;   // its place in the registry below, or -1
};

// --- the temporary files a fatal signal removes -----------------------------------------

/* Every open atomic file's temporary path, so that a program's handler of a
 * fatal signal can remove them all (dp_atomic_file_remove_temps) whoever
 * opened them: the library's checkpoint, trace and export writers too.
 * A slot goes FREE -> FILLING (its path copied) -> READY, and back to FREE
 * once the file was renamed or removed; the handler reads READY slots only.
 * The states are lock-free atomics, which a signal handler may read. A
 * path past the slot's size, or a file past the slots, is not registered
 * (its temporary file is then left by a signal, as before). */
enum { SLOT_FREE, SLOT_FILLING, SLOT_READY };
#define TEMP_SLOTS 32
static _Atomic int temp_state[TEMP_SLOTS];
static char temp_path[TEMP_SLOTS][PATH_MAX];

static int register_temp(const char *tmp)
{
    size_t n = strlen(tmp);
    if (n >= sizeof temp_path[0]) return -1;
    for (int i = 0; i < TEMP_SLOTS; i++) {
        int free_state = SLOT_FREE;
        if (!atomic_compare_exchange_strong(&temp_state[i], &free_state, SLOT_FILLING)) continue;
        memcpy(temp_path[i], tmp, n + 1);
        atomic_store(&temp_state[i], SLOT_READY);
        return i;
    }
    return -1;
}

static void unregister_temp(int slot)
{
    if (slot >= 0) atomic_store(&temp_state[slot], SLOT_FREE);
}

int dp_atomic_file_remove_temps(void)
{
    int removed = 0;
    for (int i = 0; i < TEMP_SLOTS; i++)
        if (atomic_load(&temp_state[i]) == SLOT_READY && unlink(temp_path[i]) == 0) removed++;
    return removed;
}

// pid + a process-wide counter + the host: unique across processes, threads and hosts.
static atomic_uint tmp_counter;

/* This host's tag: FNV-1a (32 bits) of its name as 8 hex digits. */
static void host_tag(char out[9])
{
    char name[256] = "";
    if (gethostname(name, sizeof name - 1) != 0) name[0] = '\0';
    uint32_t h = 2166136261u;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        h ^= *p;
        h *= 16777619u;
    }
    snprintf(out, 9, "%08x", (unsigned)h);
}

static size_t digits(unsigned long x)
{
    size_t d = 1;
    while (x >= 10) x /= 10, d++;
    return d;
}

size_t dp_atomic_file_temp_extra(void)
{
    return strlen(".tmp.") + digits((unsigned long)getpid()) + 1 + digits(UINT_MAX) + 1 + 8;
}

/* The directory holding path ("." for a bare name, "/" for "/x"), malloc'd. */
static char *parent_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    if (slash == path) return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

/* dp_atomic_file_open of target, the file path (as the caller spelled it) leads to. */
static dp_status open_target(const char *path, const char *given, dp_atomic_file **out)
{
    /* The rename would put a regular file in place of a device, a FIFO
     * or a socket (as root, /dev/null itself). */
    struct stat sb;
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
        return DP_FAIL(DP_ERR_IO, "'%s' is a %s: writing it would replace it with a "
                       "regular file; give the path of a regular file or of one that does not "
                       "exist yet", given, dp_file_kind(sb.st_mode));
    size_t tlen;
    if (!dp_size_add(strlen(path), dp_atomic_file_temp_extra() + 1, &tlen))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "the path is too long");
    dp_atomic_file *af = calloc(1, sizeof *af);
    char *p = strdup(path), *tmp = malloc(tlen);
    if (!af || !p || !tmp) {
        free(af);
        free(p);
        free(tmp);
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate the temporary file name");
    }
    /* what a killed writer of path left, before this writer adds its own */
    dp_atomic_file_remove_stale(path);
    char host[9];
    host_tag(host);
    snprintf(tmp, tlen, "%s.tmp.%ld.%u.%s", path, (long)getpid(),
             atomic_fetch_add(&tmp_counter, 1u), host);
    /* registered before it exists: a signal between the two removes
     * nothing, one after it removes the file */
    int slot = register_temp(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) {
        int e = errno;
        unregister_temp(slot);
        dp_status st = DP_FAIL(DP_ERR_IO, "cannot create '%s' to write '%s': %s", tmp, given,
                               strerror(e));
        free(af);
        free(p);
        free(tmp);
        errno = e;
        return st;
    }
    af->path = p;
    af->tmp = tmp;
    af->fd = fd;
    af->slot = slot;
    *out = af;
    return DP_OK;
}

/* Links followed before a path is written, as the kernel's limit (ELOOP). */
#define MAX_LINK_HOPS 40

/* The rename replaces the target, so a link stays a link. */
dp_status dp_atomic_file_target(const char *path, char **out)
{
    if (!path || !*path || !out)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "path and out must not be NULL or empty");
    char *cur = strdup(path);
    for (int hop = 0; cur && hop <= MAX_LINK_HOPS; hop++) {
        struct stat lb;
        if (lstat(cur, &lb) != 0 || !S_ISLNK(lb.st_mode)) {
            *out = cur;
            return DP_OK;
        }
        char to[PATH_MAX];
        ssize_t n = readlink(cur, to, sizeof to - 1);
        if (n < 0) {
            int e = errno;
            free(cur);
            return DP_FAIL(DP_ERR_IO, "cannot read the symbolic link '%s': %s", path,
                           strerror(e));
        }
        to[n] = '\0';
        char *dir = to[0] == '/' ? NULL : parent_of(cur);
        size_t len = (dir ? strlen(dir) + 1 : 0) + (size_t)n + 1;
        char *next = (to[0] == '/' || dir) ? malloc(len) : NULL;
        if (next) snprintf(next, len, "%s%s%s", dir ? dir : "", dir ? "/" : "", to);
        free(dir);
        free(cur);
        cur = next;
    }
    if (!cur) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate the path '%s' leads to", path);
    free(cur);
    return DP_FAIL(DP_ERR_IO, "'%s': more than %d symbolic links in a row; give the file's own "
                   "path", path, MAX_LINK_HOPS);
}

dp_status dp_atomic_file_open(const char *path, dp_atomic_file **out)
{
    if (!out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    if (!path || !*path) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "the path is NULL or empty");
    char *target = NULL;
    DP_TRY(dp_atomic_file_target(path, &target));
    dp_status st = open_target(target, path, out);
    free(target);
    return st;
}

int dp_atomic_file_fd(const dp_atomic_file *af) { return af ? af->fd : -1; }

const char *dp_atomic_file_temp_path(const dp_atomic_file *af) { return af ? af->tmp : NULL; }

dp_status dp_atomic_file_write(dp_atomic_file *af, const void *buf, size_t n)
{
    if (!af || (!buf && n)) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "file or buffer is NULL");
    if (af->fd < 0)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "'%s' was already synced: no more writes",
                       af->path);
    const char *p = buf;
    while (n > 0) {
        // Linux moves at most ~2 GiB per call; larger buffers take several.
        size_t chunk = n < ((size_t)1 << 30) ? n : ((size_t)1 << 30);
        ssize_t k = write(af->fd, p, chunk);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            int e = k < 0 ? errno : EIO;
            dp_status st = DP_FAIL(DP_ERR_IO, "writing '%s' failed: %s", af->tmp, strerror(e));
            errno = e;
            return st;
        }
        p += k;
        n -= (size_t)k;
    }
    return DP_OK;
}

dp_status dp_atomic_file_sync(dp_atomic_file *af)
{
    if (!af) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "file is NULL");
    if (af->synced) return DP_OK;
    int e;
    if (fsync(af->fd) != 0) {
        e = errno;
        DP_FAIL(DP_ERR_IO, "fsync of '%s' failed: %s", af->tmp, strerror(e));
        errno = e;
        return DP_ERR_IO;
    }
    int rc = close(af->fd);
    af->fd = -1;
    if (rc != 0) {
        e = errno;
        DP_FAIL(DP_ERR_IO, "closing '%s' failed: %s", af->tmp, strerror(e));
        errno = e;
        return DP_ERR_IO;
    }
    af->synced = 1;
    return DP_OK;
}

// fsync the directory holding path so the rename itself is durable.
static int fsync_parent(const char *path)
{
    char *dir = parent_of(path);
    if (!dir) {
        errno = ENOMEM;
        return -1;
    }
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    free(dir);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    // Some filesystems cannot fsync a directory; the rename is then as
    // durable as that filesystem makes it.
    if (rc != 0 && (errno == EINVAL || errno == EROFS)) rc = 0;
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

/* After the temporary file was renamed or removed. */
static void release(dp_atomic_file *af)
{
    unregister_temp(af->slot);
    free(af->path);
    free(af->tmp);
    free(af);
}

dp_status dp_atomic_file_commit(dp_atomic_file *af)
{
    if (!af) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "file is NULL");
    dp_status st = dp_atomic_file_sync(af);
    if (st != DP_OK) {
        dp_atomic_file_abort(af);
        return st;
    }
    if (rename(af->tmp, af->path) != 0) {
        int e = errno;
        st = DP_FAIL(DP_ERR_IO, "cannot rename '%s' to '%s': %s", af->tmp, af->path,
                     strerror(e));
        errno = e;
        dp_atomic_file_abort(af); // keeps errno
        return st;
    }
    if (fsync_parent(af->path) != 0) {
        int e = errno;
        st = DP_FAIL(DP_ERR_IO,
                     "'%s' was written but fsync of its directory failed (%s): it may not "
                     "survive a crash",
                     af->path, strerror(e));
        errno = e;
    }
    release(af);
    return st;
}

void dp_atomic_file_abort(dp_atomic_file *af)
{
    if (!af) return;
    int e = errno; // keep the caller's errno for its message
    if (af->fd >= 0) close(af->fd);
    unlink(af->tmp);
    release(af);
    errno = e;
}

// --- stale temporary files ----------------------------------------------------------

/* 1 when name is "<base>.tmp.<pid>.<n>.<host>" (digits, digits, 8 hex
 * digits), made on this host (host), and *pid is set. */
static int parse_temp_name(const char *name, const char *base, const char *host, long *pid)
{
    size_t bl = strlen(base);
    if (strncmp(name, base, bl) != 0 || strncmp(name + bl, ".tmp.", 5) != 0) return 0;
    const char *p = name + bl + 5;
    if (*p < '1' || *p > '9') return 0;
    char *end = NULL;
    errno = 0;
    long x = strtol(p, &end, 10);
    if (errno || *end != '.' || x <= 0) return 0;
    p = end + 1;
    size_t nd = strspn(p, "0123456789");
    if (nd == 0 || p[nd] != '.') return 0;
    p += nd + 1;
    if (strcmp(p, host) != 0) return 0; /* another host's, or not ours at all */
    *pid = x;
    return 1;
}

void dp_atomic_file_remove_stale(const char *path)
{
    if (!path || !*path) return;
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    char *dir = parent_of(path);
    DIR *d = dir ? opendir(dir) : NULL;
    if (!d) {
        free(dir);
        return;
    }
    char host[9];
    host_tag(host);
    struct dirent *de;
    while ((de = readdir(d))) {
        long pid;
        if (!parse_temp_name(de->d_name, base, host, &pid)) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        size_t n = strlen(dir) + strlen(de->d_name) + 2;
        char *full = malloc(n);
        if (!full) break;
        snprintf(full, n, "%s/%s", dir, de->d_name);
        unlink(full);
        free(full);
    }
    closedir(d);
    free(dir);
}
