/*
 * backend/cpu/cpu_gemm.c - the CPU backend's GEMM (dp_gemm_ex semantics):
 * OpenBLAS for float32 math, oneDNN's matmul for bf16 math.
 *
 * FP32 (and TF32, which a CPU computes as FP32): cblas_sgemm, one call
 * per matrix of the batch; a bfloat16 operand is first widened (exactly)
 * into the device's conversion scratch.
 * BF16: both operands as bfloat16 (a float32 one rounded into the
 * scratch), products summed in float32 by oneDNN's matmul primitive
 * (AVX512-BF16 / AMX kernels) in the oneDNN module (libdp-dnnl,
 * cpu_dnnl.c). Where oneDNN is not built in, the module cannot be loaded
 * or oneDNN has no bf16 matmul for this CPU, the same arithmetic on OpenBLAS: operands
 * rounded to bfloat16 values held as floats, whose products float32
 * represents exactly, then cblas_sgemm. Either way the result is
 * deterministic for a given machine; the two differ only in the order of
 * the float32 sums.
 *
 * The scratch (converted operands, then oneDNN's scratchpad) is the
 * device's reserved memory, counted against the limit and the host's
 * memory, and lives until close. It is bounded: a GEMM whose converted
 * operands would pass DP_GEMM_CONVERT_CAP runs in pieces
 * (backend/gemm_pieces.h), each converting only its block; so does, on
 * oneDNN, one that adds into a C larger than DP_DNNL_SUM_BLOCK. The device's
 * mutex over the scratch makes a second thread's GEMM on the same device
 * wait (the engine never does that; an application might).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "backend/cpu/cpu_kernels.h"
#include "core/error.h"
#include "backend/gemm_pieces.h"
#include "kernels/bf16.h"

#include "backend/cpu/cpu_dnnl.h"

/* The largest block of C a oneDNN matmul adds into (bytes of float32).
 * Its sum post-op on a larger C runs well below the product's rate: the
 * LM head's weight gradient (C 8192 x 256, k 256 rows) took 3.5 ms per
 * chunk on one AVX512-BF16 core beside a second device, ~2.3 at the
 * kernel's rate. In blocks of 2 MiB a bf16 GPT step (dp_bench V8192 C256
 * L2 B16 on cpu:2) takes 0.975x the time (median of 8 alternating pairs;
 * 1 and 4 MiB alike), GPT-2 small's shape (V50257 C768 L12) 0.94x. */
#define DP_DNNL_SUM_BLOCK ((size_t)2 << 20)

struct dp_cpu_ctx {
    pthread_mutex_t mu; /* guards the rest */
    unsigned char *scratch;
    size_t scratch_bytes;
    int dnnl_state; /* 0 not tried, 1 ready, -1 unavailable: emulate on OpenBLAS */
    int bf16_probe; /* 0 not probed, 1 oneDNN builds a bf16 matmul here, -1 it does not */
    const dp_dnnl_module *dnnl; /* the oneDNN module, when ready */
    void *dnnl_st;              /* its state for this device */
};

dp_status dp_cpu_ctx_create(dp_device *dev)
{
    struct dp_cpu_ctx *c = calloc(1, sizeof *c);
    if (!c) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "%s: cannot allocate the device state", dev->name);
    if (pthread_mutex_init(&c->mu, NULL) != 0) {
        free(c);
        return DP_FAIL(DP_ERR_INTERNAL, "%s: pthread_mutex_init failed", dev->name);
    }
    dev->ctx = c;
    return DP_OK;
}

void dp_cpu_ctx_destroy(dp_device *dev)
{
    struct dp_cpu_ctx *c = dev->ctx;
    if (!c) return;
    if (c->dnnl_st) c->dnnl->destroy(c->dnnl_st);
    if (c->scratch) {
        free(c->scratch);
        dp_cpu_host_release(c->scratch_bytes);
        pthread_mutex_lock(&dev->mu);
        dev->reserved -= c->scratch_bytes;
        pthread_mutex_unlock(&dev->mu);
    }
    pthread_mutex_destroy(&c->mu);
    free(c);
    dev->ctx = NULL;
}

/* The scratch grown to at least bytes (c->mu held), counted as reserved
 * memory against the device's limit and the host's memory. */
