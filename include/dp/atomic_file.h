/*
 * dp/atomic_file.h - write a file so that readers see the old contents
 * or the complete new ones, never a part.
 *
 * The bytes go to a temporary file "<path>.tmp.<pid>.<counter>.<host>" in
 * the target's directory (so the rename never crosses filesystems), which
 * is fsync'ed, closed and renamed over path; then the directory is
 * fsync'ed so the rename itself survives a crash. The pid, a process-wide
 * counter and the host (8 hex digits of a hash of its name) make the name
 * unique across processes, threads and the hosts of a shared filesystem;
 * the clean-up of stale temporary files left by a killed process
 * (dp_atomic_file_remove_stale) relies on this exact pattern.
 *
 *   dp_atomic_file *af;
 *   if ((st = dp_atomic_file_open(path, &af)) != DP_OK) return st;
 *   if ((st = dp_atomic_file_write(af, buf, n)) != DP_OK) { dp_atomic_file_abort(af); ... }
 *   st = dp_atomic_file_commit(af);   // af is freed either way
 *
 * To replace several files all or none, call dp_atomic_file_sync on each
 * (every write and fsync that can fail), and only when all succeeded
 * dp_atomic_file_commit each (what is left is a rename in a directory the
 * caller already wrote to).
 *
 * On an error, errno is left as the failing system call set it, so a
 * program can print strerror(errno) without the recorded message.
 *
 * Checkpoints, trace files and dp_bench's outputs are written through it.
 */
#ifndef DP_ATOMIC_FILE_H
#define DP_ATOMIC_FILE_H

#include <stddef.h>

#include "dp/export.h"
#include "dp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dp_atomic_file dp_atomic_file;

/* The file a write of path replaces, malloc'd in *out (free with free):
 * path itself, or where path is a symbolic link, the file its chain of
 * links leads to (relative links from the link's directory; the file
 * need not exist). A program's checks of its outputs use it, so they
 * name the file the writer writes.
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL or empty), DP_ERR_IO (a link that
 * cannot be read, a chain of more than 40), DP_ERR_OUT_OF_MEMORY. */
DP_API dp_status dp_atomic_file_target(const char *path, char **out);

/* Creates the temporary file next to path (mode 0666 & ~umask, O_EXCL),
 * after removing path's stale temporary files (dp_atomic_file_remove_stale).
 * A path that is a symbolic link writes the file the link leads to (which
 * need not exist yet; up to 40 links in a chain): the link stays a link.
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL or empty path, NULL out),
 * DP_ERR_IO (path names something other than a regular file: a
 * directory, a device, a FIFO or a socket, which the rename would
 * replace; or the temporary file cannot be created: the message names
 * path and the reason, e.g. "No such file or directory" for a missing
 * directory; a link that cannot be read or a chain of more than 40),
 * DP_ERR_OUT_OF_MEMORY. */
DP_API dp_status dp_atomic_file_open(const char *path, dp_atomic_file **out);

/* The temporary file's descriptor, for writers that need one (owned by af;
 * do not close it). -1 after dp_atomic_file_sync. */
DP_API int dp_atomic_file_fd(const dp_atomic_file *af);

/* The temporary file's path (owned by af). */
DP_API const char *dp_atomic_file_temp_path(const dp_atomic_file *af);

/* Appends n bytes (any size; retried on short writes and EINTR).
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL, or after dp_atomic_file_sync),
 * DP_ERR_IO (the message names path and the reason, e.g. no space). */
DP_API dp_status dp_atomic_file_write(dp_atomic_file *af, const void *buf, size_t n);

/* fsync and close the temporary file: after DP_OK only the rename is left.
 * Idempotent. Errors: DP_ERR_INVALID_ARGUMENT (NULL), DP_ERR_IO. On error
 * the caller still aborts af. */
DP_API dp_status dp_atomic_file_sync(dp_atomic_file *af);

/* dp_atomic_file_sync if not done, then renames the temporary file over
 * path and fsyncs the directory. Frees af whatever the outcome; on error
 * the temporary file is removed and path is untouched (except when only
 * the directory fsync failed: path then holds the new contents, which may
 * not survive a crash, and the message says so).
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL), DP_ERR_IO. */
DP_API dp_status dp_atomic_file_commit(dp_atomic_file *af);

/* Closes and removes the temporary file and frees af; path is untouched.
 * NULL is a no-op. */
DP_API void dp_atomic_file_abort(dp_atomic_file *af);

/* For a program's handler of a fatal signal (async-signal-safe: unlink on
 * lock-free state): removes the temporary file of every atomic file open
 * in the process, the library's own writers' (a checkpoint, a trace, an
 * export) included, so a killed program leaves no partial file; each
 * path stays as it was. Returns how many it removed. The handles stay
 * open: the program is meant to end (a commit would fail). Up to 32 files
 * at once, of paths under PATH_MAX, are known to it. */
DP_API int dp_atomic_file_remove_temps(void);

/* The most bytes this process's temporary file names add to the last
 * component of path (".tmp.<pid>.<counter>.<host>"): a name longer than
 * the directory's limit on a file name less this cannot be written. */
DP_API size_t dp_atomic_file_temp_extra(void);

/* Removes path's temporary files left by processes of this host that no
 * longer exist (a process killed while writing leaves one, as large as
 * what it wrote). Leaves alone those of a live process (another user's
 * answers EPERM, which counts as alive), of another host (on a
 * filesystem several hosts share, a pid names nothing here), and every
 * name not in the pattern. Best effort, no error: a directory that
 * cannot be listed is left to the next write to report. */
DP_API void dp_atomic_file_remove_stale(const char *path);

#ifdef __cplusplus
}
#endif

#endif /* DP_ATOMIC_FILE_H */
