/*
 * cli/dp_cli.h - command-line helpers shared by the programs in examples/
 * and bench/ (the dp_cli static library): a one-line error on stderr
 * prefixed with the program's name (cli/dp_cli.c), strict number parsing
 * for getopt_long values and the options as given, normalised
 * (cli/dp_cli.c), rank glue under an MPI launcher: the options compared
 * when the ranks join, waits bounded (cli/ranks.c), the files a program
 * reads and writes: the same file refused twice, outputs checked before
 * any work, inputs opened without blocking, streams checked after
 * writing (cli/files.c), what a fatal signal leaves (cli/guard.c), the
 * outputs' locks (cli/lock.c), and a monotonic clock. Call cli_set_program
 * first thing in main.
 */
#ifndef DP_CLI_H
#define DP_CLI_H

#include <getopt.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

#include <dp/dp.h>

#if defined(__GNUC__) || defined(__clang__)
#define CLI_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define CLI_PRINTF(a, b)
#endif

// --- the program's name and quiet flag ---------------------------------------------

/* The name every message starts with ("lm_train"); copied, at most 63
 * bytes. Before the first call: "dp". Each program calls it first, so it
 * also opens /dev/null on any of descriptors 0, 1 and 2 the program was
 * started without (2>&-): the next file opened (a --log) would otherwise
 * take that number, and the messages meant for stderr would land in it.
 * It ignores SIGPIPE (a write to a reader that quit fails with EPIPE,
 * which the program's cli_check_stream names) and guards the fatal
 * signals (cli_guard_signals). */
void cli_set_program(const char *name);
const char *cli_program(void);

/* When on, cli_fail prints nothing (and still returns 1; the message is
 * kept: cli_last_message): the programs parse their command line quietly
 * and print once the ranks have compared it (cli_ranks_options). Off by
 * default. */
void cli_set_quiet(int on);
int cli_is_quiet(void);

// --- messages -----------------------------------------------------------------------

/* Prints "<program>: <message>" as one line on stderr ("<program>: rank
 * r: <message>" under a launcher with ranks); returns 1. */
int cli_fail(const char *fmt, ...) CLI_PRINTF(1, 2);

/* cli_fail with dp's last error message after `what`. */
int cli_dp_fail(const char *what);

/* The last message cli_fail formatted (printed or not), without the
 * program's prefix; "" before the first. */
const char *cli_last_message(void);

// --- ranks (cli/ranks.c) ----------------------------------------------------------------

/* How long a rank waits for the others when no --watchdog bounds it: 10
 * minutes. A healthy job's ranks meet within seconds of each other (they
 * make the same calls on the same data), and the waits that rank 0's own
 * work makes the others wait through (writing a checkpoint of a few GB,
 * dp_bench's plots) take a few minutes at most; a rank stopped or stuck
 * should not hold a job's machines for hours. */
#define CLI_RANKS_WAIT_DEFAULT_S 600
#define CLI_RANKS_WAIT_DEFAULT ((double)CLI_RANKS_WAIT_DEFAULT_S)

/* Ranks under an MPI launcher (dp/dist.h), as lm_train and dp_bench use them. */
typedef struct cli_ranks {
    dp_dist *dist; /* NULL without a launcher */
    int rank, ranks;
    int broken; /* the ranks may no longer agree: the job must end (dp_dist_abort) */
    double wait; /* seconds any wait between the ranks may last (cli_ranks_set_wait) */
} cli_ranks;

/* Under a launcher with more than one rank: joins the job; ranks other
 * than 0 send stdout to /dev/null and every rank's messages name it
 * ("prog: rank 1: ..."). Makes no collective call: a failure here is
 * carried to the first one, cli_ranks_options. Without a launcher: one
 * rank, nothing opened. Sets every field of rk first (wait: the
 * default). Returns 0, or 1 after a message (the job could not be
 * joined). */
int cli_ranks_join(cli_ranks *rk, int *argc, char ***argv);