static dp_status grow_scratch(dp_device *dev, struct dp_cpu_ctx *c, size_t bytes)
{
    if (bytes <= c->scratch_bytes) return DP_OK;
    size_t unit = (size_t)64 << 10;
    if (bytes > SIZE_MAX - unit)
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "%s: %zu scratch bytes overflow", dev->name, bytes);
    bytes = (bytes + unit - 1) / unit * unit;
    size_t grow = bytes - c->scratch_bytes;
    pthread_mutex_lock(&dev->mu);
    size_t used = dev->in_use + dev->reserved, limit = dev->limit;
    int fits = !limit || (used <= limit && grow <= limit - used);
    if (fits) dev->reserved += grow;
    pthread_mutex_unlock(&dev->mu);
    if (!fits)
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY,
                       "%s: a GEMM's conversion scratch needs %zu more bytes, which would pass "
                       "the memory limit (%zu bytes in use and reserved, limit %zu bytes); use "
                       "a smaller batch or a higher limit (dp_device_set_limit; "
                       "dp_engine_config.memory_limit)",
                       dev->name, grow, used, limit);
    dp_status s = dp_cpu_host_reserve(dev, grow);
    void *p = s == DP_OK ? dp_cpu_host_alloc(bytes) : NULL;
    if (!p) {
        if (s == DP_OK) {
            dp_cpu_host_release(grow);
            s = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "%s: host allocation of %zu scratch bytes failed",
                        dev->name, bytes);
        }
        pthread_mutex_lock(&dev->mu);
        dev->reserved -= grow;
        pthread_mutex_unlock(&dev->mu);
        return s;
    }
    free(c->scratch);
    c->scratch = p;
    c->scratch_bytes = bytes;
    return DP_OK;
}

static size_t round64(size_t bytes) { return (bytes + 63) / 64 * 64; }

/* C = beta C for batch (m,n) matrices: the k == 0 product. */
static void scale_c(float *C, int m, int n, int ldc, long long sc, int batch, float beta)
{
    for (int i = 0; i < batch; i++) {
        float *Ci = C + (size_t)i * (size_t)sc;
        for (int col = 0; col < n; col++) {
            float *p = Ci + (size_t)col * (size_t)ldc;
            for (int row = 0; row < m; row++) p[row] = beta == 0.0f ? 0.0f : beta * p[row];
        }
    }
}

static void sgemm_batch(dp_op ta, dp_op tb, int m, int n, int k, float alpha, const float *A,
                        int lda, long long sa, const float *B, int ldb, long long sb, float beta,
                        float *C, int ldc, long long sc, int batch)
{
    for (int i = 0; i < batch; i++)
        cblas_sgemm(CblasColMajor, ta == DP_OP_T ? CblasTrans : CblasNoTrans,
                    tb == DP_OP_T ? CblasTrans : CblasNoTrans, m, n, k, alpha,
                    A + (size_t)i * (size_t)sa, lda, B + (size_t)i * (size_t)sb, ldb, beta,
                    C + (size_t)i * (size_t)sc, ldc);
}

/* What a piece's operand needs before the GEMM kernel can read it. */
typedef enum cvt_kind {
    CVT_NONE,        /* read in place */
    CVT_ROUND_BF16,  /* float32 -> bfloat16 bits (oneDNN's bf16 matmul) */
    CVT_WIDEN,       /* bfloat16 -> float32, exact (OpenBLAS) */
    CVT_ROUND_FLOAT, /* float32 -> its bfloat16 value as a float (bf16 math on OpenBLAS) */
} cvt_kind;

/* The block b of operand a converted densely into dst (gemm_pieces.h). */
static DP_CPU_SIMD void pack(void *dst, cvt_kind cv, const dp_gemm_arg *a, const dp_gemm_block *b)
{
    size_t rows = (size_t)b->rows, per = rows * (size_t)b->cols;
    int cols = b->cols, count = b->count;
    /* Columns that follow each other (and matrices that do): one run. */
    if ((size_t)a->ld == rows) {
        rows = per, cols = 1;
        if (count > 1 && (size_t)a->stride == per) rows *= (size_t)count, count = 1;
    }
    for (int mat = 0; mat < count; mat++)
        for (int col = 0; col < cols; col++) {
            size_t from = b->off + (size_t)mat * (size_t)a->stride + (size_t)col * (size_t)a->ld;
            size_t to = (size_t)mat * per + (size_t)col * rows;
            if (cv == CVT_ROUND_BF16) {
                const float *src = (const float *)a->p + from;
                uint16_t *d = (uint16_t *)dst + to;
                for (size_t r = 0; r < rows; r++) d[r] = dp_bf16_round(src[r]);
            } else if (cv == CVT_WIDEN) {
                const uint16_t *src = (const uint16_t *)a->p + from;
                float *d = (float *)dst + to;
                for (size_t r = 0; r < rows; r++) d[r] = dp_bf16_widen(src[r]);
            } else {
                const float *src = (const float *)a->p + from;
                float *d = (float *)dst + to;
                for (size_t r = 0; r < rows; r++) d[r] = dp_bf16_widen(dp_bf16_round(src[r]));
            }
        }
}

