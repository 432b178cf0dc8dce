/*
 * parallel/trace_gather.c - dp_trace_gather (dp/trace.h): every rank's
 * steps into rank 0's trace, each rank's part as bytes sent to rank 0
 * alone over the bootstrap (transport/dist_internal.h).
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "dp/checked.h"
#include "dp/trace.h"
#include "parallel/trace_internal.h"
#include "transport/dist_internal.h"

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
    dp_status s = dp_trace_grow(&rp, &t->cap, n, stride * sizeof(double), 64, "steps");
    t->rec = rp;
    if (s == DP_OK) s = dp_trace_grow(&sp, &t->cap_spans, n_spans, sizeof *t->spans, 256, "spans");
    t->spans = sp;
    if (s == DP_OK && n) memcpy(t->rec, rec, n * stride * sizeof(double));
    for (size_t j = 0; s == DP_OK && j < n_spans; j++) {
        double w[3];
        memcpy(w, spans + 3 * j * sizeof(double), sizeof w);
        size_t phase;
        if (!wire_count(w[0], DP_PHASE_COUNT - 1, &phase) || dp_trace_bad_time(w[1]) ||
            dp_trace_bad_time(w[2]))
            s = DP_FAIL(DP_ERR_FORMAT, "rank %d's span %zu is not a span", rank, j);
        else
            t->spans[j] = (dp_phase_span){(dp_phase)phase, w[1], w[2]};
    }
    /* every record's spans within the spans, its times and counts sane */
    for (size_t q = 0; s == DP_OK && q < n; q++) {
        const double *r = t->rec + q * stride;
        size_t first, count, rows;
        int ok = !dp_trace_bad_time(r[0]) && isfinite(r[1]) && wire_count(r[2], n_spans, &first) &&
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
    if (R <= 1) {
        if (!t) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "trace is NULL");
        if (!(timeout >= 0) || !isfinite(timeout))
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "timeout %g is negative or not finite",
                           timeout);
        return DP_OK;
    }
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
        size_t n_sends = me ? n_msgs : 0; /* rank 0 receives them all, the others send */
        if (local == DP_OK)
            local = dp_dist_persist_create(d, DP_DIST_TAG_TRACE, msgs, n_sends, msgs,
                                           n_msgs - n_sends, &p);
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
            dp_trace_drop_peers(t);
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
