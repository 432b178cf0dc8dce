/*
 * parallel/graph.c - recording a worker's compute phase and replaying it
 * (graph.h): the keys, a few recordings a worker, and the fallback to the
 * eager phase.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/graph.h"
#include "parallel/pool.h"

/* Recordings a worker keeps: a training step, an evaluation, the last
 * shorter batch of an epoch and one more; the least recently used goes. */
#define DP_GRAPH_SLOTS 4

/* What a recording froze (graph.h). Compared with memcmp: zeroed first. */
typedef struct graph_key {
    int train;
    int matmul;           /* dp_matmul_precision */
    int no_fused;         /* dp_device.no_fused_producers */
    uint32_t dscale;      /* the loss scale's bits */
    size_t rows, row_begin, n_micro, micro_rows;
    uint64_t valid;       /* compute.c's hash of the criterion calls' valid counts */
    uint64_t epoch;       /* the backend's scratch */
    const void *buf[10];  /* every buffer the phase names */
} graph_key;

typedef struct graph_slot {
    int used;
    int failed;           /* its recording failed: the key runs eagerly */
    uint64_t last;        /* the step that used it last (LRU) */
    graph_key key;
    dp_device_graph *g;   /* NULL: seen once, not recorded */
} graph_slot;

struct dp_graph_cache {
    graph_slot s[DP_GRAPH_SLOTS];
    uint64_t tick;
};

/* The test hook's recording (graphs_stand_in): a mark, no device graph. */
static char stand_in;
#define STAND_IN ((dp_device_graph *)&stand_in)

int dp_graph_eligible(const worker *w)
{
    const dp_engine *e = w->e;
    return !w->graphs_off && (w->dev->ops->graph_begin || w->graphs_stand_in) &&
           e->model.replayable && e->crit.replayable && e->crit.writes_row_losses &&
           !e->overlapping;
}

static void drop(worker *w, dp_device_graph *g)
{
    if (g != STAND_IN) dp_device_graph_destroy(w->dev, g);
}

static void make_key(const worker *w, const dp_plan *plan, int train, uint64_t valid,
                     graph_key *k)
{
    const dp_plan_device *d = &plan->dev[w->id];
    memset(k, 0, sizeof *k);
    k->train = train;
    k->matmul = (int)w->dev->matmul;
    k->no_fused = w->dev->no_fused_producers;
    memcpy(&k->dscale, &plan->dscale, sizeof k->dscale);
    k->rows = d->rows;
    k->row_begin = d->row_begin;
    k->n_micro = d->n_micro;
    k->micro_rows = d->micro_rows;
    k->valid = valid;
    k->epoch = dp_device_graph_epoch(w->dev);
    const void *b[] = {w->inputs.ptr,   w->targets.ptr,  w->workspace.ptr, w->logits.ptr,
                       w->scratch.ptr,  w->row_losses.ptr, w->features.ptr, w->dfeatures.ptr,
                       w->params,       w->grads};
    _Static_assert(sizeof b == sizeof k->buf, "graph_key.buf holds every buffer");
    memcpy(k->buf, b, sizeof b);
}

static graph_slot *find(struct dp_graph_cache *gc, const graph_key *k)
{
    for (size_t i = 0; i < DP_GRAPH_SLOTS; i++)
        if (gc->s[i].used && memcmp(&gc->s[i].key, k, sizeof *k) == 0) return &gc->s[i];
    return NULL;
}

/* A free slot, or the least recently used one (its recording destroyed:
 * a step reads its row losses after its launch, so none runs), taken for
 * key k, seen once. */
static graph_slot *take(worker *w, struct dp_graph_cache *gc, const graph_key *k)
{
    graph_slot *lru = &gc->s[0];
    for (size_t i = 1; i < DP_GRAPH_SLOTS && lru->used; i++)
        if (!gc->s[i].used || gc->s[i].last < lru->last) lru = &gc->s[i];
    drop(w, lru->g);
    memset(lru, 0, sizeof *lru);
    lru->used = 1;
    memcpy(&lru->key, k, sizeof *k); /* the padding too: keys compare with memcmp */
    return lru;
}

/* Keeps the reason a recording failed (dp_last_error) in w->graph_why. */
static void keep_why(worker *w)
{
    snprintf(w->graph_why, sizeof w->graph_why, "%s", dp_last_error());
}

/* Records body into s->g, or marks s failed (the body then runs eagerly). */
static void record(worker *w, graph_slot *s, const dp_plan *plan, int train, dp_graph_body body)
{
    if (w->graphs_stand_in) {
        s->g = STAND_IN;
        return;
    }
    dp_status b = dp_device_graph_begin(w->dev);
    if (b == DP_ERR_UNSUPPORTED) w->graphs_off = 1; /* this device never records */
    dp_status r = b == DP_OK ? body(w, plan, train, 1) : b;
    if (r != DP_OK) keep_why(w);
    dp_device_graph *g = NULL;
    dp_status e = b == DP_OK ? dp_device_graph_end(w->dev, &g) : DP_OK;
    if (r == DP_OK && e != DP_OK) keep_why(w);
    w->loss_sum = 0.0; /* what the recording added, the eager run or the replay adds */
    if (r != DP_OK || e != DP_OK) {
        dp_device_graph_destroy(w->dev, g);
        s->failed = 1;
        dp_clear_error();
        return;
    }
    s->g = g;
}

dp_status dp_graph_compute(worker *w, const dp_plan *plan, int train, uint64_t valid_key,
                           dp_graph_body body)
{
    if (!dp_graph_eligible(w)) return body(w, plan, train, 0);
    if (!w->graphs && !(w->graphs = calloc(1, sizeof *w->graphs)))
        return body(w, plan, train, 0); /* no room to keep one: as without graphs */
    struct dp_graph_cache *gc = w->graphs;
    graph_key k;
    make_key(w, plan, train, valid_key, &k);
    graph_slot *s = find(gc, &k);
    if (!s) {
        /* seen for the first time: eager, sizing what a recording names */
        take(w, gc, &k)->last = ++gc->tick;
        return body(w, plan, train, 0);
    }
    s->last = ++gc->tick;
    if (!s->g && !s->failed) record(w, s, plan, train, body);
    if (!s->g) return body(w, plan, train, 0);
    if (dp_worker_enter_phase(w, DP_PHASE_FORWARD)) return w->status;
    /* the stand-in runs the work as a replay would: once, in one phase */
    DP_TRY(s->g == STAND_IN ? body(w, plan, train, 1) : dp_device_graph_launch(w->dev, s->g));
    w->graph_replays++;
    w->replayed = 1;
    return DP_OK;
}

void dp_graph_release(worker *w)
{
    struct dp_graph_cache *gc = w->graphs;
    for (size_t i = 0; gc && i < DP_GRAPH_SLOTS; i++) drop(w, gc->s[i].g);
    free(gc);
    w->graphs = NULL;
}
