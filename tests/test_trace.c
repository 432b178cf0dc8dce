/*
 * dp/trace.h: a Chrome trace-event file built from hand-made step stats
 * with known phase times parses as JSON and holds one track per device
 * (thread_name metadata), one "X" event per device per phase run, with ts
 * and dur in microseconds from the step's start and the phase's offset, or
 * one per span where the stats have spans;
 * bad stats and unwritable paths fail without leaving a file.
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "dp/trace.h"
#include "dp_test.h"
#include "dp_test_fs.h"

static char tmpdir[64];

static void setup(void)
{
    strcpy(tmpdir, "/tmp/dp_test_trace_XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp failed");
}

static void teardown(void) { dp_test_remove_tree(tmpdir); }

TestSuite(trace, .init = setup, .fini = teardown);

/* Writes tr to tmpdir/name, destroys it and returns the file's JSON. */
static json_t *write_and_load(dp_trace *tr, const char *name)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    dp_assert_ok(dp_trace_write(tr, path));
    dp_trace_destroy(tr);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    cr_assert_not_null(root, "%s: %s (line %d)", path, je.text, je.line);
    return root;
}

static int n_entries(void)
{
    DIR *d = opendir(tmpdir);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) n += de->d_name[0] != '.';
    closedir(d);
    return n;
}

/* Step s (0-based) of k devices: starts at 10 s + s, device i enters phase p
 * at 0.01 (p + 1) + 0.001 i seconds and spends 0.002 (p + 1) seconds in it. */
static void fake_step(dp_step_stats *st, size_t k, int s)
{
    memset(st, 0, sizeof *st);
    st->n_devices = k;
    st->step = s + 1;
    st->start_seconds = 10.0 + s;
    for (size_t i = 0; i < k; i++) {
        st->devices[i].rows = 4 + i;
        for (int p = 0; p < DP_PHASE_COUNT; p++) {
            st->devices[i].phase_start[p] = 0.01 * (p + 1) + 0.001 * (double)i;
            st->devices[i].phase_seconds[p] = 0.002 * (p + 1);
        }
    }
}

Test(trace, events_tracks_and_times)
{
    const char *names[3] = {"cpu:0", "cpu:1", "gpu \"x\"\\y"}; /* escaping */
    dp_trace *tr;
    dp_assert_ok(dp_trace_create(names, 3, &tr));
    dp_step_stats st;
    for (int s = 0; s < 2; s++) {
        fake_step(&st, 3, s);
        if (s == 1) { /* device 2 did not run the optimizer in step 2 */
            st.devices[2].phase_start[DP_PHASE_OPTIMIZER] = 0;
            st.devices[2].phase_seconds[DP_PHASE_OPTIMIZER] = 0;
        }
        dp_assert_ok(dp_trace_add_step(tr, &st));
    }
    cr_assert_eq(dp_trace_steps(tr), 2);
    char path[256];
    snprintf(path, sizeof path, "%s/run.trace.json", tmpdir);
    dp_assert_ok(dp_trace_write(tr, path));
    dp_trace_destroy(tr);
    cr_assert_eq(n_entries(), 1, "only the trace file (no temporary file) may exist");

    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    cr_assert_not_null(root, "%s: %s (line %d)", path, je.text, je.line);
    json_t *ev = json_object_get(root, "traceEvents");
    cr_assert(json_is_array(ev));
    int x_count[3][DP_PHASE_COUNT] = {{0}}, tracks = 0;
    const char *track_name[3] = {NULL, NULL, NULL};
    size_t idx;
    json_t *e;
    json_array_foreach(ev, idx, e) {
        const char *ph = json_string_value(json_object_get(e, "ph"));
        const char *name = json_string_value(json_object_get(e, "name"));
        cr_assert(ph && name, "event %zu lacks ph or name", idx);
        cr_assert_eq(json_integer_value(json_object_get(e, "pid")), 1);
        json_int_t tid = json_integer_value(json_object_get(e, "tid"));
        cr_assert(tid >= 0 && tid < 3, "tid %lld", (long long)tid);
        json_t *args = json_object_get(e, "args");
        if (strcmp(ph, "M") == 0) {
            if (strcmp(name, "thread_name") == 0) {
                tracks++;
                track_name[tid] = json_string_value(json_object_get(args, "name"));
            }
            continue;
        }
        cr_assert_str_eq(ph, "X");
        int p = -1;
        for (int q = 0; q < DP_PHASE_COUNT; q++)
            if (strcmp(name, dp_phase_name((dp_phase)q)) == 0) p = q;
        cr_assert(p >= 0, "unknown phase %s", name);
        x_count[tid][p]++;
        json_int_t step = json_integer_value(json_object_get(args, "step"));
        cr_assert(step == 1 || step == 2);
        cr_assert_eq(json_integer_value(json_object_get(args, "rows")), 4 + tid);
        double want_ts = 1e6 * (10.0 + (double)(step - 1) + 0.01 * (p + 1) + 0.001 * (double)tid);
        double want_dur = 1e6 * 0.002 * (p + 1);
        cr_assert_float_eq(json_number_value(json_object_get(e, "ts")), want_ts, 1e-3,
                           "ts of %s on device %lld", name, (long long)tid);
        cr_assert_float_eq(json_number_value(json_object_get(e, "dur")), want_dur, 1e-3,
                           "dur of %s on device %lld", name, (long long)tid);
    }
    cr_assert_eq(tracks, 3, "one track per device");
    for (int i = 0; i < 3; i++) cr_assert_str_eq(track_name[i], names[i]);
    for (int i = 0; i < 3; i++)
        for (int p = 0; p < DP_PHASE_COUNT; p++)
            cr_assert_eq(x_count[i][p], (i == 2 && p == DP_PHASE_OPTIMIZER) ? 1 : 2,
                         "device %d phase %s: %d events", i, dp_phase_name((dp_phase)p),
                         x_count[i][p]);
    json_decref(root);
}

