/*
 * bench/dp_bench/modes.c - the runs: which modes run (gather, balanced,
 * each sharded with --shard-optimizer), a mode's warm-up and timed steps
 * on random tokens with its per-device peaks and phase times,
 * --find-max-batch's search for the largest batch that fits the memory
 * limit, and --scaling over 1..k devices.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp_bench.h"

/* Random tokens for `rows` sequences; row r's tokens depend on the seed and
 * r only, so a batch of any size starts with the same sequences. */
static int ensure_tokens(bench *b, size_t rows)
{
    if (rows <= b->rows_cap) return 0;
    size_t T = (size_t)b->o.context, V = (size_t)b->o.vocab, bytes;
    /* Inputs and targets: refused past the host's available RAM before
     * they are touched page by page (where overcommit would let them grow). */
    double ram = cli_host_available_bytes();
    if (!dp_size_mul(rows, T * sizeof(int32_t), &bytes) || 2.0 * (double)bytes > ram)
        return cli_fail("a batch of %zu sequences of %zu tokens (%.3g GB of inputs and targets) "
                        "does not fit in the host's %.3g GB of available RAM; use a smaller --batch-size "
                        "or --context", rows, T, 2.0 * (double)rows * (double)T * 4e-9, ram * 1e-9);
    int32_t *in = realloc(b->inputs, bytes);
    if (in) b->inputs = in;
    int32_t *tg = in ? realloc(b->targets, bytes) : NULL;
    if (tg) b->targets = tg;
    if (!in || !tg) return cli_fail("out of host memory for a batch of %zu sequences", rows);
    for (size_t r = b->rows_cap; r < rows; r++) {
        dp_rng rng;
        dp_rng_seed(&rng, b->o.seed * 1000003u + r);
        int32_t prev = (int32_t)dp_rng_below(&rng, V);
        for (size_t t = 0; t < T; t++) {
            int32_t next = (int32_t)dp_rng_below(&rng, V);
            b->inputs[r * T + t] = prev;
            b->targets[r * T + t] = next;
            prev = next;
        }
    }
    b->rows_cap = rows;
    return 0;
}

/* The devices' figures after the last step st of engine e (res->k of
 * them): names, rows, peaks and buffers, and the imbalance of the peaks
 * over the devices, with and without the optimizer state. */
static void record_devices(mode_result *res, dp_engine *e, const dp_step_stats *st)
{
    double hi = 0, lo = INFINITY, hi2 = 0, lo2 = INFINITY;
    for (size_t i = 0; i < res->k; i++) {
        dev_result *d = &res->dev[i];
        const dp_device_step_stats *ds = &st->devices[i];
        snprintf(d->name, sizeof d->name, "%s", dp_device_name(dp_engine_device(e, i)));
        d->rows = ds->rows;
        d->peak = ds->peak;
        d->optimizer = ds->optimizer_bytes;
        d->logits = ds->logits_bytes;
        d->params = ds->param_bytes;
        d->reserved = ds->reserved_bytes;
        double p = (double)d->peak, q = (double)(d->peak - d->optimizer);
        hi = fmax(hi, p), lo = fmin(lo, p), hi2 = fmax(hi2, q), lo2 = fmin(lo2, q);
    }
    res->imbalance = hi / lo;
    res->imbalance_no_opt = hi2 / lo2;
    res->ran = 1;
}

/* Warm-up and timed steps of `rows` sequences on the first k devices;
 * with `trace`, every step goes to b->trace. */
