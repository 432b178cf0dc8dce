/*
 * examples/lm_train/ranks.c - the rank glue under an MPI launcher (the
 * cli_ranks helpers of cli/dp_cli.h, bound to the run): joining, the
 * options compared, agreed and local failures, and the agreement before
 * each step on whether to go on (a failure or a signal on any rank stops
 * every rank there), each wait bounded (cli_ranks_set_wait).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
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

/* The tokenizer's fingerprint: its vocabulary size and an FNV-1a hash of
 * every id's bytes, length first (any kind: char, word, BPE). */
static int tokenizer_print(const dp_tokenizer *tok, uint64_t print[2])
{
    size_t v = dp_tokenizer_vocab_size(tok);
    uint64_t h = 1469598103934665603ull;
    for (size_t id = 0; id < v; id++) {
        int32_t i = (int32_t)id;
        char *text = NULL;
        size_t n = 0;
        if (dp_tokenizer_decode(tok, &i, 1, &text, &n) != DP_OK) return 1;
        uint64_t len = n;
        for (size_t b = 0; b < sizeof len + n; b++) {
            h ^= b < sizeof len ? (unsigned char)(len >> (8 * b)) : (unsigned char)text[b - sizeof len];
            h *= 1099511628211ull;
        }
        free(text);
    }
    print[0] = v;
    print[1] = h;
    return 0;
}

/* Every rank's tokenizer against rank 0's, after the data loaded on every
 * rank: built from --data (a char or word vocabulary), the same path may
 * hold other text on another machine, and ids would then mean other
 * tokens on each rank (or the models differ in size, which the engine
 * would name as a bare parameter count). Runs without a tokenizer (token
 * data) have nothing to compare. 0, or 1 after a message. */
int compare_tokenizers(run *r)
{
    if (r->rk.ranks == 1 || !r->tok) return 0;
    uint64_t mine[2] = {0, 0}, zero[2];
    int failed = tokenizer_print(r->tok, mine);
    if (failed) cli_dp_fail("the tokenizer's fingerprint");
    memcpy(zero, mine, sizeof zero);
    dp_status s = dp_dist_broadcast_timeout(r->rk.dist, zero, sizeof zero, r->rk.wait);
    if (s != DP_OK) {
        r->rk.broken = 1;
        return cli_dp_fail("comparing the ranks' tokenizers");
    }
    if (!failed && memcmp(mine, zero, sizeof mine) != 0)
        failed = cli_fail("this rank's tokenizer differs from rank 0's (vocab %llu here, %llu on "
                          "rank 0%s): its --data holds other text; give every rank the same "
                          "text at that path", (unsigned long long)mine[0],
                          (unsigned long long)zero[0],
                          mine[0] == zero[0] ? ", other tokens" : "");
    return agree(r, failed);
}

/* A failed engine call (cli_ranks_engine_fail). */
int engine_fail(run *r, dp_status s, const char *what)
{
    return cli_ranks_engine_fail(&r->rk, s, what,
                                 "a smaller --batch-size, micro-batches (--grad-accum N or "
                                 "--max-tokens-per-device N), --recompute all, a smaller "
                                 "--logits-chunk, --shard-optimizer, more --devices, or a "
                                 "higher --memory-limit where one is set");
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