/* Stats with spans: one event per span, in the device's order, placed
 * by the span (phase_start and phase_seconds are not drawn then); a
 * device without spans in the same step still gets one per phase run. */
Test(trace, a_device_with_spans_gets_an_event_per_span)
{
    const char *names[2] = {"cpu:0", "cpu:1"};
    dp_trace *tr;
    dp_assert_ok(dp_trace_create(names, 2, &tr));
    dp_step_stats st;
    fake_step(&st, 2, 0);
    /* backward, a piece of the reduce-scatter inside it, backward again,
     * the rest of the reduce */
    const dp_phase_span spans[] = {{DP_PHASE_BACKWARD, 0.5, 0.25},
                                   {DP_PHASE_REDUCE, 0.75, 0.125},
                                   {DP_PHASE_BACKWARD, 0.875, 0.0625},
                                   {DP_PHASE_REDUCE, 0.9375, 0.03125}};
    st.devices[0].spans = spans;
    st.devices[0].n_spans = 4;
    /* and the rounds between ranks in flight twice: one more track */
    const dp_phase_span xs[] = {{DP_PHASE_REDUCE, 0.6, 0.1}, {DP_PHASE_REDUCE, 0.9, 0.05}};
    st.exchange_spans = xs;
    st.n_exchange_spans = 2;
    dp_assert_ok(dp_trace_add_step(tr, &st));
    fake_step(&st, 2, 1); /* a step without exchanges or spans */
    dp_assert_ok(dp_trace_add_step(tr, &st));
    json_t *root = write_and_load(tr, "spans.json");
    json_t *ev = json_object_get(root, "traceEvents"), *e;
    size_t idx, on0 = 0, on1 = 0, on2 = 0;
    const char *third = NULL;
    json_array_foreach(ev, idx, e) {
        json_int_t tid = json_integer_value(json_object_get(e, "tid"));
        const char *name = json_string_value(json_object_get(e, "name"));
        if (strcmp(json_string_value(json_object_get(e, "ph")), "X") != 0) {
            if (tid == 2 && strcmp(name, "thread_name") == 0)
                third = json_string_value(json_object_get(json_object_get(e, "args"), "name"));
            continue;
        }
        double ts = json_number_value(json_object_get(e, "ts"));
        double dur = json_number_value(json_object_get(e, "dur"));
        json_int_t step = json_integer_value(json_object_get(json_object_get(e, "args"), "step"));
        if (tid == 2) {
            cr_assert(step == 1 && on2 < 2, "exchange event %zu of step %lld", on2,
                      (long long)step);
            cr_assert_str_eq(name, "rounds in flight");
            cr_assert_float_eq(ts, 1e6 * (10.0 + xs[on2].start), 1e-3);
            cr_assert_float_eq(dur, 1e6 * xs[on2].seconds, 1e-3);
            on2++;
            continue;
        }
        if (tid == 1 || step == 2) {
            on1 += tid == 1 && step == 1;
            continue;
        }
        cr_assert_lt(on0, 4, "device 0 has more events than spans");
        cr_assert_str_eq(name, dp_phase_name(spans[on0].phase), "event %zu", on0);
        cr_assert_float_eq(ts, 1e6 * (10.0 + spans[on0].start), 1e-3, "ts of event %zu", on0);
        cr_assert_float_eq(dur, 1e6 * spans[on0].seconds, 1e-3, "dur of event %zu", on0);
        on0++;
    }
    cr_assert_eq(on0, 4, "device 0: %zu events for 4 spans", on0);
    cr_assert_eq(on1, DP_PHASE_COUNT, "device 1 (no spans): one event per phase");
    cr_assert_eq(on2, 2, "%zu exchange events for 2 spans", on2);
    cr_assert(third && strcmp(third, "exchanges between ranks") == 0, "the third track: %s",
              third ? third : "(none)");
    json_decref(root);
}

