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
        if (rc != HM_OK)
            return wait_failed(&p->err, &p->policy, rc, i, HM_CNT_SYNC_IMAGES, want, seen);
    }
    return HM_OK;
}
