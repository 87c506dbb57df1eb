/* hybridmpi C core: global memory's atomics on a peer's shared memory, the
 * pairwise counters of sync_images, and the progress hook of waits.  (Puts
 * and gets inside a node are plain copies into or out of the peer's
 * segment; the release and acquire of the synchronizations order them.)
 * See hm_core.h for the contract of each exported function. */
#define _GNU_SOURCE
#include "hm_wait.h"

#include <stdlib.h>

void (*hm_progress_hook)(void) = NULL;

void hm_set_progress(void (*fn)(void)) { hm_progress_hook = fn; }

int64_t hm_fetch_add(void *addr, int64_t value)
{
    return atomic_fetch_add_explicit((_Atomic int64_t *)addr, value, memory_order_seq_cst);
}

int64_t hm_compare_swap(void *addr, int64_t expected, int64_t value)
{
    atomic_compare_exchange_strong_explicit((_Atomic int64_t *)addr, &expected, value,
                                            memory_order_seq_cst, memory_order_seq_cst);
    return expected;
}

int hm_signal_wait(hm_pairs *p)
{
    HM_PROFILED;
    int ord = p->policy.order;
    p->err.code = HM_OK;
    for (int i = 0; i < p->n; i++)
        store_rel((hm_counter *)p->signal[i], ++p->calls[p->peer[i]], ord);
    for (int i = 0; i < p->n; i++) {
        uint64_t seen = 0, want = p->calls[p->peer[i]];
        int rc = wait_geq((const hm_counter *)p->wait[i], want, &p->policy, &seen);
        if (rc == HM_OK && (seen & HM_FLAGS))
            rc = HM_EPEER;  /* the peer's HybridComm broke: it will not come */
        if (rc != HM_OK) {
            p->err.code = rc;
            p->err.peer = i;
            p->err.epoch = want;
            p->err.seen = seen;
            return rc;
        }
    }
    return HM_OK;
}

/* ------------------------------------------------------------------ chaos and warnings */

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
    int64_t t0 = prof_t0[prof_depth > HM_PROF_DEPTH ? HM_PROF_DEPTH - 1 : prof_depth - 1];
    if (prof_depth > 0)
        prof_depth--;
    if (log->n == log->cap && log->n < log->limit) {
        int64_t cap = log->cap ? 2 * log->cap : 1024;
        if (cap > log->limit)
            cap = log->limit;
        int64_t *rec = realloc(log->rec, (size_t)cap * 6 * sizeof(int64_t));
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

void (*hm_warn_hook)(const void *, uint64_t, uint64_t, double) = NULL;

void hm_set_warn(void (*fn)(const void *, uint64_t, uint64_t, double)) { hm_warn_hook = fn; }