/* The bound of every wait between the ranks: watchdog seconds when > 0,
 * else CLI_RANKS_WAIT_DEFAULT. */
void cli_ranks_set_wait(cli_ranks *rk, double watchdog);

/* The first collective call, every rank's, right after parsing:
 * `parsed` is what parsing returned (0 go on, 1 refused: its message was
 * kept quietly, -1 stopped quietly as after --help). Rank 0's options as
 * given (cli_options_text, without the options named in per_rank, a
 * NULL-terminated list such as {"--devices", NULL}: what may differ
 * between ranks) are compared with every rank's. When they differ, every
 * rank fails with the same line, naming the first option that differs
 * ("rank 1's options differ from rank 0's: --steps is 2 on rank 1, 1 on
 * rank 0"), and a rank that refused its command line alone is named with
 * its message; when they are the same, rank 0 alone prints a refusal
 * (every rank refused alike). One rank: prints a refusal. Bounded by
 * rk->wait. Returns 0 (go on), 1 (after a message) or -1 (stop, as
 * --help: exit 0). */
int cli_ranks_options(cli_ranks *rk, int parsed, const char *const *per_rank);

/* Agreement on this rank's outcome of work only some ranks do, or that
 * may fail on one rank alone: 0 when every rank succeeded, else 1 (the
 * failing rank printed why; the others stay silent). Bounded by
 * rk->wait. One process: failed. */
int cli_ranks_agree(cli_ranks *rk, int failed);

/* Agreement on an outcome every rank should meet alike, computed from
 * the options (the same on every rank: cli_ranks_options) with messages
 * kept quietly (cli_set_quiet): 0 when every rank succeeded, else 1 after
 * one message: rank 0's when it failed (the ranks failed alike), else
 * each failing rank's own. Bounded by rk->wait. One process: prints
 * the kept message when failed. */
int cli_ranks_agree_alike(cli_ranks *rk, int failed);

/* cli_ranks_agree after work rank 0 does alone while the others wait
 * (writing a checkpoint, a trace, dp_bench's outputs): bounded by the
 * larger of rk->wait and CLI_RANKS_WAIT_DEFAULT, since a file's writing
 * time does not follow the steps' pace that --watchdog is set for. */
int cli_ranks_agree_writes(cli_ranks *rk, int failed);

/* An error every rank meets alike (an engine call's, agreed inside the
 * engine, or one the ranks agreed on): rank 0 prints it; returns 1. */
#define CLI_AGREED_FAIL(rk, ...) ((rk)->rank ? 1 : cli_fail(__VA_ARGS__))

/* A failed engine call. Its error reached every rank alike, except a
 * failed exchange between the ranks (DP_ERR_COMM) or a rank that stopped
 * answering (DP_ERR_TIMEOUT): then the ranks may be in different places,
 * every rank prints, and the job must end (broken: dp_dist_abort). Out
 * of memory, oom_fix (when not NULL) follows the library's message: the
 * program's options that lower the memory, where the message names the
 * library's fields. Returns 1. */
int cli_ranks_engine_fail(cli_ranks *rk, dp_status s, const char *what, const char *oom_fix);

/* The end of a run under ranks: the ranks meet once more (bounded by
 * rk->wait) and leave together (dp_dist_close); a broken job (some rank
 * may wait in a collective that will never complete, or did not come) is
 * aborted with status code instead (no return). */
void cli_ranks_leave(cli_ranks *rk, int code);

// --- the command line -----------------------------------------------------------------

/* What an option handler returns for a code it leaves to cli_parse_options. */
#define CLI_NOT_MINE 2

struct cli_compute;

/* Parses argv with getopt_long over longopts (getopt's own messages off).
 * Each option's code and value (NULL for none) go to handle(ctx, c, v)
 * first, which returns 0 (go on), 1 (a bad value: it printed why), -1
 * (stop quietly, as after --help) or CLI_NOT_MINE; a code left to it is
 * one of CLI_COMPUTE_LONGOPTS (parsed into *cp, so a handler may note
 * one and leave its value), else a message names the argument: a
 * missing value, an unknown option or a value given to an option that
 * takes none. No operands may follow the options.
 * Returns 0, 1 after a message, or -1 when handle stopped quietly. */