/* The oneDNN module and this device's state in it, once per device; 0
 * when oneDNN cannot run here (not built, the module or libdnnl missing,
 * no CPU engine): bf16 math then runs on OpenBLAS. */
static int dnnl_ready(struct dp_cpu_ctx *c)
{
    if (c->dnnl_state == 0) {
        c->dnnl_state = -1;
        /* The GEMM goes on without oneDNN: the loader's message is not
         * this call's error, so the thread's last one is put back. */
        char prev[1024]; /* status.c's message capacity */
        snprintf(prev, sizeof prev, "%s", dp_last_error());
        const void *table = NULL;
        if (dp_module_load(DP_MODULE_DNNL, &table) == DP_OK) {
            c->dnnl = table;
            c->dnnl_st = c->dnnl->create();
            if (c->dnnl_st) c->dnnl_state = 1;
        } else {
            dp_error_raw(DP_OK, prev);
        }
    }
    return c->dnnl_state == 1;
}

/* The key of one piece's matmul. */
static dp_dnnl_key piece_key(dp_op ta, dp_op tb, int m, int n, int k, float alpha,
                             const dp_gemm_arg *A, const dp_gemm_arg *B, float beta, int ldc,
                             long long sc, int batch)
{
    dp_dnnl_key key;
    memset(&key, 0, sizeof key); /* padding too: keys compare with memcmp */
    key.ta = ta == DP_OP_T;
    key.tb = tb == DP_OP_T;
    key.m = m;
    key.n = n;
    key.k = k;
    key.lda = A->ld;
    key.ldb = B->ld;
    key.ldc = ldc;
    key.batch = batch;
    key.sa = batch > 1 ? A->stride : 0;
    key.sb = batch > 1 ? B->stride : 0;
    key.sc = batch > 1 ? sc : 0;
    key.alpha = alpha;
    key.beta = beta;
    return key;
}

dp_status dp_cpu_matmul_native(dp_device *dev, dp_matmul_precision p, int *native)
{
    if (p != DP_MATMUL_BF16) { /* TF32 computes as FP32 on CPUs */
        *native = 0;
        return DP_OK;
    }
    struct dp_cpu_ctx *c = dev->ctx;
    dp_status s = DP_OK;
    pthread_mutex_lock(&c->mu);
    if (c->bf16_probe == 0 && !dnnl_ready(c)) c->bf16_probe = -1;
    if (c->bf16_probe == 0) {
        /* The smallest GEMM of every kind the GPT runs: oneDNN implements
         * bf16 matmul for an ISA or not at all. */
        dp_dnnl_key key;
        memset(&key, 0, sizeof key);
        key.m = key.n = key.k = key.lda = key.ldb = key.ldc = 16;
        key.batch = 1;
        key.alpha = 1.0f;
        size_t pad = 0;
        int unimplemented = 0;
        s = c->dnnl->prepare(dev, c->dnnl_st, &key, &pad, &unimplemented);
        if (s == DP_OK) c->bf16_probe = unimplemented ? -1 : 1;
    }
    *native = c->bf16_probe == 1 && !dev->gemm_no_dnnl; /* the GEMMs' own test */
    pthread_mutex_unlock(&c->mu);
    return s;
}

/* One GEMM cut into pieces (gemm_pieces.h) and how each piece's operands
 * are converted. */
typedef struct pieces {
    dp_op ta, tb;
    int m, n, k, batch, ldc;
    float alpha, beta;
    const dp_gemm_arg *A, *B;
    float *C;
    long long sc;
    dp_gemm_plan p;
    cvt_kind ca, cb;
    size_t ea, eb; /* the operands' element bytes as stored */
    int dnnl;      /* bf16 math on oneDNN, else OpenBLAS */
} pieces;

/* Runs every piece in order: the blocks converted into sa and sb, then the
 * kernel (oneDNN with its scratchpad at pad, or OpenBLAS). Dry (oneDNN
 * only): converts and runs nothing, but finds each piece's primitive and
 * sets *pad_bytes to the largest scratchpad, or *unimplemented when this
 * CPU has no bf16 matmul. */
