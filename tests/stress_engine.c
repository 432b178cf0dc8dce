/*
 * tests/stress_engine.c - a plain stress program for ThreadSanitizer
 * (Criterion's runner does not run under TSan): many steps on 4 CPU
 * devices in both modes, optimizer state on the root and sharded, with
 * the reduce-scatter overlapping the backward in pieces of one float, of
 * the default bucket and not at all, random batch sizes, micro-batching, idle devices, dropout, predictions
 * between the steps and injected faults, then two threads driving one
 * engine at once, one stepping and one predicting (each call must return
 * DP_OK or DP_ERR_BUSY). Exits non-zero on any
 * failure; a watchdog thread ends the program with a message when no call
 * returns for STALL_SECONDS, so a hang (e.g. a barrier that signals
 * instead of broadcasting on abort) fails in seconds, not at CTest's timeout.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <dp/dp.h>

#include "mlp_model.h"
#include "parallel/engine_testing.h"

enum { D = 8, H = 16, K = 6, MAXROWS = 24, STALL_SECONDS = 10 };

/* Engine calls that returned so far; the watchdog reads it once a second. */
static atomic_long progress;

static void *watchdog(void *arg)
{
    (void)arg;
    long last = -1;
    int still = 0;
    for (;;) {
        struct timespec one = {1, 0};
        nanosleep(&one, NULL);
        long now = atomic_load(&progress);
        still = now == last ? still + 1 : 0;
        last = now;
        if (still >= STALL_SECONDS) {
            fprintf(stderr, "stress: no engine call returned for %d s after %ld calls: a hang\n",
                    STALL_SECONDS, now);
            _exit(3);
        }
    }
    return NULL;
}

typedef struct hammer {
    dp_engine *e;
    const dp_batch *b;
    long n, ok, bad;
    int predict; /* predict and read the outputs instead of stepping */
} hammer;

/* A prediction and its host copy (out: MAXROWS x K floats). */
static dp_status predict(dp_engine *e, const dp_batch *b, float *out)
{
    dp_status rc = dp_engine_predict(e, b);
    return rc == DP_OK ? dp_engine_outputs_to_host(e, out) : rc;
}

/* One of two threads driving one engine at once. */
static void *hammer_main(void *arg)
{
    hammer *h = arg;
    float out[MAXROWS * K];
    for (long i = 0; i < h->n; i++) {
        dp_status rc = h->predict ? predict(h->e, h->b, out) : dp_engine_step(h->e, h->b, NULL);
        atomic_fetch_add(&progress, 1);
        if (rc == DP_OK) h->ok++;
        else if (rc != DP_ERR_BUSY && !h->bad++)
            fprintf(stderr, "stress: concurrent %s: %s\n", h->predict ? "prediction" : "step",
                    dp_last_error());
    }
    return NULL;
}

