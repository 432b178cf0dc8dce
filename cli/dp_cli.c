/*
 * cli/dp_cli.c - the command-line helpers of cli/dp_cli.h: one-line
 * errors prefixed with the program's name, strict number and option-value
 * parsing for getopt_long (the GPT's compute options: compute.c), the
 * options as given (normalised, so the ranks
 * can compare them), and a monotonic clock. This file owns the state the
 * programs share: the name messages start with, the rank they name,
 * whether they are printed, the last one, and the options last parsed.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "dp_cli.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli_internal.h"

// --- the program's name and quiet flag ---------------------------------------------

/* What each message starts with: the program's name, and under a launcher
 * with ranks its rank (cli_set_rank: "lm_train: rank 1"). */
static char prog[64] = "dp";
static int rank_tag = -1;
/* When set, cli_fail prints nothing (and still returns 1). */
static int quiet;
/* The last message's text, printed or not (cli_last_message): room for
 * three paths of PATH_MAX (an output, an input, a temporary file) and
 * the reason after them, which a shorter buffer cut off. */
static char last_msg[3 * PATH_MAX + 4096];

/* Descriptors 0-2, each open: /dev/null in place of a closed one. */
static void standard_descriptors(void)
{
    for (int fd = 0; fd <= 2; fd++) {
        if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
        int n = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
        if (n >= 0 && n != fd) { /* a lower one was closed too: taken by the loop already */
            dup2(n, fd);
            close(n);
        }
    }
}

void cli_set_program(const char *name)
{
    standard_descriptors();
    size_t n = strnlen(name, sizeof prog - 1);
    memmove(prog, name, n); /* name may be cli_program() itself */
    prog[n] = '\0';
    /* A reader that quits (| head) makes the next write fail with EPIPE,
     * which the program's check of its stream names (status 1, its files
     * not written), instead of SIGPIPE's silent 141; a gnuplot that stops
     * reading its script alike. Before the guards, which leave an ignored
     * signal ignored. */
    signal(SIGPIPE, SIG_IGN);
    cli_guard_signals(); /* a fatal signal leaves no temporary file */
}

const char *cli_program(void) { return prog; }

void cli_set_rank(int rank) { rank_tag = rank; }

void cli_set_quiet(int on) { quiet = on != 0; }

int cli_is_quiet(void) { return quiet; }

const char *cli_last_message(void) { return last_msg; }

// --- messages -----------------------------------------------------------------------

void cli_print_line(const char *text)
{
    /* One write per message, so the lines of several processes (ranks
     * under mpirun) do not interleave. */
    char tag[32] = "";
    if (rank_tag >= 0) snprintf(tag, sizeof tag, "rank %d: ", rank_tag);
    fprintf(stderr, "%s: %s%s\n", prog, tag, text);
}

int cli_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_msg, sizeof last_msg, fmt, ap);
    va_end(ap);
    if (!quiet) cli_print_line(last_msg);
    return 1;
}

int cli_dp_fail(const char *what) { return cli_fail("%s: %s", what, dp_last_error()); }

// --- option values ------------------------------------------------------------------

/* A number's text starts with a digit, a sign or a point: strtol and
 * strtod would skip leading white space, which a trailing one (left in
 * *end) does not get. */
static int starts_number(const char *v)
{
    return (*v >= '0' && *v <= '9') || *v == '+' || *v == '-' || *v == '.';
}

int cli_parse_long(const char *name, const char *v, long lo, long hi, long *out)
{
    char *end = NULL;
    errno = 0;
    long x = starts_number(v) ? strtol(v, &end, 10) : 0;
    if (!end || errno || end == v || *end || x < lo || x > hi) {
        /* past LONG_MAX: the bound it passed, not only the one below */
        if (hi == LONG_MAX && errno != ERANGE)
            return cli_fail("%s: \"%s\" is not an integer >= %ld", name, v, lo);
        return cli_fail("%s: \"%s\" is not an integer in [%ld, %ld]", name, v, lo, hi);
    }
    *out = x;
    return 0;
}

double cli_host_available_bytes(void)
{
    size_t bytes = dp_host_memory_available();
    return bytes ? (double)bytes : INFINITY;
}

int cli_bad_option(char **argv, const char *shorts)
{
    const char *arg = argv[optind - 1];
    if (strncmp(arg, "--", 2) == 0) {
        if (!optopt) cli_fail("unknown option \"%s\" (see --help)", arg);
        else if (strchr(arg, '=')) cli_fail("\"%s\": this option takes no value (see --help)", arg);
        else cli_fail("%s needs a value (see --help)", arg);
        return 2;
    }
    /* a short option, named by optopt alone: argv[optind - 1] may be the
     * argument before a group such as -xy */
    char ch = optopt > ' ' && optopt < 127 ? (char)optopt : '?';
    if (ch != ':' && strchr(shorts, ch)) cli_fail("-%c needs a value (see --help)", ch);
    else cli_fail("unknown option \"-%c\" (%ssee --help)", ch, *shorts ? "" : "options are long: ");
    return 2;
}

int cli_parse_int(const char *name, const char *v, int lo, int hi, int *out)
{
    long x = 0;
    if (cli_parse_long(name, v, lo, hi, &x)) return 1;
    *out = (int)x;
    return 0;
}

int cli_parse_double(const char *name, const char *v, double lo, double *out)
{
    char *end = NULL;
    errno = 0;
    double x = starts_number(v) ? strtod(v, &end) : 0.0;
    if (!end || errno || end == v || *end || !isfinite(x) || x < lo)
        return cli_fail("%s: \"%s\" is not a number >= %g", name, v, lo);
    *out = x;
    return 0;
}

