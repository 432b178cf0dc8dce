/*
 * io/json_load.h - what a failed jansson json_load* means. jansson 2.14
 * gives every syntax error a reason (json_error_t.text), but an allocation
 * that fails inside the parser leaves the reason empty (line -1), with no
 * dependable json_error_code; so an empty reason is reported as the host
 * running out of memory, not as a malformed file.
 */
#ifndef DP_IO_JSON_LOAD_H
#define DP_IO_JSON_LOAD_H

#include <jansson.h>

/* 1 when the failed load's error e is an allocation failure. */
static inline int dp_json_load_out_of_memory(const json_error_t *e)
{
    return e->text[0] == '\0';
}

#endif /* DP_IO_JSON_LOAD_H */
