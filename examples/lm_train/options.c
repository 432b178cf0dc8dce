/*
 * examples/lm_train/options.c - lm_train's command line: the defaults,
 * --help, getopt_long parsing, the checks that need no file, and the
 * defaults that wait for the data and the checkpoint.
 */
#define _POSIX_C_SOURCE 200809L
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "lm_train.h"

void defaults(opts *o)
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
            "  --tokenizer-file PATH  token data: GPT-2's BPE (tokenizer.json, encoder.json with\n"
            "                         vocab.bpe beside it, or their directory), which encodes\n"
            "                         --prompt and decodes samples; or llm.c's gpt2_tokenizer.bin\n"
            "                         (decode only); without it samples print as token ids\n"
            "devices\n"
            "  --devices LIST         cpu, cpu:N, cpu:0,1, cuda:0,1, auto (default %s: every GPU,\n"
            "                         else one CPU device per core)\n"
            "  --mode balanced|gather where the loss is computed (default %s)\n"
            "  --device-weights W,..  relative share of each step's rows per device, one weight\n"
            "                         per device, e.g. 1,2,2,2 (default equal shares)\n"
            "  --token-balanced       split rows so devices get equal numbers of valid targets\n"
            "  --memory-limit SIZE    per-device allocation limit, e.g. 12GiB (default none)\n"
            "  --logits-chunk ROWS    output rows of logits per criterion call; auto (default) keeps a\n"
            "                         chunk's logits about the size of the features (at least 256\n"
            "                         rows, 2048 on GPUs); whole = unchunked\n"
            "  --bucket-mb MB         sum the gradient in pieces of MB MiB while the backward runs (with\n"
            "                         ranks: the rounds between them; default 4); off: after it\n"
            "  --tf32                 let cuBLAS use TF32 tensor cores on GPUs (default off)\n"
            "  --precision fp32|bf16  bf16: mixed precision, bfloat16 parameter replicas and GEMMs\n"
            "                         (oneDNN on CPUs, tensor cores on GPUs), float32 master weights,\n"
            "                         gradients and AdamW state (default fp32; with --resume, the\n"
            "                         checkpoint's; checkpoints hold float32 either way)\n"
            "  --recompute none|attention|gelu|all  what the backward recomputes instead of\n"
            "                         keeping: the attention probabilities (one more GEMM and\n"
            "                         softmax per layer), the GELU output (one more GELU), or\n"
            "                         both; same results, bitwise, less memory (default none)\n"
            "  --attention whole|chunked|fused  chunked: form the attention %d queries at a time\n"
            "                         and recompute it in the backward, so no (T,T)\n"
            "                         probabilities exist; skips the masked blocks; fused: one\n"
            "                         kernel (FlashAttention-2's online softmax), no probabilities\n"
            "                         in memory at all, for GPUs (on CPUs a slow reference); both\n"
            "                         the same results to float32 rounding (default auto: fused\n"
            "                         with --precision bf16 on GPUs at head size 64, where its\n"
            "                         tensor-core kernels run; else whole)\n"
            "  --attention-chunk N    queries per chunk with --attention chunked (default %d):\n"
            "                         larger chunks, larger GEMMs (GPUs) and a larger scratch\n"
            "  --vocab-pad N|auto     pad the vocabulary inside the model to a multiple of N (1:\n"
            "                         none; at most %d), as llm.c pads 50257 to 50304: aligned\n"
            "                         LM-head GEMMs on GPUs; the padded logits are -inf, never\n"
            "                         a target or a sample; checkpoints and --export-hf keep\n"
            "                         the true vocabulary (default auto: %d when --devices has a\n"
            "                         GPU, else none; with --resume, the checkpoint's)\n"
            "  --shard-optimizer      shard the AdamW state over the devices (ZeRO-1: each device\n"
            "                         keeps and updates its slice's moments; same results, bitwise)\n"
            "model\n"
            "  --layers N  --heads N  --dim N  --context N   (default %ld, %ld, %ld, %ld)\n"
            "training\n"
            "  --batch-size N         global sequences per step (default %ld)\n"
            "  --grad-accum N         micro-batches per device per step, at most one per row\n"
            "                         the device gets (default %ld)\n"
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
            "                         0 = off (default 0); under mpirun it also bounds every\n"
            "                         wait between the ranks (default there: %g s; twice it\n"
            "                         for the gradient's pieces inside a step)\n"
            "  --check-replicas N     every N steps, check that every replica equals the root's\n"
            "                         parameters, 0 = off (default 0)\n"
            "evaluation and output\n"
            "  --eval-interval N      steps between evaluations (default %ld)\n"
            "  --eval-iters N         batches per split per evaluation (default %ld)\n"
            "  --eval-only            with --resume or --init-from: print the loss over the whole\n"
            "                         validation split of --data, or its first --val-tokens (any\n"
            "                         text the checkpoint's tokenizer covers, or any token data\n"
            "                         of its vocabulary)\n"
            "  --val-tokens N         the final evaluation and --eval-only read only the first N\n"
            "                         tokens of the validation split: W = min(all windows,\n"
            "                         floor((N-1) / context)) windows, each context+1 tokens at a\n"
            "                         multiple of the context, wholly within them. At least\n"
            "                         context+1; 0 = the whole split (default 0); N past the split's\n"
            "                         end reads the whole split. The evaluations during training\n"
            "                         (--eval-iters batches) sample the whole split either way\n"
            "  --save PATH            safetensors checkpoint, written atomically at the end, every\n"
            "                         --save-interval steps and on SIGINT/TERM/HUP; not with\n"
            "                         --eval-only (default none). An existing PATH that is not a\n"
            "                         dp checkpoint is refused, never replaced; while the run\n"
            "                         lasts it holds PATH.lock, and a second run given the same\n"
            "                         PATH is refused\n"
            "  --save-interval N      steps between checkpoints with --save, 0 = only at the end\n"
            "                         (default 0)\n"
            "  --resume PATH          continue from a checkpoint\n"
            "  --init-from PATH       start from these weights (fresh optimizer, step 0): GPT-2 in\n"
            "                         Hugging Face's layout (a directory with model.safetensors\n"
            "                         and config.json, or a bare .safetensors file: give --heads)\n"
            "                         or a dp checkpoint's weights; the model's shape is the\n"
            "                         file's (--layers, --heads, --dim, --context, --vocab-size\n"
            "                         must match it when given)\n"
            "  --export-hf DIR        at the end (or with --eval-only: at once), write DIR/\n"
            "                         model.safetensors and DIR/config.json for transformers'\n"
            "                         GPT2LMHeadModel.from_pretrained(DIR); files there that an\n"
            "                         export did not write (another model's) are refused;\n"
            "                         the run holds DIR.lock, as --save its PATH.lock\n"
            "  --log PATH             JSONL, one row per step; with --resume, rows after the\n"
            "                         checkpoint's step are dropped first; an existing file\n"
            "                         that is not such a log is refused, never replaced, and\n"
            "                         so is one another run is writing; not with --eval-only\n"
            "  --trace PATH           Chrome trace-event JSON of the training steps (Perfetto,\n"
            "                         chrome://tracing): one track per device, a span each time\n"
            "                         it enters a phase (per micro-batch; the reduce's pieces\n"
            "                         inside the backward where the overlap sums them);\n"
            "                         an existing file that is not such a trace is refused;\n"
            "                         the run holds PATH.lock, as with --save\n"
            "  --sample N             generate N tokens at the end, 0 = none, at most %ld\n"
            "                         (default %ld)\n"
            "  --temperature X  --top-k N  --prompt TEXT   sampling (default %g, %ld, newline,\n"
            "                         or the corpus's first token when it has no newline;\n"
            "                         --top-k 0 samples from the whole vocabulary)\n"
            "  --prompt-ids ID,...    token data's prompt, as ids, e.g. 50256,464 (default the\n"
            "                         end-of-text id, 50256 or --tokenizer-file's, as llm.c; the\n"
            "                         training split's first token when the vocabulary is smaller).\n"
            "                         Token data take --prompt TEXT with a BPE --tokenizer-file\n"
            "  --help                 this text\n"
            "SIGINT, SIGTERM or SIGHUP stops after the current step, saves (with --save) and\n"
            "exits with 128 + the signal number; a second signal, or one before training\n"
            "begins, exits at once. Standard output closed by its reader (| head) stops the\n"
            "run the same way, with status 1. A token file cut short while mapped (SIGBUS)\n"
            "ends the run with status 1, unsaved: resume from the last checkpoint.\n"
