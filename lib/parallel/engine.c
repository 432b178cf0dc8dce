/*
 * parallel/engine.c - the DataParallel engine (DESIGN.md section 5).
 *
 * k persistent workers, one per device, created once. The caller's thread
 * posts a job (setup, step, evaluate, broadcast) and waits for all workers
 * to finish it; inside a job the workers meet between phases at an
 * abortable barrier. A failing worker records its device, phase and
 * message in its own slot and aborts the barrier, so every worker returns
 * and the caller reports the first failure by device index.
 */
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "core/error.h"
#include "dp/engine.h"
#include "dp/nn.h"
#include "dp/optim.h"
#include "parallel/barrier.h"

// --- types ---------------------------------------------------------------------

typedef enum job_kind { JOB_SETUP, JOB_STEP, JOB_EVAL, JOB_BROADCAST } job_kind;

/* A range of the flat buffer with one weight-decay setting (optimizer slices). */
typedef struct segment {
    size_t begin, end;
    int decay;
} segment;

/* A grow-only device buffer: steps of the same size reuse it. */
typedef struct dbuf {
    void *ptr;
    size_t bytes;
} dbuf;

typedef struct worker {
    struct dp_engine *e;
    int id;
    pthread_t thread;
    int thread_started;
    dp_device *dev;

    float *params, *grads; /* n_params floats each */
    float *stage;          /* root-side staging for this worker's reduce slice (non-host backends) */

    dbuf inputs, targets, workspace, logits, dlogits, scratch;
    dbuf gathered, gathered_d; /* root only, gather mode */

    /* this step's plan */
    size_t row_begin, rows, valid, n_micro, micro_rows;
    /* reduce/optimizer slice of the flat buffer */
    size_t slice_begin, slice_end;
    segment *segs;
    size_t n_segs;

    double loss_sum, slice_sumsq;

    /* phase tracking */
    dp_phase phase;
    double phase_start;
    double phase_seconds[DP_PHASE_COUNT];
    size_t phase_peak[DP_PHASE_COUNT];

    /* what the watchdog sees: the phase this worker is working in, or -1
     * while it waits at the barrier or has finished the job */
    atomic_int busy_phase;
    uint64_t param_hash; /* replica check */

    /* failure slot */
    dp_status status;
    dp_phase fail_phase;
    char msg[1024];
} worker;

struct dp_engine {
    size_t k;
    worker *w;
    dp_model model;
    dp_criterion crit;
    dp_engine_config cfg;
    float weights[DP_MAX_DEVICES];

    float *m, *v; /* optimizer state on the root */
    long t;
    float lr;
    int needs_sync;

    dp_barrier barrier;
    pthread_mutex_t mu;
    pthread_cond_t cv_start, cv_done;
    unsigned long job_gen;
    job_kind job;
    int running;
    int quit;

    /* per-job shared state, written by the caller before posting */
    const dp_batch *batch;
    size_t n_valid;
    float dscale;
    size_t gather_steps; /* gather mode: synchronized micro-steps */
    int skip;            /* decided identically by every worker after the reduce */
    double grad_norm;

    /* watchdog: the caller's thread waits at most watchdog_seconds after the
     * last phase change of any worker (CLOCK_MONOTONIC, guarded by mu) */
    double last_progress;
    int broken; /* a worker never came back after a watchdog abort */

    /* test hooks */
    int fault_dev;
    dp_phase fault_phase;
    dp_status fault_status;
    int stall_dev;
    dp_phase stall_phase;
    double stall_seconds;
    atomic_int diverge_dev; /* -1: none */
};

// --- small helpers -------------------------------------------------------------

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *dp_phase_name(dp_phase phase)
{
    static const char *names[DP_PHASE_COUNT] = {"scatter",  "forward",   "criterion", "backward",
                                                "reduce",   "optimizer", "broadcast"};
    return (unsigned)phase < DP_PHASE_COUNT ? names[phase] : "setup";
}

const char *dp_mode_name(dp_mode mode)
{
    return mode == DP_MODE_BALANCED ? "balanced" : mode == DP_MODE_GATHER ? "gather" : "unknown";
}

dp_engine_config dp_engine_config_default(void)
{
    dp_engine_config c;
    memset(&c, 0, sizeof c);
    c.mode = DP_MODE_BALANCED;
    c.optim.kind = DP_OPTIMIZER_ADAMW;
    c.optim.lr = 1e-3f;
    c.optim.beta1 = 0.9f;
    c.optim.beta2 = 0.95f;
    c.optim.eps = 1e-8f;
    c.optim.weight_decay = 0.1f;
    c.grad_accum = 1;
    c.seed = 1337;
    return c;
}

static dp_status ensure(dp_device *dev, dbuf *b, size_t bytes)
{
    if (b->bytes >= bytes) return DP_OK;
    /* Free first: the old buffer must not count against the limit twice. */
    dp_device_free(dev, b->ptr);
    b->ptr = NULL;
    b->bytes = 0;
    if (bytes == 0) return DP_OK;
    DP_TRY(dp_device_alloc(dev, bytes, &b->ptr));
    b->bytes = bytes;
    return DP_OK;
}

static void release(dp_device *dev, dbuf *b)
{
    dp_device_free(dev, b->ptr);
    b->ptr = NULL;
    b->bytes = 0;
}

static size_t mul_ok(size_t a, size_t b, int *overflow)
{
    if (a && b > SIZE_MAX / a) *overflow = 1;
    return a * b;
}

// --- worker failure and phases ----------------------------------------------------

/* Records this worker's failure and aborts the barrier so nobody waits for it. */
static void fail(worker *w, dp_status s)
{
    if (w->status == DP_OK) {
        w->status = s;
        w->fail_phase = w->phase;
        snprintf(w->msg, sizeof w->msg, "%s %s: %s", w->dev->name, dp_phase_name(w->phase),
                 dp_last_error());
    }
    dp_barrier_abort(&w->e->barrier);
}

static void close_phase(worker *w)
{
    if ((unsigned)w->phase >= DP_PHASE_COUNT) return;
    /* A GPU runs the phase's work asynchronously: wait for it, so the phase
     * time is the time the work took, not the time to queue it. */
    if (!w->dev->ops->host_memory && w->status == DP_OK) {
        dp_status s = dp_device_synchronize(w->dev);
        if (s != DP_OK) fail(w, s);
    }
    dp_memory_stats ms;
    dp_device_memory(w->dev, &ms);
    w->phase_seconds[w->phase] += now_seconds() - w->phase_start;
    if (ms.peak_since_reset > w->phase_peak[w->phase]) w->phase_peak[w->phase] = ms.peak_since_reset;
}

