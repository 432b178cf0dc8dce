/*
 * parallel/engine_internal.h - the engine's shared structures and the
 * functions its rooms offer one another (not installed).
 *
 * The rooms:
 *   engine.c     create/destroy, the step's phases (job_step), stats, setters
 *   workers.c    the worker pool: jobs, phases, barrier use, watchdog, test hooks
 *   plan.c       pure planning: config checks, the split, micro-batches, N
 *   compute.c    forward, criterion and backward over a device's micro-batches
 *   comm.c       the in-process collectives (comm.h)
 *   optimizer.c  optimizer slices and state, clipping and the update
 *   replica.c    the replica consistency hash
 */
#ifndef DP_PARALLEL_ENGINE_INTERNAL_H
#define DP_PARALLEL_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "core/error.h"
#include "dp/dist.h"
#include "dp/engine.h"
#include "parallel/barrier.h"
#include "parallel/clock.h"

// --- types ---------------------------------------------------------------------

/* JOB_BROADCAST: every replica = the root's (after set_params);
 * JOB_ALLGATHER: every replica fetches each slice from its owner (the
 * re-sync after a failed update or a diverged replica). */
typedef enum job_kind {
    JOB_SETUP, JOB_STEP, JOB_EVAL, JOB_BROADCAST, JOB_ALLGATHER,
    /* ranks (ranks.c): the step cut where the ranks exchange data */
    JOB_COMPUTE,      /* scatter, forward, criterion and backward of a step */
    JOB_REDUCE_ROUND, /* the local adds of reduce-scatter chunk e->round (+ sums of squares at the last) */
    JOB_UPDATE,       /* the optimizer update of the slices this rank owns */
    JOB_GATHER_LOCAL, /* every replica fetches the slices this rank's devices own */
    JOB_COPY_REMOTE,  /* every replica fetches the other ranks' slices from local device 0 (+ hash) */
    JOB_HASH,         /* every replica's hash (replica check after NCCL's all-gather) */
    JOB_REFRESH       /* bf16 replicas: each owner rounds its master slices into its replica */
} job_kind;

/* engine.needs_sync: the replicas must be re-synchronised from the slice
 * owners (all-gather, after a failed update or a diverged replica) or
 * from the root (broadcast, after a failed set_params). */
enum { DP_SYNC_FROM_OWNERS = 1, DP_SYNC_FROM_ROOT = 2 };

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

/* One of the K optimizer slices of the flat buffer (K = the job's devices
 * over every rank). The owner (a global device index: the slice's own
 * device when the optimizer is sharded, device 0 otherwise) holds its
 * moments and receives its reduced gradient; the reducer, a worker of the
 * owner's rank, reduces and updates it on the owner's device. */
typedef struct slice {
    size_t begin, end;
    int owner;   /* global device index */
    int reducer; /* local worker index, or -1 when the owner is on another rank */
    segment *segs;
    size_t n_segs;
    float *m, *v; /* the moments, on the owner */
    float *master; /* bf16 replicas: the slice's float32 master weights, on the owner */
    dbuf acc, in; /* on the owner: running sum, incoming chunk (comm.c) */
    dbuf remote;  /* on the owner: one chunk per device of the other ranks (ranks.c) */
    double sumsq; /* of the reduced gradient, this step */
} slice;

