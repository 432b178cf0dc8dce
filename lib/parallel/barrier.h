/*
 * parallel/barrier.h - an abortable barrier (mutex + condition variable +
 * generation + abort flag).
 *
 * pthread_barrier_t cannot be abandoned: a worker that fails would leave
 * the others waiting forever. Here a failing worker calls
 * dp_barrier_abort and every waiter, present or future, returns -1 until
 * dp_barrier_reset, so a failed step unwinds without a hang.
 */
#ifndef DP_PARALLEL_BARRIER_H
#define DP_PARALLEL_BARRIER_H

#include <pthread.h>

typedef struct dp_barrier {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int parties;
    int waiting;
    unsigned long generation;
    int aborted;
    unsigned long progress; /* dp_barrier_notify's count */
} dp_barrier;

int dp_barrier_init(dp_barrier *b, int parties);
void dp_barrier_destroy(dp_barrier *b);
/* 0 when all parties arrived; -1 when the barrier is (or becomes) aborted. */
int dp_barrier_wait(dp_barrier *b);
/* The same, and the last party to arrive runs fn(arg) before any party
 * goes on (under the barrier's lock: fn must be short and must not wait
 * on the barrier); an aborted barrier runs nothing. */
int dp_barrier_wait_then(dp_barrier *b, void (*fn)(void *), void *arg);
void dp_barrier_abort(dp_barrier *b);
/* Clears the abort flag; only when no thread is waiting. */
void dp_barrier_reset(dp_barrier *b);
/* Sleeps up to `seconds` or until the barrier is aborted: 0 after the full
 * time, -1 when aborted (the injected stall of the engine's test hook). */
int dp_barrier_sleep(dp_barrier *b, double seconds);

/* Progress between the parties between two rounds (the overlap: one
 * party's gradient became final, another may reduce it): notify bumps a
 * counter and wakes the waiters; await sleeps until the counter differs
 * from *seen (then stores it there and returns 0), at most `seconds` (0),
 * or until the barrier is aborted (-1), so a failed party never leaves
 * another waiting. */
void dp_barrier_notify(dp_barrier *b);
int dp_barrier_await(dp_barrier *b, unsigned long *seen, double seconds);
/* dp_barrier_notify's count so far. */
unsigned long dp_barrier_progress(dp_barrier *b);

#endif /* DP_PARALLEL_BARRIER_H */