/* Enters phase p; returns nonzero if an injected fault fires here. */
static int enter_phase(worker *w, dp_phase p)
{
    close_phase(w);
    w->phase = p;
    w->phase_start = now_seconds();
    dp_device_reset_peak(w->dev);
    dp_engine *e = w->e;
    atomic_store(&w->busy_phase, (int)p);
    if (e->cfg.watchdog_seconds > 0) {
        pthread_mutex_lock(&e->mu);
        e->last_progress = w->phase_start;
        pthread_mutex_unlock(&e->mu);
    }
    if (e->fault_dev == w->id && e->fault_phase == p) {
        /* Only this worker reads and clears its own fault. */
        dp_status s = e->fault_status;
        e->fault_phase = DP_PHASE_COUNT;
        fail(w, DP_FAIL(s, "injected fault (test hook)"));
        return 1;
    }
    if (e->stall_dev == w->id && e->stall_phase == p) {
        e->stall_phase = DP_PHASE_COUNT;
        /* An interruptible stand-in for a hung kernel or driver call: the
         * watchdog's abort ends it, and the watchdog reports the error. */
        if (dp_barrier_sleep(&e->barrier, e->stall_seconds) != 0) return 1;
    }
    return 0;
}

/* Waits at the barrier; the watchdog does not count a waiting worker as stuck. */
static int sync_workers(worker *w)
{
    int saved = atomic_exchange(&w->busy_phase, -1);
    int rc = dp_barrier_wait(&w->e->barrier);
    atomic_store(&w->busy_phase, saved);
    return rc;
}

#define ENTER(w, p)                     \
    do {                                \
        if (enter_phase((w), (p))) return; \
    } while (0)
#define SYNC(w)                                              \
    do {                                                     \
        if (sync_workers(w) != 0) return;                   \
    } while (0)
#define CHECK(w, expr)                   \
    do {                                 \
        dp_status chk_s_ = (expr);       \
        if (chk_s_ != DP_OK) {           \
            fail((w), chk_s_);           \
            return;                      \
        }                                \
    } while (0)

// --- the jobs ------------------------------------------------------------------------

static void job_setup(worker *w)
{
    dp_engine *e = w->e;
    size_t bytes = e->model.n_params * sizeof(float);
    w->phase = DP_PHASE_COUNT;
    CHECK(w, dp_device_bind_thread(w->dev));
    CHECK(w, dp_device_alloc(w->dev, bytes, (void **)&w->params));
    CHECK(w, dp_device_alloc(w->dev, bytes, (void **)&w->grads));
    CHECK(w, dp_memset(w->dev, w->grads, 0, bytes));
    if (w->id == 0) {
        CHECK(w, dp_device_alloc(w->dev, bytes, (void **)&e->m));
        CHECK(w, dp_memset(w->dev, e->m, 0, bytes));
        if (e->cfg.optim.kind == DP_OPTIMIZER_ADAMW) {
            CHECK(w, dp_device_alloc(w->dev, bytes, (void **)&e->v));
            CHECK(w, dp_memset(w->dev, e->v, 0, bytes));
        }
    }
    SYNC(w); /* the root's buffers exist before anyone stages on it */
    worker *root = &e->w[0];
    /* Staging for the peers' gradient slices; a single device has none. */
    if (!root->dev->ops->host_memory && e->k > 1 && w->slice_end > w->slice_begin) {
        size_t sb = (w->slice_end - w->slice_begin) * sizeof(float);
        dp_status s = dp_device_alloc(root->dev, sb, (void **)&w->stage);
        if (s != DP_OK) {
            dp_error_prefix("staging buffer for %s's reduce slice", w->dev->name);
            fail(w, s);
        }
    }
}

static void job_broadcast(worker *w)
{
    worker *root = &w->e->w[0];
    w->phase = DP_PHASE_BROADCAST;
    if (w->id != 0)
        CHECK(w, dp_copy_peer(w->dev, w->params, root->dev, root->params,
                              w->e->model.n_params * sizeof(float)));
}

/* Copies this worker's rows of the batch to its device. */
static void scatter(worker *w)
{
    dp_engine *e = w->e;
    const dp_model *m = &e->model;
    if (!w->rows) return;
    size_t in_bytes = w->rows * m->input_row_bytes;
    size_t tg_bytes = w->rows * m->outputs_per_row * sizeof(int32_t);
    CHECK(w, ensure(w->dev, &w->inputs, in_bytes));
    CHECK(w, ensure(w->dev, &w->targets, tg_bytes));
    const char *src = (const char *)e->batch->inputs + w->row_begin * m->input_row_bytes;
    CHECK(w, dp_copy_h2d(w->dev, w->inputs.ptr, src, in_bytes));
    CHECK(w, dp_copy_h2d(w->dev, w->targets.ptr,
                         e->batch->targets + w->row_begin * m->outputs_per_row, tg_bytes));
}

/* Rows of micro-batch j of this worker (0 when it has fewer). */
static size_t micro_rows(const worker *w, size_t j, size_t *first)
{
    size_t b = j * w->micro_rows;
    *first = b;
    if (j >= w->n_micro || b >= w->rows) return 0;
    size_t r = w->rows - b;
    return r < w->micro_rows ? r : w->micro_rows;
}

static dp_chunk chunk_of(const worker *w, size_t first, size_t rows)
{
    const dp_model *m = &w->e->model;
    dp_chunk c;
    c.rows = rows;
    c.inputs = (const char *)w->inputs.ptr + first * m->input_row_bytes;
    c.targets = (const int32_t *)w->targets.ptr + first * m->outputs_per_row;
    return c;
}

static dp_status ensure_compute(worker *w, int need_dlogits)
{
    const dp_model *m = &w->e->model;
    size_t n = w->micro_rows * m->outputs_per_row;
    DP_TRY(ensure(w->dev, &w->workspace, m->workspace_bytes(m->ctx, w->micro_rows)));
    DP_TRY(ensure(w->dev, &w->logits, n * m->n_classes * sizeof(float)));
    if (need_dlogits) DP_TRY(ensure(w->dev, &w->dlogits, n * m->n_classes * sizeof(float)));
    return DP_OK;
}