static dp_status run_pieces(dp_device *dev, struct dp_cpu_ctx *c, const pieces *q, int dry,
                            unsigned char *sa, unsigned char *sb, unsigned char *pad,
                            size_t *pad_bytes, int *unimplemented)
{
    dp_gemm_piece pc = dp_gemm_piece_first(&q->p, q->m, q->n, q->k, q->batch, q->beta);
    dp_gemm_arg pa = {0};
    do {
        if (pc.new_a) {
            dp_gemm_block ba = dp_gemm_block_a(q->A, q->ta, pc.b0, pc.g, pc.i0, pc.mb, pc.l0, pc.kb);
            if (q->ca && !dry) pack(sa, q->ca, q->A, &ba);
            pa = dp_gemm_block_arg(q->A, &ba, q->ca ? sa : NULL, q->dnnl, q->ea);
        }
        dp_gemm_block bb = dp_gemm_block_b(q->B, q->tb, pc.b0, pc.g, pc.j0, pc.nb, pc.l0, pc.kb);
        if (q->cb && !dry) pack(sb, q->cb, q->B, &bb);
        dp_gemm_arg pb = dp_gemm_block_arg(q->B, &bb, q->cb ? sb : NULL, q->dnnl, q->eb);
        float *C = q->C + (size_t)pc.b0 * (size_t)q->sc + (size_t)pc.i0 +
                   (size_t)pc.j0 * (size_t)q->ldc;
        if (q->dnnl) {
            dp_dnnl_key key = piece_key(q->ta, q->tb, pc.mb, pc.nb, pc.kb, q->alpha, &pa, &pb,
                                        pc.beta, q->ldc, q->sc, pc.g);
            if (!dry) {
                DP_TRY(c->dnnl->run(dev, c->dnnl_st, &key, pa.p, pb.p, NULL, C, pad));
                continue;
            }
            DP_TRY(c->dnnl->prepare(dev, c->dnnl_st, &key, pad_bytes, unimplemented));
            if (*unimplemented) return DP_OK;
            continue;
        }
        sgemm_batch(q->ta, q->tb, pc.mb, pc.nb, pc.kb, q->alpha, pa.p, pa.ld, pa.stride, pb.p,
                    pb.ld, pb.stride, pc.beta, C, q->ldc, q->sc, pc.g);
    } while (dp_gemm_piece_next(&pc, &q->p, q->m, q->n, q->k, q->batch, q->beta));
    return DP_OK;
}

/* A GEMM with operands to convert, in pieces: bf16 math on oneDNN (dnnl:
 * float32 operands rounded to bfloat16), else on OpenBLAS (bfloat16
 * operands widened; with bf16 math, float32 ones rounded). c->mu held.
 * The scratch is grown once, for the largest piece, before anything is
 * written: a GEMM that cannot have it leaves C untouched. */
static dp_status gemm_pieces(dp_device *dev, struct dp_cpu_ctx *c, dp_op ta, dp_op tb, int m,
                             int n, int k, float alpha, const dp_gemm_arg *A,
                             const dp_gemm_arg *B, float beta, float *C, int ldc, long long sc,
                             int batch, int bf16_math, int dnnl)
{
    pieces q = {ta, tb, m, n, k, batch, ldc, alpha, beta, A, B, C, sc,
                {0, 0, 0, 0}, CVT_NONE, CVT_NONE, A->bf16 ? 2 : 4, B->bf16 ? 2 : 4, dnnl};
    if (dnnl) {
        q.ca = A->bf16 ? CVT_NONE : CVT_ROUND_BF16;
        q.cb = B->bf16 ? CVT_NONE : CVT_ROUND_BF16;
    } else {
        q.ca = A->bf16 ? CVT_WIDEN : bf16_math ? CVT_ROUND_FLOAT : CVT_NONE;
        q.cb = B->bf16 ? CVT_WIDEN : bf16_math ? CVT_ROUND_FLOAT : CVT_NONE;
    }
    size_t esize = dnnl ? 2 : 4;
    size_t cap = dev->gemm_convert_cap ? dev->gemm_convert_cap : DP_GEMM_CONVERT_CAP;
    q.p = dp_gemm_plan_pieces(m, n, k, batch, q.ca != CVT_NONE, q.cb != CVT_NONE, esize, cap);
    if (dnnl && (beta != 0.0f || q.p.kb < k)) q.p = dp_gemm_plan_sum_cut(q.p, DP_DNNL_SUM_BLOCK);
    size_t a_bytes =
        round64(dp_gemm_piece_bytes(q.ca != CVT_NONE, 0, esize, q.p.mb, q.p.nb, q.p.kb, q.p.g));
    size_t b_bytes =
        round64(dp_gemm_piece_bytes(0, q.cb != CVT_NONE, esize, q.p.mb, q.p.nb, q.p.kb, q.p.g));
    size_t pad = 0;
    if (dnnl) { /* every piece's primitive first, for the largest scratchpad */
        int unimplemented = 0;
        unsigned char probe[1]; /* (a dry run converts nothing: any non-NULL block) */
        DP_TRY(run_pieces(dev, c, &q, 1, probe, probe, NULL, &pad, &unimplemented));
        if (unimplemented) /* no bf16 matmul on this CPU: the same arithmetic on OpenBLAS */
            return gemm_pieces(dev, c, ta, tb, m, n, k, alpha, A, B, beta, C, ldc, sc, batch,
                               bf16_math, 0);
    }
    DP_TRY(grow_scratch(dev, c, a_bytes + b_bytes + pad));
    return run_pieces(dev, c, &q, 0, c->scratch, c->scratch + a_bytes,
                      c->scratch + a_bytes + b_bytes, &pad, NULL);
}

