/*
 * examples/lm_train/lm_train.c - the main job: train a GPT on real text
 * with the balanced DataParallel engine.
 *
 * Defaults run on a fresh machine with no arguments: the corpus is the
 * text of Debian's fortunes package, character-level tokens, every GPU or
 * else one CPU device per core. Prints progress, evaluates on the held-out
 * split, saves safetensors checkpoints nanoGPT can load, resumes exactly,
 * and samples text. `lm_train --help` lists every option.
 *
 * --data also takes the field's pre-tokenized GPT-2 data (dp_token_data_open):
 * nanoGPT's train.bin / val.bin and llm.c's shards, mapped read-only; the
 * model's vocabulary is then --vocab-size (GPT-2's 50257 by default), and
 * samples decode through llm.c's gpt2_tokenizer.bin (--tokenizer-file) or
 * print as ids.
 *
 * SIGINT / SIGTERM end the run after the current step: the checkpoint is
 * written (with --save), output flushed, and the exit status is 128 + the
 * signal's number; a second signal exits at once.
 *
 * Under an MPI launcher (mpirun -np R lm_train --devices cpu:K ...) the R
 * ranks train one model on R x K devices (dp/dist.h): every rank samples
 * the same batches from the same seed and makes the same engine calls,
 * all of them collective; rank 0 alone prints, writes --save, --log and
 * --trace and samples text. Work only some ranks do, and failures only
 * one rank can meet, are followed by an agreement (dp_dist_agree), so no
 * rank goes on into a collective the others have left. A signal reaching
 * any rank stops every rank at the same step (agreed before each step).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <dp/dp.h>

#include "dp_cli.h"
/* Overflow-checked size arithmetic (header-only, no library symbols). */
#include <dp/checked.h>

/* The default corpus: the text of Debian's `fortunes` package. */
#define LM_DEFAULT_CORPUS "/usr/share/games/fortunes"

/* --sample's bound: far more text than a sample is read for, and small
 * enough that the context buffer's size cannot overflow. */
#define SAMPLE_MAX 1000000L

/* Checkpoint metadata key of the cosine schedule's length (the trainer's,
 * not the model's). */
#define META_DECAY "lr_decay_steps"
/* Checkpoint metadata: the precision the run trained in (fp32 or bf16). */
#define META_PRECISION "precision"
/* Checkpoint metadata of the data trained on: "text", or the token files'
 * format (dp_token_format_name: "nanogpt", "llmc"), and the split lengths
 * in tokens. A checkpoint without them was trained on text. */
#define META_FORMAT "data_format"
#define META_TRAIN "data_train_tokens"
#define META_VAL "data_val_tokens"
#define FORMAT_TEXT "text"

/* Token ids are uint16 on disk: a larger vocabulary could never be seen. */
#define TOKEN_VOCAB_MAX 65536L

// --- options ------------------------------------------------------------------------

typedef struct opts {
    const char *data, *tokenizer, *devices, *mode, *save, *resume, *log, *prompt, *trace;
    const char *tokenizer_file, *prompt_ids; /* token data: decoding samples, the prompt's ids */
    const char *memory_limit, *device_weights;
    long vocab_size, layers, heads, dim, context, batch_size, grad_accum, max_tokens;
    long steps, warmup, lr_decay_steps, eval_interval, eval_iters, save_interval, sample, top_k;
    long max_skips, check_replicas;
    long val_tokens; /* the final evaluation reads the first N validation tokens, 0 = all */
    size_t logits_chunk; /* dp_engine_config.logits_chunk_rows: 0 auto, DP_LOGITS_WHOLE whole */
    double lr, min_lr, weight_decay, beta1, beta2, grad_clip, temperature, watchdog;
    unsigned long long seed;
    int eval_only, tf32, token_balanced, shard_optimizer;
    int bf16; /* --precision bf16 */
    int recompute; /* --recompute: CLI_RECOMPUTE_* bits */
    int chunked_att; /* --attention chunked */
    long att_chunk;  /* --attention-chunk; 0: DP_GPT_ATTENTION_CHUNK */
    int given; /* which options were on the command line (G_* bits) */
} opts;

enum {
    G_LAYERS = 1, G_HEADS = 2, G_DIM = 4, G_CTX = 8, /* the model's shape */
    G_TOK = 16, G_VOCAB = 32, G_DECAY = 64, G_PROMPT = 128, G_SAVEI = 256, G_PREC = 512
};

static void defaults(opts *o)
{
    memset(o, 0, sizeof *o);
    o->tokenizer = "char";
    o->devices = "auto";
    o->mode = "balanced";
    o->prompt = "\n";
    o->vocab_size = 8192;
    /* Sized for the default run on a 2-core CPU: about 70 s unloaded (90 s
     * on a busy machine) and a sample that reads mostly as English words.
     * Small and wide-batched: at this budget (about 3.7M tokens) a smaller
     * model fed more tokens reaches a lower loss than a larger one. */
    o->layers = 3;
    o->heads = 4;
    o->dim = 96;
    o->context = 64;
    o->batch_size = 32;
    o->grad_accum = 1;
    o->steps = 1800;
    o->lr = 3e-3;
    o->min_lr = 3e-4;
    o->warmup = 100;
    o->weight_decay = 0.1;
    o->beta1 = 0.9;
    o->beta2 = 0.99;
    o->grad_clip = 1.0;
    o->eval_interval = 300;
    o->eval_iters = 20;
    o->seed = 1337;
    o->sample = 300;
    o->temperature = 0.7;
    o->top_k = 40;
    o->max_skips = 5;
}

static void usage(FILE *f)
{
    opts d;
    defaults(&d);
    fprintf(f,
            "usage: lm_train [options]\n"
            "Train a GPT (nanoGPT's architecture) on text with dp's balanced DataParallel engine.\n\n"
            "data\n"
            "  --data PATH            a text file or directory of text files (default:\n"
            "                         %s), or GPT-2 token ids as\n"
            "                         nanoGPT and llm.c prepare them: a directory\n"
            "                         with nanoGPT's train.bin + val.bin, or llm.c's shards (names\n"
            "                         holding train / val, e.g. fineweb_train_000001.bin,\n"
            "                         fineweb_val_000000.bin), each split its files in name order; or\n"
            "                         one .bin file, split 90/10 as text is. llm.c files are told by\n"
            "                         their header (magic 20240520), other .bin files are raw uint16.\n"
            "                         A directory holding any *.bin is token data: only its *.bin\n"
            "                         files are read, other files (scripts, the input text) ignored.\n"
            "                         Token files are mapped read-only, never loaded whole\n"
            "  --tokenizer char|word  text's tokenizer (default %s; with --resume, the checkpoint's)\n"
            "  --vocab-size N         text: the word tokenizer's vocabulary size (default %ld);\n"
            "                         token data: the model's vocabulary, every id below it (default\n"
            "                         %d, GPT-2's; llm.c pads it to 50304 for speed; at most %ld)\n"
            "  --tokenizer-file PATH  token data: llm.c's gpt2_tokenizer.bin, to print samples as\n"
            "                         text (decode only); without it samples print as token ids\n"
            "devices\n"
            "  --devices LIST         cpu, cpu:N, cpu:0,1, cuda:0,1, auto (default %s: every GPU,\n"
            "                         else one CPU device per core)\n"
            "  --mode balanced|gather where the loss is computed (default %s)\n"
            "  --device-weights W,..  relative share of each step's rows per device, one weight\n"
            "                         per device, e.g. 1,2,2,2 (default equal shares)\n"
            "  --token-balanced       split rows so devices get equal numbers of valid targets\n"
            "  --memory-limit SIZE    per-device allocation limit, e.g. 12GiB (default none)\n"
            "  --logits-chunk ROWS    output rows of logits per criterion call; auto (default) keeps a\n"
            "                         chunk's logits about the size of the features; whole = unchunked\n"
            "  --tf32                 let cuBLAS use TF32 tensor cores on GPUs (default off)\n"
            "  --precision fp32|bf16  bf16: mixed precision, bfloat16 parameter replicas and GEMMs\n"
            "                         (oneDNN on CPUs, tensor cores on GPUs), float32 master weights,\n"
            "                         gradients and AdamW state (default fp32; with --resume, the\n"
            "                         checkpoint's; checkpoints hold float32 either way)\n"
            "  --recompute none|attention|gelu|all  what the backward recomputes instead of\n"
            "                         keeping: the attention probabilities (one more GEMM and\n"
            "                         softmax per layer), the GELU output (one more GELU), or\n"
            "                         both; same results, bitwise, less memory (default none)\n"
            "  --attention whole|chunked  chunked: form the attention %d queries at a time and\n"
            "                         recompute it in the backward, so no (T,T) probabilities\n"
            "                         exist; skips the masked blocks; same results to float32\n"
            "                         rounding (default whole)\n"
            "  --attention-chunk N    queries per chunk with --attention chunked (default %d):\n"
            "                         larger chunks, larger GEMMs (GPUs) and a larger scratch\n"
            "  --shard-optimizer      shard the AdamW state over the devices (ZeRO-1: each device\n"
            "                         keeps and updates its slice's moments; same results, bitwise)\n"
            "model\n"
            "  --layers N  --heads N  --dim N  --context N   (default %ld, %ld, %ld, %ld)\n"
            "training\n"
            "  --batch-size N         global sequences per step (default %ld)\n"
            "  --grad-accum N         micro-batches per device per step (default %ld)\n"
            "  --max-tokens-per-device N  tokens per forward/backward on a device, at least\n"
            "                         --context (default no limit)\n"
            "  --steps N              total steps; with --resume, continue up to N, which must\n"
            "                         not be below the checkpoint's step (default %ld)\n"
            "  --lr X  --min-lr X     peak and final learning rate (default %g, %g)\n"
            "  --warmup N             linear warmup steps, then cosine decay to --min-lr (default %ld)\n"
            "  --lr-decay-steps N     step where the cosine decay reaches --min-lr (nanoGPT's\n"
            "                         lr_decay_iters; default --steps; with --resume, the\n"
            "                         checkpoint's). Give it to stop a run part-way and resume\n"
            "                         it bitwise: --steps 10 --lr-decay-steps 20 --save a, then\n"
            "                         --steps 20 --resume a equals --steps 20 --lr-decay-steps 20\n"
            "  --weight-decay X       AdamW weight decay on 2-D weights (default %g)\n"
            "  --beta1 X  --beta2 X   AdamW betas (default %g, %g)\n"
            "  --grad-clip X          max global gradient norm, 0 = off (default %g)\n"
            "  --seed N               seed for initialisation and batches (default %llu)\n"
            "  --max-skips K          stop after K consecutive steps skipped for a non-finite\n"
            "                         loss or gradient (default %ld)\n"
            "  --watchdog SECONDS     fail a step when no device makes progress for this long,\n"
            "                         0 = off (default 0)\n"
            "  --check-replicas N     every N steps, check that every replica equals the root's\n"
            "                         parameters, 0 = off (default 0)\n"
            "evaluation and output\n"
            "  --eval-interval N      steps between evaluations (default %ld)\n"
            "  --eval-iters N         batches per split per evaluation (default %ld)\n"
            "  --eval-only            with --resume: print the loss over the whole validation split\n"
            "                         of --data, or its first --val-tokens (any text the\n"
            "                         checkpoint's tokenizer covers, or any token data of its\n"
            "                         vocabulary)\n"
            "  --val-tokens N         the final evaluation and --eval-only read only the first N\n"
            "                         tokens of the validation split: W = min(all windows,\n"
            "                         floor((N-1) / context)) windows, each context+1 tokens at a\n"
            "                         multiple of the context, wholly within them. At least\n"
            "                         context+1; 0 = the whole split (default 0); N past the split's\n"
            "                         end reads the whole split. The evaluations during training\n"
            "                         (--eval-iters batches) sample the whole split either way\n"
            "  --save PATH            safetensors checkpoint, written atomically at the end, every\n"
            "                         --save-interval steps and on SIGINT/SIGTERM; not with\n"
            "                         --eval-only (default none)\n"
            "  --save-interval N      steps between checkpoints with --save, 0 = only at the end\n"
            "                         (default 0)\n"
            "  --resume PATH          continue from a checkpoint\n"
            "  --log PATH             JSONL, one row per step; with --resume, rows after the\n"
            "                         checkpoint's step are dropped first\n"
            "  --trace PATH           Chrome trace-event JSON of the training steps (Perfetto,\n"
            "                         chrome://tracing): one track per device, a span per phase\n"
            "  --sample N             generate N tokens at the end, 0 = none, at most %ld\n"
            "                         (default %ld)\n"
            "  --temperature X  --top-k N  --prompt TEXT   sampling (default %g, %ld, newline,\n"
            "                         or the corpus's first token when it has no newline)\n"
            "  --prompt-ids ID,...    token data's prompt, as ids, e.g. 50256,464 (default the\n"
            "                         end-of-text id, 50256 or --tokenizer-file's, as llm.c; the\n"
            "                         training split's first token when the vocabulary is smaller).\n"
            "                         --prompt TEXT would need GPT-2's BPE encoder, which dp does not\n"
            "                         have: token data take ids only\n"
            "  --help                 this text\n"
            "SIGINT or SIGTERM stops after the current step, saves (with --save) and exits with\n"
            "128 + the signal number; a second signal exits at once.\n"
            "ranks: mpirun -np R lm_train --devices cpu:K ... trains one model on R x K devices,\n"
            "bitwise as one process with R x K; rank 0 prints and writes --save, --log and\n"
            "--trace (its own devices' tracks); every rank reads --data and --resume (a path all\n"
            "ranks can read); evaluation is distributed too (each rank its rows, one global loss).\n"
            "A signal to any rank stops all at the same step and saves; Open MPI's mpirun, when\n"
            "signalled, sends SIGTERM to the ranks and SIGKILL 1 s later (more: --mca\n"
            "odls_base_sigkill_timeout SECONDS), so signal the ranks when a save takes longer.\n",
            LM_DEFAULT_CORPUS, d.tokenizer, d.vocab_size, DP_GPT2_VOCAB_SIZE, TOKEN_VOCAB_MAX,
            d.devices, d.mode, DP_GPT_ATTENTION_CHUNK, DP_GPT_ATTENTION_CHUNK, d.layers, d.heads,
            d.dim, d.context, d.batch_size, d.grad_accum, d.steps, d.lr, d.min_lr, d.warmup,
            d.weight_decay, d.beta1, d.beta2, d.grad_clip, d.seed, d.max_skips, d.eval_interval,
            d.eval_iters, SAMPLE_MAX, d.sample, d.temperature, d.top_k);
}

