/* hybridmpi C core: the protocol between the nodes (hm_core.h, "between the nodes"), the one
 * implementation that the Python library and the PMPI library both run at a node's leader.
 * It calls the MPI through the entry points of an hm_net only, so the core still builds
 * without mpi.h; its waits follow the node's wait policy (spin, yield, sleep, deadline) and
 * end early on a signal or a peer's failure notice. */
#define _GNU_SOURCE
#include <limits.h>
#include "hm_wait.h"

#include <string.h>

#if !defined(__x86_64__) && !defined(__aarch64__)
#error "hm_net passes MPI handles as intptr_t: checked for the x86-64 and AArch64 calling conventions only"
#endif

_Static_assert(HM_NTYPES == sizeof(((hm_net *)0)->types) / sizeof(intptr_t), "one MPI type per core type");
_Static_assert(HM_BXOR + 1 == sizeof(((hm_net *)0)->ops) / sizeof(intptr_t), "one MPI op per core op");

/* The leaders' combinations of what an MPI's own op may combine otherwise (hm_net_make_ops):
 * MPI's inoutvec[i] = invec[i] op inoutvec[i], by hm_combine (each op commutes). */
#define OWN_OP(name, dtype, op)                                                    \
    static void name(void *in, void *inout, int *len, void *type)                  \
    {                                                                              \
        (void)type;                                                                \
        hm_combine(inout, in, (uint64_t)*len, dtype, op);                          \
    }
OWN_OP(min_f64, HM_F64, HM_MIN)
OWN_OP(max_f64, HM_F64, HM_MAX)
OWN_OP(min_f32, HM_F32, HM_MIN)
OWN_OP(max_f32, HM_F32, HM_MAX)
OWN_OP(prod_c128, HM_C128, HM_PROD)

static const struct {
    int dtype, op;
    hm_mpi_user_fn fn;
} own[] = {{HM_F64, HM_MIN, min_f64}, {HM_F64, HM_MAX, max_f64}, {HM_F32, HM_MIN, min_f32},
           {HM_F32, HM_MAX, max_f32}, {HM_C128, HM_PROD, prod_c128}};
enum { NOWN = sizeof own / sizeof own[0] };
_Static_assert(NOWN == sizeof(((hm_net *)0)->own_ops) / sizeof(intptr_t), "one MPI op per own op");

/* The index in own[] of what the leaders combine with an op of the core's, else -1. */
static int own_op(int dtype, int op)
{
    if (dtype == HM_PYINT)   /* reduced as HM_F64 */
        dtype = HM_F64;
    for (int i = 0; i < NOWN; i++)
        if (own[i].dtype == dtype && own[i].op == op)
            return i;
    return -1;
}

/* The first call's words (hm_core.h, HM_NET_WORDS): the signature, whether the payload goes
 * inline and its negation, the lowest leader rank in the element, the inline payload. */
enum { W_SIG = 11, W_INL = 9, W_LO = 11, W_DATA = 12 };
_Static_assert(HM_NET_WORDS == W_DATA + HM_NET_INLINE / 8, "the first call's size");
_Static_assert(HM_NET_WORDS == sizeof(((hm_net *)0)->sig) / sizeof(int64_t), "hm_net.sig's size");

static int agreeing(const int64_t *s)
{
    return s[0] == 0 && s[1] == -s[2] && s[3] == -s[4] && s[5] == -s[6] && s[7] == -s[8] &&
           s[W_INL] == -s[W_INL + 1];
}

/* Whether a first call with signature s carries its payload inline (as its caller decided:
 * the checks keep a disagreeing or damaged element out of hm_combine). */
static int inline_payload(const int64_t *s)
{
    size_t esz = hm_dtype_size((int)s[5]);
    return s[W_INL] == 1 && s[1] == HM_K_ALLREDUCE_TREE && esz && s[3] >= 0 &&
           (uint64_t)s[3] <= HM_NET_INLINE / esz && hm_op_valid((int)s[5], (int)s[7]);
}

/* Whether an allreduce of `count` elements goes inline: it fits, and every leader gets the same
 * bits in any order of combination (see hm_core.h). */
static int goes_inline(const hm_net *n, uint64_t count, int dt, int op)
{
    size_t esz = hm_dtype_size(dt);
    int exact = op == HM_MIN || op == HM_MAX || n->size == 2 ||
                (dt != HM_F64 && dt != HM_F32 && dt != HM_C128 && dt != HM_PYINT);
    return esz && count <= HM_NET_INLINE / esz && exact;
}