static dp_status criterion(worker *w, double *loss, float *dlogits, const float *logits,
                           const int32_t *targets, size_t n, float dscale)
{
    dp_engine *e = w->e;
    size_t sb = e->crit.scratch_bytes(e->crit.ctx, n, e->model.n_classes);
    DP_TRY(ensure(w->dev, &w->scratch, sb));
    return e->crit.forward_backward(e->crit.ctx, w->dev, loss, dlogits, logits, targets, n,
                                    e->model.n_classes, dscale, w->scratch.ptr);
}

/* Balanced: each micro-batch runs forward, the local criterion and backward. */
static void compute_balanced(worker *w, int train)
{
    dp_engine *e = w->e;
    const dp_model *m = &e->model;
    if (!w->rows) {
        /* An idle device still passes through the phases (fault hooks, timing). */
        ENTER(w, DP_PHASE_FORWARD);
        ENTER(w, DP_PHASE_CRITERION);
        if (train) ENTER(w, DP_PHASE_BACKWARD);
        return;
    }
    for (size_t j = 0; j < w->n_micro; j++) {
        size_t first, rows = micro_rows(w, j, &first);
        if (!rows) break;
        dp_chunk c = chunk_of(w, first, rows);
        size_t n = rows * m->outputs_per_row;
        ENTER(w, DP_PHASE_FORWARD);
        CHECK(w, ensure_compute(w, 0));
        CHECK(w, m->forward(m->ctx, w->dev, w->params, &c, w->workspace.ptr, w->logits.ptr));
        ENTER(w, DP_PHASE_CRITERION);
        double loss = 0.0;
        float *logits = w->logits.ptr;
        /* dlogits overwrite the logits in place: no second V-wide buffer. */
        CHECK(w, criterion(w, &loss, train ? logits : NULL, logits, c.targets, n, e->dscale));
        w->loss_sum += loss;
        if (!train) continue;
        ENTER(w, DP_PHASE_BACKWARD);
        CHECK(w, m->backward(m->ctx, w->dev, w->params, w->grads, &c, w->workspace.ptr, logits));
    }
}

/* Gather (nn.DataParallel): logits go to the root, which computes the loss
 * and dlogits for the whole micro-step and sends each device its slice. */
static void compute_gather(worker *w)
{
    dp_engine *e = w->e;
    const dp_model *m = &e->model;
    worker *root = &e->w[0];
    size_t V = m->n_classes, opr = m->outputs_per_row;
    for (size_t j = 0; j < e->gather_steps; j++) {
        size_t first, rows = micro_rows(w, j, &first);
        dp_chunk c = chunk_of(w, first, rows);
        ENTER(w, DP_PHASE_FORWARD);
        if (rows) {
            CHECK(w, ensure_compute(w, 1));
            CHECK(w, m->forward(m->ctx, w->dev, w->params, &c, w->workspace.ptr, w->logits.ptr));
        }
        SYNC(w);
        ENTER(w, DP_PHASE_CRITERION);
        if (w->id == 0) {
            /* Gather every device's logits and targets of micro-step j on the root. */
            size_t total = 0;
            for (size_t d = 0; d < e->k; d++) {
                size_t f;
                total += micro_rows(&e->w[d], j, &f) * opr;
            }
            if (total) {
                CHECK(w, ensure(w->dev, &w->gathered, total * V * sizeof(float)));
                CHECK(w, ensure(w->dev, &w->gathered_d, total * V * sizeof(float)));
                CHECK(w, ensure(w->dev, &w->scratch,
                                e->crit.scratch_bytes(e->crit.ctx, total, V) +
                                    total * sizeof(int32_t)));
                /* Targets ride at the end of the criterion scratch. */
                size_t sb = e->crit.scratch_bytes(e->crit.ctx, total, V);
                int32_t *tg = (int32_t *)((char *)w->scratch.ptr + sb);
                size_t off = 0;
                for (size_t d = 0; d < e->k; d++) {
                    worker *wd = &e->w[d];
                    size_t f, r = micro_rows(wd, j, &f);
                    if (!r) continue;
                    size_t nd = r * opr;
                    CHECK(w, dp_copy_peer(w->dev, (float *)w->gathered.ptr + off * V, wd->dev,
                                          wd->logits.ptr, nd * V * sizeof(float)));
                    CHECK(w, dp_copy_peer(w->dev, tg + off, wd->dev,
                                          (const int32_t *)wd->targets.ptr + f * opr,
                                          nd * sizeof(int32_t)));
                    off += nd;
                }
                double loss = 0.0;
                CHECK(w, e->crit.forward_backward(e->crit.ctx, w->dev, &loss, w->gathered_d.ptr,
                                                  w->gathered.ptr, tg, total, V, e->dscale,
                                                  w->scratch.ptr));
                if (isfinite(loss)) {
                    w->loss_sum += loss;
                } else {
                    /* Rare path: attribute the non-finite loss to the devices
                     * whose rows produced it (the others wait at the barrier). */
                    off = 0;
                    for (size_t d = 0; d < e->k; d++) {
                        size_t f, nd = micro_rows(&e->w[d], j, &f) * opr;
                        double ld = 0.0;
                        if (nd)
                            CHECK(w, e->crit.forward_backward(
                                         e->crit.ctx, w->dev, &ld, NULL,
                                         (const float *)w->gathered.ptr + off * V, tg + off, nd,
                                         V, e->dscale, w->scratch.ptr));
                        e->w[d].loss_sum += ld;
                        off += nd;
                    }
                }
            }
        }
        SYNC(w);
        if (rows) {
            /* Offset of this device's rows in the gathered micro-step. */
            size_t off = 0;
            for (int d = 0; d < w->id; d++) {
                size_t f;
                off += micro_rows(&e->w[d], j, &f) * opr;
            }
            CHECK(w, dp_copy_peer(w->dev, w->dlogits.ptr, root->dev,
                                  (const float *)root->gathered_d.ptr + off * V,
                                  rows * opr * V * sizeof(float)));
            ENTER(w, DP_PHASE_BACKWARD);
            CHECK(w, m->backward(m->ctx, w->dev, w->params, w->grads, &c, w->workspace.ptr,
                                 w->dlogits.ptr));
        } else {
            ENTER(w, DP_PHASE_BACKWARD);
        }
    }
}

