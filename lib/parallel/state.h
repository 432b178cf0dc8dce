/*
 * parallel/state.h - the engine's data (not installed): the workers (one
 * per local device), the optimizer's slices, the plan of a batch and the
 * engine itself. Functions live in the rooms that own each part, one
 * header each:
 *   pool.h       the worker threads: run a function on every worker, the
 *                barrier, phases, the watchdog
 *   plan.h       the split of a batch (a value: dp_plan)
 *   compute.h    forward, criterion and backward on one worker
 *   comm.h       the collectives between this process's devices
 *   optimizer.h  the slices, their state and the update
 *   replica.h    the replica check
 *   step.h       the step, for one process and for R ranks alike
 *   ranks.h      joining the ranks of a job at create
 * Each field below names the file that writes it; the others only read.
 */
#ifndef DP_PARALLEL_STATE_H
#define DP_PARALLEL_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/device_graph.h"
#include "core/error.h"
#include "dp/engine.h"
#include "parallel/barrier.h"
#include "transport/transport.h"

// --- buffers ---------------------------------------------------------------------

/* A grow-only device buffer: steps of the same size reuse it. */
typedef struct dbuf {
    void *ptr;
    size_t bytes;
} dbuf;

static inline dp_status dp_dbuf_ensure(dp_device *dev, dbuf *b, size_t bytes)
{
    if (b->bytes >= bytes) return DP_OK;
    /* A recording (graph.c) names the buffers it was recorded with. */
    DP_TRY(dp_device_refuse_recording(dev, "a buffer that grows"));
    /* Free first: the old buffer must not count against the limit twice. */
    dp_device_free(dev, b->ptr);
    b->ptr = NULL;
    b->bytes = 0;
    if (bytes == 0) return DP_OK;
    DP_TRY(dp_device_alloc(dev, bytes, &b->ptr));
    b->bytes = bytes;
    return DP_OK;
}

static inline void dp_dbuf_release(dp_device *dev, dbuf *b)
{
    dp_device_free(dev, b->ptr);
    b->ptr = NULL;
    b->bytes = 0;
}

// --- the plan of a batch (plan.c) ---------------------------------------------------

/* One local device's part of a batch. */
typedef struct dp_plan_device {
    size_t row_begin, rows; /* its rows of the global batch */
    size_t valid;           /* valid target elements in them */
    size_t n_micro, micro_rows;
} dp_plan_device;

/* A planned batch: passed by value to the step's phases. */
typedef struct dp_plan {
    const dp_batch *batch;
    size_t n_valid; /* N: valid target elements of the whole batch */
    float dscale;   /* 1 / N */
    size_t gather_steps; /* gather mode: the micro-steps every device takes */
    size_t grows[DP_MAX_DEVICES]; /* rows per global device */
    dp_plan_device dev[DP_MAX_DEVICES]; /* per local device */
} dp_plan;

/* Rows of micro-batch j of device d (0 when it has fewer); *first is the
 * micro-batch's first row within the device's rows. */
static inline size_t dp_plan_micro_rows(const dp_plan_device *d, size_t j, size_t *first)
{
    size_t b = j * d->micro_rows;
    *first = b;
    if (j >= d->n_micro || b >= d->rows) return 0;
    size_t r = d->rows - b;
    return r < d->micro_rows ? r : d->micro_rows;
}

/* Whether global device g adds to the reduced gradient (device 0 always:
 * its zeroed buffer starts the sum; the others when they have rows). */
static inline int dp_plan_contributes(const dp_plan *p, size_t g)
{
    return g == 0 || p->grows[g] > 0;
}

// --- the optimizer's slices (optimizer.c, comm.c) --------------------------------------

/* A range of the flat buffer with one weight-decay setting. */
typedef struct segment {
    size_t begin, end;
    int decay;
} segment;

