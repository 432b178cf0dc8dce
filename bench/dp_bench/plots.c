/*
 * bench/dp_bench/plots.c - --plot: per-device peak memory and, with
 * --scaling, tokens/s over devices, drawn by gnuplot in a private
 * temporary directory and staged as outputs.
 */
#define _GNU_SOURCE /* mkdtemp */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dp_bench.h"

// --- plots: gnuplot never sees a user's text ------------------------------------------
//
// gnuplot runs in a private temporary directory of ours (mkdtemp) and
// writes a file of a fixed name there ("plot.png"/"plot.svg"); the script
// holds only numbers, dp's device and mode names and that name. The plot
// is then copied into the user's path through the atomic writer. gnuplot's
// own stdout and stderr go to a log file in that directory, never to ours;
// when it fails, its last message is reported.

static const char *ext_of(const char *path) { return strrchr(path, '.'); }

/* Runs gnuplot (argv[1..] = args) in dir with stdin from `script` (may be
 * NULL: /dev/null), stdout and stderr to logpath. Returns the wait status,
 * or -1 with errno when it could not be started. */
static int spawn_gnuplot(const char *dir, const char *script, const char *arg,
                         const char *logpath)
{
    int in[2];
    if (pipe(in) != 0) return -1;
    int logfd = open(logpath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (logfd < 0) {
        close(in[0]);
        close(in[1]);
        return -1;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(in[0]);
        close(in[1]);
        close(logfd);
        errno = e;
        return -1;
    }
    if (pid == 0) {
        if (chdir(dir) != 0 || dup2(in[0], 0) < 0 || dup2(logfd, 1) < 0 || dup2(logfd, 2) < 0)
            _exit(126);
        close(in[1]);
        execlp("gnuplot", "gnuplot", arg, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(logfd);
    if (script) {
        size_t n = strlen(script), off = 0;
        while (off < n) { /* EPIPE when gnuplot stops early: its log says why */
            ssize_t k = write(in[1], script + off, n - off);
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) break;
            off += (size_t)k;
        }
    }
    close(in[1]);
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return -1;
    return st;
}

/* The last non-empty line of the log, whitespace collapsed, into msg. */
static void last_log_line(const char *logpath, char *msg, size_t cap)
{
    snprintf(msg, cap, "no message");
    FILE *f = fopen(logpath, "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char clean[512];
        size_t n = 0;
        for (const char *c = line; *c && n + 1 < sizeof clean; c++) {
            int sp = *c == ' ' || *c == '\t' || *c == '\n' || *c == '\r';
            if (sp && (n == 0 || clean[n - 1] == ' ')) continue;
            clean[n++] = sp ? ' ' : *c;
        }
        while (n && clean[n - 1] == ' ') n--;
        clean[n] = '\0';
        /* gnuplot's caret line under the command is not a message */
        if (n && strspn(clean, "^ ") != n) snprintf(msg, cap, "%s", clean);
    }
    fclose(f);
}

typedef struct plot_dir {
    char dir[4096];
    char log[4200], out[4200];
} plot_dir;

static int plot_dir_create(plot_dir *pd, const char *ext)
{
    const char *base = getenv("TMPDIR");
    if (!base || !*base || strlen(base) > 3000) base = "/tmp";
    snprintf(pd->dir, sizeof pd->dir, "%s/dp_bench_plot_XXXXXX", base);
    if (!mkdtemp(pd->dir)) {
        snprintf(pd->dir, sizeof pd->dir, "/tmp/dp_bench_plot_XXXXXX");
        if (!mkdtemp(pd->dir))
            return cli_fail("--plot: cannot create a temporary directory in %s: %s", base,
                            strerror(errno));
    }
    snprintf(pd->log, sizeof pd->log, "%s/gnuplot.log", pd->dir);
    snprintf(pd->out, sizeof pd->out, "%s/plot%s", pd->dir, ext);
    /* a fatal signal removes the files, then the directory */
    cli_guard_path(pd->dir);
    cli_guard_path(pd->log);
    cli_guard_path(pd->out);
    return 0;
}

static void plot_dir_destroy(plot_dir *pd)
{
    unlink(pd->log);
    unlink(pd->out);
    rmdir(pd->dir);
    cli_unguard_path(pd->out);
    cli_unguard_path(pd->log);
    cli_unguard_path(pd->dir);
}

/* Fails unless gnuplot can be run (checked before the first step). */
int check_gnuplot(void)
{
    plot_dir pd;
    if (plot_dir_create(&pd, ".png")) return 1;
    int st = spawn_gnuplot(pd.dir, NULL, "--version", pd.log);
    int rc = 0;
    if (st < 0)
        rc = cli_fail("--plot: cannot start gnuplot: %s", strerror(errno));
    else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        rc = cli_fail("--plot needs gnuplot, which %s; install it (Debian: gnuplot-nox) or drop "
                      "--plot",
                      WIFEXITED(st) && WEXITSTATUS(st) == 127 ? "was not found in PATH"
                                                               : "does not run");
    plot_dir_destroy(&pd);
    return rc;
}

/* gnuplot's cairo and svg terminals ignore write errors and exit 0 with a
 * truncated file: a PNG must end with its IEND chunk, an SVG with </svg>. */
static int plot_complete(const char *ext, const char *bytes, size_t n)
{
    if (strcmp(ext, ".png") == 0)
        return n >= 20 && memcmp(bytes, "\x89PNG", 4) == 0 &&
               memcmp(bytes + n - 8, "IEND\xae\x42\x60\x82", 8) == 0;
    while (n && (bytes[n - 1] == '\n' || bytes[n - 1] == ' ')) n--;
    return n >= 6 && memcmp(bytes + n - 6, "</svg>", 6) == 0;
}

/* Renders `body` (the script after its terminal and output lines) for
 * path's extension and stages the plot as an output for path. */
static int render(outputs *out, const char *path, const char *body)
{
    const char *ext = ext_of(path);
    const char *term = strcmp(ext, ".svg") == 0 ? "svg size 900,520 dynamic"
                                                : "pngcairo size 900,520";
    plot_dir pd;
    if (plot_dir_create(&pd, ext)) return 1;
    size_t n = strlen(body) + 256;
    char *script = malloc(n);
    if (!script) {
        plot_dir_destroy(&pd);
        return cli_fail("out of host memory");
    }
    snprintf(script, n, "set terminal %s\nset output 'plot%s'\n%s", term, ext, body);
    int st = spawn_gnuplot(pd.dir, script, NULL, pd.log);
    free(script);
    int rc = 0;
    struct stat sb;
    if (st < 0) {
        rc = cli_fail("--plot: cannot start gnuplot: %s", strerror(errno));
    } else if (WIFSIGNALED(st)) {
        /* its log holds nothing then: the signal is the reason */
        int sig = WTERMSIG(st);
        rc = cli_fail("--plot: gnuplot was killed by signal %d (%s) drawing \"%s\"%s", sig,
                      strsignal(sig), path,
                      sig == SIGXFSZ ? "; raise the file size limit (ulimit -f)" : "");
    } else if (WEXITSTATUS(st) != 0 || stat(pd.out, &sb) != 0 || sb.st_size == 0) {
        char msg[512];
        last_log_line(pd.log, msg, sizeof msg);
        rc = cli_fail("--plot: gnuplot failed drawing \"%s\": %s", path, msg);
    } else {
        size_t len;
        FILE *f = fopen(pd.out, "rb");
        char *bytes = f ? malloc((size_t)sb.st_size) : NULL;
        len = bytes ? fread(bytes, 1, (size_t)sb.st_size, f) : 0;
        if (!bytes || len != (size_t)sb.st_size)
            rc = cli_fail("--plot: cannot read gnuplot's output: %s", strerror(errno));
        else if (!plot_complete(ext, bytes, len))
            rc = cli_fail("--plot: gnuplot wrote an incomplete plot for \"%s\" (%zu bytes); is "
                          "the disk full or a file size limit set?",
                          path, len);
        else
            rc = stage(out, "--plot", path, bytes, len);
        free(bytes);
        if (f) fclose(f);
    }
    plot_dir_destroy(&pd);
    return rc;
}

int plot_memory(const bench *b, outputs *out, const char *path, const run_results *rs)
{
    const mode_result *res = rs->res;
    size_t nres = rs->nres;
    size_t cap = 8192 + (size_t)DP_MAX_DEVICES * 128, len = 0;
    char *s = malloc(cap);
    if (!s) return cli_fail("out of host memory");
    len += (size_t)snprintf(s + len, cap - len, "$d << EOD\ndevice");
    char name[32];
    for (size_t r = 0; r < nres; r++)
        len += (size_t)snprintf(s + len, cap - len, " %s",
                                run_name(res[r].mode, res[r].shard, name, sizeof name));
    len += (size_t)snprintf(s + len, cap - len, "\n");
    for (size_t i = 0; i < res[0].k; i++) {
        len += (size_t)snprintf(s + len, cap - len, "%s", res[0].dev[i].name);
        for (size_t r = 0; r < nres; r++)
            len += (size_t)snprintf(s + len, cap - len, " %.4f", (double)res[r].dev[i].peak / 1e9);
        len += (size_t)snprintf(s + len, cap - len, "\n");
    }
    len += (size_t)snprintf(
        s + len, cap - len,
        "EOD\n"
        "set title 'Peak memory per device: GPT V=%ld T=%ld B=%zu C=%ld L=%ld (device 0 is the root)'\n"
        "set ylabel 'peak bytes (GB)'\nset style data histograms\n"
        "set style histogram clustered gap 1\nset style fill solid 0.8 border -1\n"
        "set key top right\nset grid ytics\nset yrange [0:*]\n"
        "plot for [c=2:%zu] $d using c:xtic(1) title columnheader\n",
        b->o.vocab, b->o.context, res[0].rows, b->o.dim, b->o.layers, nres + 1);
    int rc = render(out, path, s);
    free(s);
    return rc;
}

int plot_scaling(const bench *b, outputs *out, const char *path, const run_results *rs)
{
    const scale_point *sc = rs->sc;
    size_t nsc = rs->nsc;
    char s[8192];
    size_t len = 0;
    len += (size_t)snprintf(s + len, sizeof s - len, "$d << EOD\n");
    for (size_t i = 0; i < nsc; i++)
        len += (size_t)snprintf(s + len, sizeof s - len, "%zu %.1f %.1f\n", sc[i].global,
                                sc[i].tokens_per_s,
                                sc[0].tokens_per_s * (double)sc[i].global / (double)sc[0].global);
    /* An explicit x range: one device alone would give gnuplot an empty
     * range (and a warning). */
    snprintf(s + len, sizeof s - len,
             "EOD\n"
             "set title 'Scaling (%s mode): GPT V=%ld T=%ld B=%zu C=%ld L=%ld'\n"
             "set xlabel 'devices'\nset ylabel 'tokens/s'\nset key top left\nset grid\n"
             "set xtics %zu\nset xrange [0.5:%zu.5]\nset yrange [0:*]\n"
             "plot $d using 1:2 with linespoints lw 2 pt 7 title 'measured', "
             "$d using 1:3 with lines dt 2 title 'linear'\n",
             dp_mode_name(rs->scale_mode), b->o.vocab, b->o.context, rs->scale_rows, b->o.dim,
             b->o.layers,
             sc[0].global, sc[nsc - 1].global);
    return render(out, path, s);
}

/* PATH.ext -> PATH-scaling.ext */
char *scaling_path(const char *path)
{
    const char *dot = strrchr(path, '.');
    size_t stem = (size_t)(dot - path), n = strlen(path) + 16;
    char *out = malloc(n);
    if (out) snprintf(out, n, "%.*s-scaling%s", (int)stem, path, dot);
    return out;
}
