/*
 * examples/lm_train/log.c - what a run prints and writes as it goes: the
 * model and engine summary, the progress line, --log's JSONL rows (a
 * resumed run keeps those up to its checkpoint), the --trace file, and
 * whether every write to stdout and --log went through.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lm_train.h"

void human_bytes(size_t b, char *buf, size_t cap)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double x = (double)b;
    int i = 0;
    while (x >= 1024 && i < 4) x /= 1024, i++;
    snprintf(buf, cap, i ? "%.1f%s" : "%.0f%s", x, u[i]);
}

/* The model and engine lines every run prints once the engine exists
 * (rank 0's devices under ranks). */
void print_summary(const run *r, size_t k, const dp_engine_config *ec)
{
    const opts *o = &r->o;
    size_t K = dp_engine_num_global_devices(r->engine);
    const dp_gpt_config *c = dp_gpt_config_of(r->gpt);
    size_t Vp = dp_gpt_padded_vocab(c);
    printf("model: GPT %ld layers, %ld heads, dim %ld, context %ld: %.2fM parameters", o->layers,
           o->heads, o->dim, o->context, (double)r->n_params / 1e6);
    if (Vp != c->vocab_size)
        printf(", vocabulary %zu padded to %zu (--vocab-pad %zu)", c->vocab_size, Vp,
               c->vocab_pad);
    printf("\n");
    printf("engine: %s mode%s", dp_mode_name(ec->mode),
           ec->shard_optimizer ? ", sharded optimizer" : "");
    cli_print_compute(&o->compute);
    printf(" on %zu device%s (", K, K == 1 ? "" : "s");
    if (r->rk.ranks > 1) printf("%d ranks; rank 0's: ", r->rk.ranks);
    for (size_t i = 0; i < k; i++)
        printf("%s%s", i ? "," : "", dp_device_name(dp_engine_device(r->engine, i)));
    printf("), batch %ld x %ld tokens\n", o->batch_size, o->context);
    cli_print_matmul_note(r->engine, &o->compute, o->tf32);
}

/* --log for writing, truncated (a fresh run) or at its end (a resumed
 * one, whose kept rows are already the file): opened without blocking, so
 * a FIFO is refused instead of waited on; a regular file or a character
 * device (/dev/null). NULL after a message. */