dp_status dp_cpu_gemm(dp_device *dev, dp_op ta, dp_op tb, int m, int n, int k, float alpha,
                      const dp_gemm_arg *A, const dp_gemm_arg *B, float beta, float *C, int ldc,
                      long long sc, int batch)
{
    if (k == 0) { /* C = beta C; beta == 0 overwrites (NaNs in C are not kept) */
        scale_c(C, m, n, ldc, sc, batch, beta);
        return DP_OK;
    }
    int bf16_math = dev->matmul == DP_MATMUL_BF16;
    int admitted;
    if (!bf16_math && !A->bf16 && !B->bf16) { /* plain float32: nothing to convert */
        DP_TRY(dp_cpu_blas_enter(dev, &admitted));
        sgemm_batch(ta, tb, m, n, k, alpha, A->p, A->ld, A->stride, B->p, B->ld, B->stride, beta,
                    C, ldc, sc, batch);
        dp_cpu_blas_leave(admitted);
        return DP_OK;
    }
    struct dp_cpu_ctx *c = dev->ctx;
    pthread_mutex_lock(&c->mu);
    /* float32 math, or bf16 math without oneDNN: OpenBLAS */
    int dnnl = bf16_math && !dev->gemm_no_dnnl && dnnl_ready(c);
    dp_status s = dnnl ? DP_OK : dp_cpu_blas_enter(dev, &admitted);
    if (s == DP_OK) {
        s = gemm_pieces(dev, c, ta, tb, m, n, k, alpha, A, B, beta, C, ldc, sc, batch, bf16_math,
                        dnnl);
        if (!dnnl) dp_cpu_blas_leave(admitted);
    }
    pthread_mutex_unlock(&c->mu);
    return s;
}

/* dp_backend_ops.gemm_bias_out on oneDNN: bfloat16 operands in BF16 math,
 * the bias and the bfloat16 output in the primitive's epilogue. It
 * declines (*done = 0) where the composition is the only way or the same
 * work: FP32 or TF32 math (OpenBLAS), an operand to convert first (the
 * composition's GEMM converts it in bounded pieces), oneDNN not here or
 * without a bf16 matmul on this CPU. */
dp_status dp_cpu_gemm_bias_out(dp_device *dev, dp_op ta, dp_op tb, int m, int n, int k,
                               const dp_gemm_arg *A, const dp_gemm_arg *B, dp_pref bias, void *C,
                               int c_bf16, int ldc, int *done)
{
    *done = 0;
    if (dev->matmul != DP_MATMUL_BF16 || dev->gemm_no_dnnl || !A->bf16 || !B->bf16)
        return DP_OK;
    struct dp_cpu_ctx *c = dev->ctx;
    pthread_mutex_lock(&c->mu);
    dp_status s = DP_OK;
    if (dnnl_ready(c)) {
        dp_dnnl_key key = piece_key(ta, tb, m, n, k, 1.0f, A, B, 0.0f, ldc, 0, 1);
        key.bias = !bias.p ? DP_DNNL_BIAS_NONE : bias.bf16 ? DP_DNNL_BIAS_BF16 : DP_DNNL_BIAS_F32;
        key.c_bf16 = c_bf16 != 0;
        size_t pad = 0;
        int unimplemented = 0;
        s = c->dnnl->prepare(dev, c->dnnl_st, &key, &pad, &unimplemented);
        if (s == DP_OK && !unimplemented) {
            s = grow_scratch(dev, c, pad);
            if (s == DP_OK) s = c->dnnl->run(dev, c->dnnl_st, &key, A->p, B->p, bias.p, C,
                                             c->scratch);
            if (s == DP_OK) *done = 1;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return s;
}