/* One of the K optimizer slices of the flat buffer (K = the job's devices
 * over every rank). The owner (a global device: the slice's own when the
 * optimizer is sharded, device 0 otherwise) holds its moments and receives
 * its reduced gradient; the summer (a global device: the owner, or in
 * root mode across ranks the slice's own device when that is on another
 * rank than the owner) forms the sum, which then moves to the owner. The
 * reducer, a worker of the summer's rank, sums it (and its squares) on the
 * summer's device; the updater, a worker of the owner's rank, updates it
 * on the owner's. */
typedef struct slice {
    /* optimizer.c */
    size_t begin, end;
    int owner;   /* global device index */
    int summer;  /* global device index */
    int reducer; /* local worker index, or -1 when the summer is on another rank */
    int updater; /* local worker index, or -1 when the owner is on another rank */
    segment *segs;
    size_t n_segs;
    float *m, *v;  /* the moments, on the owner */
    float *master; /* bf16 replicas: the slice's float32 master weights, on the owner */
    double sumsq;  /* of the reduced gradient, this step (its reducer) */
    /* comm.c: on the summer, the running sum, an incoming chunk, and per
     * staging half one chunk of `staged` floats per device of the other
     * ranks */
    dbuf acc, in, remote;
    size_t staged;
    /* overlap.c (its reducer): [reduced_from, end) is reduced this step */
    size_t reduced_from;
} slice;

// --- the reduce-scatter's rounds between the ranks (rounds.c) ---------------------------

/* A round's progress in the running step. */
enum { DP_ROUND_IDLE, DP_ROUND_STARTED, DP_ROUND_ARRIVED, DP_ROUND_REDUCED };

/* One round: elements [begin, end) of slice `slice`, its messages
 * engine.xfers[at .. at + n). A forward round carries the devices'
 * pieces to the slice's summer; a return round (ret) the summed piece
 * from the summer to the owner, when they differ. */
typedef struct dp_round {
    size_t slice, begin, end;
    size_t at, n;
    int ret;
    int recvs;   /* this rank receives in it (forward: sums the slice ... */
    int half;    /* ... into this half of the slice's staging) */
    size_t prev; /* forward: the round before it into that half (SIZE_MAX: none) */
    size_t pair; /* forward: its return round; return: its forward round (SIZE_MAX: none) */
    double started, arrived; /* the caller's host monotonic seconds, this step */
    /* DP_ROUND_*: the caller starts it and marks it arrived (release), the
     * reducer marks it reduced (release); each reads the other's (acquire) */
    atomic_int state;
} dp_round;

// --- the workers (pool.c and the step's phases) --------------------------------------

struct dp_pool;

/* dp_grads_ready's handle (dp/model.h) for one backward call of worker w
 * (compute.c sets it up, overlap.c checks and publishes). */
struct dp_grads_signal {
    struct worker *w;
    size_t next_end;  /* the next range must end here (n_params at first) */
    int publish;      /* the call's signals make the gradient final: the last pass */
    dp_status refused; /* the first refused signal's status (later ones are refused too) */
    char msg[512];     /* and its message */
};

