/*
 * tests/dp_test_json.h - reading the tools' JSON outputs in tests (jansson).
 */
#ifndef DP_TEST_JSON_H
#define DP_TEST_JSON_H

#include <stdio.h>
#include <string.h>

#include <criterion/criterion.h>
#include <jansson.h>

/* The JSON file dir/name; fails the test naming the file and the parse error. */
static inline json_t *dp_test_load_json(const char *dir, const char *name)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    json_error_t je;
    json_t *j = json_load_file(p, 0, &je);
    cr_assert_not_null(j, "%s: %s (line %d)", p, je.text, je.line);
    return j;
}

/* obj[key], which must be an integer. */
static inline json_int_t dp_test_int_at(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    cr_assert(json_is_integer(v), "\"%s\" is missing or not an integer", key);
    return json_integer_value(v);
}

/* A trace's (dp/trace.h) "X" events of process pid named name; tid >= 0:
 * on that track only. */
static inline size_t dp_test_trace_events(json_t *trace, int pid, int tid, const char *name)
{
    json_t *ev = json_object_get(trace, "traceEvents"), *e;
    cr_assert(json_is_array(ev), "the trace has no traceEvents array");
    size_t i, n = 0;
    json_array_foreach(ev, i, e) {
        const char *ph = json_string_value(json_object_get(e, "ph"));
        const char *nm = json_string_value(json_object_get(e, "name"));
        if (ph && nm && strcmp(ph, "X") == 0 && strcmp(nm, name) == 0 &&
            json_integer_value(json_object_get(e, "pid")) == pid &&
            (tid < 0 || json_integer_value(json_object_get(e, "tid")) == tid))
            n++;
    }
    return n;
}

/* The name a trace's metadata event `what` (process_name, thread_name)
 * gives process pid (its track tid), or NULL. */
static inline const char *dp_test_trace_name(json_t *trace, const char *what, int pid, int tid)
{
    json_t *e;
    size_t i;
    json_array_foreach(json_object_get(trace, "traceEvents"), i, e) {
        const char *nm = json_string_value(json_object_get(e, "name"));
        if (nm && strcmp(nm, what) == 0 && json_integer_value(json_object_get(e, "pid")) == pid &&
            json_integer_value(json_object_get(e, "tid")) == tid)
            return json_string_value(json_object_get(json_object_get(e, "args"), "name"));
    }
    return NULL;
}

/* A gathered trace's process of rank r (pid r + 1): named "rank r", its
 * first track named device, and rounds between the ranks on its
 * exchanges' track (tid 1: one device). */
static inline void dp_test_trace_assert_rank(json_t *trace, int r, const char *device)
{
    char want[16];
    snprintf(want, sizeof want, "rank %d", r);
    const char *pn = dp_test_trace_name(trace, "process_name", r + 1, 0);
    cr_assert(pn && strcmp(pn, want) == 0, "process %d is named %s", r + 1, pn ? pn : "(none)");
    const char *tn = dp_test_trace_name(trace, "thread_name", r + 1, 0);
    cr_assert(tn && strcmp(tn, device) == 0, "rank %d's track: %s", r, tn ? tn : "(none)");
    cr_assert_gt(dp_test_trace_events(trace, r + 1, 1, "rounds in flight"), 0,
                 "rank %d: no rounds in flight", r);
}

#endif /* DP_TEST_JSON_H */
