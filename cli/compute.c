/*
 * cli/compute.c - how the GPT computes: the options lm_train and dp_bench
 * share (CLI_COMPUTE_LONGOPTS: precision, recompute, attention, logits
 * chunk, bucket size, vocabulary padding), their checks, names and the
 * model flags they give.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_internal.h"
#include "dp_cli.h"

// --- how the GPT computes -----------------------------------------------------------

/* --logits-chunk: auto = 0, whole = DP_LOGITS_WHOLE, else a row count >= 1
 * in decimal digits (no sign, no spaces). */
static int cli_parse_logits_chunk(const char *v, size_t *out)
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

/* --bucket-mb: off = DP_BUCKET_OFF, else MiB (PyTorch DDP's
 * bucket_cap_mb) > 0 and at most 1 TiB, as bytes (at least one float). */
static int cli_parse_bucket_mb(const char *v, size_t *out)
{
    if (strcmp(v, "off") == 0) {
        *out = DP_BUCKET_OFF;
        return 0;
    }
    char *end = NULL;
    errno = 0;
    double mb = (v[0] >= '0' && v[0] <= '9') || v[0] == '.' ? strtod(v, &end) : 0.0;
    if (!end || *end || !(mb > 0.0) || errno == ERANGE)
        return cli_fail("--bucket-mb: \"%s\" is not a positive size in MiB or off (the pieces "
                        "the reduce-scatter sums while the backward runs; e.g. --bucket-mb 4)",
                        v);
    if (mb > 1048576.0)
        return cli_fail("--bucket-mb: %s MiB is too large (at most 1048576); use off for no "
                        "overlap", v);
    double bytes = mb * 1048576.0;
    *out = bytes < (double)sizeof(float) ? sizeof(float) : (size_t)bytes;
    return 0;
}

static int cli_parse_precision(const char *v, int *bf16)
{
    if (strcmp(v, "fp32") == 0 || strcmp(v, "bf16") == 0) {
        *bf16 = v[0] == 'b';
        return 0;
    }
    return cli_fail("--precision: \"%s\" is not fp32 or bf16 (bf16: bfloat16 replicas and "
                    "GEMMs, float32 master weights and optimizer)", v);
}

const char *cli_recompute_name(int what)
{
    static const char *const names[] = {"none", "attention", "gelu", "all"};
    return names[what & 3];
}

static const char *cli_recompute_words(int what)
{
    static const char *const words[] = {"nothing", "attention", "GELU", "attention and GELU"};
    return words[what & 3];
}

static int cli_parse_recompute(const char *v, int *what)
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

static int cli_parse_attention(const char *v, int *chunked, int *fused)
{
    if (strcmp(v, "whole") == 0 || strcmp(v, "chunked") == 0 || strcmp(v, "fused") == 0) {
        *chunked = v[0] == 'c';
        *fused = v[0] == 'f';
        return 0;
    }
    return cli_fail("--attention: \"%s\" is not whole, chunked or fused (chunked: the attention "
                    "is formed %d queries at a time, so no (T,T) probabilities exist; fused: "
                    "one kernel, no probabilities in memory at all, for GPUs)",
                    v, DP_GPT_ATTENTION_CHUNK);
}

/* --vocab-pad: auto = 0, else 1..CLI_VOCAB_PAD_MAX (1: none). */
static int cli_parse_vocab_pad(const char *v, long *out)
{
    if (strcmp(v, "auto") == 0) {
        *out = 0;
        return 0;
    }
    char *end = NULL;
    errno = 0;
    long x = v[0] >= '0' && v[0] <= '9' ? strtol(v, &end, 10) : -1;
    if (!end || *end || x < 0)
        return cli_fail("--vocab-pad: \"%s\" is not a whole number or auto (pad the vocabulary "
                        "inside the model to a multiple of N, e.g. --vocab-pad 64; 1: none)", v);
    if (x == 0)
        return cli_fail("--vocab-pad 0 pads to a multiple of nothing: give 1 for no padding, a "
                        "multiple such as 64 or 128, or auto (%d on GPUs, none on CPUs)",
                        CLI_VOCAB_PAD_GPU);
    if (errno == ERANGE || x > CLI_VOCAB_PAD_MAX)
        return cli_fail("--vocab-pad %s is too large (at most %d): 64 or 128 already align the "
                        "LM head's GEMM, a larger pad only adds zero rows; give 64", v,
                        CLI_VOCAB_PAD_MAX);
    *out = x;
    return 0;
}

size_t cli_vocab_pad(const cli_compute *cp, const dp_device_spec *specs, size_t k)
{
    if (cp->vocab_pad > 0) return (size_t)cp->vocab_pad;
    for (size_t i = 0; i < k; i++)
        if (specs[i].kind == DP_DEVICE_CUDA) return CLI_VOCAB_PAD_GPU;
    return 1;
}

void cli_resolve_attention(cli_compute *cp, const dp_device_spec *specs, size_t k,
                           size_t head_size)
{
    if (cp->att_given || !cp->bf16 || head_size != 64 || k == 0) return;
    for (size_t i = 0; i < k; i++)
        if (specs[i].kind != DP_DEVICE_CUDA) return;
    cp->fused_att = 1;
}