/* --val-tokens below one window (context+1 tokens: context inputs, and
 * the last one's target one further) would evaluate nothing. `whose` says
 * where the context came from ("" or "the checkpoint's "). */
static int check_val_tokens(const opts *o, const char *whose)
{
    if (!o->val_tokens || o->val_tokens > o->context) return 0;
    /* unsigned: --context LONG_MAX must not overflow the message's number */
    unsigned long need = (unsigned long)o->context + 1;
    return cli_fail("--val-tokens %ld is shorter than one window (%scontext+1 = %lu tokens); "
                    "give at least %lu or 0 for the whole split", o->val_tokens, whose, need,
                    need);
}

/* 1 with a message when o is inconsistent (checks that need no file). */
static int check_opts(const opts *o)
{
    if (o->beta1 >= 1 || o->beta2 >= 1) return cli_fail("--beta1 and --beta2 must be < 1");
    if (o->eval_only && !o->resume) return cli_fail("--eval-only needs --resume CHECKPOINT");
    if (o->att_chunk && !o->chunked_att)
        return cli_fail("--attention-chunk %ld needs --attention chunked (it sets the queries per "
                        "chunk of the chunked attention)", o->att_chunk);
    if (o->eval_only && o->save)
        return cli_fail("--save with --eval-only: evaluation changes nothing to save; drop --save");
    if (o->eval_only && o->trace)
        return cli_fail("--trace with --eval-only: the trace records training steps; drop --trace");
    if (o->bf16 && o->tf32)
        return cli_fail("--tf32 with --precision bf16: bf16 GEMMs round further than TF32; "
                        "drop one");
    if ((o->given & G_SAVEI) && !o->save)
        return cli_fail("--save-interval needs --save PATH (where to write the checkpoints)");
    if (o->grad_accum > INT_MAX)
        return cli_fail("--grad-accum %ld is too large (at most %d)", o->grad_accum, INT_MAX);
    if (o->max_tokens && o->max_tokens < o->context && !o->resume)
        return cli_fail("--max-tokens-per-device %ld is below --context %ld (one sequence); "
                        "raise it to at least %ld", o->max_tokens, o->context, o->context);
    /* With --resume the checkpoint's context counts (apply_checkpoint checks). */
    if (!o->resume && check_val_tokens(o, "")) return 1;
    /* With --resume the checkpoint's shape counts; setup reports a conflict. */
    if (!o->resume && o->dim % o->heads)
        return cli_fail("--heads %ld does not divide --dim %ld; pick heads that divide dim",
                        o->heads, o->dim);
    return 0;
}

static int parse_args(int argc, char **argv, opts *o)
{
    enum {
        O_DATA = 256, O_TOK, O_VOCAB, O_DEV, O_MODE, O_LAYERS, O_HEADS, O_DIM, O_CTX, O_BATCH,
        O_ACCUM, O_MAXTOK, O_STEPS, O_LR, O_MINLR, O_WARMUP, O_DECAY, O_WD, O_B1, O_B2, O_CLIP,
        O_EVI, O_EVN, O_SEED, O_SAVE, O_SAVEI, O_RESUME, O_EVONLY, O_SAMPLE, O_TEMP, O_TOPK,
        O_PROMPT, O_LOG, O_MEM, O_SKIPS, O_WATCHDOG, O_CHECK, O_TF32, O_WEIGHTS, O_TOKBAL, O_TRACE,
        O_SHARD, O_CHUNK, O_PREC, O_TOKFILE, O_PROMPTIDS, O_VALTOK, O_RECOMP, O_ATTN, O_ATTCHUNK,
        O_HELP
    };
    static const struct option lo[] = {
        {"data", 1, 0, O_DATA},          {"tokenizer", 1, 0, O_TOK},
        {"vocab-size", 1, 0, O_VOCAB},   {"devices", 1, 0, O_DEV},
        {"mode", 1, 0, O_MODE},          {"layers", 1, 0, O_LAYERS},
        {"heads", 1, 0, O_HEADS},        {"dim", 1, 0, O_DIM},
        {"context", 1, 0, O_CTX},        {"batch-size", 1, 0, O_BATCH},
        {"grad-accum", 1, 0, O_ACCUM},   {"max-tokens-per-device", 1, 0, O_MAXTOK},
        {"steps", 1, 0, O_STEPS},        {"lr", 1, 0, O_LR},
        {"min-lr", 1, 0, O_MINLR},       {"warmup", 1, 0, O_WARMUP},
        {"lr-decay-steps", 1, 0, O_DECAY}, {"weight-decay", 1, 0, O_WD},
        {"beta1", 1, 0, O_B1},           {"beta2", 1, 0, O_B2},
        {"grad-clip", 1, 0, O_CLIP},     {"eval-interval", 1, 0, O_EVI},
        {"eval-iters", 1, 0, O_EVN},     {"seed", 1, 0, O_SEED},
        {"save", 1, 0, O_SAVE},          {"save-interval", 1, 0, O_SAVEI},
        {"resume", 1, 0, O_RESUME},      {"eval-only", 0, 0, O_EVONLY},
        {"sample", 1, 0, O_SAMPLE},      {"temperature", 1, 0, O_TEMP},
        {"top-k", 1, 0, O_TOPK},         {"prompt", 1, 0, O_PROMPT},
        {"log", 1, 0, O_LOG},            {"memory-limit", 1, 0, O_MEM},
        {"max-skips", 1, 0, O_SKIPS},    {"watchdog", 1, 0, O_WATCHDOG},
        {"check-replicas", 1, 0, O_CHECK}, {"tf32", 0, 0, O_TF32},
        {"device-weights", 1, 0, O_WEIGHTS}, {"token-balanced", 0, 0, O_TOKBAL},
        {"trace", 1, 0, O_TRACE},        {"shard-optimizer", 0, 0, O_SHARD},
        {"logits-chunk", 1, 0, O_CHUNK}, {"precision", 1, 0, O_PREC},
        {"tokenizer-file", 1, 0, O_TOKFILE}, {"prompt-ids", 1, 0, O_PROMPTIDS},
        {"val-tokens", 1, 0, O_VALTOK},  {"recompute", 1, 0, O_RECOMP},
        {"attention", 1, 0, O_ATTN},     {"attention-chunk", 1, 0, O_ATTCHUNK},
        {"help", 0, 0, O_HELP},
        {0, 0, 0, 0}};
    opterr = 0;
    int c;
    /* The leading ':' makes a missing value return ':' rather than '?'. */
    while ((c = getopt_long(argc, argv, ":", lo, NULL)) != -1) {
        const char *v = optarg;
        int bad = 0;
        long seed = 0;
        switch (c) {
        case O_DATA: o->data = v; break;
        case O_TOK: o->tokenizer = v; o->given |= G_TOK; break;
        case O_VOCAB: bad = cli_parse_long("--vocab-size", v, 2, LONG_MAX, &o->vocab_size); o->given |= G_VOCAB; break;
        case O_DEV: o->devices = v; break;
        case O_MODE: o->mode = v; break;
        case O_LAYERS: bad = cli_parse_long("--layers", v, 1, LONG_MAX, &o->layers); o->given |= G_LAYERS; break;
        case O_HEADS: bad = cli_parse_long("--heads", v, 1, LONG_MAX, &o->heads); o->given |= G_HEADS; break;
        case O_DIM: bad = cli_parse_long("--dim", v, 1, LONG_MAX, &o->dim); o->given |= G_DIM; break;
        case O_CTX: bad = cli_parse_long("--context", v, 1, LONG_MAX, &o->context); o->given |= G_CTX; break;
        case O_BATCH: bad = cli_parse_long("--batch-size", v, 1, LONG_MAX, &o->batch_size); break;
        case O_ACCUM: bad = cli_parse_long("--grad-accum", v, 1, LONG_MAX, &o->grad_accum); break;
        case O_MAXTOK: bad = cli_parse_long("--max-tokens-per-device", v, 1, LONG_MAX, &o->max_tokens); break;
        case O_STEPS: bad = cli_parse_long("--steps", v, 0, LONG_MAX, &o->steps); break;
        case O_LR: bad = cli_parse_double("--lr", v, 0, &o->lr); break;
        case O_MINLR: bad = cli_parse_double("--min-lr", v, 0, &o->min_lr); break;
        case O_WARMUP: bad = cli_parse_long("--warmup", v, 0, LONG_MAX, &o->warmup); break;
        case O_DECAY: bad = cli_parse_long("--lr-decay-steps", v, 1, LONG_MAX, &o->lr_decay_steps); o->given |= G_DECAY; break;
        case O_WD: bad = cli_parse_double("--weight-decay", v, 0, &o->weight_decay); break;
        case O_B1: bad = cli_parse_double("--beta1", v, 0, &o->beta1); break;
        case O_B2: bad = cli_parse_double("--beta2", v, 0, &o->beta2); break;
        case O_CLIP: bad = cli_parse_double("--grad-clip", v, 0, &o->grad_clip); break;
        case O_EVI: bad = cli_parse_long("--eval-interval", v, 1, LONG_MAX, &o->eval_interval); break;
        case O_EVN: bad = cli_parse_long("--eval-iters", v, 1, LONG_MAX, &o->eval_iters); break;
        case O_SEED: bad = cli_parse_long("--seed", v, 0, LONG_MAX, &seed); o->seed = (unsigned long long)seed; break;
        case O_SAVE: o->save = v; break;
        case O_SAVEI: bad = cli_parse_long("--save-interval", v, 0, LONG_MAX, &o->save_interval); o->given |= G_SAVEI; break;
        case O_RESUME: o->resume = v; break;
        case O_EVONLY: o->eval_only = 1; break;
        case O_VALTOK: bad = cli_parse_long("--val-tokens", v, 0, LONG_MAX, &o->val_tokens); break;
        case O_TF32: o->tf32 = 1; break;
        case O_TOKBAL: o->token_balanced = 1; break;
        case O_TRACE: o->trace = v; break;
        case O_SHARD: o->shard_optimizer = 1; break;
        case O_WEIGHTS: o->device_weights = v; break;
        case O_SAMPLE: bad = cli_parse_long("--sample", v, 0, SAMPLE_MAX, &o->sample); break;
        case O_TEMP: bad = cli_parse_double("--temperature", v, 1e-6, &o->temperature); break;
        case O_TOPK: bad = cli_parse_long("--top-k", v, 0, LONG_MAX, &o->top_k); break;
        case O_PROMPT: o->prompt = v; o->given |= G_PROMPT; break;
        case O_TOKFILE: o->tokenizer_file = v; break;
        case O_PROMPTIDS: o->prompt_ids = v; break;
        case O_LOG: o->log = v; break;
        case O_MEM: o->memory_limit = v; break;
        case O_SKIPS: bad = cli_parse_long("--max-skips", v, 1, LONG_MAX, &o->max_skips); break;
        case O_WATCHDOG: bad = cli_parse_watchdog(v, &o->watchdog); break;
        case O_CHECK: bad = cli_parse_long("--check-replicas", v, 0, LONG_MAX, &o->check_replicas); break;
        case O_CHUNK: bad = cli_parse_logits_chunk(v, &o->logits_chunk); break;
        case O_PREC: bad = cli_parse_precision(v, &o->bf16); o->given |= G_PREC; break;
        case O_RECOMP: bad = cli_parse_recompute(v, &o->recompute); break;
        case O_ATTN: bad = cli_parse_attention(v, &o->chunked_att); break;
        case O_ATTCHUNK: bad = cli_parse_long("--attention-chunk", v, 1, INT_MAX, &o->att_chunk); break;
        case O_HELP: usage(stdout); return -1;
        case ':': return cli_fail("%s needs a value (see --help)", argv[optind - 1]);
        default:
            /* getopt sets optopt to a known option given a value it does not take. */
            if (optopt)
                return cli_fail("\"%s\": this option takes no value (see --help)", argv[optind - 1]);
            return cli_fail("unknown option \"%s\" (see --help)", argv[optind - 1]);
        }
        if (bad) return 1;
    }
    if (optind < argc) return cli_fail("unexpected argument \"%s\" (see --help)", argv[optind]);
    return check_opts(o);
}

