/*
 * examples/lm_train/ranks.c - the rank glue under an MPI launcher (the
 * cli_ranks helpers of cli/dp_cli.h, bound to the run): joining, the
 * options compared, agreed and local failures, and the agreement before
 * each step on whether to go on (a failure or a signal on any rank stops
 * every rank there), each wait bounded (cli_ranks_set_wait).
 */
#include <stdio.h>
#include <string.h>

#include "lm_train.h"

/* Joins the ranks under a launcher (cli_ranks_join). */
int join_ranks(run *r, int *argc, char ***argv)
{
    return cli_ranks_join(&r->rk, argc, argv);
}

/* The options every rank may give differently: those of its own devices
 * (the engine lays out any number of devices per rank, each rank's
 * weights its own devices', and a per-device memory limit may differ
 * between machines). Every other option must be the same on every rank. */
static const char *const PER_RANK[] = {"--devices", "--device-weights", "--memory-limit", NULL};

/* The first collective call: every rank's options compared (parsed: what
 * parse_args returned), and the bound of every wait between the ranks
 * set from --watchdog (cli_ranks_options). 0, 1 after a message, -1 to
 * stop as after --help. */
int compare_options(run *r, int parsed)
{
    cli_ranks_set_wait(&r->rk, parsed ? 0 : r->o.watchdog);
    return cli_ranks_options(&r->rk, parsed, PER_RANK);
}

/* A failed engine call (cli_ranks_engine_fail). */
int engine_fail(run *r, dp_status s, const char *what)
{
    return cli_ranks_engine_fail(&r->rk, s, what);
}

/* A failure on this rank alone where the others cannot learn of it (they
 * are on their way into a collective): with ranks the job ends with
 * dp_dist_abort. For outcomes that are the same on every rank in
 * practice (sampling a batch from the same data). */
int local_fatal(run *r, const char *what)
{
    r->rk.broken = r->rk.ranks > 1;
    return cli_dp_fail(what);
}

/* Agreement on this rank's outcome (cli_ranks_agree). */
int agree(run *r, int failed) { return cli_ranks_agree(&r->rk, failed); }

/* Agreement after rank 0 wrote a file alone (cli_ranks_agree_writes). */
int agree_writes(run *r, int failed) { return cli_ranks_agree_writes(&r->rk, failed); }

/* What go_on's agreement carries for a signal, before its number. */
#define STOP_ON "lm_train stops on signal "

/* Whether to go on, at a point where a signal stops the run: 0 go on, -1
 * a rank failed (failed on this one; it printed why), else the number of
 * the signal that stops the run. With ranks every rank's pending signal
 * is agreed, so all stop at the same step (the lowest signalled rank's
 * signal), though the launcher may deliver it at different times. */
int go_on(run *r, int failed)
{
    if (r->rk.ranks == 1) return failed ? -1 : pending_signal();
    int sig = pending_signal();
    dp_status local = DP_OK;
    if (failed) local = dp_set_error(DP_ERR_ABORTED, "failed");
    else if (sig) local = dp_set_error(DP_ERR_ABORTED, STOP_ON "%d", sig);
    dp_status s = dp_dist_agree_timeout(r->rk.dist, local, r->rk.wait);
    if (s == DP_OK) return 0;
    /* The agreed message is the lowest failing rank's, with a prefix. */
    const char *m = strstr(dp_last_error(), STOP_ON);
    int got = 0;
    if (s == DP_ERR_ABORTED && m && sscanf(m + strlen(STOP_ON), "%d", &got) == 1 && got > 0)
        return got;
    if (s != DP_ERR_ABORTED) {
        r->rk.broken = 1;
        cli_dp_fail("agreement between the ranks");
    }
    return -1;
}
