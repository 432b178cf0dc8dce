/*
 * examples/lm_train/train.c - the training loop: per step the agreement
 * on going on (signals, rank 0's failed writes), the learning rate, a
 * batch and the engine's step; skipped steps, progress, --log rows,
 * evaluations and periodic checkpoints; at the end the throughput and the
 * last checkpoint. A failure the model outlives (an output, an
 * evaluation) saves the last step before the run fails.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lm_train.h"

/* A signal stops the run before step r->step: saves (with --save),
 * flushes the outputs and says where it stopped; returns 1. */
static int stop_for_signal(run *r, int sig)
{
    const opts *o = &r->o;
    if (r->tty) printf("\n");
    /* a signal during an interval's save: that save is this step's */
    int saved = o->save && (r->saved_step == r->step || !save_checkpoint(r));
    fflush(stdout);
    if (r->log) fflush(r->log);
    exit_on_signal(r, sig);
    return AGREED_FAIL(r, "interrupted by %s at step %ld%s%s", signal_name(sig), r->step,
                       saved ? "; checkpoint saved to " : o->save ? "; the checkpoint "
                       "could not be saved" : "; no --save given, nothing saved",
                       saved ? o->save : "");
}

/* Training stops early for a failure the model outlives (a write to
 * stdout, --log or the trace, or an evaluation, failed and said why):
 * the last step is saved with --save when this run trained since step
 * `first` and the ranks are still together, and the run fails; returns 1. */
static int save_and_stop(run *r, long first)
{
    const opts *o = &r->o;
    if (r->rk.broken || !o->save || r->step == first) return 1;
    if (r->saved_step != r->step && save_checkpoint(r)) return 1;
    fflush(stdout);
    return AGREED_FAIL(r, "stopped at step %ld; its checkpoint is saved in %s", r->step, o->save);
}

/* One engine step at learning rate lr on the next training batch, its
 * statistics in *st; a --trace failure on any rank sets *failed (agreed at
 * the next step's start, which saves and stops). Returns 0, 1 on a
 * failure, or 2 when the batch could not be made (an id past the
 * vocabulary in the data): the model is intact, so the caller saves. */
static int step_once(run *r, float lr, dp_step_stats *st, int *failed)
{
    size_t B = (size_t)r->o.batch_size;
    dp_status s = dp_engine_set_lr(r->engine, lr);
    if (s != DP_OK) return engine_fail(r, s, "learning rate");
    /* agreed (a collective only under ranks), so every rank stops here */
    int bad = dp_sampler_next(r->train, r->inputs, r->targets, B) != DP_OK ? cli_dp_fail("batch")
                                                                          : 0;
    if (agree(r, bad)) return r->rk.broken ? 1 : 2;
    dp_batch b = {B, r->inputs, r->targets};
    size_t sent = dp_dist_bytes_sent(r->rk.dist);
    if ((s = dp_engine_step(r->engine, &b, st)) != DP_OK) return engine_fail(r, s, "step");
    r->step_bytes += dp_dist_bytes_sent(r->rk.dist) - sent;
    if (r->trace && dp_trace_add_step(r->trace, st) != DP_OK) *failed = cli_dp_fail("--trace");
    return 0;
}

/* A step skipped for a non-finite loss or gradient: nothing was updated,
 * the step is retried on the next batch. Says so, logs it, and stops the
 * run (1) after --max-skips in a row. */
