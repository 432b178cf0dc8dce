/*
 * examples/lm_train/lm_train.h - what lm_train's files share: the options
 * (opts), the run's state (run) and the functions one file calls in
 * another. Each field of run names the file that writes it; main.c reads
 * as the program's table of contents.
 */
#ifndef LM_TRAIN_H
#define LM_TRAIN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <dp/dp.h>

#include "dp_cli.h"

/* The default corpus: the text of Debian's `fortunes` package. */
#define LM_DEFAULT_CORPUS "/usr/share/games/fortunes"

/* --sample's bound: far more text than a sample is read for, and small
 * enough that the context buffer's size cannot overflow. */
#define SAMPLE_MAX 1000000L

/* Token ids are uint16 on disk: a larger vocabulary could never be seen. */
#define TOKEN_VOCAB_MAX 65536L

// --- options (options.c) ----------------------------------------------------------------

typedef struct opts {
    const char *data, *tokenizer, *devices, *mode, *save, *resume, *log, *prompt, *trace;
    const char *init_from, *export_hf; /* weights to start from; where to write them for transformers */
    const char *tokenizer_file, *prompt_ids; /* token data: decoding samples, the prompt's ids */
    const char *memory_limit, *device_weights;
    size_t memory_limit_bytes; /* --memory-limit read (0: none given) */
    dp_device_spec specs[DP_MAX_DEVICES]; /* --devices read: this rank's devices */
    size_t n_specs;
    float weights[DP_MAX_DEVICES]; /* --device-weights read (when given) */
    long vocab_size, layers, heads, dim, context, batch_size, grad_accum, max_tokens;
    long steps, warmup, lr_decay_steps, eval_interval, eval_iters, save_interval, sample, top_k;
    long max_skips, check_replicas;
    long val_tokens; /* the final evaluation reads the first N validation tokens, 0 = all */
    double lr, min_lr, weight_decay, beta1, beta2, grad_clip, temperature, watchdog;
    unsigned long long seed;
    int eval_only, tf32, token_balanced, shard_optimizer;
    cli_compute compute; /* --precision, --recompute, --attention(-chunk), --logits-chunk */
    int given; /* which options were on the command line (G_* bits) */
} opts;

enum {
    G_LAYERS = 1, G_HEADS = 2, G_DIM = 4, G_CTX = 8, /* the model's shape */
    G_TOK = 16, G_VOCAB = 32, G_DECAY = 64, G_PROMPT = 128, G_SAVEI = 256, G_PREC = 512
};

void defaults(opts *o);
/* Parses and checks the command line into o: 0, 1 after a message, -1
 * after --help. */
int parse_args(int argc, char **argv, opts *o);
/* --max-tokens-per-device and --val-tokens against the context; `whose`
 * ("", "the checkpoint's ", "the model's ") names where it came from. */
int check_context(const opts *o, const char *whose);
/* A checkpoint's or --init-from's model shape into o's shape options, then
 * check_context(o, whose). */
int adopt_shape(opts *o, const dp_gpt_config *c, const char *whose);
/* The defaults that depend on the data and the checkpoint, once both are
 * known: the schedule's length, token data's vocabulary and tokenizer. */
void resolve_options(opts *o, int is_tokens, int resumed);

// --- the run ----------------------------------------------------------------------------

typedef struct run {
    opts o; /* options.c parses; checkpoint.c applies a --resume checkpoint's */
    dp_checkpoint *ck; /* setup.c: the --resume checkpoint, NULL without */
    /* text: the tokenizer (data.c, or checkpoint.c: the checkpoint's);
     * token data: data.c, --tokenizer-file's table or NULL */
    dp_tokenizer *tok;
    dp_token_data *data; /* data.c */
    int is_tokens;       /* data.c: --data holds token files (dp_token_files_probe) */
    dp_gpt *gpt;         /* setup.c */
    float *init_params;  /* export.c: --init-from's weights, until the engine holds them */
    dp_engine *engine;   /* setup.c */
    dp_sampler *train, *eval_train, *eval_val; /* data.c */
    int32_t *inputs, *targets; /* setup.c: (batch_size, context) host */
    int32_t *prompt_ids;       /* sample.c: the sampling prompt, prompt_len tokens */
    size_t prompt_len;         /* sample.c */
    char *prompt_text;         /* sample.c: what the prompt prints as */
    size_t n_params;           /* setup.c */
    long step;                 /* setup.c: the checkpoint's; train.c: each step */
    long saved_step;           /* checkpoint.c: step of this run's last checkpoint, -1 = none */
    long skipped, consecutive_skips; /* train.c: steps skipped for non-finite values */
    FILE *log;                 /* log.c: --log */
    /* setup.c: rank 0's locks on --save, --trace and --export-hf, for the
     * run's life: [0] --save, [1] --trace, [2] --export-hf */
    cli_lock locks[3];
    off_t log_good;            /* log.c: bytes of --log's complete rows (-1: not a regular file) */
    int write_failed;          /* log.c: a write to rank 0's stdout or --log failed (said once) */
    dp_trace *trace;           /* log.c: --trace, every training step's phase spans */
    int tty;                   /* train.c: stdout is a terminal */
    int exit_code;             /* signals.c: non-zero, the status main returns (signals) */
    cli_ranks rk; /* ranks.c: the job's ranks under mpirun (one rank, dist NULL, alone) */
    size_t step_bytes;         /* train.c: bytes this rank sent to the others in dp_engine_step */
    long replayed;             /* train.c: steps whose every device replayed a CUDA graph */
} run;

