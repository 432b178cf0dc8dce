/*
 * cli/dp_cli.h - command-line helpers shared by the programs in
 * examples/ and bench/: a one-line error on stderr prefixed with the
 * program's name, strict number parsing for getopt_long values, and a
 * monotonic clock. Header-only; include it from one file per program and
 * set cli_prog first thing in main.
 */
#ifndef DP_CLI_H
#define DP_CLI_H

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <dp/dp.h>

static const char *cli_prog = "dp";
/* When set, cli_fail prints nothing (and still returns 1): under mpirun,
 * ranks other than 0 meeting an error every rank meets alike (a bad
 * command line) leave the one message to rank 0. */
static int cli_quiet;

/* Prints "<prog>: <message>" as one line on stderr; returns 1. */
static inline int cli_fail(const char *fmt, ...)
{
    if (cli_quiet) return 1;
    /* One write per message, so the lines of several processes (ranks
     * under mpirun) do not interleave. */
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(msg, sizeof msg, "%s: ", cli_prog);
    if (n >= 0 && (size_t)n < sizeof msg) vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", msg);
    return 1;
}

/* cli_fail with dp's last error message after `what`. */
static inline int cli_dp_fail(const char *what) { return cli_fail("%s: %s", what, dp_last_error()); }

/* Ranks under an MPI launcher (dp/dist.h), as lm_train and dp_bench use them. */
typedef struct cli_ranks {
    dp_dist *dist; /* NULL without a launcher */
    int rank, ranks;
    int broken; /* the ranks may no longer agree: the job must end (dp_dist_abort) */
} cli_ranks;

/* Agreement on this rank's outcome of work only some ranks do, or that
 * may fail on one rank alone: 0 when every rank succeeded, else 1 (the
 * failing rank printed why; the others stay silent). One process: failed. */
static inline int cli_ranks_agree(cli_ranks *rk, int failed)
{
    if (rk->ranks <= 1) return failed;
    dp_status local = failed ? dp_set_error(DP_ERR_ABORTED, "failed") : DP_OK;
    dp_status s = dp_dist_agree(rk->dist, local);
    if (s == DP_OK) return 0;
    if (s != DP_ERR_ABORTED) {
        rk->broken = 1;
        cli_dp_fail("agreement between the ranks");
    }
    return 1;
}

/* An error every rank meets alike (an engine call's, agreed inside the
 * engine, or one the ranks agreed on): rank 0 prints it; returns 1. */
#define CLI_AGREED_FAIL(rk, ...) ((rk)->rank ? 1 : cli_fail(__VA_ARGS__))

/* A failed engine call. Its error reached every rank alike, except a
 * failed exchange between the ranks (DP_ERR_COMM) or a rank that stopped
 * answering (DP_ERR_TIMEOUT): then the ranks may be in different places,
 * every rank prints, and the job must end (broken: dp_dist_abort). */
static inline int cli_ranks_engine_fail(cli_ranks *rk, dp_status s, const char *what)
{
    if (rk->ranks > 1 && (s == DP_ERR_COMM || s == DP_ERR_TIMEOUT)) {
        rk->broken = 1;
        return cli_dp_fail(what);
    }
    return CLI_AGREED_FAIL(rk, "%s: %s", what, dp_last_error());
}

/* Under a launcher with more than one rank: joins the job; ranks other
 * than 0 send stdout to /dev/null and every rank's messages name it
 * ("prog: rank 1: ..."). Without a launcher: one rank, nothing opened. */
static inline int cli_ranks_join(cli_ranks *rk, int *argc, char ***argv)
{
    static char prog[64];
    rk->dist = NULL;
    rk->rank = 0;
    rk->ranks = 1;
    rk->broken = 0;
    if (dp_dist_launched_size() <= 1) return 0;
    if (dp_dist_open(argc, argv, &rk->dist) != DP_OK) return cli_dp_fail("joining the ranks");
    rk->rank = dp_dist_rank(rk->dist);
    rk->ranks = dp_dist_size(rk->dist);
    if (rk->ranks == 1) return 0;
    snprintf(prog, sizeof prog, "%s: rank %d", cli_prog, rk->rank);
    cli_prog = prog;
    if (rk->rank > 0 && !freopen("/dev/null", "w", stdout)) {
        /* Collective outcome: a rank that cannot silence its stdout stops them all. */
        cli_fail("cannot send stdout to /dev/null: %s", strerror(errno));
        return cli_ranks_agree(rk, 1), 1;
    }
    return cli_ranks_agree(rk, 0);
}

/* A whole decimal integer in [lo, hi]; otherwise a message naming the option. */
static inline int cli_parse_long(const char *name, const char *v, long lo, long hi, long *out)
{
    char *end = NULL;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        if (hi == LONG_MAX) return cli_fail("%s: \"%s\" is not an integer >= %ld", name, v, lo);
        return cli_fail("%s: \"%s\" is not an integer in [%ld, %ld]", name, v, lo, hi);
    }
    *out = x;
    return 0;
}

/* A whole finite number >= lo; otherwise a message naming the option. */
static inline int cli_parse_double(const char *name, const char *v, double lo, double *out)
{
    char *end = NULL;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(x) || x < lo)
        return cli_fail("%s: \"%s\" is not a number >= %g", name, v, lo);
    *out = x;
    return 0;
}

/* --device-weights: a comma-separated list of finite weights >= 0, at least
 * one > 0, with exactly `want` entries (the device count; 0 = any count up
 * to DP_MAX_DEVICES). *n_out is the number read. */