typedef struct worker {
    /* engine.c, at create */
    struct dp_engine *e;
    struct dp_pool *pool;
    int id; /* local device index */
    dp_device *dev;
    /* the queue the sums of the slices this device owns run on: a
     * communication queue beside dev's (backend.h: a second CUDA stream,
     * with DP_CUDA_OVERLAP=1, one process), else dev itself (CPUs, whose
     * entries complete as they are called) */
    dp_device *comm;
    void *params; /* the replica: n_params elements of the model's param_dtype */
    float *grads; /* n_params floats */

    /* compute.c and comm.c: grow-only buffers, the loss of this step */
    dbuf inputs, targets, workspace, logits, dlogits, scratch;
    dbuf features, dfeatures;  /* a model with a head: its input and that input's gradient */
    dbuf gathered, gathered_d; /* root only, gather mode */
    dbuf row_losses;           /* balanced mode: the step's row losses (compute.c) */
    float *row_losses_host;    /* their host copy (malloc), row_losses_cap floats */
    size_t row_losses_cap;
    double loss_sum;
    /* compute.c, dp_engine_predict: the logits of the rows [out_begin,
     * out_begin + out_rows) of the batch (global row indices), kept until
     * the next prediction or dp_engine_release_outputs (engine.c frees) */
    dbuf outputs;
    size_t out_begin, out_rows;

    /* replica.c */
    uint64_t param_hash;

    /* overlap.c: [ready_from, n_params) of grads is final this step (the
     * step's caller sets n_params before it starts); the signal of the
     * running backward call */
    atomic_size_t ready_from;
    struct dp_grads_signal signal;
    /* step.c: when this worker's compute of a training step ended (host
     * monotonic seconds; -1: not this step) */
    double backward_end;

    /* pool.c: the thread, the phase tracking of the step (the monotonic
     * time this worker first entered each phase, -1: not entered; the
     * device time spent in it, measured between events recorded as the
     * worker enters each phase), the watchdog's view and the failure slot */
    pthread_t thread;
    int thread_started;
    dp_phase phase;
    double phase_start;
    double phase_first[DP_PHASE_COUNT];
    double phase_seconds[DP_PHASE_COUNT];
    size_t phase_peak[DP_PHASE_COUNT];
    struct phase_mark {
        dp_event *ev; /* created on first use, reused by later jobs */
        int phase;    /* the phase this mark opens (DP_PHASE_COUNT: the job's end) */
        double at;    /* host monotonic seconds when it was recorded */
        double when;  /* its time on the step's timeline once folded, else -1 */
    } *marks;
    size_t n_marks, cap_marks;
    /* the step's spans (dp_device_step_stats.spans), start from the pool's
     * origin; grow-only */
    dp_phase_span *spans;
    size_t n_spans, cap_spans;
    atomic_int busy_phase; /* the phase being worked in, -1 at the barrier or done */
    dp_status status;
    dp_phase fail_phase;
    char msg[1024];

    /* graph.c: the compute phase's recordings (NULL until the first) */
    struct dp_graph_cache *graphs;
    int graphs_off;          /* the device records none (graph_begin unsupported) */
    int graphs_stand_in;     /* a test hook's (engine_testing.h): graph.c's policy on any
                                device, the body run where a replay would be launched */
    uint64_t graph_replays;  /* launches of a recording */
    int replayed;            /* this step's compute phase was one (dp_device_step_stats) */
    char graph_why[512];     /* why the last recording failed ("" none) */
} worker;

/* The function a job runs on every worker (pool.h). */
typedef void (*dp_pool_fn)(worker *w, void *arg);

/* The worker pool: k persistent threads, one per local device (pool.c
 * writes every field; the test hooks are set by testing.c). */
typedef struct dp_pool {
    size_t k;
    worker *w;
    double watchdog_seconds;
    double origin; /* the step's start (host monotonic seconds): spans count from it */
    dp_barrier barrier;
    pthread_mutex_t mu;
    pthread_cond_t cv_start, cv_done;
    unsigned long job_gen;
    dp_pool_fn fn;
    void *arg;
    int running;
    int quit;
    /* the caller waits at most watchdog_seconds after the last phase
     * change of any worker (CLOCK_MONOTONIC, guarded by mu) */
    double last_progress;
    int broken; /* a worker never came back after a watchdog abort */
    /* test hooks (testing.c sets them, the worker that fires one clears it) */
    int fault_dev;
    dp_phase fault_phase;
    dp_status fault_status;
    int stall_dev;
    dp_phase stall_phase;
    double stall_seconds;
    atomic_int diverge_dev; /* -1: none (replica.c fires it) */
} dp_pool;

// --- the engine ---------------------------------------------------------------------

/* engine.needs_sync: the replicas must be re-synchronised from the slice
 * owners (all-gather, after a failed update or a diverged replica) or
 * from the root (broadcast, after a failed set_params). */
enum { DP_SYNC_FROM_OWNERS = 1, DP_SYNC_FROM_ROOT = 2 };

