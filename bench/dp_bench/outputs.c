/*
 * bench/dp_bench/outputs.c - dp_bench's output files (--json, --csv,
 * --plot, --trace): every path checked before the first step (no two of
 * them one file: cli_check_overlaps), then each output (the trace too)
 * staged to a temporary file guarded from fatal signals, and renamed
 * into place only when all were written, or all removed.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp_bench.h"

/* Starts an output: its temporary file, guarded (*af). */
static int stage_open(outputs *out, const char *flag, const char *path, dp_atomic_file **af)
{
    pending *q = &out->p[out->n];
    q->flag = flag;
    q->path = path;
    if (dp_atomic_file_open(path, &q->af) != DP_OK) return cli_dp_fail(flag);
    /* a fatal signal removes the staged file (cli_guard_signals) */
    out->n++;
    *af = q->af;
    return 0;
}

/* Starts an output with its bytes. */
int stage(outputs *out, const char *flag, const char *path, const void *bytes, size_t n)
{
    dp_atomic_file *af = NULL;
    if (stage_open(out, flag, path, &af)) return 1;
    if (dp_atomic_file_write(af, bytes, n) != DP_OK || dp_atomic_file_sync(af) != DP_OK)
        return cli_dp_fail(flag);
    return 0;
}

/* Starts --trace, written by the trace itself. */
static int stage_trace(outputs *out, const bench *b)
{
    dp_atomic_file *af = NULL;
    if (stage_open(out, "--trace", b->o.trace, &af)) return 1;
    if (dp_trace_write_to(b->trace, af) != DP_OK || dp_atomic_file_sync(af) != DP_OK)
        return cli_dp_fail("--trace");
    return 0;
}

/* rc == 0: renames every staged output into place; else removes them all. */
static int finish(outputs *out, int rc)
{
    for (size_t i = 0; i < out->n; i++) {
        pending *q = &out->p[i];
        if (rc) {
            dp_atomic_file_abort(q->af);
        } else if (dp_atomic_file_commit(q->af) != DP_OK) {
            rc = cli_dp_fail(q->flag);
        }
    }
    out->n = 0;
    return rc;
}

/* --json written by dp_bench: an object with its config and results. */
static int is_bench_json(const char *path)
{
    json_t *j = json_load_file(path, 0, NULL);
    int ours = j && json_object_get(j, "config") && json_object_get(j, "results");
    json_decref(j);
    return ours;
}

/* --csv written by dp_bench: its header's first columns. */
static int is_bench_csv(const char *path)
{
    static const char head[] = "mode,device,peak_bytes,";
    char buf[sizeof head];
    return cli_read_head(path, buf, sizeof head - 1) == sizeof head - 1 && strcmp(buf, head) == 0;
}

/* --plot: a PNG or an SVG (what gnuplot's terminals write; another
 * program's image of that kind cannot be told apart, and is replaced). */
static int is_plot_image(const char *path)
{
    char buf[257];
    size_t n = cli_read_head(path, buf, sizeof buf - 1);
    return (n >= 4 && memcmp(buf, "\x89PNG", 4) == 0) || strstr(buf, "<svg") != NULL;
}

/* Every output path, before any work: a bad one, or two that are one
 * file, fails the run at once; an existing file dp_bench did not write
 * is kept (the run is refused). Then each is locked for the run
 * (cli_lock_output), so two runs given one path cannot leave one's JSON
 * beside the other's CSV: the second is refused. */