// --- signals ------------------------------------------------------------------------

/* The first SIGINT/SIGTERM's number; the loops check it between steps. */
static volatile sig_atomic_t stop_signal;
/* Under mpirun: make stdout and stderr non-blocking when a signal comes. */
static volatile sig_atomic_t unblock_output;

static void on_signal(int sig)
{
    if (unblock_output) {
        /* mpirun, signalled, stops reading the ranks' output, then sends
         * them SIGTERM: a write to a full pseudo-terminal would block rank 0
         * (and every rank waiting for it) until mpirun's SIGKILL, so it
         * must fail instead. fcntl is async-signal-safe; the write this
         * signal interrupted restarts non-blocking. */
        for (int fd = STDOUT_FILENO; fd <= STDERR_FILENO; fd++) {
            int fl = fcntl(fd, F_GETFL);
            if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
        }
    }
    if (stop_signal) {
        static const char msg[] = "lm_train: second signal: exiting at once\n";
        ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
        (void)w;
        _exit(128 + sig);
    }
    stop_signal = sig;
}

/* ranked: under mpirun, which on SIGINT/SIGTERM stops forwarding the
 * ranks' output, sends them SIGTERM and 1 s later SIGKILL (Open MPI's
 * odls_base_sigkill_timeout): no write may block or kill (SIGPIPE) a rank
 * before it saves. */
static void install_signal_handlers(int ranked)
{
    unblock_output = ranked;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART; /* no EINTR in the middle of a write */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    if (ranked) signal(SIGPIPE, SIG_IGN);
}

// --- the run ------------------------------------------------------------------------

typedef struct run {
    opts o;
    dp_checkpoint *ck; /* the --resume checkpoint, NULL without */
    dp_tokenizer *tok; /* text: the tokenizer; token data: --tokenizer-file's table or NULL */
    dp_token_data *data;
    int is_tokens;     /* --data holds token files (dp_token_files_probe) */
    dp_gpt *gpt;
    dp_engine *engine;
    dp_sampler *train, *eval_train, *eval_val;
    int32_t *inputs, *targets; /* (batch_size, context) host */
    int32_t *prompt_ids;       /* the sampling prompt, prompt_len tokens */
    size_t prompt_len;
    char *prompt_text;         /* what the prompt prints as */
    float weights[DP_MAX_DEVICES];
    size_t n_params;
    long step;
    long saved_step;           /* step of this run's last checkpoint, -1 = none */
    long skipped, consecutive_skips; /* steps skipped for non-finite values */
    FILE *log;
    dp_trace *trace; /* --trace: every training step's phase spans */
    int tty;
    int exit_code;             /* non-zero: the status main returns (signals) */
    cli_ranks rk; /* the job's ranks under mpirun (one rank, dist NULL, alone) */
    size_t step_bytes;         /* bytes this rank sent to the others inside dp_engine_step */
} run;

// --- ranks --------------------------------------------------------------------------

/* An error every rank meets alike: rank 0 prints it (CLI_AGREED_FAIL). */
#define AGREED_FAIL(r, ...) CLI_AGREED_FAIL(&(r)->rk, __VA_ARGS__)

/* A failed engine call (cli_ranks_engine_fail). */
static int engine_fail(run *r, dp_status s, const char *what)
{
    return cli_ranks_engine_fail(&r->rk, s, what);
}

/* A failure on this rank alone where the others cannot learn of it (they
 * are on their way into a collective): with ranks the job ends with
 * dp_dist_abort. For outcomes that are the same on every rank in
 * practice (sampling a batch from the same data). */
static int local_fatal(run *r, const char *what)
{
    r->rk.broken = r->rk.ranks > 1;
    return cli_dp_fail(what);
}

/* Agreement on this rank's outcome (cli_ranks_agree). */
static int agree(run *r, int failed) { return cli_ranks_agree(&r->rk, failed); }

/* What go_on's agreement carries for a signal, before its number. */
#define STOP_ON "lm_train stops on signal "

/* Whether to go on, at a point where a signal stops the run: 0 go on, -1
 * a rank failed (failed on this one; it printed why), else the number of
 * the signal that stops the run. With ranks every rank's pending signal
 * is agreed, so all stop at the same step (the lowest signalled rank's
 * signal), though the launcher may deliver it at different times. */
static int go_on(run *r, int failed)
{
    if (r->rk.ranks == 1) return failed ? -1 : stop_signal;
    int sig = stop_signal;
    dp_status local = DP_OK;
    if (failed) local = dp_set_error(DP_ERR_ABORTED, "failed");
    else if (sig) local = dp_set_error(DP_ERR_ABORTED, STOP_ON "%d", sig);
    dp_status s = dp_dist_agree(r->rk.dist, local);
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

static void human_bytes(size_t b, char *buf, size_t cap)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double x = (double)b;
    int i = 0;
    while (x >= 1024 && i < 4) x /= 1024, i++;
    snprintf(buf, cap, i ? "%.1f%s" : "%.0f%s", x, u[i]);
}

static const char *signal_name(int sig) { return sig == SIGINT ? "SIGINT" : "SIGTERM"; }

/* Signal sig arrived during evaluation or sampling: stop there. */
static int interrupted(run *r, int sig, const char *during)
{
    fflush(stdout);
    r->exit_code = 128 + sig;
    return AGREED_FAIL(r, "interrupted by %s during %s%s%s", signal_name(sig), during,
                       r->saved_step >= 0 ? "; the checkpoint was saved to " : "",
                       r->saved_step >= 0 ? r->o.save : "");
}

/* Mean loss over eval_iters random batches of a split (with ranks, each
 * rank evaluates its rows of every batch; the loss is global); -1 (no
 * message) when a signal arrived, so the training loop saves and stops. */
static int estimate_loss(run *r, dp_sampler *s, double *out)
{
    size_t B = (size_t)r->o.batch_size;
    double sum = 0.0;
    size_t n = 0;
    for (long i = 0; i < r->o.eval_iters; i++) {
        int g = go_on(r, 0);
        if (g) return g > 0 ? -1 : 1;
        if (dp_sampler_next(s, r->inputs, r->targets, B) != DP_OK) return local_fatal(r, "eval batch");
        dp_batch b = {B, r->inputs, r->targets};
        dp_step_stats st;
        dp_status es = dp_engine_evaluate(r->engine, &b, &st);
        if (es != DP_OK) return engine_fail(r, es, "evaluate");
        sum += st.loss * (double)st.valid_targets;
        n += st.valid_targets;
    }
    *out = sum / (double)n;
    return 0;
}

