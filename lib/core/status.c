/*
 * core/status.c - dp_strerror and the per-thread last-error message.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
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

/* Messages are formatted in full up to this size (a path may be 4096
 * bytes), then fitted into the 1024 bytes kept. */
#define DP_ERRMSG_FULL 8192

static int continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

void dp_error_fit(char *dst, size_t cap, const char *src, size_t len)
{
    static const char gap[] = " [...] ";
    if (cap == 0) return;
    if (len < cap) {
        memmove(dst, src, len);
        dst[len] = '\0';
        return;
    }
    if (cap <= sizeof gap + 2) { /* no room for both ends: the start alone */
        size_t head = cap - 1;
        while (head > 0 && continuation((unsigned char)src[head])) head--;
        memmove(dst, src, head);
        dst[head] = '\0';
        return;
    }
    size_t room = cap - 1 - (sizeof gap - 1);
    size_t head = room / 3, tail_at = len - (room - head);
    while (head > 0 && continuation((unsigned char)src[head])) head--;
    while (tail_at < len && continuation((unsigned char)src[tail_at])) tail_at++;
    /* memmove: src may be dst itself; the tail is moved before the gap
     * overwrites the bytes after the head. */
    size_t tail = len - tail_at;
    memmove(dst + head + sizeof gap - 1, src + tail_at, tail);
    if (src != dst) memmove(dst, src, head);
    memcpy(dst + head, gap, sizeof gap - 1);
    dst[head + sizeof gap - 1 + tail] = '\0';
}

/* src[0..len) into dp_errmsg (see dp_error_fit). */
static void fit(const char *src, size_t len) { dp_error_fit(dp_errmsg, DP_ERRMSG_CAP, src, len); }

/* prefix then fmt's text, fitted into dp_errmsg. */
static void set_formatted(const char *prefix, const char *fmt, va_list ap)
{
    char buf[DP_ERRMSG_FULL];
    size_t pl = strlen(prefix);
    if (pl >= sizeof buf) pl = sizeof buf - 1;
    memcpy(buf, prefix, pl);
    char *text = buf;
    va_list again;
    va_copy(again, ap);
    int n = vsnprintf(buf + pl, sizeof buf - pl, fmt, ap);
    size_t len = pl + (n > 0 ? (size_t)n : 0);
    if (n > 0 && len >= sizeof buf) { /* longer still: in full where memory allows */
        char *big = malloc(len + 1);
        if (big) {
            memcpy(big, prefix, pl);
            vsnprintf(big + pl, len + 1 - pl, fmt, again);
            text = big;
        } else {
            len = sizeof buf - 1;
        }
    }
    va_end(again);
    fit(text, len);
    if (text != buf) free(text);
}

dp_status dp_error_set(dp_status status, const char *func, const char *file, int line,
                       const char *fmt, ...)
{
    /* Keep only the file's base name: messages are for users, not build trees. */
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    char prefix[256];
    int n = snprintf(prefix, sizeof prefix, "%s (%s:%d): ", func, base, line);
    if (n < 0) prefix[0] = '\0';
    va_list ap;
    va_start(ap, fmt);
    set_formatted(prefix, fmt, ap);
    va_end(ap);
    return status;
}

dp_status dp_set_error(dp_status status, const char *fmt, ...)
{
    if (!fmt) return dp_error_raw(status, "");
    va_list ap;
    va_start(ap, fmt);
    set_formatted("", fmt, ap);
    va_end(ap);
    return status;
}

dp_status dp_error_raw(dp_status status, const char *msg)
{
    if (msg != dp_errmsg) fit(msg, strlen(msg));
    return status;
}

void dp_error_prefix(const char *fmt, ...)
{
    char prefix[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    char joined[DP_ERRMSG_CAP + sizeof prefix + 2];
    int n = snprintf(joined, sizeof joined, "%s: %s", prefix, dp_errmsg);
    fit(joined, n > 0 ? strlen(joined) : 0);
}