/* One of CLI_COMPUTE_LONGOPTS into *cp, else the message for what
 * getopt_long returned instead of an option. */
int cli_compute_option(int c, const char *v, char **argv, cli_compute *cp)
{
    switch (c) {
    case CLI_O_PRECISION: return cli_parse_precision(v, &cp->bf16);
    case CLI_O_RECOMPUTE: return cli_parse_recompute(v, &cp->recompute);
    case CLI_O_ATTENTION:
        cp->att_given = 1;
        return cli_parse_attention(v, &cp->chunked_att, &cp->fused_att);
    case CLI_O_ATTENTION_CHUNK:
        return cli_parse_long("--attention-chunk", v, 1, INT_MAX, &cp->att_chunk);
    case CLI_O_LOGITS_CHUNK: return cli_parse_logits_chunk(v, &cp->logits_chunk);
    case CLI_O_BUCKET_MB: return cli_parse_bucket_mb(v, &cp->bucket_bytes);
    case CLI_O_VOCAB_PAD: return cli_parse_vocab_pad(v, &cp->vocab_pad);
    }
    /* unknown, a missing value, or "this option takes no value" */
    cli_bad_option(argv, ""); /* there are no short options */
    return 1;
}

int cli_check_attention_chunk(const cli_compute *cp)
{
    if (cp->att_chunk && !cp->chunked_att)
        return cli_fail("--attention-chunk %ld needs --attention chunked (it sets the queries per "
                        "chunk of the chunked attention)", cp->att_chunk);
    return 0;
}

int cli_check_tf32(const cli_compute *cp, int tf32)
{
    if (cp->bf16 && tf32)
        return cli_fail("--tf32 with --precision bf16: bf16 GEMMs round further than TF32; "
                        "drop one");
    return 0;
}

long cli_attention_chunk(const cli_compute *cp)
{
    return cp->att_chunk ? cp->att_chunk : (long)DP_GPT_ATTENTION_CHUNK;
}

void cli_print_compute(const cli_compute *cp)
{
    if (cp->bf16) printf(", bf16 (float32 masters)");
    if (cp->recompute) printf(", %s recomputed", cli_recompute_words(cp->recompute));
    if (cp->chunked_att) printf(", attention in chunks of %ld queries", cli_attention_chunk(cp));
    if (cp->fused_att) printf(", attention fused%s", cp->att_given ? "" : " (auto)");
}

void cli_print_matmul_note(dp_engine *e, const cli_compute *cp, int tf32)
{
    if (!cp->bf16 && !tf32) return;
    dp_matmul_precision p = cp->bf16 ? DP_MATMUL_BF16 : DP_MATMUL_TF32;
    char cpus[256] = "", gpus[256] = "";
    size_t ncpu = 0, ngpu = 0;
    for (size_t i = 0; i < dp_engine_num_devices(e); i++) {
        dp_device *d = dp_engine_device(e, i);
        int native = 1; /* a probe that fails says nothing */
        if (dp_device_matmul_native(d, p, &native) != DP_OK || native) continue;
        int cpu = dp_device_kind_of(d) == DP_DEVICE_CPU;
        char *list = cpu ? cpus : gpus;
        size_t *n = cpu ? &ncpu : &ngpu, len = strlen(list);
        snprintf(list + len, sizeof cpus - len, "%s%s", *n ? "," : "", dp_device_name(d));
        ++*n;
    }
    const char *has = ncpu == 1 ? "has" : "have", *ghas = ngpu == 1 ? "has" : "have";
    if (ncpu && p == DP_MATMUL_BF16)
        printf("note: %s %s no bf16 matmul in oneDNN (it needs AVX-512, and is fast with "
               "AVX512-BF16 or AMX): their bf16 GEMMs round the operands and run on float32 "
               "kernels, slower than --precision fp32\n",
               cpus, has);
    if (ncpu && p == DP_MATMUL_TF32)
        printf("note: %s compute --tf32 GEMMs in float32 (TF32 is a format of GPU tensor "
               "cores): the same results as without it\n",
               cpus);
    if (ngpu)
        printf("note: %s %s no %s tensor cores (compute capability below 8.0): %s\n", gpus, ghas,
               p == DP_MATMUL_BF16 ? "bf16" : "TF32",
               p == DP_MATMUL_BF16 ? "bf16 GEMMs may be slower than --precision fp32"
                                   : "--tf32 changes nothing there");
}

unsigned cli_gpt_flags(const cli_compute *cp)
{
    return (cp->bf16 ? DP_GPT_BF16_ACT : 0u) | (cp->chunked_att ? DP_GPT_CHUNKED_ATTENTION : 0u) |
           (cp->fused_att ? DP_GPT_FUSED_ATTENTION : 0u) |
           ((cp->recompute & CLI_RECOMPUTE_ATTENTION) ? DP_GPT_RECOMPUTE_ATTENTION : 0u) |
           ((cp->recompute & CLI_RECOMPUTE_GELU) ? DP_GPT_RECOMPUTE_GELU : 0u);
}