/* Loss over the validation split: consecutive windows at multiples of the
 * context, the last incomplete one dropped. Window w reads tokens w*T ..
 * w*T + T (T inputs, the last target one further), so with --val-tokens N
 * the windows wholly within the first N tokens are W = min(all windows,
 * floor((N - 1) / T)): the same windows, in the same batches, as a split
 * of exactly N tokens: the loss is that split's, to the bit on the same
 * devices. With ranks every rank computes the same W (the same data and
 * command line) and evaluates its rows of each batch, so the collective
 * calls match. */
static int full_val_loss(run *r, double *out)
{
    size_t T = (size_t)r->o.context, B = (size_t)r->o.batch_size;
    size_t W = dp_eval_window_count(r->data, DP_SPLIT_VAL, T);
    if (!W)
        return AGREED_FAIL(r, "the validation split has fewer than context+1 = %zu tokens", T + 1);
    /* check_val_tokens made N > T, so the limit is at least one window. */
    size_t limit = r->o.val_tokens ? ((size_t)r->o.val_tokens - 1) / T : W;
    if (limit < W) {
        /* The loss no longer covers the whole split: say so, on a line of
         * its own so the val_loss lines read as before. */
        printf("validation: the first %zu of %zu tokens (--val-tokens %ld: %zu windows of "
               "context %zu)\n", limit * T + 1, dp_token_data_size(r->data, DP_SPLIT_VAL),
               r->o.val_tokens, limit, T);
        W = limit;
    }
    double sum = 0.0;
    size_t n = 0;
    for (size_t first = 0; first < W; first += B) {
        int g = go_on(r, 0);
        if (g) return g > 0 ? interrupted(r, g, "the final evaluation") : 1;
        size_t rows = W - first < B ? W - first : B;
        if (dp_eval_windows(r->data, DP_SPLIT_VAL, T, first, rows, r->inputs, r->targets) != DP_OK)
            return local_fatal(r, "validation windows");
        dp_batch b = {rows, r->inputs, r->targets};
        dp_step_stats st;
        dp_status es = dp_engine_evaluate(r->engine, &b, &st);
        if (es != DP_OK) return engine_fail(r, es, "evaluate");
        sum += st.loss * (double)st.valid_targets;
        n += st.valid_targets;
    }
    *out = sum / (double)n;
    return 0;
}

/* What the checkpoint's META_FORMAT says of the data. */
static const char *data_format(const run *r)
{
    dp_token_data_info info;
    if (!r->is_tokens || dp_token_data_get_info(r->data, &info) != DP_OK) return FORMAT_TEXT;
    return dp_token_format_name(info.format);
}

static char *config_json(const opts *o)
{
    json_t *j = json_pack("{s:s, s:s, s:I, s:I, s:f, s:f, s:I, s:I, s:f, s:f, s:f, s:f, s:I, "
                          "s:I, s:I, s:s}",
                          "tokenizer", o->tokenizer, "mode", o->mode, "batch_size",
                          (json_int_t)o->batch_size, "steps", (json_int_t)o->steps, "lr", o->lr,
                          "min_lr", o->min_lr, "warmup", (json_int_t)o->warmup,
                          "lr_decay_steps", (json_int_t)o->lr_decay_steps, "weight_decay",
                          o->weight_decay, "beta1", o->beta1, "beta2", o->beta2, "grad_clip",
                          o->grad_clip, "seed", (json_int_t)o->seed, "grad_accum",
                          (json_int_t)o->grad_accum, "vocab_size", (json_int_t)o->vocab_size,
                          "precision", o->bf16 ? "bf16" : "fp32");
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(j);
    return s;
}

/* Writes --save. With ranks every rank reads the parameters and moments
 * (collective), rank 0 writes the file, and the ranks agree on the
 * outcome, so a failed write stops every rank with the same status. */
static int save_checkpoint(run *r)
{
    dp_checkpoint ck;
    memset(&ck, 0, sizeof ck);
    ck.step = r->step;
    size_t bytes = 0;
    if (!dp_size_mul(r->n_params, sizeof(float), &bytes))
        return AGREED_FAIL(r, "the model's %zu parameters overflow a buffer size", r->n_params);
    ck.params = malloc(bytes);
    ck.m = malloc(bytes);
    ck.v = malloc(bytes);
    char decay[32], ntrain[32], nval[32];
    snprintf(decay, sizeof decay, "%ld", r->o.lr_decay_steps);
    snprintf(ntrain, sizeof ntrain, "%zu", dp_token_data_size(r->data, DP_SPLIT_TRAIN));
    snprintf(nval, sizeof nval, "%zu", dp_token_data_size(r->data, DP_SPLIT_VAL));
    const dp_checkpoint_kv meta[5] = {{META_DECAY, decay},
                                      {META_FORMAT, data_format(r)},
                                      {META_TRAIN, ntrain},
                                      {META_VAL, nval},
                                      {META_PRECISION, r->o.bf16 ? "bf16" : "fp32"}};
    ck.meta = meta;
    ck.n_meta = 5;
    int rc = 0;
    if (!ck.params || !ck.m || !ck.v) rc = cli_fail("out of host memory saving a checkpoint");
    rc = agree(r, rc);
    dp_status s = DP_OK;
    if (!rc && (s = dp_engine_get_params(r->engine, ck.params)) == DP_OK)
        s = dp_engine_get_optimizer_state(r->engine, ck.m, ck.v, &ck.optimizer_step);
    if (!rc && s != DP_OK) rc = engine_fail(r, s, "reading parameters");
    int all_here = !rc; /* every rank is here: the outcome of the write is agreed */
    if (!rc && r->rk.rank == 0) {
        /* Token data have no tokenizer to store (--tokenizer-file is given again). */
        if (!r->is_tokens && dp_tokenizer_serialize(r->tok, &ck.tokenizer) != DP_OK)
            rc = cli_dp_fail("tokenizer");
        if (!rc && dp_sampler_get_state(r->train, ck.sampler) != DP_OK) rc = cli_dp_fail("sampler state");
        ck.has_sampler = 1;
        if (!rc && !(ck.config_json = config_json(&r->o))) rc = cli_fail("out of host memory");
        if (!rc && dp_gpt_checkpoint_save(r->o.save, r->gpt, &ck) != DP_OK) rc = cli_dp_fail("save");
    }
    if (all_here) rc = agree(r, rc);
    if (!rc) r->saved_step = r->step;
    free(ck.params);
    free(ck.m);
    free(ck.v);
    free(ck.tokenizer);
    free(ck.config_json);
    return rc;
}

/* The sampling state; freed by sample_free on every path. */
typedef struct sampler_bufs {
    int32_t *ctx;
    float *params, *logits, *probs; /* probs: dp_sample_logits's work */
    void *ws, *dtok, *dparams, *dlogits;
    dp_device *dev;
} sampler_bufs;

static void sample_free(sampler_bufs *b)
{
    if (b->dev) {
        dp_device_free(b->dev, b->ws);
        dp_device_free(b->dev, b->dtok);
        dp_device_free(b->dev, b->dparams);
        dp_device_free(b->dev, b->dlogits);
    }
    free(b->ctx);
    free(b->params);
    free(b->logits);
    free(b->probs);
}

/* Samples n tokens after the prompt on the root device, printing them;
 * b->params holds the parameters (generate reads them). */
static int generate_into(run *r, sampler_bufs *b)
{
    const dp_gpt_config *c = dp_gpt_config_of(r->gpt);
    size_t T = c->block_size, V = c->vocab_size, n = (size_t)r->o.sample;
    size_t cap = 0, pbytes = 0, ctx_bytes = 0, v_bytes = 0, tv_bytes = 0;
    /* --sample is bounded at parse time; checked anyway, as every size from input. */
    if (!dp_size_add(r->prompt_len, n, &cap) || !dp_size_mul(cap, sizeof(int32_t), &ctx_bytes) ||
        !dp_size_mul(r->n_params, sizeof(float), &pbytes) ||
        !dp_size_mul(V, sizeof(float), &v_bytes) || !dp_size_mul(T, v_bytes, &tv_bytes))
        return cli_fail("--sample %zu: the sampling buffers' sizes overflow", n);
    b->ctx = malloc(ctx_bytes);
    b->logits = malloc(v_bytes);
    b->probs = malloc(v_bytes);
    if (!b->ctx || !b->logits || !b->probs)
        return cli_fail("out of host memory for sampling");
    memcpy(b->ctx, r->prompt_ids, r->prompt_len * sizeof(int32_t));
    size_t len = r->prompt_len;
    b->dev = dp_engine_device(r->engine, 0);
    if (dp_device_bind_thread(b->dev) != DP_OK ||
        dp_device_alloc(b->dev, dp_gpt_workspace_bytes(r->gpt, 1, T), &b->ws) != DP_OK ||
        dp_device_alloc(b->dev, T * sizeof(int32_t), &b->dtok) != DP_OK ||
        dp_device_alloc(b->dev, pbytes, &b->dparams) != DP_OK ||
        dp_device_alloc(b->dev, tv_bytes, &b->dlogits) != DP_OK ||
        dp_copy_h2d(b->dev, b->dparams, b->params, pbytes) != DP_OK)
        return cli_dp_fail("sampling setup");
    dp_rng rng;
    dp_rng_seed(&rng, r->o.seed ^ 0x5eedULL);
    int ids = r->is_tokens && !r->tok; /* token data without a table: print ids */
    printf("--- sample (%zu tokens, temperature %g, top-k %ld%s) ---\n%s", n, r->o.temperature,
           r->o.top_k, ids ? "; token ids: --tokenizer-file prints text" : "", r->prompt_text);
    for (size_t i = 0; i < n; i++) {
        if (stop_signal) return interrupted(r, stop_signal, "sampling");
        size_t t = len < T ? len : T; /* crop to the last block_size tokens */
        const int32_t *win = b->ctx + len - t;
        if (dp_copy_h2d(b->dev, b->dtok, win, t * sizeof(int32_t)) != DP_OK ||
            dp_gpt_forward(r->gpt, b->dev, b->dparams, b->dtok, 1, t, b->ws, b->dlogits) != DP_OK ||
            dp_copy_d2h(b->dev, b->logits, (float *)b->dlogits + (t - 1) * V, v_bytes) != DP_OK)
            return cli_dp_fail("sampling");
        int32_t pick = 0;
        dp_status ss = dp_sample_logits(b->logits, V, r->o.temperature, (size_t)r->o.top_k, &rng,
                                         b->probs, &pick);
        /* Logits without a distribution (NaN, +inf, all -inf) print the
         * last id, as this sampler always did before it moved into dp. */
        if (ss == DP_ERR_NON_FINITE) pick = (int32_t)(V - 1);
        else if (ss != DP_OK) return cli_dp_fail("sampling");
        b->ctx[len++] = pick;
        const char *bytes;
        size_t blen;
        /* An id past the table (a padded vocabulary, 50304 > 50257) prints nothing. */
        if (ids)
            printf(" %zu", (size_t)pick);
        else if (dp_tokenizer_token(r->tok, pick, &bytes, &blen) == DP_OK)
            fwrite(bytes, 1, blen, stdout);
    }
    printf("\n---\n");
    return 0;
}

