/*
 * parallel/trace.c - Chrome trace-event JSON of the engine's phase timing (see
 * dp/trace.h): the steps kept, and streamed with careful printf into the
 * core atomic writer (the ranks' gather: trace_gather.c).
 *
 * Format: the "JSON Object Format" of the Trace Event Format document
 * (Google, "Trace Event Format", 2016): "X" complete events with ts and
 * dur in microseconds, "M" metadata events naming the process and threads.
 */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/atomic_file.h"
#include "dp/checked.h"
#include "core/error.h"
#include "dp/tokenizer.h" /* dp_utf8_check */
#include "dp/trace.h"
#include "parallel/trace_internal.h"

dp_status dp_trace_create(const char *const *names, size_t k, dp_trace **out)
{
    if (!out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    if (!names) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "names is NULL");
    if (k < 1 || k > DP_MAX_DEVICES)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%zu devices: a trace has 1 to %d", k,
                       DP_MAX_DEVICES);
    for (size_t i = 0; i < k; i++) {
        if (!names[i] || !*names[i])
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "the name of device %zu is NULL or empty", i);
        /* the names go into the JSON as they are: it must stay UTF-8 */
        size_t at = 0;
        if (dp_utf8_check(names[i], strlen(names[i]), &at) != DP_OK)
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "the name of device %zu is not valid UTF-8 "
                           "(byte %zu)", i, at);
    }
    dp_trace *t = calloc(1, sizeof *t);
    if (!t) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate a trace");
    if (pthread_mutex_init(&t->mu, NULL) != 0) {
        free(t);
        return DP_FAIL(DP_ERR_INTERNAL, "pthread_mutex_init failed");
    }
    t->k = k;
    t->stride = HEAD + k * DEV_STRIDE;
    for (size_t i = 0; i < k; i++) {
        t->names[i] = strdup(names[i]);
        if (!t->names[i]) {
            dp_trace_destroy(t);
            return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot copy the device names");
        }
    }
    *out = t;
    return DP_OK;
}

void dp_trace_drop_peers(dp_trace *t)
{
    for (size_t r = 0; r < t->n_peers; r++) dp_trace_destroy(t->peers[r]);
    free(t->peers);
    t->peers = NULL;
    t->n_peers = 0;
}

void dp_trace_destroy(dp_trace *t)
{
    if (!t) return;
    dp_trace_drop_peers(t);
    for (size_t i = 0; i < t->k; i++) free(t->names[i]);
    free(t->rec);
    free(t->spans);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

size_t dp_trace_steps(const dp_trace *t)
{
    if (!t) return 0;
    pthread_mutex_lock((pthread_mutex_t *)&t->mu);
    size_t n = t->n;
    pthread_mutex_unlock((pthread_mutex_t *)&t->mu);
    return n;
}

int dp_trace_bad_time(double x) { return !isfinite(x) || x < 0; }

/* Device i's spans: its own, else one per phase it ran, from
 * phase_start and phase_seconds (stats made without spans). */
static size_t device_spans(const dp_device_step_stats *d, dp_phase_span *out)
{
    if (d->n_spans) {
        if (out) memcpy(out, d->spans, d->n_spans * sizeof *out);
        return d->n_spans;
    }
    size_t n = 0;
    for (int p = 0; p < DP_PHASE_COUNT; p++) {
        if (d->phase_start[p] == 0 && d->phase_seconds[p] == 0) continue; // not run
        if (out) out[n] = (dp_phase_span){(dp_phase)p, d->phase_start[p], d->phase_seconds[p]};
        n++;
    }
    return n;
}

/* spans[0..n): an array where n > 0, phases, finite times >= 0; name
 * (e.g. "device 1") is whose they are in the message. */
static dp_status check_spans(const dp_phase_span *spans, size_t n, const char *name)
{
    if (n && !spans)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: %zu spans and no array", name, n);
    for (size_t j = 0; j < n; j++) {
        const dp_phase_span *sp = &spans[j];
        if ((unsigned)sp->phase >= DP_PHASE_COUNT)
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s span %zu: phase %d is not a phase", name,
                           j, (int)sp->phase);
        if (dp_trace_bad_time(sp->start) || dp_trace_bad_time(sp->seconds))
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                           "%s span %zu (%s): start %g or seconds %g is negative or not finite",
                           name, j, dp_phase_name(sp->phase), sp->start, sp->seconds);
    }
    return DP_OK;
}

