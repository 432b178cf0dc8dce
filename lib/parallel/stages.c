/*
 * parallel/stages.c - running a step's list of stages (stages.h), for any
 * number of ranks.
 *
 * How the list runs depends only on where exchanges may run. With ranks
 * they cross processes from the caller's thread (MPI_THREAD_FUNNELED):
 * each stretch of work is a job on the worker pool (pool.h) and the caller
 * makes the exchanges between jobs. With one rank the transport moves
 * nothing, so the whole step is one job and each exchange runs at the
 * barrier between the work around it, on the last worker to arrive
 * (dp_worker_sync_then): one wake-up of the workers per step.
 *
 * A rank whose local work failed keeps making the exchanges that only
 * move data and reports its failure at the next agreement, so every rank
 * leaves the step at the same stage.
 */
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "parallel/pool.h"
#include "parallel/stages.h"

// --- a list, and what its stages call -------------------------------------------------

void dp_stages_add(step *c, void (*work)(worker *, step *, const stage *),
                   void (*exchange)(step *, const stage *))
{
    c->st[c->n++] = (stage){work, exchange, NULL};
}

void dp_stages_add_beside(step *c, void (*work)(worker *, step *, const stage *),
                          double (*beside)(void *engine))
{
    c->st[c->n++] = (stage){work, NULL, beside};
}

void dp_stages_end(step *c, dp_status s, int resync)
{
    c->status = s;
    c->stop = 1;
    if (resync) c->out->resync |= DP_SYNC_FROM_OWNERS;
}

void dp_stages_charge(step *c, dp_phase p, double since)
{
    if (!dp_stages_across(c)) return;
    double t = dp_now_seconds() - since;
    for (size_t i = 0; i < c->e->L.k; i++) {
        worker *w = &c->e->w[i];
        if (w->phase_first[p] < 0.0) w->phase_first[p] = since;
        w->phase_seconds[p] += t;
    }
}

dp_status dp_stages_agree_per_device(step *c, double *mine, double *out, int by_summer,
                                     const char *what)
{
    dp_engine *e = c->e;
    double all[DP_MAX_DEVICES * DP_MAX_DEVICES];
    dp_status s = dp_transport_agree(&e->tp, c->local, mine, all, DP_MAX_DEVICES * sizeof *mine,
                                     what);
    for (size_t g = 0; s == DP_OK && g < e->L.K; g++) {
        size_t from = by_summer ? (size_t)e->s[g].summer : g;
        out[g] = all[(size_t)dp_layout_rank_of(&e->L, from) * DP_MAX_DEVICES + g];
    }
    return s;
}

dp_status dp_stages_agree(step *c)
{
    return dp_transport_agree(&c->e->tp, c->local, NULL, NULL, 0, "agreement between the ranks");
}

// --- running the stages --------------------------------------------------------------

/* With one rank: exchanges run by the last worker at a barrier. */
static void run_exchanges(void *arg)
{
    const xrun *x = arg;
    for (size_t i = x->from; i < x->to && !x->c->stop; i++) x->c->st[i].exchange(x->c, &x->c->st[i]);
}

/* A job: the stages [job_from, job_to) on every worker (with one rank,
 * the exchanges among them at the barriers between the work; with ranks,
 * only work). A worker that fails aborts the barrier, so the others leave
 * at their next one. */
static void job_stages(worker *w, void *arg)
{
    step *c = arg;
    for (size_t i = c->job_from; i < c->job_to;) {
        const stage *st = &c->st[i];
        if (st->work) {
            if (i > c->job_from && c->st[i - 1].work) SYNC(w);
            st->work(w, c, st);
            if (w->status != DP_OK) return;
            i++;
            continue;
        }
        size_t to = i;
        while (to < c->job_to && c->st[to].exchange) to++;
        xrun *x = &c->xruns[w->id]; /* every worker's says the same; the last one's runs */
        *x = (xrun){c, i, to};
        if (dp_worker_sync_then(w, run_exchanges, x) != 0 || c->stop) return;
        i = to;
    }
}

dp_status dp_stages_run(step *c)
{
    int one_job = !dp_stages_across(c); /* nothing crosses: the exchanges may run on the workers */
    for (size_t at = 0; at < c->n && !c->stop;) {
        const stage *st = &c->st[at];
        if (st->exchange) { /* on the caller */
            st->exchange(c, st);
            at++;
            continue;
        }
        size_t to = at + 1;
        for (size_t j = at + 1; j < c->n && (one_job || c->st[j].work); j++)
            if (c->st[j].work) to = j + 1;
            else if (!one_job) break;
        if (c->local != DP_OK) { /* a rank that failed keeps exchanging */
            at = to;
            continue;
        }
        c->job_from = at;
        c->job_to = to;
        /* With ranks a job is a stretch of work: the caller may work beside it. */
        double (*beside)(void *) = NULL;
        for (size_t j = at; !one_job && j < to; j++)
            if (c->st[j].beside) beside = c->st[j].beside;
        dp_phase failed;
        dp_status s = dp_pool_run_beside(&c->e->pool, job_stages, c, &failed, beside, c->e);
        if (c->stop) break;
        if (s != DP_OK) {
            c->local = s;
            /* After the update began, the owners hold the truth. */
            int resync = failed == DP_PHASE_OPTIMIZER || failed == DP_PHASE_BROADCAST;
            if (resync) c->out->resync |= DP_SYNC_FROM_OWNERS;
            if (one_job) dp_stages_end(c, s, resync); /* nothing else crosses: it is the step's */
        }
        at = to;
    }
    return c->stop ? c->status : c->local;
}

step *dp_stages_new(dp_engine *e, size_t n, dp_step_outcome *out)
{
    step *c = calloc(1, sizeof *c + n * sizeof(stage));
    if (!c) {
        DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation of a step of %zu stages failed", n);
        return NULL;
    }
    c->e = e;
    c->plan = &e->plan;
    c->out = out;
    memset(out, 0, sizeof *out);
    return c;
}