static inline int cli_parse_weights(const char *name, const char *v, size_t want,
                                    float out[DP_MAX_DEVICES], size_t *n_out)
{
    size_t n = 0;
    int any_positive = 0;
    const char *p = v;
    for (;;) {
        char *end = NULL;
        errno = 0;
        double x = strtod(p, &end);
        if (errno || end == p || !isfinite(x) || x < 0 || x > 1e6 ||
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

/* --watchdog: 0 (off) or DP_WATCHDOG_MIN_SECONDS..DP_WATCHDOG_MAX_SECONDS. */
static inline int cli_parse_watchdog(const char *v, double *out)
{
    double x = 0;
    if (cli_parse_double("--watchdog", v, 0, &x)) return 1;
    if (x != 0 && (x < DP_WATCHDOG_MIN_SECONDS || x > DP_WATCHDOG_MAX_SECONDS))
        return cli_fail("--watchdog: %s seconds is out of range; use 0 (off) or %g to %g", v,
                        DP_WATCHDOG_MIN_SECONDS, DP_WATCHDOG_MAX_SECONDS);
    *out = x;
    return 0;
}

/* --logits-chunk ROWS|auto|whole, as dp_engine_config.logits_chunk_rows:
 * auto = 0 (the engine's automatic chunks), whole = DP_LOGITS_WHOLE, else
 * a row count >= 1 in decimal digits (no sign, no spaces). Counts stop at
 * LLONG_MAX so that tools can write them as JSON integers; any count that
 * large means whole logits anyway. */
static inline int cli_parse_logits_chunk(const char *v, size_t *out)
{
    if (strcmp(v, "auto") == 0) {
        *out = 0;
        return 0;
    }
    if (strcmp(v, "whole") == 0) {
        *out = DP_LOGITS_WHOLE;
        return 0;
    }
    /* strtoull would take "-3" (as its negation) and leading spaces. */
    char *end = NULL;
    errno = 0;
    unsigned long long x = v[0] >= '0' && v[0] <= '9' ? strtoull(v, &end, 10) : 0;
    if (!end || *end || x == 0)
        return cli_fail("--logits-chunk: \"%s\" is not a positive row count, auto or whole "
                        "(e.g. --logits-chunk 1024)", v);
    const unsigned long long cap = (unsigned long long)LLONG_MAX < (unsigned long long)SIZE_MAX - 1
                                       ? (unsigned long long)LLONG_MAX
                                       : (unsigned long long)SIZE_MAX - 1;
    if (errno == ERANGE || x > cap)
        return cli_fail("--logits-chunk: %s rows is too many (at most %llu); use whole for "
                        "unchunked logits", v, cap);
    *out = (size_t)x;
    return 0;
}

/* --precision fp32|bf16: *bf16 = 1 for mixed precision (bf16 replicas with
 * float32 masters, bf16 GEMMs), 0 for float32 throughout. */
static inline int cli_parse_precision(const char *v, int *bf16)
{
    if (strcmp(v, "fp32") == 0 || strcmp(v, "bf16") == 0) {
        *bf16 = v[0] == 'b';
        return 0;
    }
    return cli_fail("--precision: \"%s\" is not fp32 or bf16 (bf16: bfloat16 replicas and "
                    "GEMMs, float32 master weights and optimizer)", v);
}

/* --recompute none|attention|gelu|all: what the GPT recomputes in the
 * backward instead of keeping (dp/gpt.h): *what = CLI_RECOMPUTE_* bits. */
enum { CLI_RECOMPUTE_ATTENTION = 1, CLI_RECOMPUTE_GELU = 2 };

/* The --recompute value naming the CLI_RECOMPUTE_* bits what. */
static inline const char *cli_recompute_name(int what)
{
    static const char *const names[] = {"none", "attention", "gelu", "all"};
    return names[what & 3];
}

/* The banners' words for the CLI_RECOMPUTE_* bits what (non-zero). */
static inline const char *cli_recompute_words(int what)
{
    static const char *const words[] = {"nothing", "attention", "GELU", "attention and GELU"};
    return words[what & 3];
}

static inline int cli_parse_recompute(const char *v, int *what)
{
    for (int i = 0; i < 4; i++)
        if (strcmp(v, cli_recompute_name(i)) == 0) {
            *what = i;
            return 0;
        }
    return cli_fail("--recompute: \"%s\" is not none, attention, gelu or all (what the "
                    "backward recomputes instead of keeping: the attention probabilities, the "
                    "GELU output, or both)", v);
}

/* A macro's value as a string literal (CLI_STR(DP_GPT_ATTENTION_CHUNK) is "64"). */
#define CLI_STR_(x) #x
#define CLI_STR(x) CLI_STR_(x)

/* --attention whole|chunked: *chunked = 1 for chunked attention
 * (DP_GPT_CHUNKED_ATTENTION). */
static inline int cli_parse_attention(const char *v, int *chunked)
{
    if (strcmp(v, "whole") == 0 || strcmp(v, "chunked") == 0) {
        *chunked = v[0] == 'c';
        return 0;
    }
    return cli_fail("--attention: \"%s\" is not whole or chunked (chunked: the attention is "
                    "formed %d queries at a time, so no (T,T) probabilities exist)",
                    v, DP_GPT_ATTENTION_CHUNK);
}

/* The dp_gpt_model_ex flags of --precision bf16, --recompute bits and
 * --attention chunked. */
static inline unsigned cli_gpt_flags(int bf16, int recompute, int chunked)
{
    return (bf16 ? DP_GPT_BF16_ACT : 0u) | (chunked ? DP_GPT_CHUNKED_ATTENTION : 0u) |
           ((recompute & CLI_RECOMPUTE_ATTENTION) ? DP_GPT_RECOMPUTE_ATTENTION : 0u) |
           ((recompute & CLI_RECOMPUTE_GELU) ? DP_GPT_RECOMPUTE_GELU : 0u);
}

/* Seconds on the monotonic clock. */
static inline double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif /* DP_CLI_H */