/* Root grads[slice] += grads_d[slice] for d = 1..k-1, in device order. */
static void reduce_slice(worker *w)
{
    dp_engine *e = w->e;
    worker *root = &e->w[0];
    size_t b = w->slice_begin, n = w->slice_end - w->slice_begin;
    w->slice_sumsq = 0.0;
    if (!n) return;
    for (size_t d = 1; d < e->k; d++) {
        worker *wd = &e->w[d];
        if (!wd->rows) continue; /* an idle device's gradient is zero */
        const float *src = wd->grads + b;
        if (!root->dev->ops->host_memory) {
            CHECK(w, dp_copy_peer(root->dev, w->stage, wd->dev, src, n * sizeof(float)));
            src = w->stage;
        }
        CHECK(w, dp_accumulate(root->dev, root->grads + b, src, n));
    }
    CHECK(w, dp_sum_squares(root->dev, &w->slice_sumsq, root->grads + b, n));
}

static void optimizer_slice(worker *w, double grad_norm)
{
    dp_engine *e = w->e;
    worker *root = &e->w[0];
    const dp_optim_config *o = &e->cfg.optim;
    float clip = 1.0f;
    if (o->grad_clip > 0.0f && grad_norm > o->grad_clip)
        clip = (float)(o->grad_clip / (grad_norm + 1e-6)); /* torch clip_grad_norm_ */
    for (size_t i = 0; i < w->n_segs; i++) {
        size_t b = w->segs[i].begin, n = w->segs[i].end - w->segs[i].begin;
        float wd = w->segs[i].decay ? o->weight_decay : 0.0f;
        if (clip != 1.0f) CHECK(w, dp_scale(root->dev, root->grads + b, clip, n));
        if (o->kind == DP_OPTIMIZER_ADAMW)
            CHECK(w, dp_adamw_update(root->dev, root->params + b, root->grads + b, e->m + b,
                                     e->v + b, n, e->lr, o->beta1, o->beta2, o->eps, wd,
                                     (int)(e->t + 1)));
        else
            CHECK(w, dp_sgd_update(root->dev, root->params + b, root->grads + b, e->m + b, n,
                                   e->lr, o->momentum, wd, (int)(e->t + 1)));
    }
}

// --- replica consistency check -------------------------------------------------------

/* Whether the step now running ends with a replica check (e->t counts the
 * steps before it). */
static int replica_check_due(const dp_engine *e)
{
    long n = e->cfg.check_replicas_every;
    return n > 0 && (e->t + 1) % n == 0;
}

/* FNV-1a over 64-bit words (Fowler, Noll, Vo): not cryptographic, but any
 * flipped bit changes the result, which is all a divergence check needs. */
static uint64_t hash_words(const unsigned char *p, size_t bytes)
{
    uint64_t h = 0xcbf29ce484222325ull;
    size_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
        uint64_t x;
        memcpy(&x, p + i, 8);
        h = (h ^ x) * 0x100000001b3ull;
    }
    for (; i < bytes; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static dp_status hash_params(worker *w, uint64_t *out)
{
    size_t bytes = w->e->model.n_params * sizeof(float);
    if (w->dev->ops->host_memory) {
        *out = hash_words((const unsigned char *)w->params, bytes);
        return DP_OK;
    }
    unsigned char *host = malloc(bytes);
    if (!host) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host buffer for the replica check (%zu bytes)", bytes);
    dp_status s = dp_copy_d2h(w->dev, host, w->params, bytes);
    if (s == DP_OK) *out = hash_words(host, bytes);
    free(host);
    return s;
}

/* Test hook: flips the lowest bit of this replica's first parameter. */
static dp_status flip_one_bit(worker *w)
{
    uint32_t x;
    DP_TRY(dp_copy_d2h(w->dev, &x, w->params, sizeof x));
    x ^= 1u;
    return dp_copy_h2d(w->dev, w->params, &x, sizeof x);
}

static void job_step(worker *w, int train)
{
    dp_engine *e = w->e;
    size_t pbytes = e->model.n_params * sizeof(float);
    ENTER(w, DP_PHASE_SCATTER);
    scatter(w);
    if (w->status) return;
    if (train) CHECK(w, dp_memset(w->dev, w->grads, 0, pbytes));

    if (!train || e->cfg.mode == DP_MODE_BALANCED) compute_balanced(w, train);
    else compute_gather(w);
    if (w->status || !train) return;

    SYNC(w); /* every gradient is complete */
    ENTER(w, DP_PHASE_REDUCE);
    reduce_slice(w);
    if (w->status) return;
    SYNC(w);

    ENTER(w, DP_PHASE_OPTIMIZER);
    /* Every worker derives the same norm and decision from the slices, in slice order. */
    double sumsq = 0.0, loss = 0.0;
    for (size_t d = 0; d < e->k; d++) {
        sumsq += e->w[d].slice_sumsq;
        loss += e->w[d].loss_sum;
    }
    double norm = sqrt(sumsq);
    int skip = !isfinite(norm) || !isfinite(loss);
    if (w->id == 0) {
        /* Read by the caller after the job only. */
        e->grad_norm = norm;
        e->skip = skip;
    }
    if (!skip) optimizer_slice(w, norm);
    if (w->status) return;
    SYNC(w);

    ENTER(w, DP_PHASE_BROADCAST);
    if (w->id != 0 && !skip)
        CHECK(w, dp_copy_peer(w->dev, w->params, e->w[0].dev, e->w[0].params, pbytes));
    if (!skip && replica_check_due(e)) {
        if (atomic_load(&e->diverge_dev) == w->id) {
            atomic_store(&e->diverge_dev, -1);
            CHECK(w, flip_one_bit(w));
        }
        CHECK(w, hash_params(w, &w->param_hash));
    }
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    dp_engine *e = w->e;
    unsigned long seen = 0;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (e->job_gen == seen && !e->quit) pthread_cond_wait(&e->cv_start, &e->mu);
        if (e->quit) {
            pthread_mutex_unlock(&e->mu);
            break;
        }
        seen = e->job_gen;
        job_kind job = e->job;
        pthread_mutex_unlock(&e->mu);

        switch (job) {
        case JOB_SETUP: job_setup(w); break;
        case JOB_STEP: job_step(w, 1); break;
        case JOB_EVAL: job_step(w, 0); break;
        case JOB_BROADCAST: job_broadcast(w); break;
        }
        close_phase(w);
        atomic_store(&w->busy_phase, -1);

        pthread_mutex_lock(&e->mu);
        if (--e->running == 0) pthread_cond_signal(&e->cv_done);
        pthread_mutex_unlock(&e->mu);
    }
    return NULL;
}

