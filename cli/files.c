/*
 * cli/files.c - the files a program names on its command line
 * (cli/dp_cli.h): no output may be the same file as an input or as
 * another output; an output is checked before any work (its directory,
 * its temporary file's name, a probe); an input is opened without
 * blocking and must be a regular file; a stream is checked after
 * writing, so a full disk fails the run instead of cutting a file short.
 */
#define _XOPEN_SOURCE 700 /* realpath */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dp_cli.h"

// --- paths ----------------------------------------------------------------------------

/* The directory part of path ("." for a bare name); malloc'd. */
static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    if (slash == path) return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

/* The name part of path (after the last '/'). */
static const char *base_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* What a path names: the file it reaches (symlinks followed) when it
 * exists, else the resolved path it would be created at. */
typedef struct ident {
    int exists, is_dir;
    dev_t dev;
    ino_t ino;
    char *resolved; /* realpath of the file, or of its directory + "/" + its name */
} ident;

/* A symbolic link: the file a write through it creates or replaces (the
 * atomic writer's target, so the checks name what it writes), malloc'd;
 * NULL otherwise. */
static char *link_target(const char *path)
{
    char *t = NULL;
    if (dp_atomic_file_target(path, &t) != DP_OK) return NULL;
    if (strcmp(t, path) != 0) return t;
    free(t);
    return NULL;
}

static void ident_at(const char *path, ident *id);

static void ident_of(const char *given, ident *id)
{
    memset(id, 0, sizeof *id);
    size_t len = strlen(given);
    while (len > 1 && given[len - 1] == '/') len--; /* "dir/" is "dir" */
    char *path = strndup(given, len);
    if (!path) return;
    ident_at(path, id);
    free(path);
}

static void ident_at(const char *path, ident *id)
{
    struct stat sb;
    char *target = link_target(path);
    if (target) {
        ident_of(target, id);
        free(target);
        return;
    }
    if (stat(path, &sb) == 0) {
        id->exists = 1;
        id->is_dir = S_ISDIR(sb.st_mode);
        id->dev = sb.st_dev;
        id->ino = sb.st_ino;
        id->resolved = realpath(path, NULL);
        return;
    }
    char *dir = dir_of(path), *real = dir ? realpath(dir, NULL) : NULL;
    const char *base = base_of(path);
    size_t n = real ? strlen(real) + strlen(base) + 2 : 0;
    id->resolved = n ? malloc(n) : NULL;
    if (id->resolved) snprintf(id->resolved, n, "%s/%s", real, base);
    else id->resolved = strdup(path); /* its directory does not exist: the check fails later */
    free(dir);
    free(real);
}

char *cli_resolved_path(const char *path)
{
    ident id;
    ident_of(path, &id);
    return id.resolved;
}

static int same_file(const ident *a, const ident *b)
{
    if (a->exists && b->exists) return a->dev == b->dev && a->ino == b->ino;
    return !a->exists && !b->exists && a->resolved && b->resolved &&
           strcmp(a->resolved, b->resolved) == 0;
}

/* An output that is, or would become, one of the files input directory
 * dir holds (its real directory is dir, and its name ends in suffix): a
 * new file there would be read as data by the next run. */
static int in_dir(const ident *out, const ident *dir, const char *suffix)
{
    if (out->is_dir || !dir->exists || !dir->is_dir || !out->resolved) return 0;
    const char *name = base_of(out->resolved);
    size_t n = strlen(name), k = suffix ? strlen(suffix) : 0;
    if (n < k || strcmp(name + n - k, suffix ? suffix : "") != 0) return 0;
    char *parent = dir_of(out->resolved);
    struct stat sb;
    int in = parent && stat(parent, &sb) == 0 && sb.st_dev == dir->dev && sb.st_ino == dir->ino;
    free(parent);
    return in;
}

// --- outputs against inputs and each other ----------------------------------------------

