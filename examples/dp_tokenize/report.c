/*
 * examples/dp_tokenize/report.c - errors, progress and the summary.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "report.h"

int tok_fail(const char *fmt, ...)
{
    // One write per message, so that it is never interleaved with the progress line.
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(msg, sizeof msg, "dp_tokenize: ");
    vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", msg);
    return 1;
}

double tok_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void tok_progress_start(tok_progress *p, size_t files, size_t total_bytes)
{
    *p = (tok_progress){.files = files, .total_bytes = total_bytes, .tty = isatty(2)};
    p->start = p->last = tok_now();
}

static double rate(const tok_progress *p, double t)
{
    return t > p->start ? (double)p->tokens / (t - p->start) : 0.0;
}

static void draw(tok_progress *p, double t)
{
    double pct = p->total_bytes ? 100.0 * (double)p->bytes / (double)p->total_bytes : 100.0;
    fprintf(stderr, "\rdp_tokenize: [%zu/%zu] %s: %.1f%% of %zu bytes, %zu tokens, %.0f tokens/s  ",
            p->file + 1, p->files, p->path, pct, p->total_bytes, p->tokens, rate(p, t));
    fflush(stderr);
    p->last = t;
}

void tok_progress_add(tok_progress *p, size_t bytes, size_t tokens)
{
    p->bytes += bytes;
    p->tokens += tokens;
    double t = tok_now();
    if (p->tty && t - p->last >= 0.25) draw(p, t);
}

void tok_progress_file_done(tok_progress *p)
{
    double t = tok_now();
    if (p->tty) draw(p, t);
    else
        fprintf(stderr, "dp_tokenize: [%zu/%zu] %s: done, %zu bytes and %zu tokens so far\n",
                p->file + 1, p->files, p->path, p->bytes, p->tokens);
}

void tok_progress_finish(tok_progress *p, const char *out)
{
    double t = tok_now();
    if (p->tty) fputc('\n', stderr);
    printf("dp_tokenize: %zu file%s, %zu bytes -> %zu tokens in %.3f s (%.0f tokens/s)", p->files,
           p->files == 1 ? "" : "s", p->bytes, p->tokens, t - p->start, rate(p, t));
    if (out) printf("; shard %s", out);
    printf("\n");
}
