/*
 * parallel/trace.c - Chrome trace-event JSON of the engine's phase timing (see
 * dp/trace.h), streamed with careful printf into the core atomic writer.
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
#include "transport/dist_internal.h"
#include "dp/tokenizer.h" /* dp_utf8_check */
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

static void drop_peers(dp_trace *t)
{
    for (size_t r = 0; r < t->n_peers; r++) dp_trace_destroy(t->peers[r]);
    free(t->peers);
    t->peers = NULL;
    t->n_peers = 0;
}

void dp_trace_destroy(dp_trace *t)
{
    if (!t) return;
    drop_peers(t);
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

static int bad_time(double x) { return !isfinite(x) || x < 0; }

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
        if (bad_time(sp->start) || bad_time(sp->seconds))
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
    if (bad_time(st->start_seconds))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "start_seconds %g is negative or not finite",
                       st->start_seconds);
    DP_TRY(check_spans(st->exchange_spans, st->n_exchange_spans, "the exchanges"));
    for (size_t i = 0; i < t->k; i++) {
        const dp_device_step_stats *d = &st->devices[i];
        char name[32];
        snprintf(name, sizeof name, "device %zu", i);
        DP_TRY(check_spans(d->spans, d->n_spans, name));
        for (int p = 0; p < DP_PHASE_COUNT; p++)
            if (bad_time(d->phase_start[p]) || bad_time(d->phase_seconds[p]))
                return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                               "device %zu phase %s: start %g or seconds %g is negative or not "
                               "finite",
                               i, dp_phase_name((dp_phase)p), d->phase_start[p],
                               d->phase_seconds[p]);
    }
    return DP_OK;
}

/* Makes *buf (*cap elements of size bytes) hold at least need, doubling
 * from first; *buf and *cap unchanged on error. what names it. */
static dp_status grow(void **buf, size_t *cap, size_t need, size_t size, size_t first,
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
    DP_TRY(grow(&rec, &t->cap, t->n + 1, t->stride * sizeof(double), 64, "steps"));
    t->rec = rec;
    DP_TRY(grow(&spans, &t->cap_spans, t->n_spans + more, sizeof *t->spans, 256, "spans"));
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

// --- gathering the ranks' steps ---------------------------------------------------------

/* A rank's trace as bytes: WIRE_HEAD doubles [magic, k, steps, spans,
 * names' bytes], its records (steps x stride doubles), its spans (3
 * doubles each: phase, start, seconds), then its device names, each with
 * its NUL. The ranks run one build of dp on one kind of host, so doubles
 * travel as they are. */
#define WIRE_HEAD 5
#define WIRE_MAGIC 1685090420.0 /* "dptr" */

static dp_status to_wire(const dp_trace *t, unsigned char **out, size_t *bytes)
{
    size_t names = 0;
    for (size_t i = 0; i < t->k; i++) names += strlen(t->names[i]) + 1;
    size_t doubles = WIRE_HEAD + t->n * t->stride + 3 * t->n_spans, n;
    if (!dp_size_mul(doubles, sizeof(double), &n) || n > SIZE_MAX - names - 1)
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "the trace is too large to send");
    n += names;
    unsigned char *b = calloc(n, 1);
    if (!b) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes for the trace", n);
    double head[WIRE_HEAD] = {WIRE_MAGIC, (double)t->k, (double)t->n, (double)t->n_spans,
                              (double)names};
    unsigned char *at = b;
    memcpy(at, head, sizeof head);
    at += sizeof head;
    if (t->n) memcpy(at, t->rec, t->n * t->stride * sizeof(double));
    at += t->n * t->stride * sizeof(double);
    for (size_t j = 0; j < t->n_spans; j++) {
        double sp[3] = {(double)t->spans[j].phase, t->spans[j].start, t->spans[j].seconds};
        memcpy(at, sp, sizeof sp);
        at += sizeof sp;
    }
    for (size_t i = 0; i < t->k; i++) {
        size_t len = strlen(t->names[i]) + 1;
        memcpy(at, t->names[i], len);
        at += len;
    }
    *out = b;
    *bytes = n;
    return DP_OK;
}