// --- signals (signals.c) ------------------------------------------------------------------

/* First thing in main: until run_signals, SIGINT/SIGTERM end the process
 * at once with 128 + the signal's number. */
void install_signal_handlers(void);
/* After setup: the first signal stops the run after the current step. */
void run_signals(int ranked);
/* Before token files are mapped: SIGBUS names them (--data) and exits 1. */
void catch_bus_errors(const run *r, const char *data);
/* The first SIGINT/SIGTERM's number, 0 while none came. */
int pending_signal(void);
/* Signal sig arrived during evaluation or sampling: stop there; returns 1. */
int interrupted(run *r, int sig, const char *during);
/* The run stops for signal sig: main returns 128 + sig. */
void exit_on_signal(run *r, int sig);
const char *signal_name(int sig);

// --- ranks (ranks.c) ----------------------------------------------------------------------

/* An error every rank meets alike: rank 0 prints it (CLI_AGREED_FAIL). */
#define AGREED_FAIL(r, ...) CLI_AGREED_FAIL(&(r)->rk, __VA_ARGS__)

int join_ranks(run *r, int *argc, char ***argv);
int compare_options(run *r, int parsed);
int compare_data(run *r);
int engine_fail(run *r, dp_status s, const char *what);
int local_fatal(run *r, const char *what);
int agree(run *r, int failed);
int agree_writes(run *r, int failed);
int go_on(run *r, int failed);

// --- setup (setup.c), data (data.c) -------------------------------------------------------------

int setup(run *r);
int prompt_ids_parse(const char *text, int32_t *ids, size_t *n);
int probe_data(run *r, const char **path);
int load_data(run *r, const char *path);
int make_samplers(run *r);

// --- checkpoints (checkpoint.c) -----------------------------------------------------------

int apply_checkpoint(run *r);
int check_resume_data(const run *r, const char *path);
int save_checkpoint(run *r);
/* 1 when the file at path is a dp checkpoint (safetensors with its step),
 * which --save may replace. */
int is_checkpoint_file(const char *path);
void checkpoint_state(const run *r, char *buf, size_t cap);

// --- GPT-2 in and out (export.c) ---------------------------------------------------------------

/* --export-hf's directory, checked before any work (a run is not lost at
 * its end): a directory, or a name whose parent is one. */
int check_export_path(const char *dir);
/* --export-hf's files, model and config (paths), may be replaced: each is
 * absent, empty, or what an export writes (dp's weights, by their
 * producer metadata; a GPT-2 config.json). 0, or 1 after a message. */
int check_export_replace(const char *model, const char *config);
/* "dir/name", malloc'd (NULL when out of memory). */
char *export_file(const char *dir, const char *name);
/* --init-from: the model and its weights, the shape options checked
 * against it (setup.c's load). */
int load_pretrained(run *r);
/* Writes the engine's parameters to --export-hf (every rank reads them;
 * rank 0 writes); 0 without --export-hf. */
int export_hf(run *r);

// --- evaluation (eval.c), sampling (sample.c) -------------------------------------------------

/* The evaluation during training: 0, 1 failed, -1 a signal came. */
int eval_step(run *r);
/* Prints the validation split's loss: "final val_loss" after training,
 * "val_loss" with --eval-only. */
int print_val_loss(run *r, int after_training);
int prepare_prompt(run *r);
int generate(run *r);

// --- output (log.c), training (train.c) -----------------------------------------------------

void human_bytes(size_t b, char *buf, size_t cap);
void print_summary(const run *r, size_t k, const dp_engine_config *ec);
int open_outputs(run *r);
int open_trace(run *r, size_t k);
/* --log, before any work: an existing file must be an lm_train log (or a
 * character device such as /dev/null), never a FIFO. 0, or 1 after a
 * message. */
int check_log(const opts *o);
void progress(run *r, const dp_step_stats *st, double lr, double elapsed, long first);
void log_row(run *r, const dp_step_stats *st, double lr);
int check_written(run *r);
int finish_trace(run *r, int rc);
int train(run *r);

#endif /* LM_TRAIN_H */