/* What a step leaves for the stats (step.c). */
typedef struct dp_step_outcome {
    double gloss[DP_MAX_DEVICES]; /* loss sums per global device (every rank knows all) */
    double grad_norm;
    int skip;    /* decided identically on every rank after the reduce */
    int counted; /* the update reached every replica: the step counts */
    int resync;  /* DP_SYNC_* bits the engine must apply before the next step */
} dp_step_outcome;

/* dp_engine.magic: a live engine's, and the value dp_engine_destroy
 * writes before freeing it (dp/engine.h: use after destroy). */
#define DP_ENGINE_LIVE 0x64705f656e67696eull /* "dp_engin" */
#define DP_ENGINE_DEAD 0x64656164656e6721ull /* "deadeng!" */

struct dp_engine {
    /* engine.c: DP_ENGINE_LIVE from create to destroy, DP_ENGINE_DEAD after */
    uint64_t magic;
    /* engine.c, at create */
    dp_layout L;
    worker *w; /* L.k */
    dp_model model;
    dp_criterion crit;
    dp_engine_config cfg;
    int bf16;     /* replicas hold bfloat16 (model.param_dtype); owners keep float32 masters */
    size_t psize; /* bytes of one replica element: 2 or 4 */
    /* the overlap's pieces (cfg.bucket_bytes in floats; SIZE_MAX: no overlap) */
    size_t bucket_floats;
    /* overlap.c, before each step: its reduce-scatter overlaps the backward */
    int overlapping;
    slice *s;     /* L.K slices (optimizer.c makes them) */
    dp_transport tp; /* what crosses between the ranks (transport/) */
    dp_pool pool;    /* pool.c */
    /* rounds.c, at setup (with ranks): the reduce-scatter's rounds and
     * their messages; in a step, the caller's next round to start, the
     * first not yet arrived, and the transport's failure */
    dp_xfer *xfers;
    dp_round *rounds; /* the forward rounds, then the returns */
    size_t n_rounds, n_fwd_rounds, round_next, ret_next, round_first_out;
    /* with a transport that matches in order: the one order every rank
     * starts the rounds in (rounds.c), and the next of it */
    size_t *round_seq, seq_next;
    dp_status round_status;
    /* the caller's last sight of progress here (a busy worker, a notify,
     * a round moved): the rounds' wait is bounded from it */
    double round_active;
    unsigned long round_seen;
    double round_poll; /* seconds between tests of the rounds in flight */
    /* engine.c, for the stats: when this rank's rounds were in flight
     * (dp_step_stats.exchange_spans), n_rounds of room */
    dp_phase_span *xspans;

    /* engine.c, between calls */
    long t;
    float lr;
    int needs_sync; /* DP_SYNC_* bits: re-synchronise the replicas before the next step */
    /* The thread contract: one public call at a time per engine; a second
     * concurrent one finds this set and returns DP_ERR_BUSY. */
    atomic_flag busy;
    double created;    /* monotonic seconds at create */
    double step_start; /* monotonic seconds at the start of the running step */
    dp_plan plan;      /* the running step's (plan.c fills it) */
    size_t outputs_rows; /* the rows of the last dp_engine_predict's batch; 0: no outputs */
    dp_step_outcome out; /* the last step's (step.c fills it) */
};

/* Worker w's replica as the model's callbacks take it. */
static inline dp_params dp_replica_params(const worker *w)
{
    dp_params p;
    if (w->e->bf16) p.bf16 = w->params;
    else p.f32 = w->params;
    return p;
}
/* The address of element i of worker w's replica. */
static inline void *dp_replica_at(const worker *w, size_t i)
{
    return (unsigned char *)w->params + i * w->e->psize;
}

/* The worker of global device g, or NULL when it is on another rank. */
static inline worker *dp_local_worker(const dp_engine *e, size_t g)
{
    return g >= e->L.g0 && g < e->L.g0 + e->L.k ? &e->w[g - e->L.g0] : NULL;
}

#endif /* DP_PARALLEL_STATE_H */
