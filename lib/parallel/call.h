/*
 * parallel/call.h - the thread contract of the engine's public calls
 * (dp/engine.h): one call at a time per engine, and the best-effort check
 * that the handle is a live engine. engine.c and engine_params.c share it.
 */
#ifndef DP_PARALLEL_CALL_H
#define DP_PARALLEL_CALL_H

#include "parallel/state.h"

/* Whether e looks like a live engine: not NULL, and its magic word not
 * the one destroy writes (dp/engine.h: a best-effort check, as reading a
 * freed engine is itself undefined). */
static inline int dp_engine_live(const dp_engine *e) { return e && e->magic == DP_ENGINE_LIVE; }

static inline dp_status dp_engine_check_live(const dp_engine *e, const char *call)
{
    if (!e) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: engine must not be NULL", call);
    if (!dp_engine_live(e))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: engine is not a live engine: it was "
                       "destroyed (dp_engine_destroy), or is not one dp_engine_create made; "
                       "using an engine after destroying it is undefined (dp/engine.h)", call);
    return DP_OK;
}

/* Claims the engine for one public call, or fails at once with
 * DP_ERR_BUSY: a second concurrent call never waits (it would deadlock
 * on the job it cannot join) and never touches the running call's state. */
static inline dp_status dp_engine_claim(dp_engine *e, const char *call)
{
    DP_TRY(dp_engine_check_live(e, call));
    if (atomic_flag_test_and_set(&e->busy))
        return DP_FAIL(DP_ERR_BUSY, "%s: another call on this engine is running on another "
                       "thread; an engine serves one call at a time (see dp/engine.h), so "
                       "serialise the calls or give each thread its own engine", call);
    return DP_OK;
}

/* Ends the call dp_engine_claim began; returns s. */
static inline dp_status dp_engine_unclaim(dp_engine *e, dp_status s)
{
    atomic_flag_clear(&e->busy);
    return s;
}

/* Before a call that reads or writes the replicas: the re-synchronisation
 * a failed step or set_params left due (engine.needs_sync), from the
 * owners or the root (engine.c). */
dp_status dp_engine_sync_replicas(dp_engine *e);

#endif /* DP_PARALLEL_CALL_H */