typedef struct worker {
    struct dp_engine *e;
    int id;
    pthread_t thread;
    int thread_started;
    dp_device *dev;

    void *params; /* the replica: n_params elements of the model's param_dtype */
    float *grads; /* n_params floats */

    dbuf inputs, targets, workspace, logits, dlogits, scratch;
    dbuf features, dfeatures; /* a model with a head: its input and that input's gradient */
    dbuf gathered, gathered_d; /* root only, gather mode */

    /* this step's plan */
    size_t row_begin, rows, valid, n_micro, micro_rows;
    double loss_sum;

    /* phase tracking (this job): the monotonic time this worker first
     * entered each phase (-1: not entered), and the device time spent in
     * it, measured between marks (events recorded on the device as the
     * worker enters each phase and ends the job; workers.c) */
    dp_phase phase;
    double phase_start;
    double phase_first[DP_PHASE_COUNT];
    double phase_seconds[DP_PHASE_COUNT];
    size_t phase_peak[DP_PHASE_COUNT];
    struct phase_mark {
        dp_event *ev; /* created on first use, reused by later jobs */
        int phase;    /* the phase this mark opens (DP_PHASE_COUNT: the job's end) */
    } *marks;
    size_t n_marks, cap_marks;

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
    size_t k; /* this process's devices */
    worker *w;
    /* The job: K devices over nranks ranks; this rank's are g0 .. g0 + k - 1
     * (rank r's start at rank_first[r]; rank_first[nranks] = K). Without
     * ranks K = k, g0 = 0 and nranks = 1. */
    size_t K, g0;
    int rank, nranks;
    dp_dist *dist;
    struct dp_nccl *nccl; /* CUDA devices across ranks (dist/nccl.h), else NULL */
    void *msgs;           /* the reduce-scatter's message lists (ranks.c) */
    size_t rank_first[DP_MAX_DEVICES + 1];
    slice *s; /* K slices */
    size_t round; /* ranks: the reduce-scatter's chunk now being reduced (ranks.c) */
    int hash_due; /* ranks: JOB_COPY_REMOTE hashes the replicas (replica check) */
    /* this step, per global device: rows, loss sums (every rank knows all) */
    size_t grows[DP_MAX_DEVICES];
    double gloss[DP_MAX_DEVICES];
    dp_model model;
    dp_criterion crit;
    dp_engine_config cfg;
    int bf16;     /* replicas hold bfloat16 (model.param_dtype); owners keep float32 masters */
    size_t psize; /* bytes of one replica element: 2 or 4 */
    float weights[DP_MAX_DEVICES]; /* per global device */

    long t;
    float lr;
    int needs_sync; /* DP_SYNC_* bits: re-synchronise the replicas before the next step */

    /* The thread contract: one public call at a time per engine; a second
     * concurrent one finds this set and returns DP_ERR_BUSY. */
    atomic_flag busy;
    double created;    /* monotonic seconds at create */
    double step_start; /* monotonic seconds at the start of the running step */

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

    /* test hooks (engine_testing.h) */
    int fault_dev;
    dp_phase fault_phase;
    dp_status fault_status;
    int stall_dev;
    dp_phase stall_phase;
    double stall_seconds;
    atomic_int diverge_dev; /* -1: none */
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
    return g >= e->g0 && g < e->g0 + e->k ? &e->w[g - e->g0] : NULL;
}
/* Whether global device g adds to the reduced gradient this step (device 0
 * always: its zeroed buffer starts the sum; others when they have rows). */
static inline int dp_contributes(const dp_engine *e, size_t g) { return g == 0 || e->grows[g] > 0; }
/* The rank of global device g. */
static inline int dp_rank_of(const dp_engine *e, size_t g)
{
    int r = 0;
    while (r + 1 < e->nranks && g >= e->rank_first[r + 1]) r++;
    return r;
}

/* Rows of micro-batch j of worker w (0 when it has fewer); *first is the
 * micro-batch's first row within the worker's chunk. */
static inline size_t dp_micro_rows(const worker *w, size_t j, size_t *first)
{
    size_t b = j * w->micro_rows;
    *first = b;
    if (j >= w->n_micro || b >= w->rows) return 0;
    size_t r = w->rows - b;
    return r < w->micro_rows ? r : w->micro_rows;
}

// --- workers.c -------------------------------------------------------------------

/* Initialises the pool's locks and barrier (right after allocation). */
void dp_workers_init(dp_engine *e);
/* Starts one thread per device (the devices are open). */
dp_status dp_workers_start(dp_engine *e);
/* Stops and joins the threads and destroys the locks; safe after a partial start. */
void dp_workers_stop(dp_engine *e);
/* Runs a job on every worker and waits (with the watchdog). Returns the
 * first failure by device index, with its message as this thread's last error. */