static FILE *open_log_file(const char *path, int truncate)
{
    int fd = open(path, O_WRONLY | O_CREAT | (truncate ? O_TRUNC : 0) | O_NONBLOCK | O_CLOEXEC,
                  0666);
    if (fd < 0) {
        cli_fail("--log %s: %s", path, errno == ENXIO ? "a FIFO without a reader; give a regular "
                 "file" : strerror(errno));
        return NULL;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !(S_ISREG(sb.st_mode) || S_ISCHR(sb.st_mode))) {
        close(fd);
        cli_fail("--log %s: not a regular file; give a regular file", path);
        return NULL;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    if (!truncate && S_ISREG(sb.st_mode)) lseek(fd, 0, SEEK_END);
    FILE *f = fdopen(fd, "w");
    if (!f) {
        close(fd);
        cli_fail("--log %s: %s", path, strerror(errno));
    }
    return f;
}

/* Where --log's complete rows end (rows are flushed whole, at each
 * check_written); -1 for a character device. Returns 0. */
static int set_log_good(run *r)
{
    struct stat sb;
    r->log_good = fstat(fileno(r->log), &sb) == 0 && S_ISREG(sb.st_mode) ? ftello(r->log) : -1;
    return 0;
}

/* After a failed write of --log (a full disk, a file size limit): the file
 * cut back to its last complete row, so no half row is left, and the
 * stream's descriptor pointed at /dev/null, so what stdio still holds
 * cannot reach the file when the log is closed. */
static void cut_log(run *r)
{
    if (r->log_good < 0) return;
    int fd = fileno(r->log);
    if (ftruncate(fd, r->log_good) != 0) return;
    int nul = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (nul < 0) return;
    dup2(nul, fd);
    close(nul);
}

/* The rows of an existing --log to keep: those with a step up to `upto`
 * into *kept (malloc'd, *kept_len bytes; NULL when none), counted in
 * *rows, the later ones (and a last row cut off by a kill) in *dropped.
 * An existing file that is not such a log (a complete line that is not a
 * row with a step: the training text, a checkpoint named by mistake) is
 * refused before anything of it is lost; so is a FIFO or a socket. A
 * missing file or a character device (/dev/null) has no rows. 0, or 1
 * after a message. */
static int read_log(const char *path, long upto, char **kept, size_t *kept_len, size_t *rows,
                    size_t *dropped)
{
    *kept = NULL;
    *kept_len = *rows = *dropped = 0;
    struct stat sb;
    if (stat(path, &sb) != 0 || S_ISCHR(sb.st_mode)) return 0;
    if (!S_ISREG(sb.st_mode))
        return cli_fail("--log %s: a %s; give a regular file", path, dp_file_kind(sb.st_mode));
    int fd = cli_open_input("--log", path);
    if (fd < 0) return 1;
    FILE *in = fdopen(fd, "r");
    if (!in) {
        close(fd);
        return cli_fail("--log %s: %s", path, strerror(errno));
    }
    FILE *mem = open_memstream(kept, kept_len);
    if (!mem) {
        fclose(in);
        return cli_fail("out of host memory");
    }
    char *line = NULL;
    size_t cap = 0, line_no = 0, foreign = 0;
    ssize_t got;
    while (!foreign && (got = getline(&line, &cap, in)) > 0) {
        line_no++;
        int whole = line[got - 1] == '\n';
        json_t *row = whole ? json_loads(line, 0, NULL) : NULL;
        json_t *step = row ? json_object_get(row, "step") : NULL;
        int is_row = step && json_is_integer(step);
        /* a row cut by a kill is at least its opening brace, after rows
         * (a JSON file without a final newline is one line that is none) */
        if ((whole && !is_row) || (!whole && (line[0] != '{' || line_no == 1))) foreign = line_no;
        else if (is_row && json_integer_value(step) <= upto) {
            fputs(line, mem);
            (*rows)++;
        } else {
            (*dropped)++;
        }
        json_decref(row);
    }
    free(line);
    fclose(in);
    fclose(mem);
    if (!foreign) return 0;
    free(*kept);
    *kept = NULL;
    return cli_fail("--log %s: line %zu is not a row of an lm_train log (a JSON object with a "
                    "step), so the file is not one and would be lost; give a new path or the "
                    "run's own log", path, foreign);
}

int check_log(const opts *o)
{
    if (!o->log) return 0;
    char *kept = NULL;
    size_t len, rows, dropped;
    int rc = read_log(o->log, -1, &kept, &len, &rows, &dropped);
    free(kept);
    return rc;
}

/* Takes fd's advisory lock (flock) for this run, or says that another run
 * holds it: two runs appending to one log would interleave their rows
 * (and a later --resume refuse the file). 0, or 1 after a message. */
static int lock_log(int fd, const char *path)
{
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) return 0;
    if (errno == EWOULDBLOCK)
        return cli_fail("--log %s is being written by another run; give each run its own log",
                        path);
    return 0; /* a file system without locks: as before */
}

/* path's contents replaced by kept[0..len), atomically. 0, or 1 after a
 * message. */
static int write_kept(const char *path, const char *kept, size_t len)
{
    dp_atomic_file *af = NULL;
    if (dp_atomic_file_open(path, &af) != DP_OK) return cli_dp_fail("--log");
    if (len && dp_atomic_file_write(af, kept, len) != DP_OK) {
        int rc = cli_dp_fail("--log");
        dp_atomic_file_abort(af);
        return rc;
    }
    return dp_atomic_file_commit(af) != DP_OK ? cli_dp_fail("--log") : 0; /* frees af */
}