Test(trace, bad_stats_are_refused_and_leave_the_trace_unchanged)
{
    const char *names[2] = {"cpu:0", "cpu:1"};
    dp_trace *tr;
    cr_assert_eq(dp_trace_create(names, 0, &tr), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_trace_create(NULL, 2, &tr), DP_ERR_INVALID_ARGUMENT);
    const char *empty[2] = {"cpu:0", ""};
    cr_assert_eq(dp_trace_create(empty, 2, &tr), DP_ERR_INVALID_ARGUMENT);
    /* a name that is not UTF-8 would make the file invalid JSON */
    const char *bad[2] = {"cpu:0", "bad\xff"}, *cut[1] = {"x\xe2\x82"};
    cr_assert_eq(dp_trace_create(bad, 2, &tr), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "device 1 is not valid UTF-8 (byte 3)"), "%s",
              dp_last_error());
    cr_assert_eq(dp_trace_create(cut, 1, &tr), DP_ERR_INVALID_ARGUMENT);
    dp_assert_ok(dp_trace_create(names, 2, &tr));
    dp_step_stats st;
    fake_step(&st, 3, 0);
    cr_assert_eq(dp_trace_add_step(tr, &st), DP_ERR_INVALID_ARGUMENT, "3 devices in a 2-device trace");
    fake_step(&st, 2, 0);
    st.devices[1].phase_seconds[DP_PHASE_FORWARD] = NAN;
    cr_assert_eq(dp_trace_add_step(tr, &st), DP_ERR_INVALID_ARGUMENT);
    fake_step(&st, 2, 0);
    st.start_seconds = -1;
    cr_assert_eq(dp_trace_add_step(tr, &st), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_trace_add_step(NULL, &st), DP_ERR_INVALID_ARGUMENT);
    /* the step's own times too, as the doc says */
    fake_step(&st, 2, 0);
    st.seconds = NAN;
    cr_assert_eq(dp_trace_add_step(tr, &st), DP_ERR_INVALID_ARGUMENT);
    fake_step(&st, 2, 0);
    st.phase_seconds[DP_PHASE_REDUCE] = INFINITY;
    cr_assert_eq(dp_trace_add_step(tr, &st), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "phase reduce: seconds inf"), "%s", dp_last_error());
    fake_step(&st, 2, 0);
    st.exposed_seconds = -0.5;
    cr_assert_eq(dp_trace_add_step(tr, &st), DP_ERR_INVALID_ARGUMENT);
    /* a gather's timeout is checked in one process as with ranks */
    cr_assert_eq(dp_trace_gather(tr, NULL, -1.0), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_trace_gather(tr, NULL, NAN), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "timeout nan is negative or not finite"), "%s",
              dp_last_error());
    cr_assert_eq(dp_trace_gather(NULL, NULL, 1.0), DP_ERR_INVALID_ARGUMENT);
    dp_assert_ok(dp_trace_gather(tr, NULL, 0.0));
    /* spans: a count without its array, a phase that is none, a negative
     * start, an infinite length */
    fake_step(&st, 2, 0);
    st.devices[1].n_spans = 1;
    cr_assert_eq(dp_trace_add_step(tr, &st), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "device 1: 1 spans and no array"), "%s",
              dp_last_error());
    dp_phase_span sp = {DP_PHASE_COUNT, 0.0, 1.0};
    st.devices[1].spans = &sp;
    cr_assert_eq(dp_trace_add_step(tr, &st), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "is not a phase"), "%s", dp_last_error());
    sp = (dp_phase_span){DP_PHASE_REDUCE, -0.5, 1.0};
    cr_assert_eq(dp_trace_add_step(tr, &st), DP_ERR_INVALID_ARGUMENT);
    sp = (dp_phase_span){DP_PHASE_REDUCE, 0.5, INFINITY};
    cr_assert_eq(dp_trace_add_step(tr, &st), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "device 1 span 0 (reduce)"), "%s", dp_last_error());
    fake_step(&st, 2, 0);
    st.n_exchange_spans = 2;
    cr_assert_eq(dp_trace_add_step(tr, &st), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "the exchanges: 2 spans and no array"), "%s",
              dp_last_error());
    cr_assert_eq(dp_trace_steps(tr), 0);

    /* A missing directory: an i/o error naming the path, and no file. */
    char path[256];
    snprintf(path, sizeof path, "%s/nodir/t.json", tmpdir);
    cr_assert_eq(dp_trace_write(tr, path), DP_ERR_IO);
    cr_assert(strstr(dp_last_error(), "nodir/t.json"), "%s", dp_last_error());
    cr_assert_eq(dp_trace_write(tr, ""), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(n_entries(), 0);
    /* An empty trace is still a valid file with the k tracks. */
    snprintf(path, sizeof path, "%s/empty.json", tmpdir);
    dp_assert_ok(dp_trace_write(tr, path));
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    cr_assert_not_null(root, "%s", je.text);
    cr_assert_eq(json_array_size(json_object_get(root, "traceEvents")), 1 + 2 * 2);
    json_decref(root);
    dp_trace_destroy(tr);
    dp_trace_destroy(NULL);
}