static int run_mode(bench *b, dp_mode mode, int shard, size_t k, size_t rows, int trace,
                    mode_result *res)
{
    memset(res, 0, sizeof *res);
    res->mode = mode;
    res->shard = shard;
    res->k = k;
    res->k_global = k * (size_t)b->rk.ranks;
    res->rows = rows;
    char name[32];
    run_name(mode, shard, name, sizeof name);
    /* The engine first: a model too large for the devices is refused
     * before gigabytes of tokens are made for it. */
    dp_engine *e = NULL;
    dp_status es = make_engine(b, mode, shard, k, &e);
    if (es != DP_OK) return engine_fail(b, es, name);
    if (!b->noted && b->rk.rank == 0) cli_print_matmul_note(e, &b->o.compute, b->o.tf32);
    b->noted = 1;
    /* Per timed step: its time, each phase's and the exposed time, in
     * columns of m (medians taken after the steps). */
    size_t m = (size_t)b->o.steps;
    double *ms = NULL;
    int rc = ensure_tokens(b, rows);
    if (!rc && !(ms = calloc(m * (DP_PHASE_COUNT + 2), sizeof *ms)))
        rc = cli_fail("out of host memory");
    if (agree(b, rc)) {
        free(ms);
        dp_engine_destroy(e);
        return 1;
    }
    double *phase_col = ms + m, *exposed_col = ms + m * (DP_PHASE_COUNT + 1);
    dp_batch batch = {rows, b->inputs, b->targets};
    long n = b->o.warmup + b->o.steps;
    dp_step_stats st;
    size_t sent0 = 0;
    int trace_failed = 0; /* this rank's --trace failed: agreed after the steps */
    for (long s = 0; s < n && !rc; s++) {
        if (s == b->o.warmup) sent0 = dp_dist_bytes_sent(b->rk.dist);
        double t0 = cli_now();
        if ((es = dp_engine_step(e, &batch, &st)) != DP_OK) {
            char what[96];
            snprintf(what, sizeof what, "%s step %ld of %zu sequences", name, s + 1, rows);
            rc = engine_fail(b, es, what);
            break;
        }
        double dt = cli_now() - t0;
        if (trace && b->trace && !trace_failed) {
            /* One timeline for every engine: place the step by our clock. */
            st.start_seconds = t0 - b->t_origin;
            if (dp_trace_add_step(b->trace, &st) != DP_OK) {
                trace_failed = cli_dp_fail("--trace");
                /* With ranks the others are on their way into the next step. */
                if (b->rk.ranks == 1) rc = 1;
            }
        }
        for (size_t i = 0; i < k; i++)
            for (int p = 0; p < DP_PHASE_COUNT; p++)
                if (st.devices[i].phase_peak[p] > res->dev[i].phase_peak[p])
                    res->dev[i].phase_peak[p] = st.devices[i].phase_peak[p];
        if (s < b->o.warmup) continue;
        size_t t = (size_t)(s - b->o.warmup);
        ms[t] = 1e3 * dt;
        for (int p = 0; p < DP_PHASE_COUNT; p++)
            phase_col[(size_t)p * m + t] = 1e3 * st.phase_seconds[p];
        exposed_col[t] = 1e3 * st.exposed_seconds;
        res->overlapped = st.overlapped;
        size_t replays = 0;
        for (size_t i = 0; i < k; i++) replays += st.devices[i].replayed ? 1 : 0;
        res->replayed += replays == k;
        res->loss = st.loss;
    }
    if (!rc)
        res->bytes_sent_per_step = (dp_dist_bytes_sent(b->rk.dist) - sent0) / m;
    if (!rc && b->rk.ranks > 1) rc = agree(b, trace_failed);
    if (!rc) {
        step_times(res, ms, m, rows, b->o.context);
        for (int p = 0; p < DP_PHASE_COUNT; p++)
            res->phase_ms[p] = median_of(phase_col + (size_t)p * m, m);
        res->exposed_ms = median_of(exposed_col, m);
        record_devices(res, e, &st);
    }
    free(ms);
    dp_engine_destroy(e);
    return rc;
}

/* 1: a fresh engine completes one step of `rows` sequences, 0: out of
 * memory on some device (the reason copied to why), -1: another error
 * (reported). */
static int fits(bench *b, dp_mode mode, int shard, size_t rows, char *why, size_t why_cap)
{
    if (agree(b, ensure_tokens(b, rows))) return -1;
    dp_engine *e = NULL;
    dp_status s = make_engine(b, mode, shard, b->k, &e);
    if (s == DP_OK) {
        dp_batch batch = {rows, b->inputs, b->targets};
        s = dp_engine_step(e, &batch, NULL);
    }
    if (s == DP_ERR_OUT_OF_MEMORY) snprintf(why, why_cap, "%s", dp_last_error());
    dp_engine_destroy(e);
    if (s == DP_OK) return 1;
    if (s == DP_ERR_OUT_OF_MEMORY) return 0;
    char name[32], what[96];
    snprintf(what, sizeof what, "%s with %zu sequences", run_name(mode, shard, name, sizeof name),
             rows);
    engine_fail(b, s, what);
    return -1;
}

/* The largest global batch that completes a step under the limit, from
 * `start` whether or not it fits: doubling up while it fits, else halving
 * down to 1 while it does not, then bisection between the largest batch
 * that fit and the smallest that did not. *out = 0 when not even one
 * sequence fits; why then holds the reason. */
static int find_max_batch(bench *b, dp_mode mode, int shard, size_t start, long *out, char *why,
                          size_t why_cap)
{
    /* Each device holds its rows' tokens (inputs and targets, 8 bytes a
     * token) at least, so no batch above this fits: the doubling stops. */
    size_t per_row = (size_t)b->o.context * 8, cap = ((size_t)1 << 30);
    size_t bound = b->o.limit_bytes / per_row + 1;
    if (dp_size_mul(bound, b->k * (size_t)b->rk.ranks, &bound) && bound < cap) cap = bound;
    size_t lo = 0, hi = 0; /* lo fits (0 trivially); hi does not fit (0: none found yet) */
    size_t x = start < cap ? start : cap;
    int f = fits(b, mode, shard, x, why, why_cap);
    if (f < 0) return 1;
    if (f) {
        lo = x;
        while (!hi) {
            if (lo >= cap) return cli_fail("--find-max-batch: %zu sequences still fit; the "
                                           "search stops there", lo);
            x = lo > cap / 2 ? cap : 2 * lo;
            if ((f = fits(b, mode, shard, x, why, why_cap)) < 0) return 1;
            if (f) lo = x;
            else hi = x;
        }
    } else {
        hi = x;
        while (!lo && hi > 1) {
            x = hi / 2;
            if ((f = fits(b, mode, shard, x, why, why_cap)) < 0) return 1;
            if (f) lo = x;
            else hi = x;
        }
        if (!lo) { /* not even one sequence */
            *out = 0;
            return 0;
        }
    }
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if ((f = fits(b, mode, shard, mid, why, why_cap)) < 0) return 1;
        if (f) lo = mid;
        else hi = mid;
    }
    *out = (long)lo;
    return 0;
}