static struct timespec deadline_at(double t)
{
    struct timespec ts;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

/* The caller's wait with a watchdog, mu held on entry and exit: when no
 * worker has entered a new phase for watchdog_seconds, the step is aborted
 * and the worker still busy is named. The abort wakes workers waiting at
 * the barrier (and the test hook's stall); a worker stuck inside a backend
 * call gets another watchdog period to return, after which the engine is
 * marked broken. */
static dp_status watch(dp_engine *e)
{
    double wd = e->cfg.watchdog_seconds;
    while (e->running > 0) {
        struct timespec ts = deadline_at(e->last_progress + wd);
        int rc = pthread_cond_timedwait(&e->cv_done, &e->mu, &ts);
        if (rc != ETIMEDOUT || e->running == 0 || now_seconds() < e->last_progress + wd) continue;
        int stuck = -1, phase = -1;
        for (size_t i = 0; i < e->k && stuck < 0; i++) {
            int p = atomic_load(&e->w[i].busy_phase);
            if (p >= 0) stuck = (int)i, phase = p;
        }
        char who[96];
        if (stuck >= 0)
            snprintf(who, sizeof who, "%s %s", e->w[stuck].dev->name,
                     dp_phase_name((dp_phase)phase));
        else
            snprintf(who, sizeof who, "engine");
        pthread_mutex_unlock(&e->mu);
        dp_barrier_abort(&e->barrier);
        pthread_mutex_lock(&e->mu);
        double grace = now_seconds() + wd;
        while (e->running > 0) {
            struct timespec g = deadline_at(grace);
            if (pthread_cond_timedwait(&e->cv_done, &e->mu, &g) == ETIMEDOUT) break;
        }
        if (e->running > 0) {
            e->broken = 1;
            return DP_FAIL(DP_ERR_TIMEOUT, "%s: no progress for %.3g s (watchdog) and the worker "
                           "has not returned since; this engine is unusable, destroy it", who, wd);
        }
        if (phase == DP_PHASE_OPTIMIZER || phase == DP_PHASE_BROADCAST) e->needs_sync = 1;
        return DP_FAIL(DP_ERR_TIMEOUT, "%s: no progress for %.3g s (watchdog); the step was "
                       "aborted and nothing was updated%s", who, wd,
                       phase == DP_PHASE_OPTIMIZER || phase == DP_PHASE_BROADCAST
                           ? " except possibly part of the optimizer step"
                           : "");
    }
    return DP_OK;
}

/* Runs a job on every worker and waits. Returns the first failure by device
 * index, with its message as this thread's last error. */
static dp_status run_job(dp_engine *e, job_kind job)
{
    dp_barrier_reset(&e->barrier);
    for (size_t i = 0; i < e->k; i++) {
        worker *w = &e->w[i];
        w->status = DP_OK;
        w->msg[0] = '\0';
        w->phase = DP_PHASE_COUNT;
        w->loss_sum = 0.0;
        w->slice_sumsq = 0.0;
        memset(w->phase_seconds, 0, sizeof w->phase_seconds);
        memset(w->phase_peak, 0, sizeof w->phase_peak);
    }
    for (size_t i = 0; i < e->k; i++) atomic_store(&e->w[i].busy_phase, -1);
    pthread_mutex_lock(&e->mu);
    e->job = job;
    e->running = (int)e->k;
    e->job_gen++;
    e->last_progress = now_seconds();
    pthread_cond_broadcast(&e->cv_start);
    dp_status timeout = DP_OK;
    if (e->cfg.watchdog_seconds > 0)
        timeout = watch(e); /* returns with mu held */
    else
        while (e->running > 0) pthread_cond_wait(&e->cv_done, &e->mu);
    pthread_mutex_unlock(&e->mu);
    if (timeout != DP_OK) return timeout;
    for (size_t i = 0; i < e->k; i++) {
        worker *w = &e->w[i];
        if (w->status != DP_OK) {
            if (w->fail_phase == DP_PHASE_OPTIMIZER || w->fail_phase == DP_PHASE_BROADCAST)
                e->needs_sync = 1;
            /* Re-raise the worker's message on the caller's thread. */
            return dp_error_raw(w->status, w->msg);
        }
    }
    return DP_OK;
}

// --- plan ------------------------------------------------------------------------------

dp_status dp_engine_plan(const dp_engine *e, size_t rows, const int32_t *targets,
                         size_t *rows_out)
{
    if (!e || !rows_out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "engine and rows_out must not be NULL");
    size_t k = e->k;
    double W = 0.0;
    for (size_t i = 0; i < k; i++) W += e->weights[i];
    if (!e->cfg.token_balanced || !targets) {
        /* floor of each share, then the remainder one row each to the first devices */
        size_t given = 0;
        for (size_t i = 0; i < k; i++) {
            rows_out[i] = (size_t)floor((double)rows * e->weights[i] / W);
            given += rows_out[i];
        }
        for (size_t i = 0; given < rows; i = (i + 1) % k)
            if (e->weights[i] > 0.0f) {
                rows_out[i]++;
                given++;
            }
        return DP_OK;
    }
    /* Token-balanced: cut the rows where the running count of valid targets
     * is nearest each device's cumulative share. */
    size_t opr = e->model.outputs_per_row, total = 0;
    size_t *cum = malloc((rows + 1) * sizeof *cum);
    if (!cum) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "plan: host allocation failed");
    cum[0] = 0;
    for (size_t r = 0; r < rows; r++) {
        size_t v = 0;
        for (size_t t = 0; t < opr; t++) v += targets[r * opr + t] >= 0;
        cum[r + 1] = cum[r] + v;
    }
    total = cum[rows];
    size_t prev = 0;
    double acc = 0.0;
    for (size_t i = 0; i < k; i++) {
        acc += e->weights[i];
        size_t cut = rows;
        if (i + 1 < k) {
            double goal = (double)total * acc / W;
            cut = prev;
            while (cut < rows && fabs((double)cum[cut + 1] - goal) <= fabs((double)cum[cut] - goal))
                cut++;
        }
        rows_out[i] = cut - prev;
        prev = cut;
    }
    free(cum);
    return DP_OK;
}

