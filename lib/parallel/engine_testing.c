/*
 * parallel/engine_testing.c - the engine's test hooks (engine_testing.h).
 * Built into the test-only library dp_testing, never into libdp: an
 * installed libdp exports no way to inject faults. They set fields the
 * pool reads as a worker enters a phase (pool.c), so they call nothing of
 * libdp's but its public API.
 */
#include <stdatomic.h>

#include "parallel/engine_testing.h"
#include "parallel/state.h"

void dp_engine_inject_fault(dp_engine *e, int device, dp_phase phase, dp_status status)
{
    if (!e) return;
    e->pool.fault_dev = device;
    e->pool.fault_status = status;
    e->pool.fault_phase = phase;
}

void dp_engine_inject_stall(dp_engine *e, int device, dp_phase phase, double seconds)
{
    if (!e) return;
    e->pool.stall_dev = device;
    e->pool.stall_seconds = seconds;
    e->pool.stall_phase = phase;
}

void dp_engine_set_watchdog(dp_engine *e, double seconds)
{
    if (!e) return;
    e->pool.watchdog_seconds = seconds;
    e->cfg.watchdog_seconds = seconds;
}

void dp_engine_inject_divergence(dp_engine *e, int device)
{
    if (e) atomic_store(&e->pool.diverge_dev, device);
}

dp_status dp_engine_read_replica(dp_engine *e, size_t device, int grads, void *host)
{
    if (!e || device >= e->L.k || !host)
        return dp_set_error(DP_ERR_INVALID_ARGUMENT, "no such device, or host NULL");
    worker *w = &e->w[device];
    size_t n = e->model.n_params;
    dp_status s = dp_device_bind_thread(w->dev);
    if (s != DP_OK) return s;
    if (grads) return dp_copy_d2h(w->dev, host, w->grads, n * sizeof(float));
    return dp_copy_d2h(w->dev, host, w->params, n * e->psize);
}

uint64_t dp_engine_graph_replays(const dp_engine *e, size_t device, const char **why)
{
    if (why) *why = "";
    if (!e || device >= e->L.k) return 0;
    if (why) *why = e->w[device].graph_why;
    return e->w[device].graph_replays;
}

void dp_engine_stand_in_graphs(dp_engine *e)
{
    for (size_t i = 0; e && i < e->L.k; i++) e->w[i].graphs_stand_in = 1;
}
