/*
 * examples/lm_train/signals.c - SIGINT and SIGTERM: the first stops the
 * run after the current step (the loops ask pending_signal), a second
 * exits at once; the exit status is 128 + the signal's number.
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

/* Under mpirun: make stdout and stderr non-blocking when a signal comes. */
static volatile sig_atomic_t unblock_output;

static void on_signal(int sig)
{
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
        ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
        (void)w;
        _exit(128 + sig);
    }
    stop_signal = sig;
}

/* ranked: under mpirun, which on SIGINT/SIGTERM stops forwarding the
 * ranks' output, sends them SIGTERM and 1 s later SIGKILL (Open MPI's
 * odls_base_sigkill_timeout): no write may block or kill (SIGPIPE) a rank
 * before it saves. */
void install_signal_handlers(int ranked)
{
    unblock_output = ranked;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART; /* no EINTR in the middle of a write */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    if (ranked) signal(SIGPIPE, SIG_IGN);
}

int pending_signal(void) { return stop_signal; }

// --- stopping for a signal ------------------------------------------------------------

const char *signal_name(int sig) { return sig == SIGINT ? "SIGINT" : "SIGTERM"; }

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
