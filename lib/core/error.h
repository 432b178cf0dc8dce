/*
 * core/error.h - internal helpers to record errors with context.
 *
 * DP_FAIL(status, fmt, ...) records "func (file:line): message" as the
 * calling thread's last error and evaluates to status, so a failing path
 * reads `return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "C must be > 0");`.
 * DP_TRY(expr) returns early with expr's status when it is not DP_OK,
 * keeping the message the callee recorded.
 */
#ifndef DP_CORE_ERROR_H
#define DP_CORE_ERROR_H

#include <stddef.h>

#include "core/module.h"
#include "dp/status.h"

#if defined(__GNUC__) || defined(__clang__)
#define DP_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define DP_PRINTF(a, b)
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Records the message and returns status. These three are exported for
 * the modules (DP_MODULE_API): their messages are the core's. */
DP_MODULE_API dp_status dp_error_set(dp_status status, const char *func, const char *file, int line,
                       const char *fmt, ...) DP_PRINTF(5, 6);

/* Records msg verbatim (e.g. a message carried from another thread). */
DP_MODULE_API dp_status dp_error_raw(dp_status status, const char *msg);

/* src[0..len) into dst[0..cap) as a string: whole when it fits, else its
 * start and its end (where a message's reason and fix are) around
 * " [...] ", each cut at a UTF-8 character's boundary. src may be dst.
 * For messages kept or carried outside the thread's last error. */
DP_MODULE_API void dp_error_fit(char *dst, size_t cap, const char *src, size_t len);

/* Prefixes the current message with "prefix: " (e.g. a device and phase). */
DP_MODULE_API void dp_error_prefix(const char *fmt, ...) DP_PRINTF(1, 2);

#ifdef __cplusplus
}
#endif

#define DP_FAIL(status, ...) dp_error_set((status), __func__, __FILE__, __LINE__, __VA_ARGS__)

#define DP_TRY(expr)                          \
    do {                                      \
        dp_status dp_try_s_ = (expr);         \
        if (dp_try_s_ != DP_OK) return dp_try_s_; \
    } while (0)

#endif /* DP_CORE_ERROR_H */