static int skipped_step(run *r, const dp_step_stats *st, float lr)
{
    r->skipped++;
    r->consecutive_skips++;
    char where[48] = "";
    size_t g = (size_t)st->skipped_device, g0 = dp_engine_first_global_device(r->engine);
    if (st->skipped_device >= 0 && g >= g0 && g - g0 < dp_engine_num_devices(r->engine))
        snprintf(where, sizeof where, " on %s",
                 dp_device_name(dp_engine_device(r->engine, g - g0)));
    else if (st->skipped_device >= 0) /* another rank's device (global order) */
        snprintf(where, sizeof where, " on global device %zu", g);
    printf("%sstep %ld skipped: non-finite loss or gradient%s (%ld in a row, %ld in all)\n",
           r->tty ? "\n" : "", r->step + 1, where, r->consecutive_skips, r->skipped);
    log_row(r, st, lr);
    if (r->consecutive_skips < r->o.max_skips) return 0;
    char state[600];
    checkpoint_state(r, state, sizeof state);
    fflush(stdout);
    return AGREED_FAIL(r, "%ld consecutive steps had a non-finite loss or gradient "
                       "(last%s); stopping at step %ld%s. Lower --lr, tighten "
                       "--grad-clip or check the data", r->consecutive_skips,
                       where[0] ? where : " on no single device", r->step, state);
}

/* The steps' throughput since step `first`, secs seconds ago. */
static void report_throughput(const run *r, long first, double secs)
{
    const opts *o = &r->o;
    if (r->step > first)
        printf("trained %ld steps in %.1f s (%.0f tokens/s)\n", r->step - first, secs,
               (double)(r->step - first) * (double)((size_t)o->batch_size * (size_t)o->context) /
                   secs);
    if (r->step > first && r->rk.ranks > 1)
        printf("ranks: %d, %zu devices in all (rank 0 %zu); rank 0 sent %.0f bytes per step "
               "to the other ranks\n", r->rk.ranks, dp_engine_num_global_devices(r->engine),
               dp_engine_num_devices(r->engine),
               (double)r->step_bytes / (double)(r->step - first));
    /* Asked for (DP_CUDA_GRAPHS=1) or taken: say how often (docs/design.md). */
    const char *graphs = getenv("DP_CUDA_GRAPHS");
    if (r->step > first && (r->replayed || (graphs && strcmp(graphs, "1") == 0)))
        printf("CUDA graphs: %ld of %ld steps replayed their compute phase\n", r->replayed,
               r->step - first);
}

int train(run *r)
{
    const opts *o = &r->o;
    long first = r->step;
    double t0 = cli_now();
    r->tty = isatty(STDOUT_FILENO);
    /* A rank's --trace, or rank 0's --log or stdout, failed: agreed at the next step's
     * start (the only failure go_on carries here), then saved and stopped. */
    int failed = 0;
    while (r->step < o->steps) {
        int sig = go_on(r, failed || check_written(r));
        if (sig < 0) return save_and_stop(r, first);
        if (sig) return stop_for_signal(r, sig);
        float lr = dp_lr_schedule(r->step, o->warmup, o->lr_decay_steps, (float)o->lr,
                                  (float)o->min_lr);
        dp_step_stats st;
        int so = step_once(r, lr, &st, &failed);
        if (so == 2) return save_and_stop(r, first);
        if (so) return 1;
        if (st.skipped) {
            if (skipped_step(r, &st, lr)) return 1;
            continue;
        }
        r->consecutive_skips = 0;
        r->step++;
        size_t replays = 0;
        for (size_t i = 0; i < st.n_devices; i++) replays += st.devices[i].replayed ? 1 : 0;
        r->replayed += st.n_devices && replays == st.n_devices;
        progress(r, &st, lr, cli_now() - t0, first);
        log_row(r, &st, lr);
        if (r->step % o->eval_interval == 0 || r->step == o->steps) {
            int e = eval_step(r);
            if (e < 0) continue; /* a signal: the loop's top saves and stops */
            if (e) return save_and_stop(r, first); /* the model is intact: keep it */
        }
        if (o->save && o->save_interval > 0 && r->step % o->save_interval == 0 && save_checkpoint(r))
            return 1;
    }
    report_throughput(r, first, cli_now() - t0);
    if (agree(r, failed || check_written(r))) return save_and_stop(r, first);
    /* The last checkpoint holds the last step, whether or not the interval divides it. */
    if (o->save && r->saved_step != r->step && save_checkpoint(r)) return 1;
    return 0;
}
