/*
 * examples/lm_train/signals.c - SIGINT, SIGTERM and SIGHUP: before training
 * begins either ends the process at once; then the first stops the run
 * after the current step (the loops ask pending_signal), a second exits at
 * once; the exit status is 128 + the signal's number. The other fatal
 * signals (QUIT, XFSZ, USR1, ...) kill the run as cli_guard_signals says,
 * and neither leaves a temporary file behind. SIGBUS, a token file cut
 * short under its mapping: a message naming the data, exit 1.
 */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "lm_train.h"

// --- the handler ------------------------------------------------------------------------

/* The first SIGINT/SIGTERM's number; the loops check it between steps. */
static volatile sig_atomic_t stop_signal;

/* Until the run begins (run_signals), a signal ends the process at once:
 * setup has nothing to save, and a call it interrupts (an open() of a
 * slow file) would restart and hold the signal until it returns. */
static volatile sig_atomic_t starting = 1;

/* Under mpirun: make stdout and stderr non-blocking when a signal comes. */
static volatile sig_atomic_t unblock_output;

static void say(const char *msg, size_t n)
{
    ssize_t w = write(STDERR_FILENO, msg, n);
    (void)w;
}

/* Before exiting at once: no partial checkpoint, trace or export is left
 * (their writers' temporary files), and the message says so; nor the
 * outputs' lock files (cli_lock_output). */
static void leave_no_temp(void)
{
    cli_remove_guarded();
    /* "any earlier": a first save or export has none */
    static const char msg[] = "lm_train: the file being written was removed; any earlier "
                              "version of it is unchanged\n";
    if (dp_atomic_file_remove_temps() > 0) say(msg, sizeof msg - 1);
}

static void on_signal(int sig)
{
    if (starting) {
        static const char term[] = "lm_train: interrupted by SIGTERM before training began\n";
        static const char intr[] = "lm_train: interrupted by SIGINT before training began\n";
        static const char hup[] = "lm_train: interrupted by SIGHUP before training began\n";
        if (sig == SIGINT) say(intr, sizeof intr - 1);
        else if (sig == SIGHUP) say(hup, sizeof hup - 1);
        else say(term, sizeof term - 1);
        leave_no_temp();
        _exit(128 + sig);
    }
    if (unblock_output) {
        /* mpirun, signalled, stops reading the ranks' output, then sends
         * them SIGTERM: a write to a full pseudo-terminal would block rank 0
         * (and every rank waiting for it) until mpirun's SIGKILL, so it
         * must fail instead. fcntl is async-signal-safe; the write this
         * signal interrupted restarts non-blocking. */
        for (int fd = STDOUT_FILENO; fd <= STDERR_FILENO; fd++) {
            int fl = fcntl(fd, F_GETFL);
            if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
        }
    }
    if (stop_signal) {
        static const char msg[] = "lm_train: second signal: exiting at once\n";
        say(msg, sizeof msg - 1);
        leave_no_temp();
        _exit(128 + sig);
    }
    stop_signal = sig;
}

void install_signal_handlers(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART; /* no EINTR in the middle of a write */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    /* a closed terminal or ssh session stops the run as Ctrl-C does, unless
     * the run was started to outlive it (nohup: SIGHUP ignored) */
    struct sigaction old;
    if (sigaction(SIGHUP, NULL, &old) == 0 && old.sa_handler != SIG_IGN)
        sigaction(SIGHUP, &sa, NULL);
    /* SIGPIPE is ignored (cli_set_program): a reader that quits (| head)
     * makes a write fail with EPIPE, which check_written turns into: save,
     * then stop naming standard output */
}

/* ranked: under mpirun, which on SIGINT/SIGTERM stops forwarding the
 * ranks' output, sends them SIGTERM and 1 s later SIGKILL (Open MPI's
 * odls_base_sigkill_timeout): no write may block or kill (SIGPIPE) a rank
 * before it saves. */
void run_signals(int ranked)
{
    unblock_output = ranked; /* SIGPIPE is already ignored (cli_set_program) */
    starting = 0;
}

// --- token files cut while mapped -------------------------------------------------------

/* What the SIGBUS handler writes: set before the files are mapped. */
static char bus_msg[768];
static size_t bus_len;

static void on_bus(int sig)
{
    (void)sig;
    say(bus_msg, bus_len);
    _exit(1);
}

/* The token files are read through their mappings: a file cut short (or
 * unreadable) under a mapping raises SIGBUS at the next read of a page
 * past its end, which would kill the process without a word. The handler
 * names the data and exits 1; nothing can be saved from inside it (the
 * ranks, the engine may be anywhere), so the last checkpoint is what
 * remains. */
void catch_bus_errors(const run *r, const char *data)
{
    char who[32] = "";
    if (r->rk.ranks > 1) snprintf(who, sizeof who, "rank %d: ", r->rk.rank);
    int n = snprintf(bus_msg, sizeof bus_msg,
                     "lm_train: %sa token file of --data %s was cut short or could not be read "
                     "while mapped (SIGBUS); the run stops here without saving: restore the "
                     "files (they must not change during a run) and resume from the last "
                     "checkpoint\n", who, data);
    bus_len = n < 0 ? 0 : (size_t)n < sizeof bus_msg ? (size_t)n : sizeof bus_msg - 1;
    if (bus_len && bus_msg[bus_len - 1] != '\n') bus_msg[bus_len - 1] = '\n';
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_bus;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
}

int pending_signal(void) { return stop_signal; }

// --- stopping for a signal ------------------------------------------------------------

const char *signal_name(int sig)
{
    return sig == SIGINT ? "SIGINT" : sig == SIGHUP ? "SIGHUP" : "SIGTERM";
}

/* The run stops for signal sig: main returns 128 + sig. */
void exit_on_signal(run *r, int sig) { r->exit_code = 128 + sig; }

/* Signal sig arrived during evaluation or sampling: stop there. */
int interrupted(run *r, int sig, const char *during)
{
    fflush(stdout);
    exit_on_signal(r, sig);
    return AGREED_FAIL(r, "interrupted by %s during %s%s%s", signal_name(sig), during,
                       r->saved_step >= 0 ? "; the checkpoint was saved to " : "",
                       r->saved_step >= 0 ? r->o.save : "");
}