int main(int argc, char **argv)
{
    long steps = argc > 1 ? strtol(argv[1], NULL, 10) : 150;
    size_t before = dp_device_bytes_freed_at_close();
    pthread_t wd;
    if (pthread_create(&wd, NULL, watchdog, NULL) != 0 || pthread_detach(wd) != 0) {
        fprintf(stderr, "stress: cannot start the watchdog thread\n");
        return 1;
    }
    /* Both modes, with the optimizer state on the root and sharded; then
     * the sharded runs again with bf16 replicas and bf16 GEMMs (masters on
     * the owners, oneDNN's calls on every worker). */
    for (int c = 0; c < 3 * DP_MODE_COUNT; c++) {
        int mode = c % DP_MODE_COUNT, bf16 = c >= 2 * DP_MODE_COUNT;
        mlp net;
        dp_model model;
        mlp_init_model(&net, &(mlp_config){D, H, K, bf16 ? DP_DTYPE_BF16 : DP_DTYPE_F32}, &model);
        net.activation = MLP_RELU;
        net.dropout = 0.2f;
        dp_criterion crit = dp_criterion_cross_entropy();
        dp_engine_config cfg = dp_engine_config_default();
        cfg.mode = (dp_mode)mode;
        cfg.shard_optimizer = c >= DP_MODE_COUNT;
        cfg.matmul_precision = bf16 ? DP_MATMUL_BF16 : DP_MATMUL_FP32;
        cfg.max_rows_per_micro = 5;
        cfg.optim.grad_clip = 1.0f;
        /* The MLP signals its layers' gradients (dp_grads_ready): the
         * overlap sums every signalled piece, only slices' last pieces, or
         * nothing during the backward. */
        static const size_t bucket[3] = {sizeof(float), 0, DP_BUCKET_OFF};
        cfg.bucket_bytes = bucket[c % 3];
        dp_device_spec specs[4];
        for (int i = 0; i < 4; i++) specs[i] = (dp_device_spec){DP_DEVICE_CPU, i};
        dp_engine *e = NULL;
        if (dp_engine_create(specs, 4, &model, &crit, &cfg, &e) != DP_OK) {
            fprintf(stderr, "stress: create: %s\n", dp_last_error());
            return 1;
        }
        dp_rng rng;
        dp_rng_seed(&rng, 99);
        float x[MAXROWS * D];
        int32_t y[MAXROWS];
        for (long s = 0; s < steps; s++) {
            size_t rows = 1 + dp_rng_below(&rng, MAXROWS);
            dp_rng_fill_normal(&rng, x, rows * D, 0, 1);
            for (size_t i = 0; i < rows; i++) y[i] = (int32_t)dp_rng_below(&rng, K);
            y[0] = 0; /* at least one valid target */
            int inject = s % 17 == 5;
            if (inject)
                dp_engine_inject_fault(e, (int)dp_rng_below(&rng, 4),
                                       (dp_phase)dp_rng_below(&rng, DP_PHASE_COUNT), DP_ERR_DEVICE);
            dp_batch b = {rows, x, y};
            dp_step_stats st;
            dp_status rc = dp_engine_step(e, &b, &st);
            atomic_fetch_add(&progress, 1);
            if (inject) dp_engine_inject_fault(e, 0, DP_PHASE_COUNT, DP_OK); /* clear if it never fired */
            if (rc != DP_OK && !(inject && rc == DP_ERR_DEVICE)) {
                fprintf(stderr, "stress: step %ld: %s\n", s, dp_last_error());
                return 1;
            }
            if (rc == DP_OK && !isfinite(st.loss)) {
                fprintf(stderr, "stress: step %ld: non-finite loss\n", s);
                return 1;
            }
            float out[MAXROWS * K];
            b.targets = s % 2 ? y : NULL;
            if (s % 5 == 0 && predict(e, &b, out) != DP_OK) {
                fprintf(stderr, "stress: prediction after step %ld: %s\n", s, dp_last_error());
                return 1;
            }
        }
        /* Two threads at once: OK or BUSY, never a hang or another error. */
        for (size_t i = 0; i < MAXROWS; i++) y[i] = (int32_t)(i % K);
        dp_batch b = {MAXROWS, x, y};
        hammer hm[2] = {{e, &b, steps / 4 + 1, 0, 0, 0}, {e, &b, steps / 4 + 1, 0, 0, 1}};
        pthread_t th[2];
        for (int i = 0; i < 2; i++)
            if (pthread_create(&th[i], NULL, hammer_main, &hm[i]) != 0) {
                fprintf(stderr, "stress: cannot start a stepping thread\n");
                return 1;
            }
        for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
        if (hm[0].bad || hm[1].bad || hm[0].ok + hm[1].ok == 0) {
            fprintf(stderr, "stress: concurrent steps, predictions: %ld + %ld ok, %ld + %ld "
                    "failed\n",
                    hm[0].ok, hm[1].ok, hm[0].bad, hm[1].bad);
            return 1;
        }
        dp_engine_destroy(e);
    }
    if (dp_device_bytes_freed_at_close() != before) {
        fprintf(stderr, "stress: engines left memory allocated at destroy\n");
        return 1;
    }
    printf("stress: %ld steps x 2 modes x root/sharded optimizer/sharded bf16 on 4 devices: "
           "ok\n", steps);
    return 0;
}
