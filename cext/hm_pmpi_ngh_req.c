/* hybridmpi's PMPI library, the neighbourhood collectives (hm_pmpi_ngh.c): the generalized
 * requests of the non-blocking calls, the registry that tells them from the MPI's own in one
 * load, and the completion calls (MPI_Wait, Waitall, Waitany, Waitsome, the Test family,
 * MPI_Request_get_status, MPI_Request_free), which drive the library's calls, then hand the
 * requests to the MPI's own. */
#define _GNU_SOURCE
#include "hm_ngh.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ the registry */

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static op *registry;            /* every call whose request MPI has not freed */
static _Atomic int registered;
/* By a hash of the request: how many of the registry's requests have it.  A request whose word
 * is 0 is not the library's, seen without a lock. */
enum { FILTER_BITS = 12 };
static _Atomic uint16_t filter[1 << FILTER_BITS];

static inline unsigned request_hash(MPI_Request r)
{
    uint64_t x = (uint64_t)(uintptr_t)r;
    return (unsigned)((x * 0x9E3779B97F4A7C15ULL) >> (64 - FILTER_BITS));
}

/* The registry's first LIVE requests, by slot (a slot keeps its request until MPI frees it):
 * the array calls compare each entry with them, in a loop the compiler vectorises. */
enum { LIVE = 8 };
static MPI_Request live[LIVE];
static _Atomic int live_used[LIVE];
static _Atomic int unlisted;    /* the registry's requests in no slot */

/* Whether r may be one of this library's calls (0: it is not). */
static inline int maybe_ours(MPI_Request r)
{
    return atomic_load_explicit(&registered, memory_order_relaxed) != 0 && r != MPI_REQUEST_NULL &&
           atomic_load_explicit(&filter[request_hash(r)], memory_order_relaxed) != 0;
}

/* ------------------------------------------------------------------ generalized requests */

static int greq_query(void *extra, MPI_Status *st)
{
    op *o = extra;
    PMPI_Status_set_elements(st, MPI_BYTE, 0);
    PMPI_Status_set_cancelled(st, 0);
    st->MPI_SOURCE = MPI_UNDEFINED;
    st->MPI_TAG = MPI_UNDEFINED;
    st->MPI_ERROR = o->rc ? MPI_ERR_OTHER : MPI_SUCCESS;
    return MPI_SUCCESS;
}

/* MPI freed the request: the call leaves the registry. */
static int greq_free(void *extra)
{
    op *o = extra;
    pthread_mutex_lock(&reg_lock);
    for (op **at = &registry; *at; at = &(*at)->reg_next)
        if (*at == o) {
            *at = o->reg_next;
            atomic_fetch_sub(&filter[request_hash(o->greq)], 1);
            if (o->slot >= 0)
                atomic_store(&live_used[o->slot], 0);
            else
                atomic_fetch_sub(&unlisted, 1);
            atomic_fetch_sub(&registered, 1);
            break;
        }
    pthread_mutex_unlock(&reg_lock);
    ngh_op_unref(o);
    return MPI_SUCCESS;
}

/* A collective call cannot be cancelled (MPI_Cancel of one is erroneous): nothing happens. */
static int greq_cancel(void *extra, int complete)
{
    (void)extra, (void)complete;
    return MPI_SUCCESS;
}

/* The call behind request r, with a reference the caller drops (op_unref), or NULL. */
static op *ours(MPI_Request r)
{
    if (!maybe_ours(r))
        return NULL;
    pthread_mutex_lock(&reg_lock);
    op *o = registry;
    while (o && o->greq != r)
        o = o->reg_next;
    if (o)
        atomic_fetch_add(&o->refs, 1);
    pthread_mutex_unlock(&reg_lock);
    return o;
}

/* Call o's generalized request, registered: 1, else 0 (MPI made none: o->greq is
 * MPI_REQUEST_NULL). */
