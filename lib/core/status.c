/*
 * core/status.c - dp_strerror and the per-thread last-error message.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"

#define DP_ERRMSG_CAP 1024

static _Thread_local char dp_errmsg[DP_ERRMSG_CAP];

const char *dp_strerror(dp_status status)
{
    switch (status) {
    case DP_OK: return "ok";
    case DP_ERR_INVALID_ARGUMENT: return "invalid argument";
    case DP_ERR_OUT_OF_MEMORY: return "out of memory";
    case DP_ERR_DEVICE: return "device error";
    case DP_ERR_NO_DEVICE: return "no such device";
    case DP_ERR_IO: return "i/o error";
    case DP_ERR_FORMAT: return "malformed input";
    case DP_ERR_NON_FINITE: return "non-finite value";
    case DP_ERR_ABORTED: return "aborted";
    case DP_ERR_UNSUPPORTED: return "unsupported";
    case DP_ERR_INTERNAL: return "internal error";
    case DP_ERR_TIMEOUT: return "timed out";
    case DP_ERR_BUSY: return "busy";
    case DP_ERR_COMM: return "communication between ranks failed";
    case DP_STATUS_COUNT: break;
    }
    return "invalid status";
}

const char *dp_last_error(void) { return dp_errmsg; }

void dp_clear_error(void) { dp_errmsg[0] = '\0'; }

dp_status dp_error_set(dp_status status, const char *func, const char *file, int line,
                       const char *fmt, ...)
{
    /* Keep only the file's base name: messages are for users, not build trees. */
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    char msg[DP_ERRMSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* Truncation of an over-long message is acceptable. */
    int n = snprintf(dp_errmsg, sizeof dp_errmsg, "%s (%s:%d): ", func, base, line);
    if (n < 0 || (size_t)n >= sizeof dp_errmsg) n = 0;
    snprintf(dp_errmsg + n, sizeof dp_errmsg - (size_t)n, "%s", msg);
    return status;
}

dp_status dp_set_error(dp_status status, const char *fmt, ...)
{
    char msg[DP_ERRMSG_CAP];
    msg[0] = '\0';
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
    }
    return dp_error_raw(status, msg);
}

dp_status dp_error_raw(dp_status status, const char *msg)
{
    snprintf(dp_errmsg, sizeof dp_errmsg, "%s", msg);
    return status;
}

void dp_error_prefix(const char *fmt, ...)
{
    char prefix[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    char old[DP_ERRMSG_CAP];
    memcpy(old, dp_errmsg, sizeof old);
    size_t pl = strlen(prefix);
    if (pl + 2 >= sizeof dp_errmsg) pl = sizeof dp_errmsg - 3;
    memcpy(dp_errmsg, prefix, pl);
    memcpy(dp_errmsg + pl, ": ", 2);
    size_t rest = sizeof dp_errmsg - pl - 3;
    size_t ol = strlen(old);
    if (ol > rest) ol = rest;
    memcpy(dp_errmsg + pl + 2, old, ol);
    dp_errmsg[pl + 2 + ol] = '\0';
}