/* The first call's op: inout = in + inout.  The signatures combine by max; the payloads only
 * where both elements agree on one call that carries it, the lower leaders' part first. */
static void first_fn(void *in, void *inout, int *len, void *type)
{
    (void)type;
    for (int e = 0; e < *len; e++) {
        const int64_t *a = (const int64_t *)in + (size_t)e * HM_NET_WORDS;
        int64_t *b = (int64_t *)inout + (size_t)e * HM_NET_WORDS;
        if (agreeing(a) && agreeing(b) && a[1] == b[1] && a[3] == b[3] && a[5] == b[5] &&
            a[7] == b[7] && a[W_INL] == b[W_INL] && inline_payload(b)) {
            if (b[W_LO] < a[W_LO]) {
                hm_combine(b + W_DATA, a + W_DATA, (uint64_t)b[3], (int)b[5], (int)b[7]);
            } else {
                int64_t t[HM_NET_INLINE / 8];
                memcpy(t, a + W_DATA, sizeof t);
                hm_combine(t, b + W_DATA, (uint64_t)b[3], (int)b[5], (int)b[7]);
                memcpy(b + W_DATA, t, sizeof t);
            }
        }
        b[W_LO] = a[W_LO] < b[W_LO] ? a[W_LO] : b[W_LO];
        for (int k = 0; k < W_SIG; k++)
            b[k] = a[k] > b[k] ? a[k] : b[k];
    }
}

int hm_net_make_ops(hm_net *n)
{
    n->first_type = n->first_op = 0;
    if (n->type_contiguous(HM_NET_WORDS, n->int64, &n->first_type) != 0 ||
        n->type_commit(&n->first_type) != 0 || n->op_create(first_fn, 1, &n->first_op) != 0) {
        hm_net_free_ops(n);
        return HM_ENET;
    }
    for (int i = 0; i < NOWN; i++) {
        if (n->op_create(own[i].fn, 1, &n->own_ops[i]) != 0) {
            n->own_ops[i] = 0;
            hm_net_free_ops(n);
            return HM_ENET;
        }
    }
    return HM_OK;
}

void hm_net_free_ops(hm_net *n)
{
    for (int i = 0; i < NOWN; i++) {
        if (n->own_ops[i] != 0)
            n->op_free(&n->own_ops[i]);
        n->own_ops[i] = 0;   /* (MPI_OP_NULL is not 0 in MPICH) */
    }
    if (n->first_op != 0)
        n->op_free(&n->first_op);
    if (n->first_type != 0)
        n->type_free(&n->first_type);
    n->first_op = n->first_type = 0;
}

/* the status of a node whose own call failed (1: its ranks disagreed) */
enum { FAILED = 2 };
/* seconds a wait goes on after a failure notice came */
static const int64_t NOTICE_GRACE_NS = 200000000;

/* Every word the node's ranks wait on gets the error bits: they fail this call too. */
static int poisoned(hm_coll *c, int code)
{
    hm_coll_poison(c, HM_ERRBIT);
    if (code != HM_ETIMEOUT && code != HM_ENOTICE) {   /* (those two set err themselves) */
        c->err.peer = -1;
        c->err.epoch = c->epoch;
    }
    c->err.code = code;
    return code;
}

/* Complete the request at `req`: HM_OK, or HM_ETIMEOUT (the deadline, or a signal: the caller
 * tells them apart), HM_ENOTICE (err.peer: the notice's rank) or HM_ENET. */