int ngh_request(op *o)
{
    if (PMPI_Grequest_start(greq_query, greq_free, greq_cancel, o, &o->greq) != MPI_SUCCESS) {
        o->greq = MPI_REQUEST_NULL;
        return 0;
    }
    pthread_mutex_lock(&reg_lock);
    o->reg_next = registry;
    registry = o;
    atomic_fetch_add(&filter[request_hash(o->greq)], 1);
    o->slot = -1;
    for (int i = 0; i < LIVE && o->slot < 0; i++)
        if (!atomic_load(&live_used[i])) {
            __atomic_store_n(&live[i], o->greq, __ATOMIC_RELAXED);
            atomic_store_explicit(&live_used[i], 1, memory_order_release);
            o->slot = i;
        }
    if (o->slot < 0)
        atomic_fetch_add(&unlisted, 1);
    atomic_fetch_add(&registered, 1);
    pthread_mutex_unlock(&reg_lock);
    return 1;
}

/* ------------------------------------------------------------------ completion calls */

/* The completion calls drive this library's calls among `reqs` (all of them to their end with
 * `block`, else a step each), then hand the array to the MPI's own.  bad[i]: request i was
 * one of this library's calls, and it failed (bad may be NULL where none is the library's). */
static int drive(int n, const MPI_Request *reqs, int block, unsigned char *bad)
{
    int any = 0;
    for (int i = 0; i < n; i++) {
        if (bad)
            bad[i] = 0;
        op *o = maybe_ours(reqs[i]) ? ours(reqs[i]) : NULL;
        if (o == NULL)
            continue;
        any = 1;
        ngh *g = o->g;   /* (kept by the call's reference, past its communicator's free) */
        pthread_mutex_lock(&g->lock);
        if (!o->done)
            ngh_advance(g, o, block);
        if (bad)
            bad[i] = o->done && o->rc != HM_OK;
        pthread_mutex_unlock(&g->lock);
        ngh_op_unref(o);
    }
    return any;
}

/* Whether any of reqs[0:n] is one of l[0:LIVE]: no branch in the loop. */
__attribute__((optimize("O3"))) static int any_of(int n, const MPI_Request *reqs, const MPI_Request *l)
{
    int hit = 0;
    for (int i = 0; i < n; i++) {
        MPI_Request r = reqs[i];
        hit |= (r == l[0]) | (r == l[1]) | (r == l[2]) | (r == l[3]) | (r == l[4]) | (r == l[5]) |
               (r == l[6]) | (r == l[7]);
    }
    return hit;
}

/* Whether any of `reqs` may be this library's: compared with the live slots, or (more of the
 * library's requests than slots) a filter load each. */
static int any_ours(int n, const MPI_Request *reqs)
{
    if (atomic_load_explicit(&registered, memory_order_relaxed) == 0 || n <= 0)
        return 0;
    if (atomic_load_explicit(&unlisted, memory_order_relaxed) == 0) {
        MPI_Request l[LIVE];
        int k = 0;
        for (int i = 0; i < LIVE; i++)
            if (atomic_load_explicit(&live_used[i], memory_order_acquire))
                l[k++] = __atomic_load_n(&live[i], __ATOMIC_RELAXED);
        if (k == 0)   /* (one being registered now: not one of these) */
            return 0;
        for (int i = k; i < LIVE; i++)
            l[i] = l[0];
        return any_of(n, reqs, l);
    }
    for (int i = 0; i < n; i++)
        if (maybe_ours(reqs[i]))
            return 1;
    return 0;
}

/* What the MPI's call returned, with this library's failures: MPI_ERR_IN_STATUS and each
 * status's error for calls on arrays (every returned status's, as the standard wants),
 * MPI_ERR_OTHER for one request.  `idx`: the statuses' requests (Waitsome, Testsome; NULL:
 * status i is request i), `count` of them. */
static int with_failures(int rc, int count, const int *idx, const unsigned char *bad, MPI_Status *st,
                         int array)
{
    int any = 0;
    for (int k = 0; k < count; k++)
        any |= bad[idx ? idx[k] : k];
    if (!any)
        return rc;
    if (!array)
        return MPI_ERR_OTHER;
    for (int k = 0; st != MPI_STATUSES_IGNORE && k < count; k++)
        st[k].MPI_ERROR = bad[idx ? idx[k] : k] ? MPI_ERR_OTHER
                          : rc == MPI_ERR_IN_STATUS ? st[k].MPI_ERROR : MPI_SUCCESS;
    return MPI_ERR_IN_STATUS;
}