/* Opens --log. A resumed run keeps the rows up to the checkpoint's step and
 * drops the later ones (written by the run that went past the checkpoint
 * before it stopped), so every step appears once; a last line cut off by
 * a kill is dropped too. A fresh run starts the file anew. An existing
 * file that is not such a log is refused (read_log; check_log did so
 * before any work). */
static int open_log(run *r)
{
    const char *path = r->o.log;
    if (!path) return 0;
    char *kept = NULL;
    size_t kept_len = 0, dropped = 0, rows = 0;
    /* another run's log is refused before it is read or changed; the lock
     * is held until this run's own descriptor has it */
    int held = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat hs;
    if (held >= 0 && (fstat(held, &hs) != 0 || !S_ISREG(hs.st_mode))) {
        close(held);
        held = -1;
    }
    if (held >= 0 && lock_log(held, path)) {
        close(held);
        return 1;
    }
    int rc = read_log(path, r->step, &kept, &kept_len, &rows, &dropped);
    if (rc) {
        if (held >= 0) close(held);
        return 1;
    }
    if (!r->step) kept_len = 0, dropped = 0; /* a fresh run: the file starts anew */
    /* A resumed run's kept rows replace the file atomically, never in
     * place: a signal or a failed write then leaves the log as it was
     * (it used to be truncated first and rewritten). */
    struct stat sb;
    int regular = stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
    if (r->step && regular && dropped && write_kept(path, kept, kept_len)) {
        free(kept);
        if (held >= 0) close(held);
        return 1;
    }
    free(kept);
    r->log = open_log_file(path, !r->step);
    /* the lock passes to this run's descriptor (two descriptions of one
     * file conflict even in one process: the first is let go before) */
    if (held >= 0) close(held);
    if (!r->log) return 1;
    struct stat ls;
    if (fstat(fileno(r->log), &ls) == 0 && S_ISREG(ls.st_mode) && lock_log(fileno(r->log), path))
        return 1;
    char what[300];
    snprintf(what, sizeof what, "--log %s", path);
    if (cli_check_stream(r->log, what)) return 1;
    set_log_good(r);
    if (dropped)
        printf("log: %s: kept %zu rows up to step %ld, dropped %zu written after it\n", path,
               rows, r->step, dropped);
    return 0;
}

/* --trace's steps, on every rank: its k devices' tracks (rank 0 gathers
 * the others' at the end, finish_trace). The path was probed by
 * cli_check_output; the file is written atomically at the end, so an
 * older trace stays whole until then, even if the run is killed. */
int open_trace(run *r, size_t k)
{
    if (!r->o.trace || r->o.eval_only) return 0;
    const char *names[DP_MAX_DEVICES];
    for (size_t i = 0; i < k; i++) names[i] = dp_device_name(dp_engine_device(r->engine, i));
    return dp_trace_create(names, k, &r->trace) != DP_OK ? cli_dp_fail("--trace") : 0;
}

/* Rank 0's outputs, opened before the first step so that a path that
 * cannot be written fails at once: --log (never given with --eval-only). */
int open_outputs(run *r)
{
    const opts *o = &r->o;
    if (!o->eval_only && open_log(r)) return 1;
    if (r->ck && !o->eval_only && r->step == o->steps)
        printf("resume: the checkpoint is already at step %ld of --steps %ld: nothing to train\n",
               r->step, o->steps);
    return 0;
}