static int net_wait(hm_coll *c, hm_net *n, int64_t *req)
{
    const hm_wait_policy *pol = &c->policy;
    /* for a rank of the node that times out waiting for its leader (MPI's own calls: every
     * rank waits here, and only the leader's call is the node's) */
    if (c->rank == 0)
        hm_store(c->seg[0] + HM_OFF_ENTERED + HM_OFF_LEADER_WAIT, c->epoch, pol->order);
    unsigned char status[64];
    int flag = 0, notice = -1;
    int64_t polls = 0, grace = 0;
    HM_SLOW(w);
    for (;;) {
        if (n->test(req, &flag, status) != 0)
            return HM_ENET;
        if (flag) {
            *req = 0;   /* (hm_net_pending) */
            return HM_OK;
        }
        if (polls++ < pol->spin) {
            cpu_relax();
            continue;
        }
        if (!w.start) {
            slow_start(&w, pol);
            w.warn_at = 0;   /* the warning names shared-memory words: none here */
        }
        if (n->notice && polls % 64 == 0) {
            if (notice < 0) {
                notice = n->notice(n->notice_arg);
                grace = now_ns() + NOTICE_GRACE_NS;
            } else if (now_ns() > grace) {
                c->err.peer = notice;
                return HM_ENOTICE;
            }
        }
        if (slow_tick(&w, pol, NULL, 0, 0)) {
            if (!hm_signal && n->notice && notice < 0)
                notice = n->notice(n->notice_arg);
            if (!hm_signal && notice >= 0) {   /* the notice says why (not this rank's clock) */
                c->err.peer = notice;
                return HM_ENOTICE;
            }
            return wait_failed(&c->err, pol, HM_ETIMEOUT, -1, HM_CNT_NET, c->epoch, 0);
        }
    }
}

/* Whether the calls may block in MPI: n has blocking entry points, and nothing would end a
 * wait early (no deadline, no notices). */
static inline int blocking(const hm_coll *c, const hm_net *n)
{
    return n->allreduce != NULL && c->policy.timeout_ns <= 0 && n->notice == NULL;
}

/* The leaders' first call (hm_core.h, HM_NET_WORDS): their agreement on this node's status
 * and call, and the combination of `data` (NULL: none; an allreduce whose payload goes inline)
 * into the same words; HM_OK when every node is well and called the same, else the code of
 * what went wrong (the node is then poisoned).  The combined payload is at n->sig + W_DATA. */
static int agree(hm_coll *c, hm_net *n, int64_t failed, int64_t kind, int64_t count, int64_t dt,
                 int64_t op, const void *data)
{
    int64_t *m = n->mine, *s = n->sig;
    const int64_t inl = data != NULL;
    const int64_t sig[11] = {failed, kind, -kind, count, -count, dt, -dt, op, -op, inl, -inl};
    memcpy(m, sig, sizeof sig);
    m[W_LO] = n->rank;
    memset(m + W_DATA, 0, HM_NET_INLINE);
    if (data != NULL)
        memcpy(m + W_DATA, data, (size_t)count * hm_dtype_size((int)dt));
    n->req[0] = 0;
    const hm_error own = c->err;   /* a node that failed reports its own error, as it was */
    int rc = blocking(c, n) ? (n->allreduce(m, s, 1, n->first_type, n->first_op, n->comm) != 0
                                   ? HM_ENET : HM_OK)
             : n->iallreduce(m, s, 1, n->first_type, n->first_op, n->comm, &n->req[0]) != 0 ? HM_ENET
             : net_wait(c, n, &n->req[0]);
    if (failed == FAILED) {   /* the caller reports its own failure: a notice or a timeout met
                               * here must not rewrite it (err.peer, a node rank there, was
                               * once a notice's comm rank: an IndexError in the report) */
        if (rc != HM_OK)
            poisoned(c, rc);
        c->err = own;
        return HM_OK;
    }
    if (rc != HM_OK)
        return poisoned(c, rc);
    if (s[0] == FAILED)
        return poisoned(c, HM_EELSEWHERE);
    if (!agreeing(s))
        return HM_EDIFFERS;
    return HM_OK;
}

/* The MPI type and op of the core's `dtype` and `op` at n (the core's own op where MPI's may
 * combine otherwise); HM_EARG where n has none. */
static int mpi_pair(const hm_net *n, int dtype, int op, intptr_t *type, intptr_t *mop)
{
    if (hm_dtype_size(dtype) == 0 || !hm_op_valid(dtype, op))
        return HM_EARG;
    int k = own_op(dtype, op);
    *type = n->types[dtype];
    *mop = k >= 0 ? n->own_ops[k] : n->ops[op];
    return *type == 0 || *mop == 0 ? HM_EARG : HM_OK;
}