/* A count read from the wire: a whole number in [0, max]. */
static int wire_count(double x, size_t max, size_t *out)
{
    if (!(x >= 0 && x <= (double)max) || x != floor(x)) return 0;
    *out = (size_t)x;
    return 1;
}

/* Rank r's trace from its bytes, every count and index checked (a peer's
 * bytes are trusted no more than a file's). */
static dp_status from_wire(const unsigned char *b, size_t bytes, int rank, dp_trace **out)
{
    double head[WIRE_HEAD];
    size_t k, n, n_spans, names;
    if (bytes < sizeof head) return DP_FAIL(DP_ERR_FORMAT, "rank %d's trace is cut short", rank);
    memcpy(head, b, sizeof head);
    if (head[0] != WIRE_MAGIC || !wire_count(head[1], DP_MAX_DEVICES, &k) || k < 1 ||
        !wire_count(head[2], bytes, &n) || !wire_count(head[3], bytes, &n_spans) ||
        !wire_count(head[4], bytes, &names))
        return DP_FAIL(DP_ERR_FORMAT, "rank %d's trace is not one dp sent", rank);
    size_t stride = HEAD + k * DEV_STRIDE;
    /* each bounded by bytes above, so these products cannot overflow */
    size_t need = (WIRE_HEAD + n * stride + 3 * n_spans) * sizeof(double) + names;
    if (need != bytes)
        return DP_FAIL(DP_ERR_FORMAT, "rank %d's trace is %zu bytes, its counts say %zu", rank,
                       bytes, need);
    const unsigned char *rec = b + sizeof head, *spans = rec + n * stride * sizeof(double);
    const char *nm = (const char *)(spans + 3 * n_spans * sizeof(double)), *end = nm + names;
    const char *name[DP_MAX_DEVICES];
    for (size_t i = 0; i < k; i++) {
        const char *z = nm < end ? memchr(nm, '\0', (size_t)(end - nm)) : NULL;
        if (!z) return DP_FAIL(DP_ERR_FORMAT, "rank %d's trace lacks device %zu's name", rank, i);
        name[i] = nm;
        nm = z + 1;
    }
    dp_trace *t = NULL;
    DP_TRY(dp_trace_create(name, k, &t));
    void *rp = NULL, *sp = NULL;
    dp_status s = grow(&rp, &t->cap, n, stride * sizeof(double), 64, "steps");
    t->rec = rp;
    if (s == DP_OK) s = grow(&sp, &t->cap_spans, n_spans, sizeof *t->spans, 256, "spans");
    t->spans = sp;
    if (s == DP_OK && n) memcpy(t->rec, rec, n * stride * sizeof(double));
    for (size_t j = 0; s == DP_OK && j < n_spans; j++) {
        double w[3];
        memcpy(w, spans + 3 * j * sizeof(double), sizeof w);
        size_t phase;
        if (!wire_count(w[0], DP_PHASE_COUNT - 1, &phase) || bad_time(w[1]) || bad_time(w[2]))
            s = DP_FAIL(DP_ERR_FORMAT, "rank %d's span %zu is not a span", rank, j);
        else
            t->spans[j] = (dp_phase_span){(dp_phase)phase, w[1], w[2]};
    }
    /* every record's spans within the spans, its times and counts sane */
    for (size_t q = 0; s == DP_OK && q < n; q++) {
        const double *r = t->rec + q * stride;
        size_t first, count, rows;
        int ok = !bad_time(r[0]) && isfinite(r[1]) && wire_count(r[2], n_spans, &first) &&
                 wire_count(r[3], n_spans - first, &count);
        for (size_t i = 0; ok && i < k; i++) {
            const double *d = r + HEAD + i * DEV_STRIDE;
            ok = wire_count(d[0], SIZE_MAX / 2, &rows) && wire_count(d[1], n_spans, &first) &&
                 wire_count(d[2], n_spans - first, &count);
        }
        if (!ok) s = DP_FAIL(DP_ERR_FORMAT, "rank %d's step record %zu is not one", rank, q);
    }
    if (s != DP_OK) {
        dp_trace_destroy(t);
        return s;
    }
    t->n = n;
    t->n_spans = n_spans;
    *out = t;
    return DP_OK;
}