int cli_parse_float(const char *name, const char *v, double lo, double *out)
{
    double x = 0;
    if (cli_parse_double(name, v, lo, &x)) return 1;
    if (x > FLT_MAX)
        return cli_fail("%s: %s is past the largest float (%g); give a smaller value", name, v,
                        (double)FLT_MAX);
    *out = x;
    return 0;
}

int cli_parse_weights(const char *name, const char *v, size_t want,
                                    float out[DP_MAX_DEVICES], size_t *n_out)
{
    size_t n = 0;
    int any_positive = 0;
    const char *p = v;
    for (;;) {
        char *end = NULL;
        errno = 0;
        double x = starts_number(p) ? strtod(p, &end) : 0.0;
        if (!end || errno || end == p || !isfinite(x) || x < 0 || x > 1e6 ||
            (*end != ',' && *end != '\0'))
            return cli_fail("%s: \"%s\" is not a comma-separated list of weights in [0, 1e6], "
                            "e.g. 1,2,2,2", name, v);
        if (n == DP_MAX_DEVICES)
            return cli_fail("%s: more than %d weights in \"%s\"", name, DP_MAX_DEVICES, v);
        out[n++] = (float)x;
        any_positive |= x > 0;
        if (*end == '\0') break;
        p = end + 1;
    }
    if (!any_positive) return cli_fail("%s: \"%s\" has no weight > 0", name, v);
    if (want && n != want)
        return cli_fail("%s: %zu weights for %zu devices; give one weight per device", name, n,
                        want);
    *n_out = n;
    return 0;
}

int cli_parse_memory_limit(const char *v, size_t *bytes)
{
    if (dp_parse_bytes(v, bytes) != DP_OK) return cli_dp_fail("--memory-limit");
    if (*bytes == 0)
        return cli_fail("--memory-limit %s is 0 bytes, which fits nothing; give a size such as "
                        "2GiB, or leave the option out for no limit", v);
    return 0;
}

int cli_parse_watchdog(const char *v, double *out)
{
    double x = 0;
    if (cli_parse_double("--watchdog", v, 0, &x)) return 1;
    if (x != 0 && (x < DP_WATCHDOG_MIN_SECONDS || x > DP_WATCHDOG_MAX_SECONDS))
        return cli_fail("--watchdog: %s seconds is out of range; use 0 (off) or %g to %g", v,
                        DP_WATCHDOG_MIN_SECONDS, DP_WATCHDOG_MAX_SECONDS);
    *out = x;
    return 0;
}

// --- the command line -----------------------------------------------------------------

/* The options last parsed, normalised (cli_options_text). */
static char *opts_text;

/* Appends "--name[ value]\n" to the buffer at *t (len *n), the value's
 * newlines and backslashes escaped. 0, or 1 when memory ran out. */
static int text_add(char **t, size_t *n, const char *name, const char *v)
{
    size_t need = strlen(name) + 4 + (v ? 2 * strlen(v) : 0);
    char *b = realloc(*t, *n + need + 1);
    if (!b) return 1;
    *t = b;
    *n += (size_t)sprintf(b + *n, "--%s", name);
    if (v) {
        b[(*n)++] = ' ';
        for (const char *p = v; *p; p++) {
            if (*p == '\n' || *p == '\\') b[(*n)++] = '\\';
            b[(*n)++] = *p == '\n' ? 'n' : *p;
        }
    }
    b[(*n)++] = '\n';
    b[*n] = '\0';
    return 0;
}

/* Builds opts_text from what getopt_long returned: seen[i] (and the
 * value last[i]) for the first table entry i of each code. */
static int build_text(const struct option *longopts, size_t n_opts, const char *const *last,
                      const unsigned char *seen)
{
    free(opts_text);
    opts_text = NULL;
    char *t = calloc(1, 1);
    size_t len = 0;
    if (!t) return 1;
    for (size_t i = 0; i < n_opts; i++)
        if (seen[i] && text_add(&t, &len, longopts[i].name, longopts[i].has_arg ? last[i] : NULL)) {
            free(t);
            return 1;
        }
    opts_text = t;
    return 0;
}

const char *cli_options_text(void) { return opts_text ? opts_text : ""; }

int cli_parse_options(int argc, char **argv, const struct option *longopts, cli_compute *cp,
                      int (*handle)(void *ctx, int c, const char *v), void *ctx)
{
    size_t n_opts = 0;
    while (longopts[n_opts].name) n_opts++;
    const char **last = calloc(n_opts + 1, sizeof *last);
    unsigned char *seen = calloc(n_opts + 1, 1);
    if (!last || !seen) {
        free(last);
        free(seen);
        return cli_fail("out of host memory parsing the command line");
    }
    opterr = 0;
    int c, rc = 0;
    /* The leading ':' makes a missing value return ':' rather than '?'. */
    while (!rc && (c = getopt_long(argc, argv, ":", longopts, NULL)) != -1) {
        /* The first table entry of the code names it: aliases read alike. */
        size_t i = 0;
        while (i < n_opts && longopts[i].val != c) i++;
        if (i < n_opts) {
            seen[i] = 1;
            last[i] = optarg;
        }
        rc = c == ':' || c == '?' ? CLI_NOT_MINE : handle(ctx, c, optarg);
        if (rc == CLI_NOT_MINE) rc = cli_compute_option(c, optarg, argv, cp);
    }
    if (build_text(longopts, n_opts, last, seen) && !rc)
        rc = cli_fail("out of host memory parsing the command line");
    free(last);
    free(seen);
    if (rc) return rc;
    if (optind < argc) return cli_fail("unexpected argument \"%s\" (see --help)", argv[optind]);
    return 0;
}

// --- time ---------------------------------------------------------------------------

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

