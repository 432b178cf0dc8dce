/*
 * parallel/stages.h - the list of stages a step is written as (not
 * installed; step.c, sync.c and stages.c share it): work, which every
 * worker runs on its device, and exchanges, which run once and are where
 * the ranks meet. stages.c runs a list (jobs on the worker pool, pool.h,
 * and the exchanges between or inside them); step.c writes the training
 * step's and the prediction's lists, sync.c the re-synchronisations'.
 */
#ifndef DP_PARALLEL_STAGES_H
#define DP_PARALLEL_STAGES_H

#include "parallel/state.h"

typedef struct step step;

/* One stage: work (every worker) or an exchange (once). */
typedef struct stage {
    void (*work)(worker *w, step *c, const struct stage *st);
    void (*exchange)(step *c, const struct stage *st);
    /* work with ranks: what the caller does while the job runs (pool.h's
     * beside, its argument the engine), or NULL */
    double (*beside)(void *engine);
} stage;

/* With one rank, the exchanges [from, to) a barrier runs. */
typedef struct xrun {
    step *c;
    size_t from, to;
} xrun;

struct step {
    dp_engine *e;
    const dp_plan *plan;
    dp_step_outcome *out;
    int train;
    double norm;     /* update: the global gradient norm */
    int skip;        /* update: skip it (non-finite loss or norm) */
    int hash;        /* all-gather: hash the replicas after every copy */
    int quiet;       /* a re-synchronisation outside a step: no phase entered */
    dp_status local; /* this rank's outcome since the last agreement */
    dp_status status; /* the step's, once an exchange decided it */
    int stop;        /* the step ends after this stage */
    size_t job_from, job_to; /* the stages the running job covers */
    xrun xruns[DP_MAX_DEVICES]; /* one rank: each worker's view of the next exchanges */
    size_t n;
    stage st[]; /* n of them */
};

/* A step of room for n stages, its outcome into out (zeroed); free() it. */
step *dp_stages_new(dp_engine *e, size_t n, dp_step_outcome *out);
/* Appends a stage: work or exchange (the other NULL). */
void dp_stages_add(step *c, void (*work)(worker *, step *, const stage *),
                   void (*exchange)(step *, const stage *));
/* Appends work with what the caller does beside it when the job crosses
 * ranks (stage.beside). */
void dp_stages_add_beside(step *c, void (*work)(worker *, step *, const stage *),
                          double (*beside)(void *engine));
/* Runs the stages in order until one ends the step; its outcome. */
dp_status dp_stages_run(step *c);

/* Inside a stage. Ends the step with s (and, after the update began,
 * re-synchronises the replicas from the owners before the next). */
void dp_stages_end(step *c, dp_status s, int resync);

/* Whether exchanges cross between ranks (otherwise the transport moves
 * nothing). */
static inline int dp_stages_across(const step *c) { return dp_transport_spans_ranks(&c->e->tp); }

/* In an exchange. Adds the caller's seconds in an exchange between ranks
 * to every local worker's phase p. */
void dp_stages_charge(step *c, dp_phase p, double since);
/* The agreement of an exchange: this rank's outcome and, per global
 * device, its values (local ones filled), read back per global device
 * (by_summer: the value of slice g comes from the rank that summed it). */
dp_status dp_stages_agree_per_device(step *c, double *mine, double *out, int by_summer,
                                     const char *what);
/* The agreement of an exchange on this rank's outcome alone. */
dp_status dp_stages_agree(step *c);

// --- step.c's, for sync.c ----------------------------------------------------------

/* The most stages of a list: compute, its rounds' end, losses, reduce,
 * its rounds' end, norm, update, updated and at most 5 for the
 * all-gather. */
#define DP_STEP_FIXED_STAGES 13

/* The all-gather's stages (a step's, and a re-synchronisation's from the
 * owners). */
void dp_step_add_allgather(step *c);

#endif /* DP_PARALLEL_STAGES_H */