typedef int (*wait_fn)(MPI_Request *, MPI_Status *);
typedef int (*test_fn)(MPI_Request *, int *, MPI_Status *);
typedef int (*waitall_fn)(int, MPI_Request *, MPI_Status *);
typedef int (*testall_fn)(int, MPI_Request *, int *, MPI_Status *);
typedef int (*waitany_fn)(int, MPI_Request *, int *, MPI_Status *);
typedef int (*testany_fn)(int, MPI_Request *, int *, int *, MPI_Status *);
typedef int (*some_fn)(int, MPI_Request *, int *, int *, MPI_Status *);
typedef int (*free_fn)(MPI_Request *);
/* One request that may be the library's (r may be NULL: MPI says so). */
#define MINE(r) __builtin_expect((r) != NULL && maybe_ours(*(r)), 0)

static int __attribute__((noinline)) wait_ours(MPI_Request *r, MPI_Status *st, wait_fn f)
{
    unsigned char bad;
    drive(1, r, 1, &bad);
    return with_failures(f(r, st), 1, NULL, &bad, st, 0);
}

EXPORT int MPI_Wait(MPI_Request *r, MPI_Status *st)
{
    NEXT(wait_fn, "MPI_Wait");
    if (!MINE(r))
        return f_(r, st);
    return wait_ours(r, st, f_);
}

EXPORT int MPI_Test(MPI_Request *r, int *flag, MPI_Status *st)
{
    NEXT(test_fn, "MPI_Test");
    if (!MINE(r))
        return f_(r, flag, st);
    unsigned char bad;
    drive(1, r, 0, &bad);
    int rc = f_(r, flag, st);
    return *flag ? with_failures(rc, 1, NULL, &bad, st, 0) : rc;
}

EXPORT int MPI_Request_get_status(MPI_Request r, int *flag, MPI_Status *st)
{
    typedef int (*status_fn)(MPI_Request, int *, MPI_Status *);
    NEXT(status_fn, "MPI_Request_get_status");
    if (!MINE(&r))
        return f_(r, flag, st);
    unsigned char bad;
    drive(1, &r, 0, &bad);
    int rc = f_(r, flag, st);
    return *flag ? with_failures(rc, 1, NULL, &bad, st, 0) : rc;
}

/* A freed call still completes: in later calls on its communicator, or when it is freed. */
EXPORT int MPI_Request_free(MPI_Request *r)
{
    NEXT(free_fn, "MPI_Request_free");
    if (MINE(r))
        drive(1, r, 0, NULL);
    return f_(r);
}

/* The calls on arrays: a flag per request on the stack for short arrays. */
#define BAD_FLAGS(n)                                                                             \
    unsigned char small_[64], *bad = (n) <= 64 ? small_ : malloc((size_t)(n));                   \
    if (bad == NULL)                                                                             \
        return MPI_ERR_NO_MEM

static void free_flags(unsigned char *bad, const unsigned char *small)
{
    if (bad != small)
        free(bad);
}

EXPORT int MPI_Waitall(int n, MPI_Request reqs[], MPI_Status st[])
{
    NEXT(waitall_fn, "MPI_Waitall");
    if (!any_ours(n, reqs))
        return f_(n, reqs, st);
    BAD_FLAGS(n);
    drive(n, reqs, 1, bad);
    int rc = with_failures(f_(n, reqs, st), n, NULL, bad, st, 1);
    free_flags(bad, small_);
    return rc;
}

EXPORT int MPI_Testall(int n, MPI_Request reqs[], int *flag, MPI_Status st[])
{
    NEXT(testall_fn, "MPI_Testall");
    if (!any_ours(n, reqs))
        return f_(n, reqs, flag, st);
    BAD_FLAGS(n);
    drive(n, reqs, 0, bad);
    int rc = f_(n, reqs, flag, st);
    if (*flag)
        rc = with_failures(rc, n, NULL, bad, st, 1);
    free_flags(bad, small_);
    return rc;
}