/* The data step: the leaders' combination of `count` elements in the node's slot. */
static int combine(hm_coll *c, hm_net *n, uint64_t count, int dt, int op)
{
    void *slot = hm_coll_slot(c, 0);
    intptr_t type, mop;
    if (mpi_pair(n, dt, op, &type, &mop) != HM_OK)
        return poisoned(c, HM_EARG);
    const void *send = n->rank == 0 ? (const void *)n->in_place : slot;
    if (blocking(c, n)) {
        if (n->reduce(send, slot, (int)count, type, mop, 0, n->comm) != 0 ||
            n->bcast(slot, (int)count, type, 0, n->comm) != 0)
            return poisoned(c, HM_ENET);
        return HM_OK;
    }
    n->req[0] = n->req[1] = 0;
    int rc = n->ireduce(send, slot, (int)count, type, mop, 0, n->comm, &n->req[0]) != 0 ? HM_ENET
             : net_wait(c, n, &n->req[0]);
    if (rc == HM_OK)
        rc = n->ibcast(slot, (int)count, type, 0, n->comm, &n->req[1]) != 0 ? HM_ENET
             : net_wait(c, n, &n->req[1]);
    return rc == HM_OK ? HM_OK : poisoned(c, rc);
}

int hm_net_barrier(hm_coll *c, hm_net *n, int method, int kind)
{
    HM_PROFILED;
    int rc = hm_barrier(c, method, HM_GATHER);
    int agreed = agree(c, n, rc != HM_OK ? FAILED : 0, kind, 0, 0, 0, NULL);
    if (rc != HM_OK)
        return rc;
    if (agreed == HM_EDIFFERS)
        return poisoned(c, HM_EDIFFERS);
    if (agreed != HM_OK)
        return agreed;
    return hm_barrier(c, method, HM_RELEASE);   /* the agreement was the barrier */
}

int hm_net_allreduce(hm_coll *c, hm_net *n, const void *send, void *recv, uint64_t count,
                     int dtype, int op)
{
    HM_PROFILED;
    size_t esz = hm_dtype_size(dtype);
    if (esz == 0 || !hm_op_valid(dtype, op))
        return HM_EARG;
    uint64_t per = c->capacity / esz, start = 0;
    if (per == 0)
        return HM_EARG;
    do {
        uint64_t k = count - start < per ? count - start : per;
        const char *sp = (const char *)send + start * esz;
        char *rp = (char *)recv + start * esz;
        int rc = hm_allreduce_chunk(c, sp, rp, k, count, dtype, op, HM_GATHER);
        /* the leaders first agree that every node passed the same arguments: combining
         * buffers of different sizes would be erroneous MPI, and a node whose ranks disagreed
         * or failed must not leave the others waiting */
        int64_t status = rc != HM_OK ? FAILED : hm_allreduce_verdict(c, 0) != -1;
        /* a call whose payload fits goes inline, in the agreement itself (count is every
         * node's, if they agree: then all of them do) */
        int inl = k == count && status == 0 && goes_inline(n, count, dtype, op);
        int agreed = agree(c, n, status, HM_K_ALLREDUCE_TREE, (int64_t)count, dtype, op,
                           inl ? hm_coll_slot(c, 0) : NULL);
        if (rc != HM_OK)
            return rc;
        if (agreed == HM_EDIFFERS)   /* the release fails on every rank of the node */
            hm_allreduce_verdict(c, n->sig[1] == HM_K_BAD ? 2 : 1);
        else if (agreed != HM_OK)
            return agreed;
        else if (inl)
            memcpy(hm_coll_slot(c, 0), n->sig + W_DATA, (size_t)count * esz);
        else if (k && (rc = combine(c, n, k, dtype, op)) != HM_OK)
            return rc;
        if ((rc = hm_allreduce_chunk(c, NULL, rp, k, count, dtype, op, HM_RELEASE)) != HM_OK)
            return rc;
        start += k;
    } while (start < count);
    return HM_OK;
}

/* Every NaN of `count` elements of a float type at p made the default quiet NaN (+, no
 * payload).  MPI's sums and products of the same values give the same bits on every rank but
 * where NaNs meet: which NaN's payload and sign survive depends on the order of the operands,
 * which MPI's algorithms choose by rank. */
#if defined(__GNUC__) && !defined(__clang__)
#define VECTORIZED __attribute__((optimize("O3")))   /* (-O2 leaves these loops scalar) */
#else
#define VECTORIZED
#endif

/* Whether any of m doubles (floats) at u is a NaN: its magnitude's bits above infinity's; one
 * pass without branches, about 0.2 ns an element where the loop is vectorized (1.5 with a
 * branch per element: 25 us on 128 KiB, a third of MPI's allreduce of it). */
static VECTORIZED int any_nan64(const uint64_t *u, uint64_t m)
{
    uint64_t acc = 0;
    for (uint64_t i = 0; i < m; i++)
        acc |= 0x7ff0000000000000ULL - (u[i] & 0x7fffffffffffffffULL);
    return (int)(acc >> 63);
}

