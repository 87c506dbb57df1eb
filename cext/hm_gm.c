/* hybridmpi C core: global memory's atomics on a peer's shared memory and the
 * pairwise counters of sync_images.  (Puts
 * and gets inside a node are plain copies into or out of the peer's
 * segment; the release and acquire of the synchronizations order them.)
 * See hm_core.h for the contract of each exported function. */
#define _GNU_SOURCE
#include "hm_wait.h"

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

/* The word after a pair's counter: bit (k % 64) set while the writer's call k naming the
 * reader was invalid (written by the writer alone, before the counter's release store). */
static inline _Atomic uint64_t *invalid_marks(void *counter)
{
    return (_Atomic uint64_t *)counter + 1;
}

/* The word after the marks: the last call naming the reader that the writer completed (every
 * wait of it returned), stored before anything could poison the counter. */
static inline hm_counter *completed(void *counter)
{
    return (hm_counter *)counter + 2;
}

static inline void mark_call(void *counter, uint64_t k, int invalid)
{
    _Atomic uint64_t *m = invalid_marks(counter);
    uint64_t bit = (uint64_t)1 << (k % 64), old = atomic_load_explicit(m, memory_order_relaxed);
    if (!!(old & bit) != invalid)
        atomic_store_explicit(m, old ^ bit, memory_order_relaxed);
}

int hm_signal_wait(hm_pairs *p)
{
    HM_PROFILED;
    int ord = p->policy.order;
    p->err.code = HM_OK;
    for (int i = 0; i < p->n; i++) {
        uint64_t k = ++p->calls[p->peer[i]];
        mark_call(p->signal[i], k, 0);
        store_rel((hm_counter *)p->signal[i], k, ord);
    }
    int invalid = -1;  /* the first peer whose matching call had invalid arguments */
    for (int i = 0; i < p->n; i++) {
        uint64_t seen = 0, want = p->calls[p->peer[i]];
        int rc = wait_geq((const hm_counter *)p->wait[i], want, &p->policy, &seen);
        /* The peer's HybridComm broke: it will not come, unless it had completed this call
         * before (then it broke in something later; a peer that came but failed in this call,
         * a timeout waiting for this rank say, has not completed it). */
        if (rc == HM_OK && (seen & HM_FLAGS) &&
            ((seen & ~HM_FLAGS) < want ||
             atomic_load_explicit(completed(p->wait[i]), memory_order_acquire) < want))
            rc = HM_EPEER;
        if (rc == HM_ETIMEOUT)   /* the error bits now, before a late peer reads its count */
            for (int j = 0; j < p->n; j++)
                atomic_fetch_or_explicit((hm_counter *)p->signal[j], HM_ERRBIT, memory_order_seq_cst);
        if (rc != HM_OK)
            return wait_failed(&p->err, &p->policy, rc, i, HM_CNT_SYNC_IMAGES, want, seen);
        if (invalid < 0 && (atomic_load_explicit(invalid_marks(p->wait[i]), memory_order_acquire)
                            >> (want % 64) & 1))
            invalid = i;
    }
    if (invalid >= 0)  /* every peer's call was waited for: the counts stay matched */
        return wait_failed(&p->err, &p->policy, HM_EMISMATCH, invalid, HM_CNT_SYNC_IMAGES,
                           p->calls[p->peer[invalid]], 0);
    for (int i = 0; i < p->n; i++)
        atomic_store_explicit(completed(p->signal[i]), p->calls[p->peer[i]], memory_order_release);
    return HM_OK;
}

void hm_signal_invalid(hm_pairs *p)
{
    HM_PROFILED;
    int ord = p->policy.order;
    for (int i = 0; i < p->n; i++) {
        uint64_t k = ++p->calls[p->peer[i]];
        mark_call(p->signal[i], k, 1);
        store_rel((hm_counter *)p->signal[i], k, ord);
    }
}
