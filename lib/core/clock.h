/*
 * core/clock.h - the monotonic clock of the engine's phase timing, the
 * overflow-safe conversion of a deadline to a struct timespec, and the
 * pause between two polls of a wait for other ranks.
 *
 * Deadlines are absolute CLOCK_MONOTONIC seconds (a double). Converting a
 * huge one to time_t is undefined behaviour (1e19 s wrapped to a past
 * time and the watchdog spun at 100%), so deadlines are clamped to
 * DP_DEADLINE_MAX_SECONDS (about 31,700 years of uptime: never reached) and a NaN
 * or negative deadline means "now".
 */
#ifndef DP_CORE_CLOCK_H
#define DP_CORE_CLOCK_H

#include <time.h>

#define DP_DEADLINE_MAX_SECONDS 1e12

static inline double dp_now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The timespec of absolute monotonic time t (seconds), for
 * pthread_cond_timedwait: tv_nsec always in [0, 1e9). */
static inline struct timespec dp_deadline_at(double t)
{
    if (!(t > 0.0)) t = 0.0; /* NaN, negative */
    if (t > DP_DEADLINE_MAX_SECONDS) t = DP_DEADLINE_MAX_SECONDS;
    struct timespec ts;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    if (ts.tv_nsec < 0) ts.tv_nsec = 0;
    return ts;
}

/* The pause before poll number `spins` (from 1) of a wait for other
 * ranks: none for the first 200 (a peer already there is caught at
 * once), then 50 us, 200 us from the 1000th and 1 ms from the 3000th, so
 * a waiting rank leaves the cores to ranks still computing (ranks may
 * share cores). */
static inline void dp_poll_pause(long spins)
{
    if (spins <= 200) return;
    long us = spins < 1000 ? 50 : spins < 3000 ? 200 : 1000;
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, NULL);
}

#endif /* DP_CORE_CLOCK_H */