static VECTORIZED int any_nan32(const uint32_t *u, uint64_t m)
{
    uint32_t acc = 0;
    for (uint64_t i = 0; i < m; i++)
        acc |= 0x7f800000U - (u[i] & 0x7fffffffU);
    return (int)(acc >> 31);
}

static void same_nans(void *p, uint64_t count, int dtype)
{
    if (dtype == HM_F32) {
        float *x = p;
        if (any_nan32(p, count))
            for (uint64_t i = 0; i < count; i++)
                if (x[i] != x[i])
                    x[i] = __builtin_nanf("");
    } else if (dtype == HM_F64 || dtype == HM_PYINT || dtype == HM_C128) {
        double *x = p;
        uint64_t m = dtype == HM_C128 ? 2 * count : count;
        if (any_nan64(p, m))
            for (uint64_t i = 0; i < m; i++)
                if (x[i] != x[i])
                    x[i] = __builtin_nan("");
    }
}

int hm_net_mpi_allreduce(hm_coll *c, hm_net *n, const void *send, void *recv, uint64_t count,
                         int dtype, int op)
{
    HM_PROFILED;
    intptr_t type, mop;
    if (mpi_pair(n, dtype, op, &type, &mop) != HM_OK)
        return HM_EARG;
    size_t esz = hm_dtype_size(dtype);
    c->err.code = HM_OK;
    const uint64_t most = INT_MAX;
    uint64_t start = 0;
    do {
        uint64_t m = count - start < most ? count - start : most;
        const char *sp = send == recv ? (const char *)n->in_place : (const char *)send + start * esz;
        char *rp = (char *)recv + start * esz;
        int rc;
        if (blocking(c, n)) {
            rc = n->allreduce(sp, rp, (int)m, type, mop, n->comm) != 0 ? HM_ENET : HM_OK;
        } else {
            n->req[0] = 0;
            rc = n->iallreduce(sp, rp, (int)m, type, mop, n->comm, &n->req[0]) != 0 ? HM_ENET
                 : net_wait(c, n, &n->req[0]);
        }
        if (rc != HM_OK)
            return c->err.code = rc;
        start += m;
    } while (start < count);
    if (op == HM_SUM || op == HM_PROD)
        same_nans(recv, count, dtype);
    return HM_OK;
}

int hm_net_mpi_barrier(hm_coll *c, hm_net *n)
{
    HM_PROFILED;
    c->err.code = HM_OK;
    int rc;
    /* the library's barrier orders every rank's writes to shared memory before it against
     * every read after it (MPI's own does not promise that for load/store access) */
    atomic_thread_fence(memory_order_seq_cst);
    if (blocking(c, n) && n->barrier != NULL) {
        rc = n->barrier(n->comm) != 0 ? HM_ENET : HM_OK;
    } else if (n->ibarrier == NULL) {
        return HM_EARG;
    } else {
        n->req[0] = 0;
        rc = n->ibarrier(n->comm, &n->req[0]) != 0 ? HM_ENET : net_wait(c, n, &n->req[0]);
    }
    atomic_thread_fence(memory_order_seq_cst);
    return rc == HM_OK ? HM_OK : (c->err.code = rc);
}

int hm_barrier_mpi(hm_coll *c)
{
    return hm_net_mpi_barrier(c, (hm_net *)c->net);
}

double hm_allreduce_mpi_f64(hm_coll *c, double x, int op)
{
    double r;
    if (hm_net_mpi_allreduce(c, (hm_net *)c->net, &x, &r, 1, HM_F64, op) != HM_OK) {
        if (c->err.code == HM_OK)
            c->err.code = HM_EARG;
        return __builtin_nan("");
    }
    return r;
}

int hm_allreduce_mpi(hm_coll *c, const void *send, void *recv, uint64_t count, int dtype, int op,
                     int any)
{
    (void)any;
    return hm_net_mpi_allreduce(c, (hm_net *)c->net, send, recv, count, dtype, op);
}

int hm_net_pending(const hm_net *n)
{
    return n->req[0] != 0 || n->req[1] != 0;
}

int hm_net_bad(hm_coll *c, hm_net *n)
{
    int agreed = agree(c, n, 0, HM_K_BAD, 0, 0, 0, NULL);
    return agreed == HM_EDIFFERS ? poisoned(c, HM_EDIFFERS) : agreed;
}
