/*
 * cli/dp_cli.h - command-line helpers shared by the programs in examples/
 * and bench/ (the dp_cli static library, cli/dp_cli.c): a one-line error
 * on stderr prefixed with the program's name, rank glue under an MPI
 * launcher, strict number parsing for getopt_long values, and a monotonic
 * clock. Call cli_set_program first thing in main.
 */
#ifndef DP_CLI_H
#define DP_CLI_H

#include <stddef.h>

#include <dp/dp.h>

#if defined(__GNUC__) || defined(__clang__)
#define CLI_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define CLI_PRINTF(a, b)
#endif

// --- the program's name and quiet flag ---------------------------------------------

/* The name every message starts with ("lm_train"); copied, at most 63
 * bytes. Before the first call: "dp". */
void cli_set_program(const char *name);
const char *cli_program(void);

/* When on, cli_fail prints nothing (and still returns 1): under mpirun,
 * ranks other than 0 meeting an error every rank meets alike (a bad
 * command line) leave the one message to rank 0. Off by default. */
void cli_set_quiet(int on);
int cli_is_quiet(void);

// --- messages -----------------------------------------------------------------------

/* Prints "<program>: <message>" as one line on stderr; returns 1. */
int cli_fail(const char *fmt, ...) CLI_PRINTF(1, 2);

/* cli_fail with dp's last error message after `what`. */
int cli_dp_fail(const char *what);

// --- ranks --------------------------------------------------------------------------

/* Ranks under an MPI launcher (dp/dist.h), as lm_train and dp_bench use them. */
typedef struct cli_ranks {
    dp_dist *dist; /* NULL without a launcher */
    int rank, ranks;
    int broken; /* the ranks may no longer agree: the job must end (dp_dist_abort) */
} cli_ranks;

/* Under a launcher with more than one rank: joins the job; ranks other
 * than 0 send stdout to /dev/null and every rank's messages name it
 * ("prog: rank 1: ..."). Without a launcher: one rank, nothing opened.
 * Sets every field of rk first. Returns 0, or 1 after a message. */
int cli_ranks_join(cli_ranks *rk, int *argc, char ***argv);

/* Agreement on this rank's outcome of work only some ranks do, or that
 * may fail on one rank alone: 0 when every rank succeeded, else 1 (the
 * failing rank printed why; the others stay silent). One process: failed. */
int cli_ranks_agree(cli_ranks *rk, int failed);

/* An error every rank meets alike (an engine call's, agreed inside the
 * engine, or one the ranks agreed on): rank 0 prints it; returns 1. */
#define CLI_AGREED_FAIL(rk, ...) ((rk)->rank ? 1 : cli_fail(__VA_ARGS__))

/* A failed engine call. Its error reached every rank alike, except a
 * failed exchange between the ranks (DP_ERR_COMM) or a rank that stopped
 * answering (DP_ERR_TIMEOUT): then the ranks may be in different places,
 * every rank prints, and the job must end (broken: dp_dist_abort).
 * Returns 1. */
int cli_ranks_engine_fail(cli_ranks *rk, dp_status s, const char *what);

// --- option values: 0, or 1 after a message naming the option --------------------------

/* A whole decimal integer in [lo, hi]. */
int cli_parse_long(const char *name, const char *v, long lo, long hi, long *out);

/* A whole finite number >= lo. */
int cli_parse_double(const char *name, const char *v, double lo, double *out);

/* --device-weights: a comma-separated list of finite weights >= 0, at least
 * one > 0, with exactly `want` entries (the device count; 0 = any count up
 * to DP_MAX_DEVICES). *n_out is the number read. */
int cli_parse_weights(const char *name, const char *v, size_t want, float out[DP_MAX_DEVICES],
                      size_t *n_out);

/* --watchdog: 0 (off) or DP_WATCHDOG_MIN_SECONDS..DP_WATCHDOG_MAX_SECONDS. */
int cli_parse_watchdog(const char *v, double *out);

/* --logits-chunk ROWS|auto|whole, as dp_engine_config.logits_chunk_rows:
 * auto = 0 (the engine's automatic chunks), whole = DP_LOGITS_WHOLE, else
 * a row count >= 1 in decimal digits (no sign, no spaces). Counts stop at
 * LLONG_MAX so that tools can write them as JSON integers; any count that
 * large means whole logits anyway. */
int cli_parse_logits_chunk(const char *v, size_t *out);

/* --precision fp32|bf16: *bf16 = 1 for mixed precision (bf16 replicas with
 * float32 masters, bf16 GEMMs), 0 for float32 throughout. */
int cli_parse_precision(const char *v, int *bf16);

/* --recompute none|attention|gelu|all: what the GPT recomputes in the
 * backward instead of keeping (dp/gpt.h): *what = CLI_RECOMPUTE_* bits. */
enum { CLI_RECOMPUTE_ATTENTION = 1, CLI_RECOMPUTE_GELU = 2 };
int cli_parse_recompute(const char *v, int *what);

/* The --recompute value naming the CLI_RECOMPUTE_* bits what. */
const char *cli_recompute_name(int what);

/* The banners' words for the CLI_RECOMPUTE_* bits what (non-zero). */
const char *cli_recompute_words(int what);

/* --attention whole|chunked: *chunked = 1 for chunked attention
 * (DP_GPT_CHUNKED_ATTENTION). */
int cli_parse_attention(const char *v, int *chunked);

/* The dp_gpt_model_ex flags of --precision bf16, --recompute bits and
 * --attention chunked. */
unsigned cli_gpt_flags(int bf16, int recompute, int chunked);

/* A macro's value as a string literal (CLI_STR(DP_GPT_ATTENTION_CHUNK) is "64"). */
#define CLI_STR_(x) #x
#define CLI_STR(x) CLI_STR_(x)

// --- time ---------------------------------------------------------------------------

/* Seconds on the monotonic clock. */
double cli_now(void);

#endif /* DP_CLI_H */