/* Plans the batch on the caller's thread: rows per device, micro-batches, N. */
static dp_status plan_batch(dp_engine *e, const dp_batch *b)
{
    const dp_model *m = &e->model;
    if (!b || !b->inputs || !b->targets)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "batch, its inputs and targets must not be NULL");
    if (b->rows == 0)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "empty batch (0 rows); pass at least one row");
    int of = 0;
    size_t n_out = mul_ok(b->rows, m->outputs_per_row, &of);
    if (of) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "batch of %zu rows overflows", b->rows);
    size_t valid = 0;
    for (size_t i = 0; i < n_out; i++) {
        int32_t t = b->targets[i];
        if (t < -1 || (t >= 0 && (size_t)t >= m->n_classes))
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "target %d at position %zu is outside "
                           "[-1, %zu); use -1 to ignore a position", (int)t, i, m->n_classes);
        valid += t >= 0;
    }
    if (!valid)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "the batch has no valid target (all -1): its "
                       "mean loss is undefined");
    if (m->validate_inputs) DP_TRY(m->validate_inputs(m->ctx, b->inputs, b->rows));
    e->batch = b;
    e->n_valid = valid;
    e->dscale = (float)(1.0 / (double)valid);

    size_t rows[DP_MAX_DEVICES];
    DP_TRY(dp_engine_plan(e, b->rows, b->targets, rows));
    size_t begin = 0, gather_steps = 0;
    for (size_t i = 0; i < e->k; i++) {
        worker *w = &e->w[i];
        w->row_begin = begin;
        w->rows = rows[i];
        begin += rows[i];
        w->valid = 0;
        for (size_t t = w->row_begin * m->outputs_per_row; t < begin * m->outputs_per_row; t++)
            w->valid += b->targets[t] >= 0;
        size_t nm = e->cfg.grad_accum > 1 ? (size_t)e->cfg.grad_accum : 1;
        if (e->cfg.max_rows_per_micro) {
            size_t need = (w->rows + e->cfg.max_rows_per_micro - 1) / e->cfg.max_rows_per_micro;
            if (need > nm) nm = need;
        }
        if (e->cfg.max_tokens_per_micro) {
            size_t per = e->cfg.max_tokens_per_micro / m->outputs_per_row;
            if (per == 0)
                return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "max_tokens_per_micro %zu is smaller "
                               "than one row (%zu tokens); raise it", e->cfg.max_tokens_per_micro,
                               m->outputs_per_row);
            size_t need = (w->rows + per - 1) / per;
            if (need > nm) nm = need;
        }
        if (w->rows == 0) {
            w->n_micro = 0;
            w->micro_rows = 0;
        } else {
            if (nm > w->rows) nm = w->rows;
            w->micro_rows = (w->rows + nm - 1) / nm;
            w->n_micro = (w->rows + w->micro_rows - 1) / w->micro_rows;
        }
        if (w->n_micro > gather_steps) gather_steps = w->n_micro;
    }
    e->gather_steps = gather_steps;
    return DP_OK;
}

static void fill_stats(dp_engine *e, dp_step_stats *st, double seconds)
{
    if (!st) return;
    memset(st, 0, sizeof *st);
    double loss = 0.0;
    for (size_t i = 0; i < e->k; i++) loss += e->w[i].loss_sum; /* device order: reproducible */
    st->loss = loss / (double)e->n_valid;
    st->valid_targets = e->n_valid;
    st->grad_norm = e->grad_norm;
    st->skipped = e->skip;
    st->skipped_device = -1;
    if (e->skip)
        for (size_t i = 0; i < e->k; i++)
            if (!isfinite(e->w[i].loss_sum)) {
                st->skipped_device = (int)i;
                break;
            }
    st->step = e->t;
    st->seconds = seconds;
    /* A phase lasts as long as its slowest device: phases that end at a
     * barrier read about the same on every device, and the broadcast, where
     * the root only waits, is timed by the devices that copy. */
    for (int p = 0; p < DP_PHASE_COUNT; p++) {
        st->phase_seconds[p] = 0;
        for (size_t i = 0; i < e->k; i++)
            if (e->w[i].phase_seconds[p] > st->phase_seconds[p])
                st->phase_seconds[p] = e->w[i].phase_seconds[p];
    }
    st->n_devices = e->k;
    size_t pbytes = e->model.n_params * sizeof(float);
    for (size_t i = 0; i < e->k; i++) {
        worker *w = &e->w[i];
        dp_device_step_stats *d = &st->devices[i];
        dp_memory_stats ms;
        dp_device_memory(w->dev, &ms);
        d->rows = w->rows;
        d->valid_targets = w->valid;
        d->micro_batches = w->n_micro;
        d->in_use = ms.in_use;
        d->peak = ms.peak;
        for (int p = 0; p < DP_PHASE_COUNT; p++) {
            d->phase_peak[p] = w->phase_peak[p];
            if (w->phase_peak[p] > d->step_peak) d->step_peak = w->phase_peak[p];
        }
        d->logits_bytes = w->logits.bytes + w->dlogits.bytes + w->gathered.bytes + w->gathered_d.bytes;
        d->param_bytes = 2 * pbytes;
        d->optimizer_bytes = i == 0 ? (e->v ? 2 : 1) * pbytes : 0;
    }
}

static dp_status check_usable(const dp_engine *e)
{
    if (e->broken)
        return DP_FAIL(DP_ERR_TIMEOUT, "a worker of this engine did not return after a watchdog "
                       "timeout; destroy the engine and create a new one");
    return DP_OK;
}

static dp_status sync_replicas(dp_engine *e)
{
    if (!e->needs_sync) return DP_OK;
    DP_TRY(run_job(e, JOB_BROADCAST));
    e->needs_sync = 0;
    return DP_OK;
}

