/*
 * parallel/engine_testing.h - test-only hooks of the engine (not
 * installed). Defined in engine_testing.c, which only the test-only
 * library dp_testing holds (libdp does not export them): tests include
 * "parallel/engine_testing.h" (lib/ is on their include path) and link
 * dp_testing. Call them between steps, from the thread that drives the
 * engine.
 */
#ifndef DP_PARALLEL_ENGINE_TESTING_H
#define DP_PARALLEL_ENGINE_TESTING_H

#include "dp/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The next step fails with `status` on device `device` at the start of
 * `phase` (once). phase == DP_PHASE_COUNT clears it. */
void dp_engine_inject_fault(dp_engine *engine, int device, dp_phase phase,
                                   dp_status status);
/* In the next step, device `device` stalls for `seconds` at the start of
 * `phase` (once), as a hung kernel would; a watchdog abort ends the stall
 * early. phase == DP_PHASE_COUNT clears it. */
void dp_engine_inject_stall(dp_engine *engine, int device, dp_phase phase,
                                   double seconds);
/* The watchdog of the steps that follow: seconds as dp_engine_config's
 * watchdog_seconds (0: off; not checked). The watchdog tests create their
 * engine without one and set it here, so that what creation does on a
 * busy machine (libraries loading, first-touch allocations) never fires
 * it, and its period can be long enough that only the injected stall
 * does. */
void dp_engine_set_watchdog(dp_engine *engine, double seconds);
/* At the next replica check, device `device` flips one bit of its
 * parameter replica just before hashing it (once). */
void dp_engine_inject_divergence(dp_engine *engine, int device);

/* Copies local device `device`'s parameter replica (grads 0: n_params
 * elements of the model's param_dtype) or its gradient buffer (grads 1:
 * n_params floats; after a step, a slice owner's slices hold the reduced
 * gradient) to host. */
dp_status dp_engine_read_replica(dp_engine *engine, size_t device, int grads, void *host);

/* Local device `device`'s replays of a recorded compute phase so far
 * (parallel/graph.h: CUDA devices with DP_CUDA_GRAPHS=1); *why (may be
 * NULL) gets why its last recording failed, "" when none has. */
uint64_t dp_engine_graph_replays(const dp_engine *engine, size_t device, const char **why);

/* Every local device takes parallel/graph.c's policy as if it recorded
 * graphs (CPU devices included): a key's second step "records" nothing
 * and each "replay" runs the compute phase in place, in one forward phase,
 * so the keys and which steps replay are tested where no GPU is. Call it
 * before the first step. */
void dp_engine_stand_in_graphs(dp_engine *engine);

#ifdef __cplusplus
}
#endif

#endif /* DP_PARALLEL_ENGINE_TESTING_H */
