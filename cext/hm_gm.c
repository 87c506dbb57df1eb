/* hybridmpi C core: one-sided access to a peer's shared memory (put, get,
 * strided sections, atomics) and the pairwise counters of sync_images.
 * See hm_core.h for the contract of each exported function. */
#define _GNU_SOURCE
#include "hm_wait.h"

#include <string.h>

void (*hm_progress_hook)(void) = NULL;

void hm_set_progress(void (*fn)(void)) { hm_progress_hook = fn; }

void hm_put(void *dst, const void *src, uint64_t nbytes)
{
    memcpy(dst, src, nbytes);
    atomic_thread_fence(memory_order_release);
}

void hm_get(void *dst, const void *src, uint64_t nbytes)
{
    atomic_thread_fence(memory_order_acquire);
    memcpy(dst, src, nbytes);
}

/* Copy one dimension of a strided section; the innermost dimension moves
 * with one memcpy when both sides are contiguous there. */
static void copy_dim(char *dst, const int64_t *dstride, const char *src, const int64_t *sstride,
                     const int64_t *shape, int ndim, int64_t itemsize)
{
    int64_t n = shape[0];
    if (ndim == 1) {
        if (dstride[0] == itemsize && sstride[0] == itemsize) {
            memcpy(dst, src, (size_t)(n * itemsize));
            return;
        }
        switch (itemsize) {
        case 4:
            for (int64_t i = 0; i < n; i++)
                memcpy(dst + i * dstride[0], src + i * sstride[0], 4);
            return;
        case 8:
            for (int64_t i = 0; i < n; i++)
                memcpy(dst + i * dstride[0], src + i * sstride[0], 8);
            return;
        default:
            for (int64_t i = 0; i < n; i++)
                memcpy(dst + i * dstride[0], src + i * sstride[0], (size_t)itemsize);
            return;
        }
    }
    for (int64_t i = 0; i < n; i++)
        copy_dim(dst + i * dstride[0], dstride + 1, src + i * sstride[0], sstride + 1, shape + 1,
                 ndim - 1, itemsize);
}

int hm_copy_strided(void *dst, const int64_t *dst_strides, const void *src,
                    const int64_t *src_strides, const int64_t *shape, int ndim, int64_t itemsize)
{
    if (ndim < 0 || itemsize <= 0)
        return HM_EARG;
    for (int d = 0; d < ndim; d++)
        if (shape[d] <= 0)
            return HM_OK;
    atomic_thread_fence(memory_order_acquire);
    if (ndim == 0)
        memcpy(dst, src, (size_t)itemsize);
    else
        copy_dim(dst, dst_strides, src, src_strides, shape, ndim, itemsize);
    atomic_thread_fence(memory_order_release);
    return HM_OK;
}

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
    int ord = p->policy.order;
    p->err.code = HM_OK;
    for (int i = 0; i < p->n; i++)
        store_rel((hm_counter *)p->signal[i], p->signal_value[i], ord);
    for (int i = 0; i < p->n; i++) {
        uint64_t seen = 0;
        if (wait_geq((const hm_counter *)p->wait[i], p->wait_value[i], &p->policy, &seen) != HM_OK) {
            p->err.code = HM_ETIMEOUT;
            p->err.peer = i;
            p->err.epoch = p->wait_value[i];
            p->err.seen = seen;
            return HM_ETIMEOUT;
        }
    }
    return HM_OK;
}