static dp_status check_stats(const dp_trace *t, const dp_step_stats *st)
{
    if (st->n_devices != t->k)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "the step has %zu devices, the trace %zu",
                       st->n_devices, t->k);
    if (dp_trace_bad_time(st->start_seconds) || dp_trace_bad_time(st->seconds) ||
        dp_trace_bad_time(st->exposed_seconds))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "start_seconds %g, seconds %g or "
                       "exposed_seconds %g is negative or not finite",
                       st->start_seconds, st->seconds, st->exposed_seconds);
    for (int p = 0; p < DP_PHASE_COUNT; p++)
        if (dp_trace_bad_time(st->phase_seconds[p]))
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "phase %s: seconds %g is negative or not "
                           "finite", dp_phase_name((dp_phase)p), st->phase_seconds[p]);
    DP_TRY(check_spans(st->exchange_spans, st->n_exchange_spans, "the exchanges"));
    for (size_t i = 0; i < t->k; i++) {
        const dp_device_step_stats *d = &st->devices[i];
        char name[32];
        snprintf(name, sizeof name, "device %zu", i);
        DP_TRY(check_spans(d->spans, d->n_spans, name));
        for (int p = 0; p < DP_PHASE_COUNT; p++)
            if (dp_trace_bad_time(d->phase_start[p]) || dp_trace_bad_time(d->phase_seconds[p]))
                return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                               "device %zu phase %s: start %g or seconds %g is negative or not "
                               "finite",
                               i, dp_phase_name((dp_phase)p), d->phase_start[p],
                               d->phase_seconds[p]);
    }
    return DP_OK;
}

dp_status dp_trace_grow(void **buf, size_t *cap, size_t need, size_t size, size_t first,
                        const char *what)
{
    if (need <= *cap) return DP_OK;
    size_t ncap = *cap ? *cap : first, bytes;
    while (ncap < need) {
        if (ncap > SIZE_MAX / 2)
            return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "the trace's %s cannot hold %zu", what, need);
        ncap *= 2;
    }
    void *p = dp_size_mul(ncap, size, &bytes) ? realloc(*buf, bytes) : NULL;
    if (!p) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot grow the trace's %s to %zu", what, ncap);
    *buf = p;
    *cap = ncap;
    return DP_OK;
}

/* Room for one more step and `more` spans; the trace is unchanged on error. */
static dp_status reserve(dp_trace *t, size_t more)
{
    if (more > SIZE_MAX - t->n_spans)
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "%zu more spans in a trace of %zu overflow", more,
                       t->n_spans);
    void *rec = t->rec, *spans = t->spans;
    DP_TRY(dp_trace_grow(&rec, &t->cap, t->n + 1, t->stride * sizeof(double), 64, "steps"));
    t->rec = rec;
    DP_TRY(dp_trace_grow(&spans, &t->cap_spans, t->n_spans + more, sizeof *t->spans, 256, "spans"));
    t->spans = spans;
    return DP_OK;
}

dp_status dp_trace_add_step(dp_trace *t, const dp_step_stats *st)
{
    if (!t || !st) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "trace or stats is NULL");
    DP_TRY(check_stats(t, st));
    size_t more = st->n_exchange_spans;
    for (size_t i = 0; i < t->k; i++) more += device_spans(&st->devices[i], NULL);
    pthread_mutex_lock(&t->mu);
    dp_status s = reserve(t, more);
    if (s != DP_OK) {
        pthread_mutex_unlock(&t->mu);
        return s;
    }
    double *r = t->rec + t->n * t->stride;
    r[0] = st->start_seconds;
    r[1] = (double)st->step;
    r[2] = (double)t->n_spans;
    r[3] = (double)st->n_exchange_spans;
    if (st->n_exchange_spans)
        memcpy(t->spans + t->n_spans, st->exchange_spans, st->n_exchange_spans * sizeof *t->spans);
    t->n_spans += st->n_exchange_spans;
    for (size_t i = 0; i < t->k; i++) {
        double *d = r + HEAD + i * DEV_STRIDE;
        size_t n = device_spans(&st->devices[i], t->spans + t->n_spans);
        d[0] = (double)st->devices[i].rows;
        d[1] = (double)t->n_spans;
        d[2] = (double)n;
        t->n_spans += n;
    }
    t->n++;
    pthread_mutex_unlock(&t->mu);
    return DP_OK;
}

// --- writing ------------------------------------------------------------------------

// Output buffered in memory and handed to the atomic file in 64 KiB pieces.
typedef struct out_buf {
    dp_atomic_file *af;
    char buf[1 << 16];
    size_t len;
    dp_status st;
} out_buf;

static void flush_out(out_buf *o)
{
    if (o->st == DP_OK && o->len) o->st = dp_atomic_file_write(o->af, o->buf, o->len);
    o->len = 0;
}

DP_PRINTF(2, 3) static void put(out_buf *o, const char *fmt, ...)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(o->buf + o->len, sizeof o->buf - o->len, fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n < sizeof o->buf - o->len) {
            o->len += (size_t)n;
            return;
        }
        flush_out(o); // did not fit: write what is buffered and try once more
    }
    if (o->st == DP_OK) o->st = DP_FAIL(DP_ERR_INTERNAL, "a trace event did not fit the buffer");
}

