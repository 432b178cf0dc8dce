/*
 * examples/lm_train/main.c - the main job: train a GPT on real text with
 * the balanced DataParallel engine. main() is the table of contents.
 *
 * Defaults run on a fresh machine with no arguments: the corpus is the
 * text of Debian's fortunes package, character-level tokens, every GPU or
 * else one CPU device per core. Prints progress, evaluates on the held-out
 * split, saves safetensors checkpoints nanoGPT can load, resumes exactly,
 * and samples text. `lm_train --help` lists every option.
 *
 * --data also takes the field's pre-tokenized GPT-2 data (dp_token_data_open):
 * nanoGPT's train.bin / val.bin and llm.c's shards, mapped read-only; the
 * model's vocabulary is then --vocab-size (GPT-2's 50257 by default), and
 * samples decode through llm.c's gpt2_tokenizer.bin (--tokenizer-file) or
 * print as ids.
 *
 * SIGINT / SIGTERM / SIGHUP end the run after the current step: the checkpoint is
 * written (with --save), output flushed, and the exit status is 128 + the
 * signal's number; a second signal exits at once. Before training begins
 * (setup) they end it at once, with the same status.
 *
 * Under an MPI launcher (mpirun -np R lm_train --devices cpu:K ...) the R
 * ranks train one model on R x K devices (dp/dist.h): every rank samples
 * the same batches from the same seed and makes the same engine calls,
 * all of them collective; rank 0 alone prints, writes --save, --log and
 * --trace. Their options are compared when they join (all but those of
 * their own devices), so a rank started differently fails them all at
 * once. Work only some ranks do, and failures only one rank can meet,
 * are followed by an agreement (dp_dist_agree_timeout), so no rank goes
 * on into a collective the others have left; every wait between them is
 * bounded by --watchdog, or CLI_RANKS_WAIT_DEFAULT without it. A signal
 * reaching any rank stops every rank at the same step (agreed before
 * each step).
 *
 * The files, one concern each (lm_train.h: what they share): options.c
 * (defaults, --help, parsing), signals.c, ranks.c (the rank glue),
 * setup.c (everything before the first step), data.c (text and token
 * files, batch samplers), checkpoint.c (--save, --resume), train.c (the
 * loop), eval.c (losses), log.c (summary, progress, --log, --trace),
 * sample.c (prompt and generation), export.c (--init-from, --export-hf).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lm_train.h"

/* Frees what the run holds (every field may still be NULL). */
static void run_free(run *r)
{
    if (r->log) fclose(r->log);
    for (size_t i = 0; i < sizeof r->locks / sizeof r->locks[0]; i++)
        cli_unlock_output(&r->locks[i]);
    free(r->inputs);
    free(r->targets);
    free(r->prompt_ids);
    free(r->prompt_text);
    dp_sampler_destroy(r->train);
    dp_sampler_destroy(r->eval_train);
    dp_sampler_destroy(r->eval_val);
    dp_trace_destroy(r->trace);
    dp_engine_destroy(r->engine);
    dp_gpt_destroy(r->gpt);
    dp_token_data_destroy(r->data);
    dp_tokenizer_destroy(r->tok);
    dp_checkpoint_close(r->ck);
    free(r->init_params);
}

/* Leaves before setup (joining the ranks or comparing the options
 * failed, or --help). */
static int leave(run *r, int code)
{
    cli_ranks_leave(&r->rk, code);
    return code;
}

/* Leaves after setup: frees the run; a broken job (some rank may wait in
 * a collective that will never complete) is aborted. */
static int finish(run *r, int rc)
{
    /* A failed write to stdout or --log fails the run (train.c saved the
     * model first); exit alone cannot change the status. */
    if (check_written(r) && !rc) rc = 1;
    int code = rc ? (r->exit_code ? r->exit_code : 1) : 0;
    /* A worker that never came back from a device call (the watchdog's
     * second period): destroying the engine would wait for it forever
     * (dp/engine.h), and so could the BLAS library's exit handlers. The
     * process leaves at once. */
    if (rc && r->engine && dp_engine_usable(r->engine) == DP_ERR_TIMEOUT) {
        r->rk.broken = r->rk.ranks > 1; /* the others: aborted, not waited for */
        cli_ranks_leave(&r->rk, code);
        fflush(stdout);
        fflush(stderr);
        _exit(code);
    }
    run_free(r);
    return leave(r, code);
}

int main(int argc, char **argv)
{
    cli_set_program("lm_train");
    install_signal_handlers();
    run r;
    memset(&r, 0, sizeof r);
    r.saved_step = -1;
    defaults(&r.o);
    if (join_ranks(&r, &argc, &argv)) return leave(&r, 1);
    /* Quietly: the ranks first compare their options, then say what is wrong. */
    cli_set_quiet(1);
    int pa = parse_args(argc, argv, &r.o);
    cli_set_quiet(0);
    if ((pa = compare_options(&r, pa))) /* -1: --help, which must have reached stdout */
        return leave(&r, pa > 0 ? 2 : cli_check_stream(stdout, "the help to standard output"));
    int rc = setup(&r);
    run_signals(r.rk.ranks > 1);
    if (!rc && r.o.eval_only) {
        rc = export_hf(&r);
        if (!rc) rc = print_val_loss(&r, 0);
    } else if (!rc) {
        rc = finish_trace(&r, train(&r));
        if (!rc) rc = export_hf(&r);
        if (!rc) rc = print_val_loss(&r, 1);
        if (!rc && r.o.sample > 0) rc = generate(&r);
    }
    return finish(&r, rc);
}
