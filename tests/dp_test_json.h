/*
 * tests/dp_test_json.h - reading the tools' JSON outputs in tests (jansson).
 */
#ifndef DP_TEST_JSON_H
#define DP_TEST_JSON_H

#include <stdio.h>

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

#endif /* DP_TEST_JSON_H */