dp_status dp_workers_run(dp_engine *e, job_kind job);
/* Clears the step's per-worker figures (loss sums, phase times and peaks);
 * a step made of several jobs (ranks) calls it once, before the first. */
void dp_workers_reset_stats(dp_engine *e);

/* Records this worker's failure (device, phase, last error) and aborts the
 * barrier so nobody waits for it. */
void dp_worker_fail(worker *w, dp_status s);
/* Enters phase p (timing, memory peaks, watchdog progress, test hooks);
 * nonzero when the job must end here (an injected fault or an abort). */
int dp_worker_enter_phase(worker *w, dp_phase p);
/* Waits for every worker at the barrier; nonzero when the job was aborted. */
int dp_worker_sync(worker *w);

/* Grow-only device buffers. */
dp_status dp_dbuf_ensure(dp_device *dev, dbuf *b, size_t bytes);
void dp_dbuf_release(dp_device *dev, dbuf *b);

/* Inside a job function (void): leave it when the phase hook, the barrier
 * or a call says so; CHECK records the failure first. */
#define ENTER(w, p)                                \
    do {                                           \
        if (dp_worker_enter_phase((w), (p))) return; \
    } while (0)
#define SYNC(w)                                \
    do {                                       \
        if (dp_worker_sync(w) != 0) return;    \
    } while (0)
#define CHECK(w, expr)                   \
    do {                                 \
        dp_status chk_s_ = (expr);       \
        if (chk_s_ != DP_OK) {           \
            dp_worker_fail((w), chk_s_); \
            return;                      \
        }                                \
    } while (0)

/* engine.c: runs one job on worker w (called by its thread). */
void dp_engine_job(worker *w, job_kind job);

// --- plan.c --------------------------------------------------------------------------

/* Checks a configuration and device list before anything is allocated. */
dp_status dp_plan_check_config(const dp_engine_config *cfg, const dp_device_spec *devices,
                               size_t k);

/* Checks the batch (targets in range, at least one valid) and plans it on
 * the caller's thread: rows per device, micro-batches, N and 1/N. */
dp_status dp_plan_batch(dp_engine *e, const dp_batch *b);

/* Valid target elements (not -1 / NaN) of rows [first, first + rows) of a
 * host target array laid out as the engine's model says. */
size_t dp_plan_valid_targets(const dp_engine *e, const void *targets, size_t first, size_t rows);
/* The same over output rows [first, first + n) (rows x outputs_per_row of them). */
size_t dp_plan_valid_outputs(const dp_engine *e, const void *targets, size_t first, size_t n);
/* Output rows per logits chunk for a micro-batch of n output rows (a model
 * with a head; dp_engine_config.logits_chunk_rows), in [1, n]. */
size_t dp_plan_logits_chunk(const dp_engine *e, size_t n);

/* After a user callback (named by what) failed with s: keeps its
 * dp_set_error message, or records one saying it set none. Call
 * dp_clear_error() before the callback. */
void dp_callback_message(dp_status s, const char *what);

// --- compute.c ----------------------------------------------------------------------

/* Forward, criterion (and backward when train) over this worker's
 * micro-batches, the criterion on each device (balanced) ... */
void dp_compute_balanced(worker *w, int train);
/* ... or on the root over every device's gathered logits (gather mode). */
void dp_compute_gather(worker *w);

// --- optimizer.c --------------------------------------------------------------------

/* Cuts the flat buffer into K slices (the rule is in dp/engine.h,
 * shard_optimizer), names each slice's owner and reducer and splits the
 * slices by tensor into segments of one weight-decay setting. */
dp_status dp_opt_build_slices(dp_engine *e);
/* Allocates and zeroes the moments of the slices this worker's device
 * owns, on it (setup job). */
dp_status dp_opt_alloc_state(worker *owner);
void dp_opt_free_state(dp_engine *e);
/* Bytes of optimizer state held on local device d. */
size_t dp_opt_state_bytes(const dp_engine *e, size_t d);
/* The sum of squares of the reduced gradient of each slice this worker
 * reduces (on its owner). */