int cli_parse_options(int argc, char **argv, const struct option *longopts,
                      struct cli_compute *cp, int (*handle)(void *ctx, int c, const char *v),
                      void *ctx);

/* The options cli_parse_options read, normalised: a line per option
 * given, in the order of the longopts table, an alias under the table's
 * first name for its code, the last value of an option given twice,
 * "--name value" ("--name" for one without a value; a newline or
 * backslash in the value escaped as \n, \\); up to the option where
 * parsing stopped. "" before parsing. So `--steps=5`, `--steps 5` and
 * `--st 5` read alike. Owned by cli; valid until the next parse. */
const char *cli_options_text(void);

// --- option values: 0, or 1 after a message naming the option --------------------------

/* A whole decimal integer in [lo, hi]. */
int cli_parse_long(const char *name, const char *v, long lo, long hi, long *out);
/* ... into an int. */
int cli_parse_int(const char *name, const char *v, int lo, int hi, int *out);

/* The host's RAM available now in bytes (dp_host_memory_available;
 * INFINITY when the system does not say): the ceiling for host buffers a
 * command line asks for, refused before they are touched (overcommit
 * would let them grow into the OOM killer). */
double cli_host_available_bytes(void);

/* For a small program's own getopt_long loop (run with opterr = 0): the
 * message for what getopt returned instead of an option ('?' or ':'),
 * named by the program, not by argv[0]'s path: an unknown option, or a
 * known one missing its value or given one it does not take. shorts is
 * the loop's optstring. Returns 2, the exit status of a refused command
 * line. */
int cli_bad_option(char **argv, const char *shorts);

/* A whole finite number >= lo. */
int cli_parse_double(const char *name, const char *v, double lo, double *out);
/* ... for a value the engine keeps as a float (a learning rate, AdamW's
 * settings): also at most FLT_MAX, which a double may pass. */
int cli_parse_float(const char *name, const char *v, double lo, double *out);

/* --device-weights: a comma-separated list of finite weights >= 0, at least
 * one > 0, with exactly `want` entries (the device count; 0 = any count up
 * to DP_MAX_DEVICES). *n_out is the number read. */
int cli_parse_weights(const char *name, const char *v, size_t want, float out[DP_MAX_DEVICES],
                      size_t *n_out);

/* --memory-limit: a size dp_parse_bytes reads ("12GiB"), above 0 bytes
 * (no option is no limit; 0 would read as one and mean none). */
int cli_parse_memory_limit(const char *v, size_t *bytes);

/* --watchdog: 0 (off) or DP_WATCHDOG_MIN_SECONDS..DP_WATCHDOG_MAX_SECONDS. */
int cli_parse_watchdog(const char *v, double *out);

// --- how the GPT computes: options lm_train and dp_bench share ---------------------------

/* --precision fp32|bf16, --recompute none|attention|gelu|all, --attention
 * whole|chunked|fused, --attention-chunk N, --logits-chunk ROWS|auto|whole,
 * --bucket-mb MB|off and --vocab-pad N|auto. */
typedef struct cli_compute {
    int bf16;            /* mixed precision: bf16 replicas with float32 masters, bf16 GEMMs */
    int recompute;       /* what the backward recomputes instead of keeping: CLI_RECOMPUTE_* */
    int chunked_att;     /* chunked attention (DP_GPT_CHUNKED_ATTENTION) */
    int fused_att;       /* fused attention (DP_GPT_FUSED_ATTENTION) */
    int att_given;       /* --attention was given (else auto: cli_resolve_attention) */
    long att_chunk;      /* queries per chunk; 0: DP_GPT_ATTENTION_CHUNK */
    size_t logits_chunk; /* dp_engine_config.logits_chunk_rows: 0 auto, DP_LOGITS_WHOLE whole */
    size_t bucket_bytes; /* dp_engine_config.bucket_bytes: 0 default, DP_BUCKET_OFF off */
    long vocab_pad;      /* dp_gpt_config.vocab_pad, 1..CLI_VOCAB_PAD_MAX; 0: auto */
} cli_compute;

