/* hybridmpi C core, internal: epoch counters and the wait policy, shared by
 * the collectives (hm_core.c) and the ghost exchange (hm_halo.c). */
#ifndef HM_WAIT_H
#define HM_WAIT_H

#include "hm_core.h"

#include <sched.h>
#include <stdatomic.h>
#include <time.h>

typedef _Atomic uint64_t hm_counter;

/* Called between polls once a wait has stopped spinning (hm_set_progress):
 * lets the caller drive MPI progress, so that RMA aimed at a waiting rank
 * completes.  NULL when nothing needs it. */
extern void (*hm_progress_hook)(void);

static inline void wait_idle(int64_t since_start, const hm_wait_policy *pol,
                             const struct timespec *nap)
{
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



/* The slow part of a wait, kept out of line so the fast path stays small:
 * yield while ranks may be sharing cores, then sleep, checking the
 * deadline between polls. */
static int __attribute__((noinline, unused))
wait_slow(const hm_counter *p, uint64_t value, const hm_wait_policy *pol, uint64_t *seen)
{
    int64_t start = now_ns();
    int64_t deadline = pol->timeout_ns > 0 ? start + pol->timeout_ns : 0;
    struct timespec nap = {0, pol->sleep_ns > 0 ? pol->sleep_ns : 50000};
    for (;;) {
        uint64_t v = load_acq(p, pol->order);
        if (v >= value)
            return HM_OK;
        int64_t t = now_ns();
        if (deadline && t >= deadline) {
            *seen = v;
            return HM_ETIMEOUT;
        }
        wait_idle(t - start, pol, &nap);
    }
}

static inline int wait_geq(const hm_counter *p, uint64_t value, const hm_wait_policy *pol,
                           uint64_t *seen)
{
    for (int64_t i = 0;; i++) {
        if (load_acq(p, pol->order) >= value)
            return HM_OK;
        if (i >= pol->spin)
            return wait_slow(p, value, pol, seen);
        cpu_relax();
    }
}

#endif