"ranks: mpirun -np R lm_train --devices cpu:K ... trains one model on R x K devices,\n"
            "bitwise as one process with R x K; rank 0 prints and writes --save, --log and\n"
            "--trace (a process per rank: its devices' tracks, and when its rounds between\n"
            "the ranks were in flight); every rank reads --data and --resume (a path all\n"
            "ranks can read); evaluation is distributed too (each rank its rows, one global loss).\n"
            "Every rank must be given the same options, except --devices, --device-weights and\n"
            "--memory-limit (its own devices): the ranks compare them when they join and all fail\n"
            "naming the first that differs. A wait between the ranks lasts at most --watchdog\n"
            "seconds, else %g s (and at least %g s while rank 0 writes a file; twice it for the\n"
            "gradient's pieces inside a step, so a stuck rank's own watchdog names it first);\n"
            "then every rank stops. A signal to any rank stops all at the same step and saves;\n"
            "Open MPI's mpirun, when signalled, sends SIGTERM to the ranks and SIGKILL 1 s later\n"
            "(more: --mca odls_base_sigkill_timeout SECONDS), so signal the ranks when a save\n"
            "takes longer.\n",
            LM_DEFAULT_CORPUS, d.tokenizer, d.vocab_size, DP_GPT2_VOCAB_SIZE, TOKEN_VOCAB_MAX,
            d.devices, d.mode, DP_GPT_ATTENTION_CHUNK, DP_GPT_ATTENTION_CHUNK, CLI_VOCAB_PAD_MAX,
            CLI_VOCAB_PAD_GPU, d.layers, d.heads,
            d.dim, d.context, d.batch_size, d.grad_accum, d.steps, d.lr, d.min_lr, d.warmup,
            d.weight_decay, d.beta1, d.beta2, d.grad_clip, d.seed, d.max_skips, CLI_RANKS_WAIT_DEFAULT,
            d.eval_interval, d.eval_iters, SAMPLE_MAX, d.sample, d.temperature, d.top_k,
            CLI_RANKS_WAIT_DEFAULT, CLI_RANKS_WAIT_DEFAULT);
}