/* --vocab-pad's bound: 64 or 128 already align the LM head's GEMM; a
 * larger pad only adds zero rows to wte and -inf columns to the logits. */
#define CLI_VOCAB_PAD_MAX 65536
/* --vocab-pad auto with a GPU among the devices: every logits row then
 * starts on a 256-byte boundary (DP_PARAM_ALIGN floats) and the head's
 * GEMM dimension is a multiple of the tensor cores' 8 and 16; GPT-2's
 * 50257 pads to 50304, as llm.c's 128 gives. */
#define CLI_VOCAB_PAD_GPU 64

enum { CLI_RECOMPUTE_ATTENTION = 1, CLI_RECOMPUTE_GELU = 2 };

/* Their getopt_long codes (above any program's own) and table entries;
 * cli_parse_options parses them. Counts stop at LLONG_MAX so that tools
 * can write them as JSON integers. */
enum {
    CLI_O_PRECISION = 4096, CLI_O_RECOMPUTE, CLI_O_ATTENTION, CLI_O_ATTENTION_CHUNK,
    CLI_O_LOGITS_CHUNK, CLI_O_BUCKET_MB, CLI_O_VOCAB_PAD
};
#define CLI_COMPUTE_LONGOPTS                                                                    \
    {"precision", 1, 0, CLI_O_PRECISION}, {"recompute", 1, 0, CLI_O_RECOMPUTE},               \
        {"attention", 1, 0, CLI_O_ATTENTION}, {"attention-chunk", 1, 0, CLI_O_ATTENTION_CHUNK}, \
        {"logits-chunk", 1, 0, CLI_O_LOGITS_CHUNK}, {"bucket-mb", 1, 0, CLI_O_BUCKET_MB},     \
        {"vocab-pad", 1, 0, CLI_O_VOCAB_PAD}

/* The checks of *cp against the rest of a command line, each 0 or 1
 * after a message: --attention-chunk without --attention chunked, and
 * --tf32 with --precision bf16. */
int cli_check_attention_chunk(const cli_compute *cp);
int cli_check_tf32(const cli_compute *cp, int tf32);

/* Queries per chunk of the chunked attention as *cp asks (the default
 * when --attention-chunk was not given). */
long cli_attention_chunk(const cli_compute *cp);

/* dp_gpt_config.vocab_pad as *cp asks on the devices specs[0..k): the
 * --vocab-pad given, else (auto) CLI_VOCAB_PAD_GPU when one of them is a
 * GPU, 1 (none) on CPU devices alone, whose results it would not change
 * but whose head GEMM it would only make larger. */
size_t cli_vocab_pad(const cli_compute *cp, const dp_device_spec *specs, size_t k);

/* --attention auto (not given): fused where dp's tensor-core attention
 * kernels run, i.e. in bf16 (*cp) with every device of specs[0..k) a
 * GPU and a head size of 64 (every GPT-2 size); whole elsewhere, as
 * before (on CPUs the fused path is a slow reference; at other head
 * sizes and in float32 it runs CUDA-core kernels that are not measured
 * against the whole matrix's GEMMs). On an H200, GPT-2 small at batch 8
 * in bf16 took 34.8 ms a step fused and 46.9 chunked (README). Nothing
 * when --attention was given (fused_att without att_given: auto's). */
void cli_resolve_attention(cli_compute *cp, const dp_device_spec *specs, size_t k,
                           size_t head_size);

/* The --recompute value naming the CLI_RECOMPUTE_* bits what. */
const char *cli_recompute_name(int what);