dp_status dp_opt_slice_sumsq(worker *w);
/* Clipping for the global norm and the update of the slices this worker
 * reduces (on their owners); with bf16 replicas the owner's float32 master
 * is updated and rounded into its replica. */
dp_status dp_opt_update_slice(worker *w, double grad_norm);
/* bf16 replicas: this worker's replica = bf16(master) over the slices its
 * device owns (before an all-gather that re-synchronises the replicas). */
dp_status dp_opt_refresh_replica(worker *owner);
/* bf16 replicas: the owners' masters <- host (n_params floats), or host <-
 * the masters of the slices this rank owns (to_host). */
dp_status dp_opt_move_masters(dp_engine *e, float *host_out, const float *host_in);
/* The caller's thread: the moments of the slices this rank owns, between
 * the host's flat m and v (n_params floats each; v may be NULL, and is
 * ignored for SGD) and the owners; get leaves the other ranks' ranges of
 * m and v untouched. */
dp_status dp_opt_get_state(dp_engine *e, float *m, float *v);
dp_status dp_opt_set_state(dp_engine *e, const float *m, const float *v);
/* The range [*begin, *begin + *count) of the flat buffer whose slices rank r's
 * devices own (contiguous; empty for ranks that own none). */
void dp_opt_rank_range(const dp_engine *e, int r, size_t *begin, size_t *count);

// --- replica.c ----------------------------------------------------------------------

/* Whether the step now running ends with a replica check. */
int dp_replica_check_due(const dp_engine *e);
/* Hashes this worker's replica into w->param_hash (test hook: flips a bit first). */
dp_status dp_replica_hash(worker *w);
/* After a checked step: fails naming the first replica whose hash differs
 * from the root's, and marks the replicas for a re-broadcast. */
dp_status dp_replica_compare(dp_engine *e);

// --- ranks.c --------------------------------------------------------------------------

/* At create, on every rank after the local checks: exchanges device
 * counts, weights and the configuration, and fails on every rank when
 * they disagree; fills K, g0, rank_first and the global weights. */
dp_status dp_ranks_init(dp_engine *e, const dp_device_spec *devices, size_t k);
/* After the setup job, with CUDA devices: joins the ranks' GPUs (NCCL). */
dp_status dp_ranks_open_gpus(dp_engine *e);
/* After the setup job: reserves the host memory of the largest exchange,
 * so no exchange allocates (a failure here is agreed at create). */
dp_status dp_ranks_reserve(dp_engine *e);
/* A rank whose create failed before it had an engine: takes part in the
 * exchanges the others make before they learn of it, then returns s. */
dp_status dp_ranks_create_failed(dp_dist *d, dp_status s);
/* Whether this engine spans ranks. */
static inline int dp_ranks_active(const dp_engine *e) { return e->nranks > 1; }
/* The reduce-scatter's rounds with ranks: chunks of the longest slice. */
size_t dp_ranks_rounds(const dp_engine *e);
/* The step (train) or evaluation of a planned batch over every rank. */
dp_status dp_ranks_step(dp_engine *e, int train);
/* Every replica of every rank = the slices' owners' parameters. */
dp_status dp_ranks_allgather_params(dp_engine *e);
/* After planning batch b (planned: the plan's outcome): every rank planned
 * the same batch, or every rank fails naming the first that differs. */
dp_status dp_ranks_check_batch(dp_engine *e, const dp_batch *b, dp_status planned);
/* Agreement on a local outcome: the first failing rank's status on all. */
dp_status dp_ranks_agree(dp_engine *e, dp_status local);
/* Rank 0's bytes to every rank (watchdog-bounded). */
dp_status dp_ranks_bcast(dp_engine *e, void *buf, size_t bytes, const char *what);
/* The flat buffer buf of every rank (esize-byte elements: 4 float32, 2
 * bfloat16) gets every rank's owned range. */
dp_status dp_ranks_allgather_owned(dp_engine *e, void *buf, size_t esize, const char *what);

#endif /* DP_PARALLEL_ENGINE_INTERNAL_H */
