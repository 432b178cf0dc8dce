/*
 * cli/ranks.c - the rank glue of cli/dp_cli.h under an MPI launcher:
 * joining, the options every rank was started with compared in the first
 * collective call, and agreements bounded by the wait (--watchdog, else
 * CLI_RANKS_WAIT_DEFAULT).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_internal.h"
#include "dp_cli.h"

/* The longest statement of options (below) the ranks compare: far more
 * than any command line holds (16 paths of PATH_MAX bytes). */
#define STATEMENT_MAX ((size_t)64 * 1024)

/* The room for one rank's message in an agreement (dist_mpi.c carries
 * 600 bytes, "rank r: " included). */
#define MSG_MAX 560

/* This rank's failure before the first collective call (cli_ranks_join),
 * carried to it so that no rank waits for one that has left. */
static char early[MSG_MAX];

// --- joining --------------------------------------------------------------------------

int cli_ranks_join(cli_ranks *rk, int *argc, char ***argv)
{
    rk->dist = NULL;
    rk->rank = 0;
    rk->ranks = 1;
    rk->broken = 0;
    rk->wait = CLI_RANKS_WAIT_DEFAULT;
    early[0] = '\0';
    if (dp_dist_launched_size() <= 1) return 0;
    if (dp_dist_open(argc, argv, &rk->dist) != DP_OK) return cli_dp_fail("joining the ranks");
    rk->rank = dp_dist_rank(rk->dist);
    rk->ranks = dp_dist_size(rk->dist);
    if (rk->ranks == 1) return 0;
    cli_set_rank(rk->rank);
    if (rk->rank > 0 && !freopen("/dev/null", "w", stdout))
        snprintf(early, sizeof early, "rank %d cannot send its standard output to /dev/null: %s",
                 rk->rank, strerror(errno));
    return 0;
}

void cli_ranks_set_wait(cli_ranks *rk, double watchdog)
{
    rk->wait = watchdog > 0 ? watchdog : CLI_RANKS_WAIT_DEFAULT;
}

/* A wait between the ranks that failed (a rank stuck past the bound, or
 * MPI's error): the ranks may now be in different places, so the job
 * must end. Every rank that sees it prints. Returns 1. */
static int lost(cli_ranks *rk, const char *what)
{
    rk->broken = 1;
    return cli_dp_fail(what);
}

// --- agreements -------------------------------------------------------------------------

static int agree_within(cli_ranks *rk, int failed, double seconds)
{
    if (rk->ranks <= 1) return failed;
    dp_status local = failed ? dp_set_error(DP_ERR_ABORTED, "failed") : DP_OK;
    dp_status s = dp_dist_agree_timeout(rk->dist, local, seconds);
    if (s == DP_OK) return 0;
    if (s != DP_ERR_ABORTED) lost(rk, "agreement between the ranks");
    return 1;
}

int cli_ranks_agree(cli_ranks *rk, int failed) { return agree_within(rk, failed, rk->wait); }

int cli_ranks_agree_alike(cli_ranks *rk, int failed)
{
    if (rk->ranks <= 1) {
        if (failed) cli_print_line(cli_last_message());
        return failed;
    }
    dp_status local = failed ? dp_set_error(DP_ERR_ABORTED, "failed") : DP_OK;
    dp_status s = dp_dist_agree_timeout(rk->dist, local, rk->wait);
    if (s == DP_OK) return 0;
    if (s != DP_ERR_ABORTED) return lost(rk, "agreement between the ranks");
    /* The agreed message is the lowest failing rank's: "rank r: ...". */
    int first = -1;
    if (sscanf(dp_last_error(), "rank %d:", &first) != 1) first = -1;
    if (failed && (rk->rank == 0 || first != 0)) cli_print_line(cli_last_message());
    return 1;
}

int cli_ranks_agree_writes(cli_ranks *rk, int failed)
{
    double w = rk->wait > CLI_RANKS_WAIT_DEFAULT ? rk->wait : CLI_RANKS_WAIT_DEFAULT;
    return agree_within(rk, failed, w);
}

int cli_ranks_engine_fail(cli_ranks *rk, dp_status s, const char *what, const char *oom_fix)
{
    if (rk->ranks > 1 && (s == DP_ERR_COMM || s == DP_ERR_TIMEOUT)) return lost(rk, what);
    if (s == DP_ERR_OUT_OF_MEMORY && oom_fix)
        return CLI_AGREED_FAIL(rk, "%s: %s; in %s: %s", what, dp_last_error(), cli_program(),
                               oom_fix);
    return CLI_AGREED_FAIL(rk, "%s: %s", what, dp_last_error());
}