/* With ranks every rank reads the parameters (collective), rank 0
 * samples, and the ranks agree on its outcome. */
static int generate(run *r)
{
    sampler_bufs b;
    memset(&b, 0, sizeof b);
    size_t pbytes = 0;
    int rc = 0;
    if (!dp_size_mul(r->n_params, sizeof(float), &pbytes) || !(b.params = malloc(pbytes)))
        rc = cli_fail("out of host memory for sampling");
    rc = agree(r, rc);
    dp_status s = DP_OK;
    if (!rc && (s = dp_engine_get_params(r->engine, b.params)) != DP_OK)
        rc = engine_fail(r, s, "sampling setup");
    int all_here = !rc;
    if (!rc && r->rk.rank == 0) rc = generate_into(r, &b);
    if (all_here) rc = agree(r, rc);
    sample_free(&b);
    return rc;
}

static void progress(run *r, const dp_step_stats *st, double lr, double elapsed, long first)
{
    double tok_s = (double)(r->o.batch_size * r->o.context) / st->seconds;
    double eta = (elapsed / (double)(r->step - first)) * (double)(r->o.steps - r->step);
    char line[512];
    int n = snprintf(line, sizeof line, "step %ld/%ld | loss %.4f | lr %.2e | %.0f tok/s | %.1f ms | ETA %.0fs | peak",
                     r->step, r->o.steps, st->loss, lr, tok_s, 1e3 * st->seconds, eta);
    for (size_t d = 0; d < st->n_devices && n < (int)sizeof line - 16; d++) {
        char b[32];
        human_bytes(st->devices[d].peak, b, sizeof b);
        n += snprintf(line + n, sizeof line - (size_t)n, " %s", b);
    }
    if (r->tty) {
        printf("\r%s\033[K", line);
        fflush(stdout);
    } else {
        long every = r->o.eval_interval / 10 > 0 ? r->o.eval_interval / 10 : 1;
        if (r->step % every == 0 || r->step == r->o.steps) {
            printf("%s\n", line);
            fflush(stdout); /* a log watcher (or a job killed by SIGKILL) sees whole lines */
        }
    }
}

static void log_row(run *r, const dp_step_stats *st, double lr)
{
    if (!r->log) return;
    json_t *peaks = json_array();
    for (size_t d = 0; d < st->n_devices; d++)
        json_array_append_new(peaks, json_integer((json_int_t)st->devices[d].peak));
    /* JSON has no NaN or Inf: a non-finite loss or norm is logged as null. */
    json_t *loss = isfinite(st->loss) ? json_real(st->loss) : json_null();
    json_t *norm = isfinite(st->grad_norm) ? json_real(st->grad_norm) : json_null();
    json_t *row = json_pack("{s:I, s:o, s:f, s:o, s:f, s:f, s:b, s:I, s:o}", "step",
                            (json_int_t)(st->skipped ? r->step + 1 : r->step), "loss", loss,
                            "lr", lr, "grad_norm", norm, "tokens_per_s",
                            (double)(r->o.batch_size * r->o.context) / st->seconds, "ms",
                            1e3 * st->seconds, "skipped", st->skipped, "skipped_total",
                            (json_int_t)r->skipped, "peak_bytes", peaks);
    if (row) {
        json_dumpf(row, r->log, JSON_COMPACT);
        fputc('\n', r->log);
        fflush(r->log);
    }
    json_decref(row);
}

/* Fails unless a checkpoint can be written at path: its directory exists
 * and is writable, and path is not a directory. Checked before training so
 * a typo does not cost the whole run. */
static int check_save_path(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return cli_fail("--save %s is a directory; give a file name for the checkpoint", path);
    char *dir = strdup(path);
    if (!dir) return cli_fail("out of host memory");
    char *slash = strrchr(dir, '/');
    const char *d = ".";
    if (slash == dir) {
        d = "/";
    } else if (slash) {
        *slash = '\0';
        d = dir;
    }
    int rc = 0;
    if (stat(d, &sb) != 0)
        rc = cli_fail("--save %s: directory '%s': %s; create it first", path, d, strerror(errno));
    else if (!S_ISDIR(sb.st_mode))
        rc = cli_fail("--save %s: '%s' is not a directory", path, d);
    else if (access(d, W_OK | X_OK) != 0)
        rc = cli_fail("--save %s: cannot write in directory '%s': %s", path, d, strerror(errno));
    free(dir);
    return rc;
}

/* Opens --log. A resumed run keeps the rows up to the checkpoint's step and
 * drops the later ones (written by the run that went past the checkpoint
 * before it stopped), so every step appears once; an unreadable row (a
 * line cut off by a kill) is dropped too. */