int cli_check_overlaps(const cli_file *files, size_t n)
{
    ident *id = calloc(n ? n : 1, sizeof *id);
    if (!id) return cli_fail("out of host memory");
    for (size_t i = 0; i < n; i++)
        if (files[i].path) ident_of(files[i].path, &id[i]);
    int rc = 0;
    /* Inputs first: an output over one loses data; then outputs over each other. */
    for (int pass = 0; pass < 2 && !rc; pass++)
        for (size_t i = 0; i < n && !rc; i++) {
            const cli_file *o = &files[i];
            if (!o->output || !o->path) continue;
            for (size_t j = 0; j < n && !rc; j++) {
                const cli_file *x = &files[j];
                if (j == i || !x->path || x->output != pass) continue;
                /* An input that does not exist cannot be replaced (reading it fails). */
                if (!pass && !id[j].exists) continue;
                if (pass == 1 && j < i) continue; /* each pair of outputs once */
                if (!pass && o->may_replace && strcmp(o->may_replace, x->flag) == 0) continue;
                if (pass == 1 && same_file(&id[i], &id[j]))
                    rc = cli_fail("%s \"%s\" and %s \"%s\" both write the same file; give each "
                                  "output its own path", o->flag, o->path, x->flag, x->path);
                else if (!pass && same_file(&id[i], &id[j]))
                    rc = cli_fail("%s \"%s\" is the same file as %s \"%s\": writing it would "
                                  "replace what %s reads; give %s another path", o->flag,
                                  o->path, x->flag, x->path, x->flag, o->flag);
                else if (!pass && in_dir(&id[i], &id[j], x->dir_suffix))
                    rc = cli_fail("%s \"%s\" is %s the files %s \"%s\" reads: writing it "
                                  "would change them; give %s a path outside it", o->flag,
                                  o->path, id[i].exists ? "one of" : "among", x->flag, x->path,
                                  o->flag);
            }
        }
    /* An output onto the regular file standard output or error writes
     * (--log /dev/stdout > run.txt): both would write it, the output's
     * truncation or rename first. */
    static const char *const stream[2] = {"standard output", "standard error"};
    for (int fd = 1; fd <= 2 && !rc; fd++) {
        struct stat sb;
        if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        for (size_t i = 0; i < n && !rc; i++)
            if (files[i].output && files[i].path && id[i].exists && id[i].dev == sb.st_dev &&
                id[i].ino == sb.st_ino)
                rc = cli_fail("%s \"%s\" is the file %s goes to: both would write it; give %s "
                              "another path", files[i].flag, files[i].path, stream[fd - 1],
                              files[i].flag);
    }
    for (size_t i = 0; i < n; i++) free(id[i].resolved);
    free(id);
    return rc;
}

// --- an output, before any work --------------------------------------------------------

int cli_check_output(const char *flag, const char *path)
{
    if (!*path) return cli_fail("%s: the path is empty", flag);
    struct stat sb;
    int exists = stat(path, &sb) == 0;
    if (exists && S_ISDIR(sb.st_mode))
        return cli_fail("%s: \"%s\" is a directory; give a file name", flag, path);
    /* the atomic writer's rename would replace a device or a FIFO */
    if (exists && !S_ISREG(sb.st_mode))
        return cli_fail("%s: \"%s\" is a %s: it must be a regular file or not exist yet", flag,
                        path, dp_file_kind(sb.st_mode));
    char *dir = dir_of(path);
    if (!dir) return cli_fail("out of host memory");
    int rc = 0;
    if (stat(dir, &sb) != 0)
        rc = cli_fail("%s: cannot write \"%s\": the directory \"%s\" %s; create it first", flag,
                      path, dir, errno == ENOENT ? "does not exist" : strerror(errno));
    else if (!S_ISDIR(sb.st_mode))
        rc = cli_fail("%s: cannot write \"%s\": \"%s\" is not a directory", flag, path, dir);
    else if (access(dir, W_OK | X_OK) != 0)
        rc = cli_fail("%s: cannot write \"%s\": the directory \"%s\" is not writable (%s)", flag,
                      path, dir, strerror(errno));
    /* The atomic writer's temporary file (dp/atomic_file.h): its longest
     * name must fit too, or the run would fail at its end, with the
     * counter of its last write. */
    long name_max = rc ? 0 : pathconf(dir, _PC_NAME_MAX);
    if (!rc && name_max <= 0) name_max = 255;
    size_t name = strlen(base_of(path));
    size_t extra = dp_atomic_file_temp_extra();
    if (!rc && name + extra > (size_t)name_max)
        rc = cli_fail("%s: the name of \"%s\" is %zu bytes: its temporary file (the name and "
                      "\".tmp.<pid>.<n>.<host>\", up to %zu bytes more) would pass the %ld-byte limit "
                      "on a file name in \"%s\"; give a name of at most %zu bytes", flag, path,
                      name, extra, name_max, dir,
                      (size_t)name_max > extra ? (size_t)name_max - extra : 0);
    free(dir);
    if (rc) return rc;
    dp_atomic_file *af = NULL;
    if (dp_atomic_file_open(path, &af) != DP_OK)
        return cli_fail("%s: cannot write \"%s\": %s", flag, path, strerror(errno));
    dp_atomic_file_abort(af);
    return 0;
}

