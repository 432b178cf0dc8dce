/*
 * tests/stress_engine.c - a plain stress program for ThreadSanitizer
 * (Criterion's runner does not run under TSan): many steps on 4 CPU
 * devices in both modes with random batch sizes, micro-batching, idle
 * devices and injected faults. Exits non-zero on any failure.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <dp/dp.h>

#include "mlp_model.h"
#include "parallel/engine_testing.h"

enum { D = 8, H = 16, K = 6, MAXROWS = 24 };

int main(int argc, char **argv)
{
    long steps = argc > 1 ? strtol(argv[1], NULL, 10) : 150;
    size_t before = dp_device_bytes_freed_at_close();
    for (int mode = 0; mode < DP_MODE_COUNT; mode++) {
        mlp net;
        dp_model model;
        mlp_init_model(&net, &(mlp_config){D, H, K}, &model);
        dp_criterion crit = dp_criterion_cross_entropy();
        dp_engine_config cfg = dp_engine_config_default();
        cfg.mode = (dp_mode)mode;
        cfg.max_rows_per_micro = 5;
        cfg.optim.grad_clip = 1.0f;
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
            if (inject) dp_engine_inject_fault(e, 0, DP_PHASE_COUNT, DP_OK); /* clear if it never fired */
            if (rc != DP_OK && !(inject && rc == DP_ERR_DEVICE)) {
                fprintf(stderr, "stress: step %ld: %s\n", s, dp_last_error());
                return 1;
            }
            if (rc == DP_OK && !isfinite(st.loss)) {
                fprintf(stderr, "stress: step %ld: non-finite loss\n", s);
                return 1;
            }
        }
        dp_engine_destroy(e);
    }
    if (dp_device_bytes_freed_at_close() != before) {
        fprintf(stderr, "stress: engines left memory allocated at destroy\n");
        return 1;
    }
    printf("stress: %ld steps x 2 modes on 4 devices: ok\n", steps);
    return 0;
}
