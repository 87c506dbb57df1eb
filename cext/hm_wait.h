/* hybridmpi C core, internal: epoch counters and the wait policy, shared by
 * the collectives (hm_coll.c) and the ghost exchange (hm_halo.c). */
#ifndef HM_WAIT_H
#define HM_WAIT_H

#include "hm_core.h"

#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>

typedef _Atomic uint64_t hm_counter;

/* The error bits (HM_ERRBIT, HM_MISBIT) are in hm_core.h, which Python reads. */
#define HM_FLAGS (HM_ERRBIT | HM_MISBIT)
/* The mark of a collective call made with invalid arguments (hm_coll_bad): its signals
 * carry it beside the epoch, so that a peer in a valid call, even of the same algorithm,
 * fails as for a mismatch, and a peer in an invalid call too goes on.  Epochs are compared
 * without it. */
#define HM_BADBIT (1ULL << 61)

/* The chaos hook (hm_set_chaos): random delays at protocol points, for the
 * drift tests.  Off, it is one predictable branch on a global. */
extern int hm_chaos_on;
void hm_chaos_delay(void);
#define CHAOS()                                                                \
    do {                                                                       \
        if (__builtin_expect(hm_chaos_on, 0))                                  \
            hm_chaos_delay();                                                  \
    } while (0)

/* Called once per wait that lasts policy.warn_ns (hm_set_warn), with the
 * watched word, the value waited for, the value seen and the seconds
 * waited; NULL: no warning. */
extern void (*hm_warn_hook)(const void *, uint64_t, uint64_t, double);

/* Called between polls once a wait has stopped spinning (hm_set_progress):
 * lets the caller drive MPI progress, so that RMA aimed at a waiting rank
 * completes.  NULL when nothing needs it. */
extern void (*hm_progress_hook)(void);

/* A signal that ends the waits (hm_interrupt, hm_catch_signal), and whether a
 * wait that stopped spinning is in progress (the handler's test of "inside a
 * wait": set by slow_start, cleared when the wait's hm_slow goes out of scope,
 * on every return path). */
extern volatile sig_atomic_t hm_signal;
extern _Atomic int hm_in_wait;

static inline void wait_idle(int64_t since_start, const hm_wait_policy *pol,
                             const struct timespec *nap)
{
    CHAOS();
    if (hm_progress_hook)
        hm_progress_hook();
    if (since_start < pol->yield_ns)
        sched_yield();
    else
        nanosleep(nap, NULL);
}

#if defined(__x86_64__) || defined(__i386__)
static inline void cpu_relax(void) { __builtin_ia32_pause(); }
#elif defined(__aarch64__)
static inline void cpu_relax(void) { __asm__ __volatile__("yield" ::: "memory"); }
#else
static inline void cpu_relax(void) { atomic_signal_fence(memory_order_seq_cst); }
#endif

static inline int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline int prof_enter(void)
{
    if (__builtin_expect(hm_prof[2] == 0, 1))
        return 0;
    if (hm_prof_nest++ == 0 && hm_prof[0] == 0)
        hm_prof[0] = now_ns();
    return 1;
}

static inline void prof_leave(const int *on)
{
    if (__builtin_expect(*on, 0) && --hm_prof_nest == 0)
        hm_prof[1] = now_ns();
}

/* First statement of a profiled entry point (hm_prof): entry and return times. */
#define HM_PROFILED int hm_prof_on_ __attribute__((cleanup(prof_leave), unused)) = prof_enter()

static inline uint64_t load_acq(const hm_counter *p, int order)
{
    return order == HM_SEQ_CST ? atomic_load_explicit(p, memory_order_seq_cst)
                               : atomic_load_explicit(p, memory_order_acquire);
}

static inline void store_rel(hm_counter *p, uint64_t v, int order)
{
    if (order == HM_SEQ_CST)
        atomic_store_explicit(p, v, memory_order_seq_cst);
    else
        atomic_store_explicit(p, v, memory_order_release);
}



/* The state of a wait that stopped spinning: its deadline, and whether it
 * warned already. */
typedef struct hm_slow {
    int64_t start, deadline, warn_at;
    struct timespec nap;
} hm_slow;