/* The library's calls among `reqs` that are still pending fail (HYBRIDMPI_PMPI_TIMEOUT). */
static void expire(int n, const MPI_Request *reqs)
{
    for (int i = 0; i < n; i++) {
        op *o = ours(reqs[i]);
        if (o == NULL)
            continue;
        ngh *g = o->g;
        pthread_mutex_lock(&g->lock);
        for (op *p = g->head; p && !o->done; p = g->head) {   /* (in order, up to it) */
            if (!p->done)
                ngh_fail(p, HM_ETIMEOUT, -1);
            ngh_retire(g, p);
        }
        pthread_mutex_unlock(&g->lock);
        ngh_op_unref(o);
    }
}

/* Waitany and Waitsome (`block`), Testany and Testsome: this library's calls a step at a time
 * between tests of the whole array, so that whichever request completes first ends the wait
 * (as MPI's own).  *flagp: Testany's flag (NULL for the others). */
static int first_of(int n, MPI_Request reqs[], int *idx, int *flagp, int *outcount, int *indices,
                    MPI_Status *st, testany_fn any, some_fn some, int block)
{
    BAD_FLAGS(n);
    int rc, flag = 0;
    int64_t polls = 0;
    hm_wait_policy pol = plain_policy();
    HM_SLOW(w);
    for (;;) {
        int mine = drive(n, reqs, 0, bad);
        if (any) {
            rc = any(n, reqs, idx, &flag, st);
            if (flag && mine && *idx != MPI_UNDEFINED && bad[*idx] && rc == MPI_SUCCESS)
                rc = MPI_ERR_OTHER;
        } else {
            rc = some(n, reqs, outcount, indices, st);
            flag = *outcount != 0;
            if (mine && flag && *outcount != MPI_UNDEFINED)
                rc = with_failures(rc, *outcount, indices, bad, st, 1);
        }
        if (flag || rc != MPI_SUCCESS || !block)
            break;
        if (idle(&polls, &w, &pol) && mine)   /* the deadline: this library's calls fail */
            expire(n, reqs);
    }
    if (flagp)
        *flagp = flag;
    free_flags(bad, small_);
    return rc;
}

EXPORT int MPI_Waitany(int n, MPI_Request reqs[], int *idx, MPI_Status *st)
{
    NEXT(waitany_fn, "MPI_Waitany");
    static testany_fn any;
    if (!any_ours(n, reqs))
        return f_(n, reqs, idx, st);
    if (any == NULL)
        any = (testany_fn)pmpi_next("MPI_Testany", "PMPI_Testany");
    return first_of(n, reqs, idx, NULL, NULL, NULL, st, any, NULL, 1);
}

EXPORT int MPI_Waitsome(int n, MPI_Request reqs[], int *outcount, int indices[], MPI_Status st[])
{
    NEXT(some_fn, "MPI_Waitsome");
    static some_fn some;
    if (!any_ours(n, reqs))
        return f_(n, reqs, outcount, indices, st);
    if (some == NULL)
        some = (some_fn)pmpi_next("MPI_Testsome", "PMPI_Testsome");
    return first_of(n, reqs, NULL, NULL, outcount, indices, st, NULL, some, 1);
}

EXPORT int MPI_Testany(int n, MPI_Request reqs[], int *idx, int *flag, MPI_Status *st)
{
    NEXT(testany_fn, "MPI_Testany");
    if (!any_ours(n, reqs))
        return f_(n, reqs, idx, flag, st);
    return first_of(n, reqs, idx, flag, NULL, NULL, st, f_, NULL, 0);
}

EXPORT int MPI_Testsome(int n, MPI_Request reqs[], int *outcount, int indices[], MPI_Status st[])
{
    NEXT(some_fn, "MPI_Testsome");
    if (!any_ours(n, reqs))
        return f_(n, reqs, outcount, indices, st);
    return first_of(n, reqs, NULL, NULL, outcount, indices, st, NULL, f_, 0);
}