void progress(run *r, const dp_step_stats *st, double lr, double elapsed, long first)
{
    double tok_s = (double)(r->o.batch_size * r->o.context) / st->seconds;
    double eta = (elapsed / (double)(r->step - first)) * (double)(r->o.steps - r->step);
    char line[512];
    int n = snprintf(line, sizeof line, "step %ld/%ld | loss %.4f | lr %.2e | %.0f tok/s | %.1f ms | ETA %.0fs | peak",
                     r->step, r->o.steps, st->loss, lr, tok_s, 1e3 * st->seconds, eta);
    for (size_t d = 0; d < st->n_devices && n < (int)sizeof line - 16; d++) {
        char b[32];
        human_bytes(st->devices[d].peak, b, sizeof b);
        n += snprintf(line + n, sizeof line - (size_t)n, " %s", b);
    }
    if (r->tty) {
        printf("\r%s\033[K", line);
        cli_flush(stdout);
    } else {
        long every = r->o.eval_interval / 10 > 0 ? r->o.eval_interval / 10 : 1;
        if (r->step % every == 0 || r->step == r->o.steps) {
            printf("%s\n", line);
            cli_flush(stdout); /* a log watcher (or a job killed by SIGKILL) sees whole lines */
        }
    }
}

void log_row(run *r, const dp_step_stats *st, double lr)
{
    if (!r->log) return;
    json_t *peaks = json_array();
    for (size_t d = 0; d < st->n_devices; d++)
        json_array_append_new(peaks, json_integer((json_int_t)st->devices[d].peak));
    /* JSON has no NaN or Inf: a non-finite loss or norm is logged as null. */
    json_t *loss = isfinite(st->loss) ? json_real(st->loss) : json_null();
    json_t *norm = isfinite(st->grad_norm) ? json_real(st->grad_norm) : json_null();
    json_t *row = json_pack("{s:I, s:o, s:f, s:o, s:f, s:f, s:b, s:I, s:o}", "step",
                            (json_int_t)(st->skipped ? r->step + 1 : r->step), "loss", loss,
                            "lr", lr, "grad_norm", norm, "tokens_per_s",
                            (double)(r->o.batch_size * r->o.context) / st->seconds, "ms",
                            1e3 * st->seconds, "skipped", st->skipped, "skipped_total",
                            (json_int_t)r->skipped, "peak_bytes", peaks);
    if (row) { /* flushed, and checked, at the next step's start (check_written) */
        json_dumpf(row, r->log, JSON_COMPACT);
        fputc('\n', r->log);
    }
    json_decref(row);
}

/* What rank 0 wrote so far to stdout and --log, flushed and checked: 1
 * once a write failed (a full disk, /dev/full), said once; the run then
 * saves and stops (train.c) or fails at its end (main.c). */
int check_written(run *r)
{
    /* Under ranks a signal made stdout non-blocking on purpose (signals.c):
     * a write it refuses then is no failure; the run stops for the signal. */
    if (r->write_failed || r->rk.rank != 0 || (r->rk.ranks > 1 && pending_signal()))
        return r->write_failed;
    char what[300];
    snprintf(what, sizeof what, "--log %s", r->o.log ? r->o.log : "");
    r->write_failed = cli_check_stream(stdout, "standard output");
    if (!r->write_failed && r->log) {
        r->write_failed = cli_check_stream(r->log, what);
        if (r->write_failed) cut_log(r);
        else if (r->log_good >= 0) r->log_good = ftello(r->log);
    }
    return r->write_failed;
}

/* Whatever stopped training, the trace holds the steps that ran: with
 * ranks still in step, rank 0 gathers every rank's (dp_trace_gather),
 * then writes it (its own alone when the gather failed); when training
 * succeeded, the ranks agree on the write's outcome. */
int finish_trace(run *r, int rc)
{
    int tw = 0;
    if (r->trace && r->rk.ranks > 1 && !r->rk.broken) {
        dp_status s = dp_trace_gather(r->trace, r->rk.dist, r->rk.wait);
        if (s != DP_OK) tw = engine_fail(r, s, "--trace: gathering the ranks' steps");
    }
    if (r->trace && r->rk.rank == 0 && dp_trace_write(r->trace, r->o.trace) != DP_OK)
        tw = cli_dp_fail("--trace");
    return rc ? rc : r->rk.broken ? 1 : agree_writes(r, tw);
}
