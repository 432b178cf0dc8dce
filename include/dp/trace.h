/*
 * dp/trace.h - a timeline of training steps as a Chrome trace-event JSON
 * file, viewable in Perfetto (ui.perfetto.dev) or chrome://tracing.
 *
 * One track per device (thread_name metadata naming it, e.g. "cpu:0"), and
 * on each track one complete ("X") event per span of the step
 * (dp_device_step_stats.spans: each stretch between two phase changes, so a
 * phase run per micro-batch, or the reduce-scatter's pieces summed while
 * the backward runs, appear where they ran), named after its phase
 * ("scatter", "forward", ...): ts = (dp_step_stats.start_seconds +
 * span.start) and dur = span.seconds, both written in microseconds. Stats
 * without spans (made by hand) give one event per phase run instead, at
 * phase_start[p] for phase_seconds[p]. Every event has pid 1 and tid =
 * device index; args carry the step number and the rows the device
 * processed. Where steps have exchange spans (dp_step_stats, with ranks)
 * one more track, tid = k, named "exchanges between ranks", has an event
 * "rounds in flight" per span. With ranks, dp_trace_gather brings every
 * rank's steps into rank 0's trace: a process per rank, pid r + 1.
 *
 *   dp_trace *tr;
 *   dp_trace_create(names, k, &tr);
 *   for each step: dp_engine_step(e, &batch, &st); dp_trace_add_step(tr, &st);
 *   dp_trace_write(tr, "run.trace.json");
 *   dp_trace_destroy(tr);
 *
 * The events are kept in host memory (24 bytes per device per step, and
 * 24 per span: a device's step has 3 per micro-batch, 2 per piece of the
 * reduce-scatter summed inside the backward, and about 4 more) until
 * written. A trace may be used from several threads: steps
 * added while another thread writes wait, and are in a later write.
 */
#ifndef DP_TRACE_H
#define DP_TRACE_H

#include <stddef.h>

#include "dp/atomic_file.h"
#include "dp/dist.h"
#include "dp/engine.h"
#include "dp/export.h"
#include "dp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dp_trace dp_trace;

/* A trace of k devices (1..DP_MAX_DEVICES) named names[0..k) (copied; each
 * a non-empty string, e.g. dp_device_name). *out is freed with
 * dp_trace_destroy.
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL, k out of range, an empty name or
 * one that is not UTF-8, which the JSON file could not hold),
 * DP_ERR_OUT_OF_MEMORY. */
DP_API dp_status dp_trace_create(const char *const *names, size_t k, dp_trace **out);

/* Appends one step's phase timing (copied, spans and exchange spans
 * included). Without
 * spans, phases a device did not run (phase_start and phase_seconds both
 * 0) give no event.
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL; st->n_devices differs from k; a
 * time that is negative or not finite; n_spans without spans; a span's
 * phase out of range), DP_ERR_OUT_OF_MEMORY. The trace is unchanged on
 * error. */
DP_API dp_status dp_trace_add_step(dp_trace *trace, const dp_step_stats *st);

/* Steps added so far. 0 for NULL. */
DP_API size_t dp_trace_steps(const dp_trace *trace);

/* Writes the JSON object {"traceEvents": [...], "displayTimeUnit": "ms"}
 * to path atomically (a temporary file renamed over path: a failed write
 * leaves path as it was). May be called again after more steps.
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL or empty path), DP_ERR_IO (the
 * message has the path and the reason), DP_ERR_OUT_OF_MEMORY. */
DP_API dp_status dp_trace_write(const dp_trace *trace, const char *path);

/* The same JSON written into af, an atomic file the caller opened
 * (dp/atomic_file.h) and then commits or aborts: to stage the trace with other
 * outputs that must appear together or not at all. On an error af has
 * part of the text; abort it. Errors: DP_ERR_INVALID_ARGUMENT (NULL),
 * DP_ERR_IO, DP_ERR_OUT_OF_MEMORY. */
DP_API dp_status dp_trace_write_to(const dp_trace *trace, dp_atomic_file *af);

/* With ranks (dp/dist.h): every rank's steps into rank 0's trace, so its
 * file shows the whole job. Collective over dist's ranks: each calls it
 * with its own trace (its devices' tracks, made and filled as above)
 * after its last step. Rank 0's trace then writes one process per rank
 * (pid r + 1, named "rank r"), each with its devices' tracks and its
 * exchanges' track; its own steps stay what dp_trace_steps counts, and a
 * later gather replaces the ranks' steps gathered before. The other
 * ranks' traces are unchanged. Each rank's steps keep their
 * start_seconds: the engine's count from its creation, which the ranks
 * leave together (its last agreement), so their tracks line up to within
 * that agreement's skew. One rank (dist NULL or of size 1): nothing to
 * do. Waits at most timeout_seconds (0: no limit) for each exchange.
 * Errors, on every rank alike unless said: DP_ERR_INVALID_ARGUMENT (a
 * rank's trace NULL, or its timeout negative or not finite),
 * DP_ERR_OUT_OF_MEMORY; DP_ERR_FORMAT on rank 0 alone when a rank's part
 * is malformed (its trace unchanged); DP_ERR_TIMEOUT or DP_ERR_COMM when
 * the exchange failed (the ranks may no longer be in step: end the
 * job). */
DP_API dp_status dp_trace_gather(dp_trace *trace, dp_dist *dist, double timeout_seconds);
/* NULL is a no-op. */
DP_API void dp_trace_destroy(dp_trace *trace);

#ifdef __cplusplus
}
#endif

#endif /* DP_TRACE_H */