void cli_ranks_leave(cli_ranks *rk, int code)
{
    /* MPI_Finalize waits for every rank, without a bound: first a last
     * bounded agreement, so a rank that never comes (stuck, stopped) ends
     * the job instead of holding the others there. */
    if (rk->ranks > 1 && !rk->broken) agree_within(rk, 0, rk->wait);
    if (rk->broken) {
        fflush(stdout);
        fflush(stderr);
        dp_dist_abort(rk->dist, code ? code : 1);
    }
    dp_dist_close(rk->dist);
    rk->dist = NULL;
}

// --- the options, compared ----------------------------------------------------------------

/* A rank's statement of how it was started: "program NAME", a line per
 * option (cli_options_text, without the per-rank ones), and, when it
 * refused its command line, "refused MESSAGE" (newlines escaped). */

/* Whether the option line at p names one of per_rank. */
static int per_rank_line(const char *p, size_t len, const char *const *per_rank)
{
    for (size_t i = 0; per_rank && per_rank[i]; i++) {
        size_t n = strlen(per_rank[i]);
        if (len >= n && memcmp(p, per_rank[i], n) == 0 && (len == n || p[n] == ' ')) return 1;
    }
    return 0;
}

static char *statement(int parsed, const char *const *per_rank)
{
    const char *opts = cli_options_text(), *msg = cli_last_message();
    size_t cap = strlen(cli_program()) + strlen(opts) + 2 * strlen(msg) + 32;
    char *s = malloc(cap);
    if (!s) return NULL;
    size_t n = (size_t)snprintf(s, cap, "program %s\n", cli_program());
    for (const char *p = opts; *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = (size_t)(nl - p);
        if (!per_rank_line(p, len, per_rank)) {
            memcpy(s + n, p, len + 1);
            n += len + 1;
        }
        p = nl + 1;
    }
    if (parsed > 0) {
        n += (size_t)sprintf(s + n, "refused ");
        for (const char *p = msg; *p; p++) {
            if (*p == '\n' || *p == '\\') s[n++] = '\\';
            s[n++] = *p == '\n' ? 'n' : *p;
        }
        s[n++] = '\n';
    }
    s[n] = '\0';
    return s;
}

/* The lines of a statement, as (start, length) pairs: *n of them; NULL
 * when memory ran out. */
typedef struct line {
    const char *p;
    size_t len;
} line;

static line *lines_of(const char *s, size_t *n)
{
    size_t k = 0;
    for (const char *p = s; *p; p++) k += *p == '\n';
    line *l = malloc((k + 1) * sizeof *l);
    if (!l) return NULL;
    *n = 0;
    for (const char *p = s; *p;) {
        const char *nl = strchr(p, '\n');
        l[(*n)++] = (line){p, (size_t)(nl - p)};
        p = nl + 1;
    }
    return l;
}

static int same(line a, line b) { return a.len == b.len && memcmp(a.p, b.p, a.len) == 0; }

/* The option's name: the line up to its first space. */
static size_t name_len(line a)
{
    const char *sp = memchr(a.p, ' ', a.len);
    return sp ? (size_t)(sp - a.p) : a.len;
}

static int same_name(line a, line b)
{
    size_t n = name_len(a);
    return n == name_len(b) && memcmp(a.p, b.p, n) == 0;
}

/* The value of an option line, at most 120 bytes of it, as " VALUE"
 * (paren: " (VALUE)"); "" without one. */
static void value_of(line a, int paren, char *buf, size_t cap)
{
    size_t n = name_len(a);
    if (n == a.len) {
        buf[0] = '\0';
        return;
    }
    size_t v = a.len - n - 1;
    snprintf(buf, cap, paren ? " (%.*s%s)" : " %.*s%s", (int)(v > 120 ? 120 : v), a.p + n + 1,
             v > 120 ? "..." : "");
}

/* How rank r's statement `b` differs from rank 0's `a` (they differ), in
 * words, into msg. */
