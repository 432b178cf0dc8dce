/*
 * parallel/barrier.c - the abortable barrier.
 */
#include "parallel/barrier.h"

#include "core/clock.h"

int dp_barrier_init(dp_barrier *b, int parties)
{
    if (pthread_mutex_init(&b->mu, NULL) != 0) return -1;
    /* CLOCK_MONOTONIC: dp_barrier_sleep's deadline ignores wall-clock jumps. */
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&b->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (rc != 0) {
        pthread_mutex_destroy(&b->mu);
        return -1;
    }
    b->parties = parties;
    b->waiting = 0;
    b->generation = 0;
    b->aborted = 0;
    b->progress = 0;
    return 0;
}

void dp_barrier_destroy(dp_barrier *b)
{
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
}

int dp_barrier_wait(dp_barrier *b) { return dp_barrier_wait_then(b, NULL, NULL); }

int dp_barrier_wait_then(dp_barrier *b, void (*fn)(void *), void *arg)
{
    pthread_mutex_lock(&b->mu);
    if (b->aborted) {
        pthread_mutex_unlock(&b->mu);
        return -1;
    }
    unsigned long gen = b->generation;
    if (++b->waiting == b->parties) {
        /* Last to arrive: run fn while every other party waits, then open
         * the barrier for this generation. */
        if (fn) fn(arg);
        b->waiting = 0;
        b->generation++;
        pthread_cond_broadcast(&b->cv);
        pthread_mutex_unlock(&b->mu);
        return 0;
    }
    while (gen == b->generation && !b->aborted) pthread_cond_wait(&b->cv, &b->mu);
    int rc = gen == b->generation ? -1 : 0; /* woken by abort, not by the last arrival */
    if (rc) b->waiting--;
    pthread_mutex_unlock(&b->mu);
    return rc;
}

void dp_barrier_abort(dp_barrier *b)
{
    pthread_mutex_lock(&b->mu);
    b->aborted = 1;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

void dp_barrier_reset(dp_barrier *b)
{
    pthread_mutex_lock(&b->mu);
    b->aborted = 0;
    b->waiting = 0;
    pthread_mutex_unlock(&b->mu);
}

int dp_barrier_sleep(dp_barrier *b, double seconds)
{
    /* dp_deadline_at clamps a huge (or NaN) duration instead of overflowing. */
    struct timespec ts = dp_deadline_at(dp_now_seconds() + seconds);
    pthread_mutex_lock(&b->mu);
    int rc = 0;
    while (!b->aborted && rc == 0) rc = pthread_cond_timedwait(&b->cv, &b->mu, &ts);
    int aborted = b->aborted;
    pthread_mutex_unlock(&b->mu);
    return aborted ? -1 : 0;
}

void dp_barrier_notify(dp_barrier *b)
{
    pthread_mutex_lock(&b->mu);
    b->progress++;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

unsigned long dp_barrier_progress(dp_barrier *b)
{
    pthread_mutex_lock(&b->mu);
    unsigned long n = b->progress;
    pthread_mutex_unlock(&b->mu);
    return n;
}

int dp_barrier_await(dp_barrier *b, unsigned long *seen, double seconds)
{
    struct timespec ts = dp_deadline_at(dp_now_seconds() + seconds);
    pthread_mutex_lock(&b->mu);
    int rc = 0;
    /* The barrier's waiters share the condition: their wake-ups are spurious here. */
    while (!b->aborted && b->progress == *seen && rc == 0)
        rc = pthread_cond_timedwait(&b->cv, &b->mu, &ts);
    int aborted = b->aborted;
    *seen = b->progress;
    pthread_mutex_unlock(&b->mu);
    return aborted ? -1 : 0;
}
