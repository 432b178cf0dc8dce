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

#define FNV_START 1469598103934665603ull

/* FNV-1a (64-bit) of p[0..n) onto h. */
static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* The tokenizer's fingerprint: its vocabulary size and an FNV-1a hash of
 * every id's bytes, length first (any kind: char, word, BPE). */
static int tokenizer_print(const dp_tokenizer *tok, uint64_t print[2])
{
    size_t v = dp_tokenizer_vocab_size(tok);
    uint64_t h = FNV_START;
    for (size_t id = 0; id < v; id++) {
        int32_t i = (int32_t)id;
        char *text = NULL;
        size_t n = 0;
        if (dp_tokenizer_decode(tok, &i, 1, &text, &n) != DP_OK) return 1;
        unsigned char len[8]; /* little-endian, whatever the host's order */
        for (size_t b = 0; b < sizeof len; b++) len[b] = (unsigned char)((uint64_t)n >> (8 * b));
        h = fnv1a(fnv1a(h, len, sizeof len), text, n);
        free(text);
    }
    print[0] = v;
    print[1] = h;
    return 0;
}

/* Tokens read at each end of a split for its fingerprint: enough to tell
 * other files apart without reading gigabytes of mapped tokens. */
#define PRINT_TOKENS 4096

/* FNV-1a over tokens [first, first + n) of split into *h. A range that
 * cannot be read (an id past the vocabulary) hashes as a mark: the same
 * data fails the same way on every rank, and the run reports it where it
 * reads those tokens, as in one process. */
static void hash_tokens(const dp_token_data *d, dp_split split, size_t first, size_t n,
                        int32_t *buf, uint64_t *h)
{
    if (!n) return;
    size_t bytes = n * sizeof *buf;
    if (dp_token_data_read(d, split, first, n, buf) != DP_OK) {
        buf[0] = -1;
        bytes = sizeof *buf;
    }
    *h = fnv1a(*h, buf, bytes);
}

/* The data's fingerprint: the tokenizer's (0, 0 for token data), each
 * split's size, and a hash of each split's first and last tokens. */
static int data_print(const run *r, uint64_t print[6])
{
    memset(print, 0, 6 * sizeof *print);
    if (r->tok && tokenizer_print(r->tok, print)) return 1;
    int32_t *buf = malloc(PRINT_TOKENS * sizeof *buf);
    if (!buf) {
        dp_set_error(DP_ERR_OUT_OF_MEMORY, "out of host memory");
        return 1;
    }
    const dp_split splits[2] = {DP_SPLIT_TRAIN, DP_SPLIT_VAL};
    for (int i = 0; i < 2; i++) {
        size_t n = dp_token_data_size(r->data, splits[i]);
        size_t head = n < PRINT_TOKENS ? n : PRINT_TOKENS;
        uint64_t h = FNV_START;
        hash_tokens(r->data, splits[i], 0, head, buf, &h);
        hash_tokens(r->data, splits[i], n - head, head, buf, &h);
        print[2 + 2 * i] = n;
        print[3 + 2 * i] = h;
    }
    free(buf);
    return 0;
}

/* Every rank's data against rank 0's, after the data loaded on every
 * rank. The same path may hold other text or tokens on another machine:
 * a char or word vocabulary built from other text gives ids other tokens
 * (or models of other sizes, which the engine would name as a bare
 * parameter count), and other token files sample other batches (the
 * engine's batch check blames the seed) or, with --eval-only, other
 * numbers of validation windows (one rank finished while the others
 * waited for its next batch). 0, or 1 after a message. */
int compare_data(run *r)
{
    if (r->rk.ranks == 1) return 0;
    uint64_t mine[6], zero[6];
    int failed = data_print(r, mine);
    if (failed) cli_dp_fail("the data's fingerprint");
    memcpy(zero, mine, sizeof zero);
    dp_status s = dp_dist_broadcast_timeout(r->rk.dist, zero, sizeof zero, r->rk.wait);
    if (s != DP_OK) {
        r->rk.broken = 1;
        return cli_dp_fail("comparing the ranks' data");
    }
    if (!failed && memcmp(mine, zero, 2 * sizeof *mine) != 0)
        failed = cli_fail("this rank's tokenizer differs from rank 0's (vocab %llu here, %llu on "
                          "rank 0%s): its --data holds other text; give every rank the same "
                          "text at that path", (unsigned long long)mine[0],
                          (unsigned long long)zero[0],
                          mine[0] == zero[0] ? ", other tokens" : "");
    else if (!failed && memcmp(mine, zero, sizeof mine) != 0)
        failed = cli_fail("this rank's --data differs from rank 0's (train split %llu tokens "
                          "here, %llu on rank 0; validation split %llu, %llu%s): give every rank "
                          "the same data at that path", (unsigned long long)mine[2],
                          (unsigned long long)zero[2], (unsigned long long)mine[4],
                          (unsigned long long)zero[4],
                          mine[2] == zero[2] && mine[4] == zero[4] ? "; other tokens" : "");
    return agree(r, failed);
}

/* A failed engine call (cli_ranks_engine_fail). */
int engine_fail(run *r, dp_status s, const char *what)
{
    return cli_ranks_engine_fail(&r->rk, s, what,
                                 "a smaller --batch-size, micro-batches (--grad-accum N or "
                                 "--max-tokens-per-device N), --recompute all, a smaller "
                                 "--logits-chunk, --shard-optimizer, a smaller model "
                                 "(--layers, --dim), more GPUs in --devices (CPU devices share "
                                 "the host's memory), or a higher --memory-limit where one is "
                                 "set");
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