/* Prints on stdout what *cp changes from float32 and whole attention, as
 * a banner's words: ", bf16 (float32 masters)", ", GELU recomputed",
 * ", attention in chunks of 64 queries", ", attention fused" (nothing for
 * the defaults). */
void cli_print_compute(const cli_compute *cp);

/* With bf16 (*cp) or tf32 (--tf32), prints on stdout a "note:" line
 * naming e's devices whose GEMMs in that precision are not native
 * (dp_device_matmul_native): bf16 on CPUs without oneDNN's bf16 matmul
 * (slower than float32 there), TF32 on CPUs (computed as float32), either
 * on GPUs older than compute capability 8.0; nothing otherwise. */
void cli_print_matmul_note(dp_engine *e, const cli_compute *cp, int tf32);

/* The dp_gpt_model flags of *cp. */
unsigned cli_gpt_flags(const cli_compute *cp);

/* A macro's value as a string literal (CLI_STR(DP_GPT_ATTENTION_CHUNK) is "64"). */
#define CLI_STR_(x) #x
#define CLI_STR(x) CLI_STR_(x)

// --- files (cli/files.c) ----------------------------------------------------------------

/* A file a program names on its command line: what it reads (an input:
 * a file, or for a directory the files in it whose names end in
 * dir_suffix, every file when NULL) or writes (an output). */
typedef struct cli_file {
    const char *flag; /* "--save", or "INPUT" for an operand */
    const char *path; /* NULL: not given (skipped) */
    int output;
    const char *dir_suffix;
    const char *may_replace; /* an output: the flag of the one input it may replace (NULL none) */
} cli_file;

/* Refuses, before anything is written, an output that is the same file
 * as an input or as another output: the same device and inode when both
 * exist (symlinks, "./", ".." and hard links alike), else the same
 * resolved path (the real directory and the name; a symbolic link to
 * nothing counts as the path it names), and an output that is, or would
 * become, one of the files an input directory holds (for a new file: its
 * directory is that directory and its name ends in the suffix). Returns
 * 0, or 1 after one line naming both options and both paths. */
int cli_check_overlaps(const cli_file *files, size_t n);

/* Refuses an existing output that the program did not write, so that a
 * mistyped path loses no one's file: path is replaceable when it does
 * not exist, is empty, or ours(path) says it is one of the program's
 * files (a checkpoint, a trace); anything else fails naming flag, path,
 * what the program writes there (what: "a dp checkpoint") and the
 * fix. Returns 0, or 1 after that line. (Whether the path can be written
 * at all is cli_check_output's.) */
int cli_check_replace(const char *flag, const char *path, int (*ours)(const char *path),
                      const char *what);

/* The first bytes of the file at path, up to n of them, into buf, then
 * a NUL (buf holds n + 1 bytes); returns how many were read (0 when it
 * cannot be read). For the recognisers of cli_check_replace. */
size_t cli_read_head(const char *path, char *buf, size_t n);

/* 1 when the file at path is safetensors whose metadata holds key, with
 * the given value (NULL: any value). */
int cli_st_has_metadata(const char *path, const char *key, const char *value);

/* 1 when the file at path begins as dp's trace files do (dp_trace_write:
 * Chrome trace-event JSON), which a --trace may replace. */
int cli_is_dp_trace(const char *path);

/* An output one run at a time may write (an advisory lock, held until
 * cli_unlock_output or the process's end). */
typedef struct cli_lock {
    int fd;
    char *path; /* cli_lock_name's; NULL: none held (a zeroed cli_lock holds none) */
} cli_lock;

/* The lock file of output path, malloc'd (NULL: out of memory): the
 * resolved path (symbolic links followed, "./", ".." and trailing
 * slashes resolved) and ".lock", so that every spelling of one output
 * meets at one lock. A program checks it against its other files
 * (cli_check_overlaps), since it is written and removed too. */
char *cli_lock_name(const char *path);