/* The checks that depend on the context: a device's token limit below
 * one sequence, and --val-tokens below one window (context+1 tokens:
 * context inputs, and the last one's target one further), which would
 * evaluate nothing. `whose` says where the context came from ("", "the
 * checkpoint's " or "the model's "). */
int check_context(const opts *o, const char *whose)
{
    if (o->max_tokens && o->max_tokens < o->context)
        return cli_fail("--max-tokens-per-device %ld is below %s--context %ld (one sequence); "
                        "raise it to at least %ld", o->max_tokens, whose, o->context,
                        o->context);
    if (!o->val_tokens || o->val_tokens > o->context) return 0;
    /* unsigned: --context LONG_MAX must not overflow the message's number */
    unsigned long need = (unsigned long)o->context + 1;
    return cli_fail("--val-tokens %ld is shorter than one window (%scontext+1 = %lu tokens); "
                    "give at least %lu or 0 for the whole split", o->val_tokens, whose, need,
                    need);
}

int adopt_shape(opts *o, const dp_gpt_config *c, const char *whose)
{
    o->layers = (long)c->n_layer;
    o->heads = (long)c->n_head;
    o->dim = (long)c->n_embd;
    o->context = (long)c->block_size;
    return check_context(o, whose);
}

/* 1 with a message when o is inconsistent (checks that need no file). */
static int check_opts(opts *o)
{
    /* Refused as a command line (status 2), before anything loads. */
    if (strcmp(o->mode, "balanced") != 0 && strcmp(o->mode, "gather") != 0)
        return cli_fail("--mode: \"%s\" is not balanced or gather", o->mode);
    if (dp_device_list_parse(o->devices, o->specs, DP_MAX_DEVICES, &o->n_specs) != DP_OK)
        return cli_dp_fail("--devices");
    size_t nw = 0;
    if (o->device_weights &&
        cli_parse_weights("--device-weights", o->device_weights, o->n_specs, o->weights, &nw))
        return 1;
    dp_tokenizer_kind kind;
    if (dp_tokenizer_kind_parse(o->tokenizer, &kind) != DP_OK) return cli_dp_fail("--tokenizer");
    size_t n_ids = 0;
    if (o->prompt_ids && prompt_ids_parse(o->prompt_ids, NULL, &n_ids)) return 1;
    if (o->memory_limit && cli_parse_memory_limit(o->memory_limit, &o->memory_limit_bytes))
        return 1;
    if (o->beta1 >= 1 || o->beta2 >= 1) return cli_fail("--beta1 and --beta2 must be < 1");
    /* The cosine decay goes from --lr down to --min-lr; the other way it
     * would raise the rate all run long (a lone small --lr meets the
     * default --min-lr). */
    if (o->min_lr > o->lr)
        return cli_fail("--min-lr %g is above --lr %g: the schedule would raise the rate to it; "
                        "give --min-lr at most --lr (nanoGPT uses a tenth of it)",
                        o->min_lr, o->lr);
    if (o->eval_only && !o->resume && !o->init_from)
        return cli_fail("--eval-only needs a model: --resume CHECKPOINT or --init-from WEIGHTS");
    if (o->resume && o->init_from)
        return cli_fail("--init-from starts a new run from weights and --resume continues one; "
                        "give one of them");
    if (o->init_from && !*o->init_from)
        return cli_fail("--init-from needs a path: a Hugging Face directory, its "
                        "model.safetensors, or a dp checkpoint");
    if (cli_check_attention_chunk(&o->compute)) return 1;
    if (o->eval_only && o->save)
        return cli_fail("--save with --eval-only: evaluation changes nothing to save; drop --save");
    if (o->eval_only && o->trace)
        return cli_fail("--trace with --eval-only: the trace records training steps; drop --trace");
    if (o->eval_only && o->log)
        return cli_fail("--log with --eval-only: the log records training steps, and the "
                        "evaluation's loss goes to standard output; drop --log");
    if (cli_check_tf32(&o->compute, o->tf32)) return 1;
    if ((o->given & G_SAVEI) && !o->save)
        return cli_fail("--save-interval needs --save PATH (where to write the checkpoints)");
    if (o->grad_accum > INT_MAX)
        return cli_fail("--grad-accum %ld is too large (at most %d)", o->grad_accum, INT_MAX);
    /* With --resume (--init-from) the checkpoint's (weights') context counts. */
    if (!o->resume && !o->init_from && check_context(o, "")) return 1;
    if (o->export_hf && check_export_path(o->export_hf)) return 1;
    /* With --resume the checkpoint's shape counts; setup reports a conflict. */
    if (!o->resume && !o->init_from && o->dim % o->heads)
        return cli_fail("--heads %ld does not divide --dim %ld; pick heads that divide dim",
                        o->heads, o->dim);
    return 0;
}