static void difference(const line *a, size_t na, const line *b, size_t nb, int r, char *msg,
                       size_t cap)
{
    int n = snprintf(msg, cap, "rank %d's options differ from rank 0's: ", r);
    char *m = msg + n;
    size_t room = cap - (size_t)n;
    if (!same(a[0], b[0])) {
        snprintf(m, room, "rank %d runs %.*s, rank 0 %.*s", r, (int)(b[0].len - 8), b[0].p + 8,
                 (int)(a[0].len - 8), a[0].p + 8);
        return;
    }
    /* A refusal is the last line. */
    const line *ra = na > 1 && a[na - 1].len >= 8 && memcmp(a[na - 1].p, "refused ", 8) == 0
                         ? &a[na - 1] : NULL;
    const line *rb = nb > 1 && b[nb - 1].len >= 8 && memcmp(b[nb - 1].p, "refused ", 8) == 0
                         ? &b[nb - 1] : NULL;
    /* A refusal is said alone: the option refused may be one of those a
     * rank gives its own way (its --devices), which do not "differ". */
    if (ra && (!rb || !same(*ra, *rb))) {
        snprintf(msg, cap, "rank 0 refuses its command line: %.*s", (int)(ra->len - 8),
                 ra->p + 8);
        return;
    }
    if (rb && !ra) {
        snprintf(msg, cap, "rank %d refuses its command line: %.*s", r, (int)(rb->len - 8),
                 rb->p + 8);
        return;
    }
    /* The option lines, in the table's order: the first that differs. */
    size_t ea = ra ? na - 1 : na, eb = rb ? nb - 1 : nb, i = 1, j = 1;
    while (i < ea && j < eb && same(a[i], b[j])) i++, j++;
    if (i >= ea && j >= eb) {
        snprintf(m, room, "the same options, stated differently");
        return;
    }
    char va[160], vb[160];
    if (i < ea && j < eb && same_name(a[i], b[j])) {
        value_of(a[i], 0, va, sizeof va);
        value_of(b[j], 0, vb, sizeof vb);
        snprintf(m, room, "%.*s is%s on rank %d,%s on rank 0", (int)name_len(a[i]), a[i].p, vb, r,
                 va);
        return;
    }
    /* One side has an option the other lacks: rank 0's, unless the other
     * holds it further on. */
    int only_a = i < ea;
    for (size_t k = j; only_a && k < eb; k++)
        if (same_name(a[i], b[k])) only_a = 0;
    const line *x = only_a ? &a[i] : &b[j];
    value_of(*x, 1, va, sizeof va);
    snprintf(m, room, "%.*s is given on rank %d%s, not on rank %d", (int)name_len(*x), x->p,
             only_a ? 0 : r, va, only_a ? r : 0);
}

/* Rank 0's statement, received into this (a fixed buffer: nothing is
 * allocated between the broadcasts, where a failure would leave the
 * others waiting). */
static char peer[STATEMENT_MAX + 1];

int cli_ranks_options(cli_ranks *rk, int parsed, const char *const *per_rank)
{
    if (rk->ranks <= 1) {
        if (parsed > 0) cli_print_line(cli_last_message());
        return parsed;
    }
    char *mine = statement(parsed, per_rank);
    if (mine && strlen(mine) > STATEMENT_MAX) {
        free(mine);
        mine = NULL;
        snprintf(early, sizeof early, "rank %d's options are longer than %zu bytes", rk->rank,
                 STATEMENT_MAX);
    } else if (!mine) {
        snprintf(early, sizeof early, "rank %d is out of host memory", rk->rank);
    }
    /* Rank 0's statement to every rank: its length, then its bytes. */
    uint64_t len = rk->rank == 0 && mine ? strlen(mine) : 0;
    dp_status s = dp_dist_broadcast_timeout(rk->dist, &len, sizeof len, rk->wait);
    if (s == DP_OK && rk->rank == 0 && mine) memcpy(peer, mine, (size_t)len);
    if (s == DP_OK) s = dp_dist_broadcast_timeout(rk->dist, peer, (size_t)len, rk->wait);
    if (s != DP_OK) {
        free(mine);
        return lost(rk, "comparing the ranks' options");
    }
    peer[len] = '\0';
    char msg[MSG_MAX] = "";
    if (rk->rank > 0 && mine && len && strcmp(mine, peer) != 0) {
        size_t na = 0, nb = 0;
        line *a = lines_of(peer, &na), *b = lines_of(mine, &nb);
        if (a && b && na && nb)
            difference(a, na, b, nb, rk->rank, msg, sizeof msg);
        else
            snprintf(msg, sizeof msg, "rank %d's options differ from rank 0's", rk->rank);
        free(a);
        free(b);
    } else if (rk->rank > 0 && mine && !len) {
        snprintf(msg, sizeof msg, "rank 0 could not state its options");
    }
    if (!msg[0] && early[0]) snprintf(msg, sizeof msg, "%s", early);
    free(mine);
    dp_status local = msg[0] ? dp_set_error(DP_ERR_INVALID_ARGUMENT, "%s", msg) : DP_OK;
    s = dp_dist_agree_timeout(rk->dist, local, rk->wait);
    if (s == DP_ERR_INVALID_ARGUMENT) {
        /* Every rank says it, without the agreement's "rank r: ". */
        const char *e = dp_last_error(), *colon = strstr(e, ": ");
        cli_print_line(strncmp(e, "rank ", 5) == 0 && colon ? colon + 2 : e);
        return 1;
    }
    if (s != DP_OK) return lost(rk, "comparing the ranks' options");
    /* The same options everywhere: the same outcome, told once, by rank 0. */
    if (parsed > 0 && rk->rank == 0) cli_print_line(cli_last_message());
    return parsed;
}
