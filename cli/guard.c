/*
 * cli/guard.c - what a fatal signal leaves (cli/dp_cli.h): the handler
 * of INT, TERM, HUP, QUIT, PIPE, XFSZ, ALRM, VTALRM, USR1 and USR2 removes
 * every atomic file's temporary file and the guarded paths (temporary
 * files, private directories, lock files), says so in one line, and dies
 * of the signal as before.
 */
#define _POSIX_C_SOURCE 200809L /* sigaction, sigprocmask */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "dp_cli.h"

// --- temporary files removed by a fatal signal ------------------------------------------

/* What a fatal signal removes: every atomic file's temporary file
 * (dp_atomic_file_remove_temps: the program's own and the library's, a
 * checkpoint's or a trace's), and the guarded paths, other temporary files
 * and private directories, removed last-added first (a directory after
 * the files in it); edited with the signals blocked. */
#define GUARD_MAX 16
static char guard_paths[GUARD_MAX][4096], guard_msg[512];
/* quiet: a lock file (cli_guard_lock), no output of the program's */
static volatile sig_atomic_t guard_n, guard_msg_len, guard_quiet[GUARD_MAX];

int cli_remove_guarded(void)
{
    int outputs = 0;
    for (int i = guard_n; i-- > 0;) {
        /* a file or an emptied directory: the other call fails, harmless */
        unlink(guard_paths[i]);
        rmdir(guard_paths[i]);
        outputs += !guard_quiet[i];
    }
    return outputs;
}

static void on_fatal_signal(int sig)
{
    int removed = dp_atomic_file_remove_temps();
    if (cli_remove_guarded() > 0 || removed) {
        ssize_t w = write(STDERR_FILENO, guard_msg, (size_t)guard_msg_len);
        (void)w;
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

static const int fatal_sigs[] = {SIGINT,  SIGTERM, SIGHUP,    SIGQUIT, SIGPIPE,
                                 SIGXFSZ, SIGALRM, SIGVTALRM, SIGUSR1, SIGUSR2};
#define N_FATAL (sizeof fatal_sigs / sizeof fatal_sigs[0])

/* Blocks (block = 1) or restores the fatal signals around an edit. */
static void guard_edit(int block, sigset_t *old)
{
    if (!block) {
        sigprocmask(SIG_SETMASK, old, NULL);
        return;
    }
    sigset_t set;
    sigemptyset(&set);
    for (size_t i = 0; i < N_FATAL; i++) sigaddset(&set, fatal_sigs[i]);
    sigprocmask(SIG_BLOCK, &set, old);
}

/* The handler's line: "<program>: stopped by a signal; <left>". */
static void set_guard_msg(const char *left)
{
    sigset_t old;
    guard_edit(1, &old);
    int n = snprintf(guard_msg, sizeof guard_msg, "%s: stopped by a signal; %s\n", cli_program(),
                     left);
    guard_msg_len = n < 0 ? 0 : (size_t)n < sizeof guard_msg ? n : (int)sizeof guard_msg - 1;
    guard_edit(0, &old);
}

void cli_guard_signals(void)
{
    static int installed;
    set_guard_msg("its outputs were left as they were");
    if (installed) return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fatal_signal;
    sigemptyset(&sa.sa_mask);
    /* a signal the program was started with ignored (nohup's HUP, a
     * parent's SIGXFSZ to see EFBIG) stays ignored */
    for (size_t i = 0; i < N_FATAL; i++) {
        struct sigaction old;
        if (sigaction(fatal_sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN) continue;
        sigaction(fatal_sigs[i], &sa, NULL);
    }
    installed = 1;
}

void cli_guard_temp(const dp_atomic_file *af, const char *what)
{
    char left[320];
    snprintf(left, sizeof left, "%s was left as it was", af && what ? what : "the output");
    set_guard_msg(af ? left : "its outputs were left as they were");
}

static int guard(const char *path, int quiet)
{
    if (!path || strlen(path) >= sizeof guard_paths[0]) return 1;
    sigset_t old;
    guard_edit(1, &old);
    int full = guard_n >= GUARD_MAX;
    if (!full) {
        memcpy(guard_paths[guard_n], path, strlen(path) + 1);
        guard_quiet[guard_n] = quiet;
        guard_n = guard_n + 1;
    }
    guard_edit(0, &old);
    return full;
}

int cli_guard_path(const char *path)
{
    return guard(path, 0);
}

int cli_guard_lock(const char *path)
{
    return guard(path, 1);
}

void cli_unguard_path(const char *path)
{
    sigset_t old;
    guard_edit(1, &old);
    for (int i = 0; path && i < guard_n; i++)
        if (strcmp(guard_paths[i], path) == 0) {
            for (int j = i + 1; j < guard_n; j++) {
                memcpy(guard_paths[j - 1], guard_paths[j], sizeof guard_paths[0]);
                guard_quiet[j - 1] = guard_quiet[j];
            }
            guard_n = guard_n - 1;
            break;
        }
    guard_edit(0, &old);
}