run_plan plan_runs(const bench *b)
{
    const opts *o = &b->o;
    run_plan p = {.nmodes = 0, .n = 0};
    int both = strcmp(o->mode, "both") == 0;
    /* Gather mode copies every logit to one device: across ranks the engine refuses it. */
    p.skip_gather = both && b->rk.ranks > 1;
    if ((both && !p.skip_gather) || strcmp(o->mode, "gather") == 0)
        p.modes[p.nmodes++] = DP_MODE_GATHER;
    if (both || strcmp(o->mode, "balanced") == 0) p.modes[p.nmodes++] = DP_MODE_BALANCED;
    for (size_t r = 0; r < p.nmodes; r++)
        for (int sh = 0; sh <= o->shard_optimizer; sh++) {
            p.mode[p.n] = p.modes[r];
            p.shard[p.n++] = sh;
        }
    return p;
}

/* Times each planned run at --batch-size, or with --find-max-batch at the
 * smaller of that and the largest batch that fits (a run where nothing
 * fits is said so and not timed). */
/* --find-max-batch's limit against the host: CPU devices' memory is the
 * host's, and a limit they cannot all reach in RAM would let the
 * doubling take the host's memory first. 0, or 1 after a message. */
static int check_limit_fits_host(const bench *b)
{
    size_t n_cpu = 0;
    for (size_t i = 0; i < b->k; i++) n_cpu += b->specs[i].kind == DP_DEVICE_CPU;
    double ram = cli_host_available_bytes();
    if (!n_cpu || (double)b->o.limit_bytes * (double)n_cpu <= ram) return 0;
    return cli_fail("--find-max-batch: --memory-limit %s on %zu CPU device%s is more than the "
                    "host's %.3g GB of available RAM, which the search would run out of "
                    "first; give at most %.3g GB", b->o.memory_limit, n_cpu,
                    n_cpu > 1 ? "s" : "", ram * 1e-9, ram / (double)n_cpu * 1e-9);
}

int time_runs(bench *b, const run_plan *p, run_results *rs)
{
    const opts *o = &b->o;
    int rc = o->find_max_batch ? check_limit_fits_host(b) : 0;
    char name[32];
    for (size_t r = 0; r < p->n && !rc; r++) {
        size_t rows = (size_t)o->batch;
        run_name(p->mode[r], p->shard[r], name, sizeof name);
        if (o->find_max_batch) {
            char *why = rs->max_why[r];
            why[0] = '\0';
            rc = find_max_batch(b, p->mode[r], p->shard[r], rows, &rs->max_batch[r], why,
                                sizeof rs->max_why[r]);
            if (rc) break;
            if (rs->max_batch[r] == 0) {
                printf("%s: not even 1 sequence fits under --memory-limit %s: %s\n", name,
                       o->memory_limit, why);
                continue;
            }
            if ((size_t)rs->max_batch[r] < rows) rows = (size_t)rs->max_batch[r];
        }
        rc = run_mode(b, p->mode[r], p->shard[r], b->k, rows, 1, &rs->res[rs->nres]);
        if (!rc) rs->res[rs->nres++].max_batch = rs->max_batch[r];
    }
    return rc;
}

/* --scaling: tokens/s on the first 1..k devices (with ranks R x 1..k,
 * each rank adding one device at a time) in balanced mode (or the one
 * mode run), at the batch that mode was timed at (under --find-max-batch
 * perhaps smaller than --batch-size); skipped when it was not timed. */
int run_scaling(bench *b, const run_plan *p, run_results *rs)
{
    rs->scale_mode = p->nmodes == 2 ? DP_MODE_BALANCED : p->modes[0];
    for (size_t r = 0; r < rs->nres; r++)
        if (rs->res[r].mode == rs->scale_mode && !rs->res[r].shard)
            rs->scale_rows = rs->res[r].rows;
    if (!b->o.scaling) return 0;
    if (!rs->scale_rows) {
        printf("\nscaling: skipped, %s mode was not timed\n", dp_mode_name(rs->scale_mode));
        return 0;
    }
    print_scaling_header(b, rs);
    for (size_t k = 1; k <= b->k; k++) {
        mode_result m;
        if (run_mode(b, rs->scale_mode, 0, k, rs->scale_rows, 0, &m)) return 1;
        rs->sc[rs->nsc] = (scale_point){.k = k,
                                        .global = m.k_global,
                                        .tokens_per_s = m.tokens_per_s,
                                        .bytes_sent_per_step = m.bytes_sent_per_step};
        print_scaling_row(b, rs, rs->nsc++);
    }
    return 0;
}