/* Plans batch, runs a step or evaluation job and fills stats. */
static dp_status run_batch(dp_engine *e, const dp_batch *batch, job_kind job, dp_step_stats *stats)
{
    if (!e) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "engine must not be NULL");
    DP_TRY(check_usable(e));
    double t0 = now_seconds();
    DP_TRY(sync_replicas(e));
    DP_TRY(plan_batch(e, batch));
    e->skip = 0;
    e->grad_norm = 0.0;
    int check = job == JOB_STEP && replica_check_due(e);
    DP_TRY(run_job(e, job));
    check = check && !e->skip;
    if (job == JOB_STEP && !e->skip) e->t++;
    fill_stats(e, stats, now_seconds() - t0);
    for (size_t i = 1; check && i < e->k; i++)
        if (e->w[i].param_hash != e->w[0].param_hash) {
            e->needs_sync = 1;
            return DP_FAIL(DP_ERR_INTERNAL, "replica on %s diverged from the root %s after step "
                           "%ld (parameter hash %016llx, root %016llx); it will be re-broadcast "
                           "from the root before the next step",
                           e->w[i].dev->name, e->w[0].dev->name, e->t,
                           (unsigned long long)e->w[i].param_hash,
                           (unsigned long long)e->w[0].param_hash);
        }
    return DP_OK;
}

dp_status dp_engine_step(dp_engine *e, const dp_batch *batch, dp_step_stats *stats)
{
    return run_batch(e, batch, JOB_STEP, stats);
}

dp_status dp_engine_evaluate(dp_engine *e, const dp_batch *batch, dp_step_stats *stats)
{
    return run_batch(e, batch, JOB_EVAL, stats);
}

// --- create / destroy ---------------------------------------------------------------

static dp_status build_slices(dp_engine *e)
{
    const dp_model *m = &e->model;
    size_t n = m->n_params, k = e->k;
    for (size_t i = 0; i < k; i++) {
        worker *w = &e->w[i];
        /* Slices on DP_PARAM_ALIGN boundaries; the last one ends at n. */
        size_t b = (n * i / k) / DP_PARAM_ALIGN * DP_PARAM_ALIGN;
        size_t en = i + 1 == k ? n : (n * (i + 1) / k) / DP_PARAM_ALIGN * DP_PARAM_ALIGN;
        w->slice_begin = b;
        w->slice_end = en;
        w->segs = calloc(m->n_tensors ? m->n_tensors : 1, sizeof *w->segs);
        if (!w->segs) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
        w->n_segs = 0;
        for (size_t t = 0; t < m->n_tensors; t++) {
            size_t tb = m->tensors[t].offset, te = tb + m->tensors[t].numel;
            size_t sb = tb > b ? tb : b, se = te < en ? te : en;
            if (sb >= se) continue;
            w->segs[w->n_segs].begin = sb;
            w->segs[w->n_segs].end = se;
            w->segs[w->n_segs].decay = m->tensors[t].weight_decay;
            w->n_segs++;
        }
    }
    return DP_OK;
}

static dp_status check_config(const dp_engine_config *c, size_t k)
{
    if ((unsigned)c->mode >= DP_MODE_COUNT)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "unknown mode %d; use balanced or gather", (int)c->mode);
    if ((unsigned)c->optim.kind >= DP_OPTIMIZER_COUNT)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "unknown optimizer %d", (int)c->optim.kind);
    const dp_optim_config *o = &c->optim;
    if (!(o->lr >= 0.0f) || !(o->weight_decay >= 0.0f) || !(o->grad_clip >= 0.0f))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "lr, weight_decay and grad_clip must be >= 0");
    if (o->kind == DP_OPTIMIZER_ADAMW &&
        (!(o->beta1 >= 0.0f && o->beta1 < 1.0f) || !(o->beta2 >= 0.0f && o->beta2 < 1.0f) ||
         !(o->eps > 0.0f)))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "AdamW needs 0 <= beta1, beta2 < 1 and eps > 0 "
                       "(got beta1 %g, beta2 %g, eps %g)", o->beta1, o->beta2, o->eps);
    if (o->kind == DP_OPTIMIZER_SGD && !(o->momentum >= 0.0f && o->momentum < 1.0f))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "SGD momentum must be in [0, 1)");
    if (c->grad_accum < 0)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "grad_accum must be >= 1 (got %d)", c->grad_accum);
    if (!(c->watchdog_seconds >= 0.0) || !isfinite(c->watchdog_seconds))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "watchdog_seconds is %g; use 0 (off) or a "
                       "positive number of seconds", c->watchdog_seconds);
    if (c->check_replicas_every < 0)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "check_replicas_every is %ld; use 0 (off) or a "
                       "step interval >= 1", c->check_replicas_every);
    if (c->device_weights) {
        double sum = 0.0;
        for (size_t i = 0; i < k; i++) {
            if (!(c->device_weights[i] >= 0.0f) || !isfinite(c->device_weights[i]))
                return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "device weight %zu is %g; weights must be "
                               "finite and >= 0", i, c->device_weights[i]);
            sum += c->device_weights[i];
        }
        if (sum <= 0.0)
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "device weights are all zero; give at least "
                           "one device a positive share");
    }
    return DP_OK;
}