/* Takes the lock of output path for this run: flock on the file
 * cli_lock_name(path) (created; it holds a marker line and this process's pid),
 * because the output itself is replaced by every atomic write. Refused
 * when another process holds it (named with its pid), or when
 * "<path>.lock" exists and is not such a lock file (it is never
 * replaced then). On a file system without locks the output goes
 * unguarded (0, no lock). A fatal signal removes the lock file
 * (cli_guard_lock); one left by SIGKILL is taken by the next run. Returns
 * 0, or 1 after one line naming flag, path and the fix. */
int cli_lock_output(const char *flag, const char *path, cli_lock *lk);

/* Removes the lock file and releases the lock (no-op when none is held). */
void cli_unlock_output(cli_lock *lk);

/* Fails unless a file can be written at path through the atomic writer:
 * its directory exists, is a directory and is writable, path is a
 * regular file or does not exist (not a directory, a device or a FIFO,
 * which the writer's rename would replace), the temporary file's longest name fits the file system's
 * limit on a name, and a probe creates and removes one. Returns 0, or 1
 * after one line naming flag, path and the fix. */
int cli_check_output(const char *flag, const char *path);

/* Opens an input file for reading without blocking (a FIFO, a device or
 * a socket is refused unread, not waited on) and checks that it is a
 * regular file; returns its descriptor (blocking again, close-on-exec),
 * or -1 after one line naming flag and path. */
int cli_open_input(const char *flag, const char *path);

/* cli_open_input then closes it: the input can be read as a file. 0 or 1. */
int cli_check_input(const char *flag, const char *path);

/* Flushes stream f and checks it for an error of this or any earlier
 * write (what names it: "standard output", "--log run.jsonl"). Returns 0,
 * or 1 after one line with the reason (e.g. "No space left on device"). */
int cli_check_stream(FILE *f, const char *what);

/* Writes usage's text to stdout in one write, so that a failure keeps
 * its reason (stdio's flag does not) for cli_check_stream to name:
 * "No space left on device", not "an earlier write failed". */
void cli_print_help(void (*usage)(FILE *f));

/* fflush(f), keeping a failure's reason for cli_check_stream (a program
 * that flushes as it goes, then checks once). */
int cli_flush(FILE *f);

// --- a fatal signal (cli/guard.c) --------------------------------------------------------

/* Installs (once; cli_set_program does) the handler of the signals that
 * would kill the program (INT, TERM, HUP, QUIT, PIPE, XFSZ, ALRM, VTALRM,
 * USR1, USR2; one ignored when the program started stays ignored): it
 * removes every atomic file's temporary file (dp_atomic_file_remove_temps:
 * the program's and the library's writers') and the guarded paths, prints
 * "<program>: stopped by a signal; its outputs were left as they were"
 * when it removed any, then dies of the signal as before. A program's own
 * handler of some of them (lm_train's INT, TERM, HUP) replaces it there. */
void cli_guard_signals(void);

/* The handler's line names what (af open: "<what> was left as it was");
 * cli_guard_temp(NULL, NULL) after the commit or abort restores the
 * general line. */
void cli_guard_temp(const dp_atomic_file *af, const char *what);

/* Adds path (a temporary file the atomic writer does not know, or a
 * private directory: removed after what was added after it, so its files
 * go first) to what the handler removes; 0, or 1 when the set (16 paths)
 * is full. cli_unguard_path drops it again (it was removed or renamed). */
int cli_guard_path(const char *path);
/* The same for a lock file (cli_lock_output's): removed by the handler
 * without its line, for the lock is no output. */
int cli_guard_lock(const char *path);
void cli_unguard_path(const char *path);

/* Removes the guarded paths now (async-signal-safe: for a program's own
 * handler that exits at once); returns how many were not lock files. */
int cli_remove_guarded(void);

// --- time ---------------------------------------------------------------------------

/* Seconds on the monotonic clock. */
double cli_now(void);

#endif /* DP_CLI_H */