int cli_check_replace(const char *flag, const char *path, int (*ours)(const char *path),
                      const char *what)
{
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size == 0 || ours(path)) return 0;
    return cli_fail("%s %s exists and is not %s, so it would be lost; give a new path, or move "
                    "the file away first", flag, path, what);
}

size_t cli_read_head(const char *path, char *buf, size_t n)
{
    FILE *f = fopen(path, "rb");
    size_t got = f ? fread(buf, 1, n, f) : 0;
    if (f) fclose(f);
    buf[got] = '\0';
    return got;
}

int cli_st_has_metadata(const char *path, const char *key, const char *value)
{
    dp_st_file *f = NULL;
    if (dp_st_open(path, &f) != DP_OK) return 0;
    const char *v = dp_st_metadata(f, key);
    int has = v && (!value || strcmp(v, value) == 0);
    dp_st_close(f);
    return has;
}

int cli_is_dp_trace(const char *path)
{
    static const char head[] = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [";
    char buf[sizeof head];
    return cli_read_head(path, buf, sizeof head - 1) == sizeof head - 1 && strcmp(buf, head) == 0;
}

// --- an input, without blocking ----------------------------------------------------------

int cli_open_input(const char *flag, const char *path)
{
    /* Non-blocking: a FIFO without a writer would block open() for ever. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        cli_fail("%s: cannot read \"%s\": %s", flag, path, strerror(errno));
        return -1;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        cli_fail("%s: cannot read \"%s\": %s", flag, path, strerror(e));
        return -1;
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        cli_fail("%s: \"%s\" is a %s; give a regular file", flag, path, dp_file_kind(sb.st_mode));
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
}

int cli_check_input(const char *flag, const char *path)
{
    int fd = cli_open_input(flag, path);
    if (fd < 0) return 1;
    close(fd);
    return 0;
}

// --- streams --------------------------------------------------------------------------

/* The stream and errno of the last failed cli_print_help or cli_flush:
 * stdio keeps only a flag, and a later fflush has nothing left to fail
 * with. */
static FILE *failed_stream;
static int failed_errno;

int cli_flush(FILE *f)
{
    errno = 0;
    int rc = fflush(f);
    if (rc != 0) {
        failed_stream = f;
        failed_errno = errno;
    }
    return rc;
}

void cli_print_help(void (*usage)(FILE *f))
{
    char *text = NULL;
    size_t n = 0;
    FILE *m = open_memstream(&text, &n);
    if (m) {
        usage(m);
        if (fclose(m) != 0) {
            free(text);
            text = NULL;
        }
    }
    if (!text) { /* no memory for it: straight to stdout, errno unknown */
        usage(stdout);
        return;
    }
    errno = 0;
    if (fwrite(text, 1, n, stdout) != n) {
        failed_stream = stdout;
        failed_errno = errno;
    } else {
        cli_flush(stdout);
    }
    free(text);
}

int cli_check_stream(FILE *f, const char *what)
{
    errno = 0;
    int flushed = fflush(f);
    int e = errno;
    if (flushed == 0 && !ferror(f)) return 0;
    if (!e && f == failed_stream) e = failed_errno;
    return cli_fail("cannot write %s: %s", what, e ? strerror(e) : "an earlier write failed");
}