int check_outputs(bench *b)
{
    const opts *o = &b->o;
    const char *flag[5] = {"--json", "--csv", "--plot", "--plot", "--trace"};
    const char *path[5] = {o->json, o->csv, o->plot, NULL, o->trace};
    char *sp = NULL;
    if (o->plot && o->scaling) {
        if (!(sp = scaling_path(o->plot))) return cli_fail("out of host memory");
        path[3] = sp;
    }
    int rc = 0;
    for (int i = 0; i < 5 && !rc; i++)
        if (path[i]) rc = cli_check_output(flag[i], path[i]);
    /* each output's lock file too: it is written and removed as well */
    static const char *const lock_flag[5] = {"--json's lock file", "--csv's lock file",
                                             "--plot's lock file", "--plot's lock file",
                                             "--trace's lock file"};
    char *lock[5] = {NULL};
    cli_file files[10];
    for (int i = 0; i < 5; i++) {
        if (path[i] && !(lock[i] = cli_lock_name(path[i])) && !rc)
            rc = cli_fail("out of host memory");
        files[i] = (cli_file){flag[i], path[i], 1, NULL, NULL};
        files[5 + i] = (cli_file){lock_flag[i], lock[i], 1, NULL, NULL};
    }
    if (!rc) rc = cli_check_overlaps(files, 10);
    for (int i = 0; i < 5; i++) free(lock[i]);
    /* after the overlaps (whose message names both options): nothing
     * another program wrote is replaced */
    static int (*const ours[5])(const char *) = {is_bench_json, is_bench_csv, is_plot_image,
                                                  is_plot_image, cli_is_dp_trace};
    static const char *const what[5] = {"dp_bench's JSON", "dp_bench's CSV",
                                        "a PNG or SVG plot", "a PNG or SVG plot", "a dp trace"};
    for (int i = 0; i < 5 && !rc; i++)
        if (path[i]) rc = cli_check_replace(flag[i], path[i], ours[i], what[i]);
    for (int i = 0; i < 5 && !rc; i++)
        if (path[i]) rc = cli_lock_output(flag[i], path[i], &b->locks[i]);
    free(sp);
    if (!rc && o->plot) rc = check_gnuplot();
    return rc;
}

/* --trace (every rank's; rank 0 gathers them before writing): a track
 * per device of the list, filled by the timed runs' steps and written
 * last, with the other outputs. */
int open_trace(bench *b)
{
    if (!b->o.trace) return 0;
    const char *names[DP_MAX_DEVICES];
    char nbuf[DP_MAX_DEVICES][32];
    for (size_t i = 0; i < b->k; i++) names[i] = spec_name(&b->specs[i], nbuf[i], sizeof nbuf[i]);
    return dp_trace_create(names, b->k, &b->trace) != DP_OK ? cli_dp_fail("--trace") : 0;
}

/* Stages every requested output, then renames them all into place, or
 * removes them all when one failed. */
int write_outputs(bench *b, const run_results *rs)
{
    const opts *o = &b->o;
    outputs out = {.n = 0};
    int rc = 0;
    char *sp = NULL;
    if (o->json) {
        json_t *j = json_results(b, rs);
        /* 17 significant digits: every double reads back exactly (a loss compares bitwise). */
        char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(17)) : NULL;
        rc = text ? stage(&out, "--json", o->json, text, strlen(text))
                  : cli_fail("--json: cannot encode the results");
        free(text);
        json_decref(j);
    }
    if (!rc && o->csv) {
        char *text = csv_text(rs, b->rk.ranks);
        rc = text ? stage(&out, "--csv", o->csv, text, strlen(text)) : cli_fail("out of host memory");
        free(text);
    }
    if (!rc && o->plot && rs->nres) rc = plot_memory(b, &out, o->plot, rs);
    if (!rc && o->plot && rs->nsc) {
        sp = scaling_path(o->plot);
        rc = sp ? plot_scaling(b, &out, sp, rs) : cli_fail("out of host memory");
    }
    if (!rc && o->trace) rc = stage_trace(&out, b);
    /* The table and figures went to stdout: where they could not be
     * written, the run failed, and its files are not left as if it had not. */
    if (!rc) rc = cli_check_stream(stdout, "standard output");
    rc = finish(&out, rc);
    if (!rc && o->plot) {
        if (!rs->nres) printf("plot: none, no mode was timed\n");
        else if (rs->nsc) printf("plots: %s, %s\n", o->plot, sp);
        else printf("plot: %s\n", o->plot);
    }
    if (!rc && o->trace) printf("trace: %s (open in ui.perfetto.dev)\n", o->trace);
    free(sp);
    return rc;
}