// A JSON string literal of s (quotes, backslashes and control bytes escaped).
static void put_string(out_buf *o, const char *s)
{
    put(o, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') put(o, "\\%c", c);
        else if (c < 0x20) put(o, "\\u%04x", c);
        else put(o, "%c", c);
    }
    put(o, "\"");
}

/* One process's events: its name ("dp" alone, "rank r" after a gather),
 * a track per device and, where a step has them, the exchanges' track. */
static void put_process(out_buf *o, const dp_trace *t, int pid, int ranks)
{
    if (ranks)
        put(o, "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, "
               "\"args\": {\"name\": \"rank %d\"}},\n{\"name\": \"process_sort_index\", "
               "\"ph\": \"M\", \"pid\": %d, \"tid\": 0, \"args\": {\"sort_index\": %d}}",
            pid, pid - 1, pid, pid - 1);
    else
        put(o, "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, "
               "\"args\": {\"name\": \"dp\"}}", pid);
    for (size_t i = 0; i < t->k; i++) {
        put(o, ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %zu, "
               "\"args\": {\"name\": ", pid, i);
        put_string(o, t->names[i]);
        put(o, "}},\n{\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": %d, "
               "\"tid\": %zu, \"args\": {\"sort_index\": %zu}}", pid, i, i);
    }
    /* the exchanges between the ranks: one more track, where a step has them */
    int exchanges = 0;
    for (size_t s = 0; s < t->n && !exchanges; s++) exchanges = t->rec[s * t->stride + 3] > 0;
    if (exchanges)
        put(o, ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %zu, "
               "\"args\": {\"name\": \"exchanges between ranks\"}},\n{\"name\": "
               "\"thread_sort_index\", \"ph\": \"M\", \"pid\": %d, \"tid\": %zu, "
               "\"args\": {\"sort_index\": %zu}}", pid, t->k, pid, t->k, t->k);
    for (size_t s = 0; s < t->n; s++) {
        const double *r = t->rec + s * t->stride;
        const dp_phase_span *x = t->spans + (size_t)r[2];
        for (size_t j = 0; j < (size_t)r[3]; j++)
            put(o, ",\n{\"name\": \"rounds in flight\", \"cat\": \"step\", \"ph\": \"X\", "
                   "\"pid\": %d, \"tid\": %zu, \"ts\": %.3f, \"dur\": %.3f, "
                   "\"args\": {\"step\": %.0f}}",
                pid, t->k, 1e6 * (r[0] + x[j].start), 1e6 * x[j].seconds, r[1]);
        for (size_t i = 0; i < t->k; i++) {
            const double *d = r + HEAD + i * DEV_STRIDE;
            const dp_phase_span *sp = t->spans + (size_t)d[1];
            for (size_t j = 0; j < (size_t)d[2]; j++)
                put(o, ",\n{\"name\": \"%s\", \"cat\": \"step\", \"ph\": \"X\", \"pid\": %d, "
                       "\"tid\": %zu, \"ts\": %.3f, \"dur\": %.3f, "
                       "\"args\": {\"step\": %.0f, \"rows\": %.0f}}",
                    dp_phase_name(sp[j].phase), pid, i, 1e6 * (r[0] + sp[j].start),
                    1e6 * sp[j].seconds, r[1], d[0]);
        }
    }
}

dp_status dp_trace_write_to(const dp_trace *t, dp_atomic_file *af)
{
    if (!t || !af) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "trace or file is NULL");
    out_buf *o = calloc(1, sizeof *o);
    if (!o) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate the output buffer");
    o->af = af;
    /* the steps as they are now: one being added waits */
    pthread_mutex_lock((pthread_mutex_t *)&t->mu);
    put(o, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
    int ranks = t->n_peers > 0;
    put_process(o, t, 1, ranks);
    for (size_t r = 0; r < t->n_peers; r++) {
        put(o, ",\n");
        put_process(o, t->peers[r], (int)r + 2, ranks);
    }
    put(o, "\n]}\n");
    pthread_mutex_unlock((pthread_mutex_t *)&t->mu);
    flush_out(o);
    dp_status st = o->st;
    free(o);
    return st;
}

dp_status dp_trace_write(const dp_trace *t, const char *path)
{
    if (!t || !path || !*path) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "trace or path is NULL/empty");
    dp_atomic_file *af = NULL;
    DP_TRY(dp_atomic_file_open(path, &af));
    dp_status st = dp_trace_write_to(t, af);
    if (st == DP_OK) st = dp_atomic_file_commit(af);
    else dp_atomic_file_abort(af);
    return st;
}