static int open_log(run *r)
{
    const char *path = r->o.log;
    if (!path) return 0;
    if (!r->step) {
        if (!(r->log = fopen(path, "w"))) return cli_fail("--log %s: %s", path, strerror(errno));
        return 0;
    }
    FILE *in = fopen(path, "r");
    if (!in && errno != ENOENT) return cli_fail("--log %s: %s", path, strerror(errno));
    char *kept = NULL;
    size_t kept_len = 0, dropped = 0, rows = 0;
    FILE *mem = in ? open_memstream(&kept, &kept_len) : NULL;
    if (in && !mem) {
        fclose(in);
        return cli_fail("out of host memory");
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    while (in && (got = getline(&line, &cap, in)) > 0) {
        json_t *row = line[got - 1] == '\n' ? json_loads(line, 0, NULL) : NULL;
        json_t *step = row ? json_object_get(row, "step") : NULL;
        if (step && json_is_integer(step) && json_integer_value(step) <= r->step) {
            fputs(line, mem);
            rows++;
        } else {
            dropped++;
        }
        json_decref(row);
    }
    free(line);
    if (in) {
        fclose(in);
        fclose(mem);
    }
    r->log = fopen(path, "w");
    if (!r->log) {
        free(kept);
        return cli_fail("--log %s: %s", path, strerror(errno));
    }
    if (kept_len) fwrite(kept, 1, kept_len, r->log);
    free(kept);
    fflush(r->log);
    if (dropped)
        printf("log: %s: kept %zu rows up to step %ld, dropped %zu written after it\n", path,
               rows, r->step, dropped);
    return 0;
}

/* The prompt as tokens, checked before any training: a prompt given with
 * --prompt must be in the vocabulary; the default (a newline) falls back to
 * the first token of the training text when the vocabulary has no newline. */
static int prepare_text_prompt(run *r)
{
    const opts *o = &r->o;
    int given = (o->given & G_PROMPT) != 0;
    if (!o->sample && !given) return 0;
    size_t plen = strlen(o->prompt), cap = plen ? plen : 1, bytes = 0;
    if (!dp_size_mul(cap, sizeof(int32_t), &bytes)) return cli_fail("--prompt is too long");
    r->prompt_ids = malloc(bytes);
    if (!r->prompt_ids) return cli_fail("out of host memory for --prompt");
    size_t n = 0, unk = 0;
    dp_status s = dp_tokenizer_encode(r->tok, o->prompt, plen, r->prompt_ids, cap, &n, &unk);
    if (s == DP_OK && !unk && n > 0) {
        r->prompt_len = n;
        r->prompt_text = strdup(o->prompt);
        return r->prompt_text ? 0 : cli_fail("out of host memory");
    }
    if (given) {
        if (s != DP_OK)
            return cli_fail("--prompt: %s; use text made of the corpus's characters",
                            dp_last_error());
        if (unk)
            return cli_fail("--prompt \"%s\": %zu word%s not in the vocabulary; use words of "
                            "the corpus", o->prompt, unk, unk == 1 ? " is" : "s are");
        /* An empty prompt: fall through to the first token. */
    }
    /* The corpus's first token exists in every vocabulary built from it. */
    int32_t first = 0;
    if (!dp_token_data_size(r->data, DP_SPLIT_TRAIN))
        return cli_fail("the training split is empty; nothing to prompt with");
    if (dp_token_data_read(r->data, DP_SPLIT_TRAIN, 0, 1, &first) != DP_OK)
        return cli_dp_fail("prompt token");
    r->prompt_ids[0] = first;
    r->prompt_len = 1;
    const char *tb = NULL;
    size_t tl = 0;
    if (dp_tokenizer_token(r->tok, first, &tb, &tl) != DP_OK) return cli_dp_fail("prompt token");
    r->prompt_text = malloc(tl + 1);
    if (!r->prompt_text) return cli_fail("out of host memory");
    memcpy(r->prompt_text, tb, tl);
    r->prompt_text[tl] = '\0';
    return 0;
}

/* Parses --prompt-ids: decimal ids separated by ',', each below V, into
 * r->prompt_ids. */
static int parse_prompt_ids(run *r, size_t V)
{
    const char *text = r->o.prompt_ids;
    size_t n = 1;
    for (const char *p = text; *p; p++) n += *p == ',';
    size_t bytes = 0;
    if (!dp_size_mul(n, sizeof(int32_t), &bytes) || !(r->prompt_ids = malloc(bytes)))
        return cli_fail("out of host memory for --prompt-ids");
    const char *p = text;
    for (size_t i = 0; i < n; i++) {
        const char *end = p;
        unsigned long long id = 0;
        while (*end >= '0' && *end <= '9' && id <= (unsigned long long)INT32_MAX)
            id = id * 10 + (unsigned long long)(*end++ - '0');
        if (end == p || (*end != ',' && *end != '\0') || id > (unsigned long long)INT32_MAX)
            return cli_fail("--prompt-ids \"%s\": entry %zu is not a token id; give decimal ids "
                            "separated by commas, e.g. --prompt-ids %d,464", text, i + 1,
                            DP_GPT2_EOT);
        if (id >= V)
            return cli_fail("--prompt-ids: id %llu (entry %zu) is outside the model's vocabulary "
                            "[0, %zu); give ids below %zu (--vocab-size)", id, i + 1, V, V);
        r->prompt_ids[i] = (int32_t)id;
        p = end + 1;
    }
    r->prompt_len = n;
    return 0;
}

/* Token data's prompt: --prompt-ids, else the end-of-text id (as llm.c
 * starts its samples; --tokenizer-file's, else GPT-2's 50256), else, when
 * the vocabulary is smaller, the training split's first token. It prints
 * as text through --tokenizer-file, else as ids. */
static int prepare_token_prompt(run *r)
{
    const opts *o = &r->o;
    if (!o->sample && !o->prompt_ids) return 0;
    size_t V = (size_t)o->vocab_size;
    if (o->prompt_ids) {
        if (parse_prompt_ids(r, V)) return 1;
    } else {
        if (!(r->prompt_ids = malloc(sizeof(int32_t)))) return cli_fail("out of host memory");
        int32_t eot = r->tok ? dp_tokenizer_eot_id(r->tok) : DP_GPT2_EOT;
        if (eot >= 0 && (size_t)eot < V)
            r->prompt_ids[0] = eot;
        else if (dp_token_data_read(r->data, DP_SPLIT_TRAIN, 0, 1, r->prompt_ids) != DP_OK)
            return cli_dp_fail("prompt token");
        r->prompt_len = 1;
    }
    /* Its text: each id's bytes, or the ids themselves. */
    size_t cap = 0, len = 0;
    for (size_t i = 0; i < r->prompt_len; i++) {
        const char *b = NULL;
        size_t bl = 0;
        if (r->tok && dp_tokenizer_token(r->tok, r->prompt_ids[i], &b, &bl) != DP_OK) bl = 0;
        cap += r->tok ? bl : 12;
    }
    if (!(r->prompt_text = malloc(cap + 1))) return cli_fail("out of host memory");
    for (size_t i = 0; i < r->prompt_len; i++) {
        const char *b = NULL;
        size_t bl = 0;
        if (!r->tok) {
            len += (size_t)snprintf(r->prompt_text + len, cap + 1 - len, "%s%d", i ? " " : "",
                                    (int)r->prompt_ids[i]);
        } else if (dp_tokenizer_token(r->tok, r->prompt_ids[i], &b, &bl) == DP_OK) {
            memcpy(r->prompt_text + len, b, bl);
            len += bl;
        }
    }
    r->prompt_text[len] = '\0';
    return 0;
}

static int prepare_prompt(run *r)
{
    return r->is_tokens ? prepare_token_prompt(r) : prepare_text_prompt(r);
}

static int apply_schedule(run *r);

/* With --resume: checks the options given against the checkpoint (the
 * model's shape, the kind of data, tokenizer, vocabulary size, steps) and
 * takes the checkpoint's values for the others. */
static int apply_checkpoint(run *r)
{
    opts *o = &r->o;
    const dp_checkpoint *ck = r->ck;
    const dp_gpt_config *c = dp_gpt_config_of(r->gpt);
    /* Only the options given count: the others are defaults, not requests. */
    int g = o->given;
    if (((g & G_LAYERS) && (size_t)o->layers != c->n_layer) ||
        ((g & G_HEADS) && (size_t)o->heads != c->n_head) ||
        ((g & G_DIM) && (size_t)o->dim != c->n_embd) ||
        ((g & G_CTX) && (size_t)o->context != c->block_size))
        return cli_fail("--resume %s holds a model with --layers %zu --heads %zu --dim %zu "
                        "--context %zu, which differs from the options given; drop them or "
                        "match them", o->resume, c->n_layer, c->n_head, c->n_embd, c->block_size);
    o->layers = (long)c->n_layer;
    o->heads = (long)c->n_head;
    o->dim = (long)c->n_embd;
    o->context = (long)c->block_size;
    if (o->max_tokens && o->max_tokens < o->context)
        return cli_fail("--max-tokens-per-device %ld is below the checkpoint's --context %ld "
                        "(one sequence); raise it to at least %ld", o->max_tokens, o->context,
                        o->context);
    if (check_val_tokens(o, "the checkpoint's ")) return 1;
    /* The kind of data trained on: token files, or text (older checkpoints). */
    const char *fmt = dp_checkpoint_meta(ck, META_FORMAT);
    int ck_tokens = fmt && strcmp(fmt, FORMAT_TEXT) != 0;
    const char *data = o->data ? o->data : LM_DEFAULT_CORPUS;
    if (ck_tokens != r->is_tokens)
        return cli_fail("--resume %s was trained on %s, but --data %s is %s: %s", o->resume,
                        ck_tokens ? "token ids (pre-tokenized files)" : "text", data,
                        r->is_tokens ? "token files" : "text",
                        ck_tokens ? "pass token data (a directory of .bin files or one .bin file)"
                                  : "pass text the checkpoint's tokenizer covers");
    if (ck_tokens) {
        /* The model's vocabulary is the checkpoint's; token data's --vocab-size names it. */
        if ((g & G_VOCAB) && (size_t)o->vocab_size != c->vocab_size)
            return cli_fail("--resume %s has a vocabulary of %zu, which differs from --vocab-size "
                            "%ld; drop --vocab-size or match it", o->resume, c->vocab_size,
                            o->vocab_size);
        o->vocab_size = (long)c->vocab_size;
        return apply_schedule(r);
    }
    if (!ck->tokenizer) return cli_fail("--resume %s has no tokenizer", o->resume);
    if (dp_tokenizer_parse(ck->tokenizer, &r->tok) != DP_OK) return cli_dp_fail("checkpoint tokenizer");
    dp_tokenizer_kind kind = dp_tokenizer_kind_of(r->tok);
    const char *kname = dp_tokenizer_kind_name(kind);
    if ((g & G_TOK) && strcmp(o->tokenizer, kname) != 0)
        return cli_fail("--resume %s uses the %s tokenizer, which differs from --tokenizer %s; "
                        "drop --tokenizer or match it", o->resume, kname, o->tokenizer);
    o->tokenizer = kname;
    /* The word vocabulary asked for is in the training options (a corpus
     * with fewer words gives a smaller one); older files: the tokenizer's size. */
    long want = (long)dp_tokenizer_vocab_size(r->tok);
    json_t *cfg = ck->config_json ? json_loads(ck->config_json, 0, NULL) : NULL;
    json_t *vs = cfg ? json_object_get(cfg, "vocab_size") : NULL;
    if (vs && json_is_integer(vs)) want = (long)json_integer_value(vs);
    json_decref(cfg);
    if (g & G_VOCAB) {
        if (kind != DP_TOKENIZER_WORD)
            return cli_fail("--vocab-size applies to the word tokenizer; --resume %s uses the %s "
                            "tokenizer; drop --vocab-size", o->resume, kname);
        if (o->vocab_size != want)
            return cli_fail("--resume %s has a word vocabulary of --vocab-size %ld, which differs "
                            "from --vocab-size %ld; drop it or match it", o->resume, want,
                            o->vocab_size);
    }
    if (kind == DP_TOKENIZER_WORD) o->vocab_size = want;
    if (dp_tokenizer_vocab_size(r->tok) != c->vocab_size)
        return cli_fail("--resume: the checkpoint's vocabulary (%zu) does not match its "
                        "tokenizer (%zu)", c->vocab_size, dp_tokenizer_vocab_size(r->tok));
    return apply_schedule(r);
}

/* With --resume, the schedule and the steps: the checkpoint's
 * --lr-decay-steps unless given, and --steps not below its step. */
static int apply_schedule(run *r)
{
    opts *o = &r->o;
    const dp_checkpoint *ck = r->ck;
    int g = o->given;
    /* The schedule's length: the flag, else the checkpoint's, else --steps. */
    const char *decay = dp_checkpoint_meta(ck, META_DECAY);
    if (!(g & G_DECAY) && decay) {
        char *end = NULL;
        errno = 0;
        long d = strtol(decay, &end, 10);
        if (errno || end == decay || *end || d < 1)
            return cli_fail("--resume %s: metadata \"" META_DECAY "\" = \"%s\" is not an integer "
                            ">= 1", o->resume, decay);
        o->lr_decay_steps = d;
    }
    /* The precision: the flag, else the checkpoint's (files from before
     * bf16 trained in fp32); the weights are float32 either way. */
    const char *prec = dp_checkpoint_meta(ck, META_PRECISION);
    if (!(g & G_PREC) && prec) {
        if (strcmp(prec, "bf16") == 0 || strcmp(prec, "fp32") == 0) o->bf16 = prec[0] == 'b';
        else
            return cli_fail("--resume %s: metadata \"" META_PRECISION "\" = \"%s\" is not fp32 "
                            "or bf16", o->resume, prec);
        if (o->bf16 && o->tf32)
            return cli_fail("--tf32 with --resume %s, which trained in bf16: give --precision "
                            "fp32 to resume in float32 with TF32, or drop --tf32", o->resume);
    }
    if (!o->eval_only && o->steps < ck->step)
        return cli_fail("--steps %ld is below the checkpoint's step %ld: nothing to train; give "
                        "--steps above %ld to continue, or --eval-only", o->steps, ck->step,
                        ck->step);
    return 0;
}

/* Says what --devices auto chose when it fell back to CPU devices. */
static void explain_auto(const opts *o, const dp_device_spec *specs, size_t k)
{
    if (strcmp(o->devices, "auto") != 0 || !k || specs[0].kind != DP_DEVICE_CPU) return;
#ifdef DP_HAVE_CUDA
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    printf("devices: auto chose %zu CPU device%s: no CUDA device is visible (no GPU or driver, "
           "or CUDA_VISIBLE_DEVICES=%s)\n", k, k == 1 ? "" : "s", cvd ? cvd : "unset");
#else
    printf("devices: auto chose %zu CPU device%s (one per core): this build has no CUDA "
           "backend\n", k, k == 1 ? "" : "s");
#endif
}

/* The run's local part: checkpoint, data, tokenizer, samplers, model. */
/* Options that apply to one kind of data only, refused for the other. */
static int check_data_options(const run *r, const char *path)
{
    const opts *o = &r->o;
    if (r->is_tokens) {
        if (o->given & G_TOK)
            return cli_fail("--tokenizer %s applies to text, but --data %s holds token ids (already "
                            "tokenized); drop --tokenizer (--tokenizer-file decodes samples)",
                            o->tokenizer, path);
        if (o->given & G_PROMPT)
            return cli_fail("--prompt takes text, which token data would need GPT-2's BPE encoder "
                            "for (dp has none); give the prompt as ids, e.g. --prompt-ids %d,464",
                            DP_GPT2_EOT);
        if ((o->given & G_VOCAB) && o->vocab_size > TOKEN_VOCAB_MAX)
            return cli_fail("--vocab-size %ld: token files hold uint16 ids, all below %ld; give at "
                            "most %ld", o->vocab_size, TOKEN_VOCAB_MAX, TOKEN_VOCAB_MAX);
        return 0;
    }
    if (o->tokenizer_file)
        return cli_fail("--tokenizer-file decodes token data's samples, but --data %s is text (its "
                        "tokenizer comes from the text); drop --tokenizer-file", path);
    if (o->prompt_ids)
        return cli_fail("--prompt-ids applies to token data, but --data %s is text; give the "
                        "prompt as --prompt TEXT", path);
    return 0;
}

/* Text: loads the corpus and builds (or takes the checkpoint's) tokenizer. */
static int load_text(run *r, const char *path)
{
    const opts *o = &r->o;
    char *text = NULL;
    size_t len = 0, files = 0;
    if (dp_text_load(path, &text, &len, &files) != DP_OK) return cli_dp_fail("--data");
    if (!r->tok) {
        dp_tokenizer_kind kind = DP_TOKENIZER_CHAR;
        const char *what = "--tokenizer";
        dp_status s = dp_tokenizer_kind_parse(o->tokenizer, &kind);
        if (s == DP_OK) {
            what = "tokenizer";
            s = kind == DP_TOKENIZER_CHAR
                    ? dp_tokenizer_create_char(text, len, &r->tok)
                    : dp_tokenizer_create_word(text, len, (size_t)o->vocab_size, &r->tok);
        }
        if (s != DP_OK) {
            free(text);
            return cli_dp_fail(what);
        }
    }
    dp_status s = dp_token_data_from_text(r->tok, text, len, &r->data);
    free(text);
    if (s != DP_OK) return cli_dp_fail("--data");
    printf("data: %s (%zu file%s, %zu tokens: %zu train, %zu validation), %s tokenizer, vocab %zu\n",
           path, files, files == 1 ? "" : "s", dp_token_data_total(r->data),
           dp_token_data_size(r->data, DP_SPLIT_TRAIN), dp_token_data_size(r->data, DP_SPLIT_VAL),
           dp_tokenizer_kind_name(dp_tokenizer_kind_of(r->tok)), dp_tokenizer_vocab_size(r->tok));
    return 0;
}

/* The checkpoint's number under key, or -1 when absent or not a number. */
static long long meta_count(const dp_checkpoint *ck, const char *key)
{
    const char *v = dp_checkpoint_meta(ck, key);
    if (!v || !*v) return -1;
    char *end = NULL;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    return errno || *end || x < 0 ? -1 : x;
}

/* Resuming training on token data: the same format and split lengths as
 * the checkpoint's (the sampler state checks the training split's length
 * too). --eval-only evaluates any token data of the model's vocabulary. */
static int check_resume_data(const run *r, const char *path)
{
    if (!r->ck || r->o.eval_only) return 0;
    const char *fmt = dp_checkpoint_meta(r->ck, META_FORMAT), *now = data_format(r);
    long long ct = meta_count(r->ck, META_TRAIN), cv = meta_count(r->ck, META_VAL);
    size_t nt = dp_token_data_size(r->data, DP_SPLIT_TRAIN);
    size_t nv = dp_token_data_size(r->data, DP_SPLIT_VAL);
    if (!fmt || ct < 0 || cv < 0)
        return cli_fail("--resume %s does not record its token data (metadata \"" META_FORMAT
                        "\", \"" META_TRAIN "\", \"" META_VAL "\"); it cannot be checked "
                        "against --data %s", r->o.resume, path);
    if (strcmp(fmt, now) != 0 || (size_t)ct != nt || (size_t)cv != nv)
        return cli_fail("--resume %s was trained on %s data of %lld train and %lld validation "
                        "tokens, but --data %s is %s data of %zu and %zu: resume on the same data "
                        "(--eval-only evaluates on other data)", r->o.resume, fmt, ct, cv, path,
                        now, nt, nv);
    return 0;
}

/* Token data: maps the files (nothing is converted), loads
 * --tokenizer-file, and says what was found. */
static int load_tokens(run *r, const char *path)
{
    opts *o = &r->o;
    if (!r->ck && !(o->given & G_VOCAB)) o->vocab_size = DP_GPT2_VOCAB_SIZE;
    o->tokenizer = "none"; /* the training options' record: no tokenizer was built */
    size_t V = (size_t)o->vocab_size;
    if (dp_token_data_open(path, V, &r->data) != DP_OK) return cli_dp_fail("--data");
    if (o->tokenizer_file) {
        if (dp_tokenizer_load_llmc(o->tokenizer_file, &r->tok) != DP_OK)
            return cli_dp_fail("--tokenizer-file");
        size_t tv = dp_tokenizer_vocab_size(r->tok);
        if (tv > V)
            return cli_fail("--tokenizer-file %s has %zu tokens, more than the model's vocabulary "
                            "of %zu: ids past it could never be trained; give --vocab-size %zu or "
                            "more (or the tokenizer the data was made with)", o->tokenizer_file,
                            tv, V, tv);
    }
    dp_token_data_info info;
    if (dp_token_data_get_info(r->data, &info) != DP_OK) return cli_dp_fail("--data");
    const char *kind = info.format == DP_TOKEN_FORMAT_LLMC ? "llm.c" : "nanoGPT raw uint16";
    char files[160];
    if (info.split_by_files)
        snprintf(files, sizeof files, "%s files: %zu train, %zu validation%s", kind,
                 info.files[DP_SPLIT_TRAIN], info.files[DP_SPLIT_VAL],
                 info.ignored_files ? ", other files ignored" : "");
    else
        snprintf(files, sizeof files, "one %s file, split 90/10", kind);
    char mapped[32];
    human_bytes(info.mapped_bytes, mapped, sizeof mapped);
    printf("data: %s (%s; %zu tokens: %zu train, %zu validation; %s mapped read-only), token ids, "
           "vocab %zu%s\n", path, files, dp_token_data_total(r->data),
           dp_token_data_size(r->data, DP_SPLIT_TRAIN), dp_token_data_size(r->data, DP_SPLIT_VAL),
           mapped, V, o->sample && !r->tok ? " (samples print as ids: --tokenizer-file "
                                            "decodes them)" : "");
    return check_resume_data(r, path);
}

/* The run's local part: checkpoint, data, tokenizer, samplers, model. */
static int load(run *r)
{
    opts *o = &r->o;
    /* Rank 0 writes the checkpoints. */
    if (o->save && r->rk.rank == 0 && check_save_path(o->save)) return 1;
    const char *path = o->data ? o->data : LM_DEFAULT_CORPUS;
    struct stat sb;
    if (!o->data && stat(path, &sb) != 0)
        return cli_fail("the default corpus '%s' does not exist: install Debian's fortunes "
                        "package (apt-get install fortunes) or pass --data FILE", path);
    /* Text or token files: told by names and at most 4 bytes, nothing read yet. */
    if (dp_token_files_probe(path, &r->is_tokens) != DP_OK) return cli_dp_fail("--data");
    if (check_data_options(r, path)) return 1;
    if (o->resume) {
        if (dp_gpt_checkpoint_load(o->resume, &r->ck, &r->gpt) != DP_OK)
            return cli_dp_fail("--resume");
        if (apply_checkpoint(r)) return 1;
    }
    if (!o->lr_decay_steps) o->lr_decay_steps = o->steps;

    if (r->is_tokens ? load_tokens(r, path) : load_text(r, path)) return 1;
    size_t V = r->is_tokens ? (size_t)o->vocab_size : dp_tokenizer_vocab_size(r->tok);
    if (prepare_prompt(r)) return 1;

    size_t T = (size_t)o->context;
    if (dp_sampler_create(r->data, DP_SPLIT_TRAIN, T, o->seed, &r->train) != DP_OK ||
        dp_sampler_create(r->data, DP_SPLIT_TRAIN, T, o->seed + 1, &r->eval_train) != DP_OK ||
        dp_sampler_create(r->data, DP_SPLIT_VAL, T, o->seed + 2, &r->eval_val) != DP_OK)
        return cli_dp_fail("--context");
    /* Evaluation reads no training batches: the sampler's state (which
     * belongs to the training corpus) matters only to a run that trains. */
    if (r->ck && r->ck->has_sampler && !o->eval_only &&
        dp_sampler_set_state(r->train, r->ck->sampler) != DP_OK)
        return cli_dp_fail("--resume sampler state");

    if (!r->gpt) {
        dp_gpt_config gc = {.vocab_size = V,
                            .block_size = T,
                            .n_layer = (size_t)o->layers,
                            .n_head = (size_t)o->heads,
                            .n_embd = (size_t)o->dim,
                            .attention_chunk = (size_t)o->att_chunk};
        if (dp_gpt_create(&gc, &r->gpt) != DP_OK) return cli_dp_fail("model");
    } else if (o->att_chunk) {
        /* How the attention runs is not in the checkpoint: the same model
         * with the chunk asked for (same tensors and parameters). */
        dp_gpt_config gc = *dp_gpt_config_of(r->gpt);
        gc.attention_chunk = (size_t)o->att_chunk;
        dp_gpt *g = NULL;
        if (dp_gpt_create(&gc, &g) != DP_OK) return cli_dp_fail("--attention-chunk");
        dp_gpt_destroy(r->gpt);
        r->gpt = g;
    }
    r->n_params = dp_gpt_model(r->gpt)->n_params;
    return 0;
}

/* This rank's devices (specs[0..*k)) and the engine's configuration. */
static int configure(run *r, dp_device_spec *specs, size_t *kp, dp_engine_config *ecp)
{
    const opts *o = &r->o;
    size_t k = 0;
    if (dp_device_list_parse(o->devices, specs, DP_MAX_DEVICES, &k) != DP_OK) return cli_dp_fail("--devices");
    *kp = k;
    explain_auto(o, specs, k);
    dp_engine_config ec = dp_engine_config_default();
    if (strcmp(o->mode, "balanced") == 0) ec.mode = DP_MODE_BALANCED;
    else if (strcmp(o->mode, "gather") == 0) ec.mode = DP_MODE_GATHER;
    else return cli_fail("--mode: \"%s\" is not balanced or gather", o->mode);
    if (o->device_weights) {
        size_t nw = 0;
        if (cli_parse_weights("--device-weights", o->device_weights, k, r->weights, &nw)) return 1;
        ec.device_weights = r->weights;
    }
    ec.token_balanced = o->token_balanced;
    ec.optim.lr = (float)o->lr;
    ec.optim.beta1 = (float)o->beta1;
    ec.optim.beta2 = (float)o->beta2;
    ec.optim.weight_decay = (float)o->weight_decay;
    ec.optim.grad_clip = (float)o->grad_clip;
    ec.grad_accum = (int)o->grad_accum;
    ec.max_tokens_per_micro = (size_t)o->max_tokens;
    ec.seed = o->seed;
    ec.watchdog_seconds = o->watchdog;
    ec.check_replicas_every = o->check_replicas;
    ec.allow_tf32 = o->tf32;
    ec.matmul_precision = o->bf16 ? DP_MATMUL_BF16 : DP_MATMUL_FP32;
    ec.shard_optimizer = o->shard_optimizer;
    /* The same on every rank (the engine checks): it comes from the command line. */
    ec.logits_chunk_rows = o->logits_chunk;
    if (o->memory_limit && dp_parse_bytes(o->memory_limit, &ec.memory_limit) != DP_OK)
        return cli_dp_fail("--memory-limit");
    ec.dist = r->rk.dist;
    *ecp = ec;
    return 0;
}

/* What the run prints and writes once the engine exists: the summary
 * lines, batch buffers, --log and --trace (rank 0's). */
static int outputs(run *r, size_t k, const dp_engine_config *ec)
{
    const opts *o = &r->o;
    size_t T = (size_t)o->context, K = dp_engine_num_global_devices(r->engine);
    printf("model: GPT %ld layers, %ld heads, dim %ld, context %ld: %.2fM parameters\n", o->layers,
           o->heads, o->dim, o->context, (double)r->n_params / 1e6);
    printf("engine: %s mode%s%s", dp_mode_name(ec->mode),
           ec->shard_optimizer ? ", sharded optimizer" : "",
           o->bf16 ? ", bf16 (float32 masters)" : "");
    if (o->recompute) printf(", %s recomputed", cli_recompute_words(o->recompute));
    if (o->chunked_att)
        printf(", attention in chunks of %ld queries",
               o->att_chunk ? o->att_chunk : (long)DP_GPT_ATTENTION_CHUNK);
    printf(" on %zu device%s (", K, K == 1 ? "" : "s");
    if (r->rk.ranks > 1) printf("%d ranks; rank 0's: ", r->rk.ranks);
    for (size_t i = 0; i < k; i++)
        printf("%s%s", i ? "," : "", dp_device_name(dp_engine_device(r->engine, i)));
    printf("), batch %ld x %ld tokens\n", o->batch_size, o->context);
    size_t bt = 0;
    if (!dp_size_mul((size_t)o->batch_size, T, &bt) || !dp_size_mul(bt, sizeof(int32_t), &bt))
        return cli_fail("--batch-size %ld x --context %ld overflows a buffer size", o->batch_size,
                        o->context);
    r->inputs = malloc(bt);
    r->targets = malloc(bt);
    if (!r->inputs || !r->targets) return cli_fail("out of host memory");
    if (r->rk.rank > 0) return 0;
    if (!o->eval_only && open_log(r)) return 1;
    if (o->trace) {
        const char *names[DP_MAX_DEVICES];
        for (size_t i = 0; i < k; i++) names[i] = dp_device_name(dp_engine_device(r->engine, i));
        /* An empty trace written now: a path that cannot be written fails
         * before the first step, not after the run. */
        if (dp_trace_create(names, k, &r->trace) != DP_OK ||
            dp_trace_write(r->trace, o->trace) != DP_OK)
            return cli_dp_fail("--trace");
    }
    if (r->ck && !o->eval_only && r->step == o->steps)
        printf("resume: the checkpoint is already at step %ld of --steps %ld: nothing to train\n",
               r->step, o->steps);
    return 0;
}

/* Everything before the first step. With ranks the local parts' outcomes
 * are agreed before the collective calls (create, and with --resume the
 * parameters, which come from rank 0's file) and after the outputs. */
static int setup(run *r)
{
    dp_device_spec specs[DP_MAX_DEVICES];
    size_t k = 0;
    dp_engine_config ec = dp_engine_config_default();
    int rc = load(r);
    if (!rc) rc = configure(r, specs, &k, &ec);
    if (agree(r, rc)) return 1;
    dp_criterion ce = dp_criterion_cross_entropy();
    /* bf16: bf16 replicas, and the activations off the residual stream
     * kept as bfloat16 (dp/gpt.h). */
    const dp_model *model = dp_gpt_model_ex(r->gpt, cli_gpt_flags(r->o.bf16, r->o.recompute, r->o.chunked_att));
    dp_status s = dp_engine_create(specs, k, model, &ce, &ec, &r->engine);
    if (s != DP_OK) return engine_fail(r, s, "engine");
    if (r->ck) {
        if ((s = dp_engine_set_params(r->engine, r->ck->params)) != DP_OK)
            return engine_fail(r, s, "--resume params");
        if (r->ck->m && (s = dp_engine_set_optimizer_state(r->engine, r->ck->m, r->ck->v,
                                                           r->ck->optimizer_step)) != DP_OK)
            return engine_fail(r, s, "--resume optimizer state");
        r->step = r->ck->step;
    }
    return agree(r, outputs(r, k, &ec));
}

/* What the checkpoint file holds after the run stops early, in words. */
static void checkpoint_state(const run *r, char *buf, size_t cap)
{
    const opts *o = &r->o;
    if (!o->save)
        snprintf(buf, cap, "; no --save was given, nothing was saved");
    else if (r->saved_step >= 0)
        snprintf(buf, cap, "; the last checkpoint is intact: %s (step %ld)", o->save,
                 r->saved_step);
    else if (r->ck && strcmp(o->resume, o->save) == 0)
        snprintf(buf, cap, "; the last checkpoint is intact: %s (step %ld, the one resumed)",
                 o->save, r->ck->step);
    else
        snprintf(buf, cap, "; no checkpoint was written to %s (none was due%s)", o->save,
                 o->save_interval ? " yet" : ": --save-interval is 0");
}

static int train(run *r)
{
    opts *o = &r->o;
    size_t B = (size_t)o->batch_size;
    long first = r->step;
    double t0 = cli_now();
    r->tty = isatty(STDOUT_FILENO);
    int failed = 0; /* rank 0's --trace failed: agreed at the next step's start */
    while (r->step < o->steps) {
        int sig = go_on(r, failed);
        if (sig < 0) return 1;
        if (sig) {
            if (r->tty) printf("\n");
            int saved = o->save && !save_checkpoint(r);
            fflush(stdout);
            if (r->log) fflush(r->log);
            r->exit_code = 128 + sig;
            return AGREED_FAIL(r, "interrupted by %s at step %ld%s%s", signal_name(sig), r->step,
                               saved ? "; checkpoint saved to " : o->save ? "; the checkpoint "
                               "could not be saved" : "; no --save given, nothing saved",
                               saved ? o->save : "");
        }
        float lr = dp_lr_schedule(r->step, o->warmup, o->lr_decay_steps, (float)o->lr,
                                  (float)o->min_lr);
        dp_status s = dp_engine_set_lr(r->engine, lr);
        if (s != DP_OK) return engine_fail(r, s, "learning rate");
        if (dp_sampler_next(r->train, r->inputs, r->targets, B) != DP_OK) return local_fatal(r, "batch");
        dp_batch b = {B, r->inputs, r->targets};
        dp_step_stats st;
        size_t sent = dp_dist_bytes_sent(r->rk.dist);
        if ((s = dp_engine_step(r->engine, &b, &st)) != DP_OK) return engine_fail(r, s, "step");
        r->step_bytes += dp_dist_bytes_sent(r->rk.dist) - sent;
        if (r->trace && dp_trace_add_step(r->trace, &st) != DP_OK) {
            failed = cli_dp_fail("--trace");
            if (r->rk.ranks == 1) return 1;
        }
        if (st.skipped) {
            /* Nothing was updated: the step is retried on the next batch. */
            r->skipped++;
            r->consecutive_skips++;
            char where[48] = "";
            size_t g = (size_t)st.skipped_device, g0 = dp_engine_first_global_device(r->engine);
            if (st.skipped_device >= 0 && g >= g0 && g - g0 < dp_engine_num_devices(r->engine))
                snprintf(where, sizeof where, " on %s",
                         dp_device_name(dp_engine_device(r->engine, g - g0)));
            else if (st.skipped_device >= 0) /* another rank's device (global order) */
                snprintf(where, sizeof where, " on global device %zu", g);
            printf("%sstep %ld skipped: non-finite loss or gradient%s (%ld in a row, %ld in all)\n",
                   r->tty ? "\n" : "", r->step + 1, where, r->consecutive_skips, r->skipped);
            log_row(r, &st, lr);
            if (r->consecutive_skips >= o->max_skips) {
                char state[600];
                checkpoint_state(r, state, sizeof state);
                fflush(stdout);
                return AGREED_FAIL(r, "%ld consecutive steps had a non-finite loss or gradient "
                                   "(last%s); stopping at step %ld%s. Lower --lr, tighten "
                                   "--grad-clip or check the data", r->consecutive_skips,
                                   where[0] ? where : " on no single device", r->step, state);
            }
            continue;
        }
        r->consecutive_skips = 0;
        r->step++;
        progress(r, &st, lr, cli_now() - t0, first);
        log_row(r, &st, lr);
        if (r->step % o->eval_interval == 0 || r->step == o->steps) {
            double tl, vl;
            int e = estimate_loss(r, r->eval_train, &tl);
            if (!e) e = estimate_loss(r, r->eval_val, &vl);
            if (e < 0) continue; /* a signal: the loop's top saves and stops */
            if (e) return 1;
            printf("%seval step %ld: train loss %.4f, val loss %.4f\n", r->tty ? "\n" : "", r->step, tl, vl);
            fflush(stdout);
        }
        if (o->save && o->save_interval > 0 && r->step % o->save_interval == 0 && save_checkpoint(r))
            return 1;
    }
    double secs = cli_now() - t0;
    if (r->step > first)
        printf("trained %ld steps in %.1f s (%.0f tokens/s)\n", r->step - first, secs,
               (double)(r->step - first) * (double)(B * (size_t)o->context) / secs);
    if (r->step > first && r->rk.ranks > 1)
        printf("ranks: %d x %zu devices; rank 0 sent %.0f bytes per step to the other ranks\n",
               r->rk.ranks, dp_engine_num_devices(r->engine),
               (double)r->step_bytes / (double)(r->step - first));
    if (agree(r, failed)) return 1;
    /* The last checkpoint holds the last step, whether or not the interval divides it. */
    if (o->save && r->saved_step != r->step && save_checkpoint(r)) return 1;
    return 0;
}

static void run_free(run *r)
{
    if (r->log) fclose(r->log);
    free(r->inputs);
    free(r->targets);
    free(r->prompt_ids);
    free(r->prompt_text);
    dp_sampler_destroy(r->train);
    dp_sampler_destroy(r->eval_train);
    dp_sampler_destroy(r->eval_val);
    dp_trace_destroy(r->trace);
    dp_engine_destroy(r->engine);
    dp_gpt_destroy(r->gpt);
    dp_token_data_destroy(r->data);
    dp_tokenizer_destroy(r->tok);
    dp_checkpoint_close(r->ck);
}

/* Joins the ranks under a launcher (cli_ranks_join). */
static int join_ranks(run *r, int *argc, char ***argv)
{
    return cli_ranks_join(&r->rk, argc, argv);
}

int main(int argc, char **argv)
{
    cli_set_program("lm_train");
    run r;
    memset(&r, 0, sizeof r);
    r.saved_step = -1;
    r.rk.ranks = 1;
    defaults(&r.o);
    if (join_ranks(&r, &argc, &argv)) {
        dp_dist_close(r.rk.dist);
        return 1;
    }
    /* Every rank has the same command line: rank 0 says what is wrong with it. */
    cli_set_quiet(r.rk.rank > 0);
    int pa = parse_args(argc, argv, &r.o);
    cli_set_quiet(0);
    if (pa) {
        dp_dist_close(r.rk.dist);
        return pa < 0 ? 0 : 2; /* -1: --help */
    }
    install_signal_handlers(r.rk.ranks > 1);
    int rc = setup(&r);
    if (!rc && r.ck) {
        /* The parameters live in the engine now; the metadata stays for messages. */
        free(r.ck->params);
        free(r.ck->m);
        free(r.ck->v);
        r.ck->params = r.ck->m = r.ck->v = NULL;
    }
    if (!rc && r.o.eval_only) {
        double vl;
        rc = full_val_loss(&r, &vl);
        if (!rc) printf("val_loss %.6f\n", vl);
    } else if (!rc) {
        rc = train(&r);
        /* Whatever stopped training, the trace holds the steps that ran. */
        int tw = r.trace && dp_trace_write(r.trace, r.o.trace) != DP_OK ? cli_dp_fail("--trace") : 0;
        if (!rc) rc = agree(&r, tw);
        double vl;
        if (!rc) rc = full_val_loss(&r, &vl);
        if (!rc) printf("final val_loss %.4f\n", vl);
        if (!rc && r.o.sample > 0) rc = generate(&r);
    }
    fflush(stdout);
    int code = rc ? (r.exit_code ? r.exit_code : 1) : 0;
    run_free(&r);
    if (r.rk.broken) {
        /* Some rank may wait in a collective that will never complete. */
        fflush(stderr);
        dp_dist_abort(r.rk.dist, code);
    }
    dp_dist_close(r.rk.dist);
    return code;
}