/* getopt_long's codes of this program's own options and their table (the
 * shared ones: CLI_COMPUTE_LONGOPTS). */
enum {
    O_DATA = 256, O_TOK, O_VOCAB, O_DEV, O_MODE, O_LAYERS, O_HEADS, O_DIM, O_CTX, O_BATCH,
    O_ACCUM, O_MAXTOK, O_STEPS, O_LR, O_MINLR, O_WARMUP, O_DECAY, O_WD, O_B1, O_B2, O_CLIP,
    O_EVI, O_EVN, O_SEED, O_SAVE, O_SAVEI, O_RESUME, O_EVONLY, O_SAMPLE, O_TEMP, O_TOPK,
    O_PROMPT, O_LOG, O_MEM, O_SKIPS, O_WATCHDOG, O_CHECK, O_TF32, O_WEIGHTS, O_TOKBAL, O_TRACE,
    O_SHARD, O_TOKFILE, O_PROMPTIDS, O_VALTOK, O_INIT, O_EXPORT, O_HELP
};

static const struct option longopts[] = {
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
    {"tokenizer-file", 1, 0, O_TOKFILE}, {"prompt-ids", 1, 0, O_PROMPTIDS},
    {"val-tokens", 1, 0, O_VALTOK},  {"init-from", 1, 0, O_INIT},
    {"export-hf", 1, 0, O_EXPORT},   {"help", 0, 0, O_HELP},
    CLI_COMPUTE_LONGOPTS,
    {0, 0, 0, 0}};

