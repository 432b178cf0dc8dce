/*
 * parallel/trace_internal.h - the trace's data (dp/trace.h), shared by
 * trace.c (steps kept and written) and trace_gather.c (the ranks' steps
 * brought to rank 0). Not installed.
 */
#ifndef DP_PARALLEL_TRACE_INTERNAL_H
#define DP_PARALLEL_TRACE_INTERNAL_H

#include <pthread.h>
#include <stddef.h>

#include "dp/trace.h"

// One step's record: [start_seconds, step, the exchanges' first span's
// index in spans and their count, then per device: rows, its first span's
// index, its span count], all doubles (counts below 2^53 are exact).
#define HEAD 4
#define DEV_STRIDE 3

struct dp_trace {
    pthread_mutex_t mu; /* guards rec, n, cap and the spans: steps added while another
                           thread writes */
    size_t k;
    char *names[DP_MAX_DEVICES];
    size_t stride;  // doubles per step
    double *rec;    // (n, stride)
    size_t n, cap;  // steps stored, steps of capacity
    dp_phase_span *spans;
    size_t n_spans, cap_spans;
    /* rank 0's after dp_trace_gather: peers[r - 1] holds rank r's steps */
    dp_trace **peers;
    size_t n_peers;
};

/* 1 when x is negative or not finite: not a time. */
int dp_trace_bad_time(double x);
/* Makes *buf (*cap elements of size bytes) hold at least need, doubling
 * from first; *buf and *cap unchanged on error. what names it. */
dp_status dp_trace_grow(void **buf, size_t *cap, size_t need, size_t size, size_t first,
                        const char *what);
/* Frees the ranks' steps a gather brought (t->mu held, or t private). */
void dp_trace_drop_peers(dp_trace *t);

#endif /* DP_PARALLEL_TRACE_INTERNAL_H */