/* Steps added from two threads while a third writes: every step is kept
 * (the adds raced in realloc and crashed), and each file written is
 * valid JSON with a whole number of steps. */
typedef struct adder {
    dp_trace *tr;
    int first;
} adder;

static void *add_steps(void *arg)
{
    adder *a = arg;
    dp_step_stats st;
    for (int s = 0; s < 3000; s++) {
        fake_step(&st, 2, a->first + s);
        if (dp_trace_add_step(a->tr, &st) != DP_OK) return (void *)1;
    }
    return NULL;
}

Test(trace, steps_added_from_threads_while_one_writes)
{
    const char *names[2] = {"cpu:0", "cpu:1"};
    dp_trace *tr;
    dp_assert_ok(dp_trace_create(names, 2, &tr));
    adder a[2] = {{tr, 0}, {tr, 100000}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) cr_assert_eq(pthread_create(&th[i], NULL, add_steps, &a[i]), 0);
    char path[256];
    snprintf(path, sizeof path, "%s/live.json", tmpdir);
    for (int w = 0; w < 5; w++) {
        dp_assert_ok(dp_trace_write(tr, path));
        json_error_t je;
        json_t *root = json_load_file(path, 0, &je);
        cr_assert_not_null(root, "write %d: %s", w, je.text);
        size_t events = json_array_size(json_object_get(root, "traceEvents")) - (1 + 2 * 2);
        cr_assert_eq(events % (2 * DP_PHASE_COUNT), 0, "write %d: %zu events", w, events);
        json_decref(root);
    }
    for (int i = 0; i < 2; i++) {
        void *rc;
        pthread_join(th[i], &rc);
        cr_assert_null(rc, "thread %d: %s", i, dp_last_error());
    }
    cr_assert_eq(dp_trace_steps(tr), 6000);
    dp_trace_destroy(tr);
}

Test(trace, many_steps_stream_through_the_buffer)
{
    /* 400 steps x 2 devices x 7 phases = 5600 events, about 800 kB: the
     * writer flushes its 64 KiB buffer many times. */
    const char *names[2] = {"cpu:0", "cpu:1"};
    dp_trace *tr;
    dp_assert_ok(dp_trace_create(names, 2, &tr));
    dp_step_stats st;
    for (int s = 0; s < 400; s++) {
        fake_step(&st, 2, s);
        dp_assert_ok(dp_trace_add_step(tr, &st));
    }
    json_t *root = write_and_load(tr, "big.json");
    cr_assert_eq(json_array_size(json_object_get(root, "traceEvents")),
                 1 + 2 * 2 + 400 * 2 * DP_PHASE_COUNT);
    json_decref(root);
}
