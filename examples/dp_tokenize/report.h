/*
 * examples/dp_tokenize/report.h - what dp_tokenize prints: one-line
 * errors, the progress line on stderr and the closing summary.
 */
#ifndef DP_TOKENIZE_REPORT_H
#define DP_TOKENIZE_REPORT_H

#include <stddef.h>

/* Prints "dp_tokenize: <message>" as one line on stderr; returns 1. */
int tok_fail(const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* Seconds on a monotonic clock. */
double tok_now(void);

typedef struct tok_progress {
    size_t files, total_bytes; /* inputs, and their bytes, as found before encoding */
    size_t file;               /* the input being encoded (0-based) */
    const char *path;
    size_t bytes, tokens;      /* done so far, over every input */
    double start, last;        /* when encoding began; the last progress line */
    int tty;                   /* stderr is a terminal: one line rewritten in place */
} tok_progress;

void tok_progress_start(tok_progress *p, size_t files, size_t total_bytes);

/* Counts bytes and tokens just encoded; redraws the line at most 4 times a
 * second on a terminal. */
void tok_progress_add(tok_progress *p, size_t bytes, size_t tokens);

/* An input is done: on a terminal the line is redrawn, otherwise one line
 * is printed per input. */
void tok_progress_file_done(tok_progress *p);

/* The summary on stdout: inputs, bytes, tokens, seconds, tokens/s, and
 * the shard about to be committed (NULL: none). Printed before the
 * commit, so that a summary lost fails the run with nothing written. */
void tok_progress_finish(tok_progress *p, const char *out);

#endif /* DP_TOKENIZE_REPORT_H */