dp_status dp_trace_gather(dp_trace *t, dp_dist *d, double timeout)
{
    int R = dp_dist_size(d), me = dp_dist_rank(d);
    if (R <= 1) return t ? DP_OK : DP_FAIL(DP_ERR_INVALID_ARGUMENT, "trace is NULL");
    const char *what = "gathering the trace";
    /* Every call below is made by every rank, whatever failed here, so
     * none waits for a call another rank skipped: local failures are
     * agreed first. Only rank 0 receives (point to point): no rank but it
     * holds more than its own part. */
    unsigned char *mine = NULL, *all = NULL;
    size_t my_bytes = 0, total = 0;
    uint64_t *sizes = calloc((size_t)R, sizeof *sizes);
    dp_dist_msg *msgs = calloc((size_t)R, sizeof *msgs);
    dp_status s = DP_OK;
    if (!t) s = DP_FAIL(DP_ERR_INVALID_ARGUMENT, "trace is NULL");
    else if (!(timeout >= 0) || !isfinite(timeout))
        s = DP_FAIL(DP_ERR_INVALID_ARGUMENT, "timeout %g is negative or not finite", timeout);
    else if (!sizes || !msgs)
        s = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
    if (s == DP_OK) {
        pthread_mutex_lock(&t->mu);
        s = to_wire(t, &mine, &my_bytes);
        pthread_mutex_unlock(&t->mu);
    }
    double wait = s == DP_OK ? timeout : 0.0;
    s = dp_dist_agree_timeout(d, s, wait);
    uint64_t mb = my_bytes;
    int lost = 0;
    if (s == DP_OK) s = dp_dist_agree_payload(d, wait, DP_OK, &mb, sizes, sizeof mb, what, &lost);
    /* rank 0: room for the others' parts, one after the other */
    dp_dist_persist *p = NULL;
    if (s == DP_OK) {
        dp_status local = DP_OK;
        for (int r = 1; r < R && me == 0 && local == DP_OK; r++) {
            if (sizes[r] > SIZE_MAX - total)
                local = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "the ranks' traces overflow");
            else
                total += (size_t)sizes[r];
        }
        if (me == 0 && local == DP_OK && !(all = malloc(total ? total : 1)))
            local = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes for the ranks' "
                            "traces", total);
        size_t n_msgs = 0, at = 0;
        for (int r = 1; r < R && me == 0 && local == DP_OK; r++) {
            msgs[n_msgs++] = (dp_dist_msg){r, all + at, (size_t)sizes[r]};
            at += (size_t)sizes[r];
        }
        if (me != 0) msgs[n_msgs++] = (dp_dist_msg){0, mine, my_bytes};
        if (local == DP_OK)
            local = me == 0 ? dp_dist_persist_create(d, DP_DIST_TAG_TRACE, NULL, 0, msgs, n_msgs, &p)
                            : dp_dist_persist_create(d, DP_DIST_TAG_TRACE, msgs, n_msgs, NULL, 0, &p);
        s = dp_dist_agree_timeout(d, local, wait);
    }
    if (s == DP_OK) s = dp_dist_persist_run(p, wait, what);
    /* a set given up on may still be written or read by MPI: its buffers
     * stay allocated (leaked) */
    int pinned = p && dp_dist_persist_pinned(p);
    dp_dist_persist_free(p);
    /* rank 0 keeps them; the others are done */
    dp_trace **peers = NULL;
    if (s == DP_OK && me == 0) {
        if (!(peers = calloc((size_t)R - 1, sizeof *peers)))
            s = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
        size_t at = 0;
        for (int r = 1; r < R && s == DP_OK; r++) {
            s = from_wire(all + at, (size_t)sizes[r], r, &peers[r - 1]);
            at += (size_t)sizes[r];
        }
        if (s == DP_OK) {
            pthread_mutex_lock(&t->mu);
            drop_peers(t);
            t->peers = peers;
            t->n_peers = (size_t)R - 1;
            pthread_mutex_unlock(&t->mu);
            peers = NULL;
        }
    }
    if (peers)
        for (int r = 1; r < R; r++) dp_trace_destroy(peers[r - 1]);
    free(peers);
    if (!pinned) {
        free(mine);
        free(all);
    }
    free(sizes);
    free(msgs);
    (void)lost; /* a lost exchange fails s itself */
    return s;
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