static inline void slow_end(hm_slow *w)
{
    if (w->start)
        atomic_store_explicit(&hm_in_wait, 0, memory_order_relaxed);
}

/* A wait's slow state: declared with HM_SLOW(w), it marks the end of the wait
 * whatever way the function returns. */
#define HM_SLOW(w) hm_slow w __attribute__((cleanup(slow_end))) = {0}

static inline void slow_start(hm_slow *w, const hm_wait_policy *pol)
{
    atomic_store_explicit(&hm_in_wait, 1, memory_order_relaxed);
    w->start = now_ns();
    w->deadline = pol->timeout_ns > 0 ? w->start + pol->timeout_ns : 0;
    w->warn_at = pol->warn_ns > 0 ? w->start + pol->warn_ns : 0;
    w->nap.tv_sec = 0;
    w->nap.tv_nsec = pol->sleep_ns > 0 ? pol->sleep_ns : 50000;
}

/* One idle step of a slow wait on `word` (for `value`; `seen` last read):
 * 1 once the deadline passed, else warn once if it lasted, idle, 0. */
static inline int slow_tick(hm_slow *w, const hm_wait_policy *pol, const void *word,
                            uint64_t value, uint64_t seen)
{
    int64_t t = now_ns();
    if ((w->deadline && t >= w->deadline) || hm_signal)
        return 1;
    if (w->warn_at && t >= w->warn_at) {
        w->warn_at = 0;
        if (hm_warn_hook)
            hm_warn_hook(word, value, seen, (double)(t - w->start) * 1e-9);
    }
    wait_idle(t - w->start, pol, &w->nap);
    return 0;
}

/* Record a failed wait in `err`: the code, the peer, the counter (HM_CNT_*)
 * and epoch it waited for, the value it read last and, for a timeout, the
 * seconds it waited.  Every wait's error is filled here, so all say the same. */
static inline int wait_failed(hm_error *err, const hm_wait_policy *pol, int code, int peer,
                              int cnt, uint64_t e, uint64_t seen)
{
    err->code = code;
    err->peer = peer;
    err->counter = cnt;
    err->epoch = e;
    err->seen = seen;
    err->waited_s = code == HM_ETIMEOUT ? (double)pol->timeout_ns * 1e-9 : 0.0;
    return code;
}

/* One idle round of a loop that polls several words and takes whichever is
 * ready first (none was this round): spin first, then the slow wait's step on
 * `word`, the last one polled (its value into *seen).  1 once the deadline
 * passed. */
static inline int idle_poll(int64_t *polls, hm_slow *w, const hm_wait_policy *pol,
                            const void *word, uint64_t value, uint64_t *seen)
{
    if ((*polls)++ < pol->spin) {
        cpu_relax();
        return 0;
    }
    if (*polls == pol->spin + 1)
        slow_start(w, pol);
    *seen = load_acq((const hm_counter *)word, pol->order);
    return slow_tick(w, pol, word, value, *seen);
}

/* The slow part of a wait, kept out of line so the fast path stays small:
 * yield while ranks may be sharing cores, then sleep, checking the
 * deadline between polls. */
static int __attribute__((noinline, unused))
wait_slow(const hm_counter *p, uint64_t value, const hm_wait_policy *pol, uint64_t *seen)
{
    HM_SLOW(w);
    slow_start(&w, pol);
    for (;;) {
        uint64_t v = load_acq(p, pol->order);
        *seen = v;
        if (v >= value)
            return HM_OK;
        if (slow_tick(&w, pol, p, value, v))
            return HM_ETIMEOUT;
    }
}

/* Wait until *p >= value; *seen is the value read last (a caller checks
 * its HM_FLAGS: a poisoned word also ends the wait). */
static inline int wait_geq(const hm_counter *p, uint64_t value, const hm_wait_policy *pol,
                           uint64_t *seen)
{
    for (int64_t i = 0;; i++) {
        uint64_t v = load_acq(p, pol->order);
        if (v >= value) {
            *seen = v;
            return HM_OK;
        }
        if (i >= pol->spin)
            return wait_slow(p, value, pol, seen);
        cpu_relax();
    }
}

#endif
