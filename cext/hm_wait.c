/* hybridmpi C core: the state every wait shares (hm_wait.h): the progress
 * and warning hooks, the chaos hook of the drift tests, and the profile
 * clock.  The collectives, the ghost exchange and global memory all wait
 * through hm_wait.h, so each links with this unit alone.  See hm_core.h for
 * the contract of each exported function. */
#define _GNU_SOURCE
#include "hm_wait.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ hooks */

void (*hm_progress_hook)(void) = NULL;

void hm_set_progress(void (*fn)(void)) { hm_progress_hook = fn; }

/* ------------------------------------------------------------------ interrupts */

volatile sig_atomic_t hm_signal = 0;
_Atomic int hm_in_wait = 0;

static void on_signal(int sig)
{
    if (atomic_load_explicit(&hm_in_wait, memory_order_relaxed)) {
        hm_signal = sig;
        return;
    }
    /* outside the library's waits: what the default action would have done */
    signal(sig, SIG_DFL);
    raise(sig);
}

int hm_catch_signal(int sig)
{
    struct sigaction old, sa;
    if (sigaction(sig, NULL, &old) != 0 || old.sa_handler != SIG_DFL)
        return 0;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    return sigaction(sig, &sa, NULL) == 0;
}

void hm_interrupt(int sig) { hm_signal = sig; }

int hm_interrupted(void) { return hm_signal; }

int hm_wait_tick(int on)
{
    atomic_store_explicit(&hm_in_wait, on, memory_order_relaxed);
    return hm_signal;
}

void (*hm_warn_hook)(const void *, uint64_t, uint64_t, double) = NULL;

void hm_set_warn(void (*fn)(const void *, uint64_t, uint64_t, double)) { hm_warn_hook = fn; }

/* ------------------------------------------------------------------ profile clock */

int64_t hm_prof[3];
int hm_prof_nest = 0;

#define HM_PROF_DEPTH 16
static int64_t prof_t0[HM_PROF_DEPTH];
static int prof_depth = 0;

void hm_prof_begin(void)
{
    if (prof_depth < HM_PROF_DEPTH)
        prof_t0[prof_depth] = now_ns();
    prof_depth++;
    hm_prof[0] = hm_prof[1] = 0;
}

void hm_prof_abort(void)
{
    if (prof_depth > 0)
        prof_depth--;
}

int hm_prof_end_bytes(hm_prof_log *log, int64_t nbytes)
{
    int64_t t1 = now_ns(), a = hm_prof[0], b = hm_prof[1];
    /* an end without its begin (depth 0) times nothing, never reads prof_t0[-1]; calls nested
     * deeper than HM_PROF_DEPTH share the deepest stamp */
    int deepest = prof_depth > HM_PROF_DEPTH ? HM_PROF_DEPTH : prof_depth;
    int64_t t0 = deepest > 0 ? prof_t0[deepest - 1] : t1;
    if (prof_depth > 0)
        prof_depth--;
    if (log->n == log->cap && log->n < log->limit) {
        int64_t cap = log->cap ? 2 * log->cap : 1024;
        if (cap > log->limit)
            cap = log->limit;
        /* cap records of 6 words: a limit past what size_t holds fails as out of memory */
        int64_t *rec = (uint64_t)cap > SIZE_MAX / (6 * sizeof(int64_t))
                           ? NULL : realloc(log->rec, (size_t)cap * 6 * sizeof(int64_t));
        if (rec != NULL) {
            log->rec = rec;
            log->cap = cap;
        }
    }
    if (log->n == log->cap) {
        log->over[0] += 1;
        log->over[1] += nbytes;
        log->over[2] += t1 - t0;
        log->over[3] += (a && b >= a) ? b - a : 0;
        return log->n < log->limit ? -1 : 0;
    }
    int64_t *r = log->rec + 6 * log->n++;
    r[0] = t0;
    r[1] = a;
    r[2] = b;
    r[3] = t1;
    r[4] = 0;
    r[5] = nbytes;
    return 0;
}

int hm_prof_end(hm_prof_log *log) { return hm_prof_end_bytes(log, log->nbytes); }

void hm_prof_free(hm_prof_log *log)
{
    free(log->rec);
    log->rec = NULL;
    log->n = log->cap = 0;
}

/* ------------------------------------------------------------------ chaos */

int hm_chaos_on = 0;
static uint64_t chaos_state = 1;
static int64_t chaos_max_ns = 0;

void hm_set_chaos(uint64_t seed, int64_t max_ns)
{
    chaos_state = seed * 0x9E3779B97F4A7C15ULL + 1;
    chaos_max_ns = max_ns;
    hm_chaos_on = max_ns > 0;
}

/* One protocol point under chaos: most pass at once; some yield, some
 * spin a little, some sleep up to chaos_max_ns (a xorshift generator, one
 * per process, so each rank drifts its own way). */
void hm_chaos_delay(void)
{
    uint64_t x = chaos_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    chaos_state = x;
    switch (x & 15) {
    case 0: {
        struct timespec ts = {0, (long)((x >> 8) % (uint64_t)chaos_max_ns)};
        nanosleep(&ts, NULL);
        break;
    }
    case 1:
    case 2:
        sched_yield();
        break;
    case 3:
        for (uint64_t i = (x >> 8) % 2000; i > 0; i--)
            cpu_relax();
        break;
    default:
        break;
    }
}