dp_status dp_engine_create(const dp_device_spec *devices, size_t k, const dp_model *model,
                           const dp_criterion *crit, const dp_engine_config *cfg, dp_engine **out)
{
    if (!out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "out must not be NULL");
    *out = NULL;
    if (!devices || !model || !crit || !cfg)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "devices, model, criterion and cfg must not be NULL");
    if (k == 0 || k > DP_MAX_DEVICES)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%zu devices; use 1 to %d", k, DP_MAX_DEVICES);
    if (!crit->forward_backward || !crit->scratch_bytes)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "criterion callbacks must not be NULL");
    DP_TRY(dp_model_validate(model));
    DP_TRY(check_config(cfg, k));

    dp_engine *e = calloc(1, sizeof *e);
    if (!e) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
    e->w = calloc(k, sizeof *e->w);
    if (!e->w) {
        free(e);
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
    }
    e->k = k;
    e->model = *model;
    e->crit = *crit;
    e->cfg = *cfg;
    e->cfg.device_weights = NULL;
    for (size_t i = 0; i < k; i++) e->weights[i] = cfg->device_weights ? cfg->device_weights[i] : 1.0f;
    e->lr = cfg->optim.lr;
    e->fault_phase = DP_PHASE_COUNT;
    e->stall_dev = -1;
    e->stall_phase = DP_PHASE_COUNT;
    atomic_init(&e->diverge_dev, -1);
    for (size_t i = 0; i < k; i++) atomic_init(&e->w[i].busy_phase, -1);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv_start, NULL);
    /* CLOCK_MONOTONIC: the watchdog's deadlines ignore wall-clock jumps. */
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&e->cv_done, &ca);
    pthread_condattr_destroy(&ca);
    dp_barrier_init(&e->barrier, (int)k);

    dp_status s = build_slices(e);
    for (size_t i = 0; s == DP_OK && i < k; i++) {
        worker *w = &e->w[i];
        w->e = e;
        w->id = (int)i;
        w->phase = DP_PHASE_COUNT;
        s = dp_device_open(&devices[i], &w->dev);
        if (s == DP_OK && cfg->memory_limit) dp_device_set_limit(w->dev, cfg->memory_limit);
        if (s == DP_OK && cfg->allow_tf32) s = dp_device_set_allow_tf32(w->dev, 1);
    }
    for (size_t i = 0; s == DP_OK && i < k; i++) {
        if (pthread_create(&e->w[i].thread, NULL, worker_main, &e->w[i]) != 0)
            s = DP_FAIL(DP_ERR_INTERNAL, "cannot start worker thread %zu", i);
        else
            e->w[i].thread_started = 1;
    }
    if (s == DP_OK) s = run_job(e, JOB_SETUP);
    if (s == DP_OK) {
        float *host = calloc(model->n_params, sizeof *host);
        if (!host) s = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation of %zu parameters failed",
                               model->n_params);
        if (s == DP_OK) s = model->init(model->ctx, host, cfg->seed);
        if (s == DP_OK) s = dp_engine_set_params(e, host);
        free(host);
    }
    if (s != DP_OK) {
        dp_engine_destroy(e);
        return s;
    }
    *out = e;
    return DP_OK;
}

void dp_engine_destroy(dp_engine *e)
{
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->quit = 1;
    pthread_cond_broadcast(&e->cv_start);
    pthread_mutex_unlock(&e->mu);
    for (size_t i = 0; i < e->k; i++)
        if (e->w[i].thread_started) pthread_join(e->w[i].thread, NULL);
    worker *root = &e->w[0];
    for (size_t i = 0; i < e->k; i++) {
        worker *w = &e->w[i];
        if (!w->dev) continue;
        dbuf *bufs[] = {&w->inputs, &w->targets, &w->workspace, &w->logits,
                        &w->dlogits, &w->scratch, &w->gathered, &w->gathered_d};
        for (size_t b = 0; b < sizeof bufs / sizeof *bufs; b++) release(w->dev, bufs[b]);
        dp_device_free(w->dev, w->params);
        dp_device_free(w->dev, w->grads);
        if (root->dev) dp_device_free(root->dev, w->stage);
    }
    if (root->dev) {
        dp_device_free(root->dev, e->m);
        dp_device_free(root->dev, e->v);
    }
    for (size_t i = 0; i < e->k; i++) {
        dp_device_close(e->w[i].dev);
        free(e->w[i].segs);
    }
    dp_barrier_destroy(&e->barrier);
    pthread_cond_destroy(&e->cv_start);
    pthread_cond_destroy(&e->cv_done);
    pthread_mutex_destroy(&e->mu);
    free(e->w);
    free(e);
}

// --- parameters and state -------------------------------------------------------------

void dp_engine_set_lr(dp_engine *e, float lr)
{
    if (e) e->lr = lr;
}

dp_status dp_engine_get_params(dp_engine *e, float *host)
{
    if (!e || !host) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "engine and host must not be NULL");
    DP_TRY(dp_device_bind_thread(e->w[0].dev));
    return dp_copy_d2h(e->w[0].dev, host, e->w[0].params, e->model.n_params * sizeof(float));
}

dp_status dp_engine_set_params(dp_engine *e, const float *host)
{
    if (!e || !host) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "engine and host must not be NULL");
    DP_TRY(dp_device_bind_thread(e->w[0].dev));
    DP_TRY(dp_copy_h2d(e->w[0].dev, e->w[0].params, host, e->model.n_params * sizeof(float)));
    e->needs_sync = 1;
    return sync_replicas(e);
}

dp_status dp_engine_get_optimizer_state(dp_engine *e, float *m, float *v, long *t)
{
    if (!e) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "engine must not be NULL");
    dp_device *root = e->w[0].dev;
    size_t bytes = e->model.n_params * sizeof(float);
    DP_TRY(dp_device_bind_thread(root));
    if (m) DP_TRY(dp_copy_d2h(root, m, e->m, bytes));
    if (v && e->v) DP_TRY(dp_copy_d2h(root, v, e->v, bytes));
    if (t) *t = e->t;
    return DP_OK;
}

dp_status dp_engine_set_optimizer_state(dp_engine *e, const float *m, const float *v, long t)
{
    if (!e) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "engine must not be NULL");
    if (t < 0) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "step count %ld is negative", t);
    dp_device *root = e->w[0].dev;
    size_t bytes = e->model.n_params * sizeof(float);
    DP_TRY(dp_device_bind_thread(root));
    if (m) DP_TRY(dp_copy_h2d(root, e->m, m, bytes));
    if (v && e->v) DP_TRY(dp_copy_h2d(root, e->v, v, bytes));
    e->t = t;
    return DP_OK;
}

size_t dp_engine_num_devices(const dp_engine *e) { return e ? e->k : 0; }

dp_device *dp_engine_device(dp_engine *e, size_t i) { return e && i < e->k ? e->w[i].dev : NULL; }

const dp_model *dp_engine_model(const dp_engine *e) { return e ? &e->model : NULL; }

void dp_engine_inject_fault(dp_engine *e, int device, dp_phase phase, dp_status status)
{
    if (!e) return;
    e->fault_dev = device;
    e->fault_status = status;
    e->fault_phase = phase;
}

void dp_engine_inject_stall(dp_engine *e, int device, dp_phase phase, double seconds)
{
    if (!e) return;
    e->stall_dev = device;
    e->stall_seconds = seconds;
    e->stall_phase = phase;
}

void dp_engine_inject_divergence(dp_engine *e, int device)
{
    if (e) atomic_store(&e->diverge_dev, device);
}