/* One option of ours into *ctx (an opts): 0, 1 after a message, -1 after
 * --help, or CLI_NOT_MINE (cli_parse_options). */
static int option(void *ctx, int c, const char *v)
{
    opts *o = ctx;
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
    case O_LR: bad = cli_parse_float("--lr", v, 0, &o->lr); break;
    case O_MINLR: bad = cli_parse_float("--min-lr", v, 0, &o->min_lr); break;
    case O_WARMUP: bad = cli_parse_long("--warmup", v, 0, LONG_MAX, &o->warmup); break;
    case O_DECAY: bad = cli_parse_long("--lr-decay-steps", v, 1, LONG_MAX, &o->lr_decay_steps); o->given |= G_DECAY; break;
    case O_WD: bad = cli_parse_float("--weight-decay", v, 0, &o->weight_decay); break;
    case O_B1: bad = cli_parse_float("--beta1", v, 0, &o->beta1); break;
    case O_B2: bad = cli_parse_float("--beta2", v, 0, &o->beta2); break;
    case O_CLIP: bad = cli_parse_float("--grad-clip", v, 0, &o->grad_clip); break;
    case O_EVI: bad = cli_parse_long("--eval-interval", v, 1, LONG_MAX, &o->eval_interval); break;
    case O_EVN: bad = cli_parse_long("--eval-iters", v, 1, LONG_MAX, &o->eval_iters); break;
    case O_SEED: bad = cli_parse_long("--seed", v, 0, LONG_MAX, &seed); o->seed = (unsigned long long)seed; break;
    case O_SAVE: o->save = v; break;
    case O_SAVEI: bad = cli_parse_long("--save-interval", v, 0, LONG_MAX, &o->save_interval); o->given |= G_SAVEI; break;
    case O_RESUME: o->resume = v; break;
    case O_INIT: o->init_from = v; break;
    case O_EXPORT: o->export_hf = v; break;
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
    case O_HELP: cli_print_help(usage); return -1;
    case CLI_O_PRECISION:
        o->given |= G_PREC; /* given, it wins over a resumed checkpoint's */
        return CLI_NOT_MINE; /* its value: cli_parse_options */
    default: return CLI_NOT_MINE;
    }
    return bad;
}

int parse_args(int argc, char **argv, opts *o)
{
    int rc = cli_parse_options(argc, argv, longopts, &o->compute, option, o);
    return rc ? rc : check_opts(o);
}

/* After --resume applied the checkpoint's options and the data's kind is
 * known: the cosine schedule's length defaults to --steps; token data
 * (without a checkpoint or --vocab-size) have GPT-2's vocabulary and no
 * tokenizer to record in the training options. */
void resolve_options(opts *o, int is_tokens, int resumed)
{
    if (!o->lr_decay_steps) o->lr_decay_steps = o->steps;
    if (!is_tokens) return;
    if (!resumed && !(o->given & G_VOCAB)) o->vocab_size = DP_GPT2_VOCAB_SIZE;
    o->tokenizer = "none"; /* the training options' record: no tokenizer was built */
}
