/* hybridmpi C core: ghost exchange over channels (pack, publish, wait,
 * unpack).  See hm_core.h for the contract of each exported function. */
#define _GNU_SOURCE
#include "hm_wait.h"

#include <errno.h>
#include <string.h>
#include <sys/uio.h>

/* Move every run between x and the contiguous buffer b with MOVE(x_part,
 * b_part, bytes).  SZ is a constant in the specialized cases, so a
 * single-point run becomes a few moves instead of a memcpy call. */
#define COPY_RUNS(SZ, MOVE)                                                    \
    for (int64_t k = 0; k < c->nruns; k++) {                                   \
        int64_t len = c->run_len[k];                                           \
        char *p = x + c->run_start[k] * (SZ);                                  \
        if (len == 1)                                                          \
            MOVE(p, b, (SZ));                                                  \
        else                                                                   \
            MOVE(p, b, (size_t)len * (SZ));                                    \
        b += len * (SZ);                                                       \
    }

/* KERNEL(SZ, ARG) with SZ the point size esz: a constant, so each point
 * size of block 1 and 3 of the supported types gets its own loop, else esz
 * itself. */
#define BY_POINT_SIZE(esz, KERNEL, ARG)                                        \
    switch (esz) {                                                             \
    case 4: KERNEL(4, ARG) break;                                              \
    case 8: KERNEL(8, ARG) break;                                              \
    case 12: KERNEL(12, ARG) break;                                            \
    case 16: KERNEL(16, ARG) break;                                            \
    case 24: KERNEL(24, ARG) break;                                            \
    case 48: KERNEL(48, ARG) break;                                            \
    default: KERNEL(esz, ARG) break;                                           \
    }

#define TO_BUF(p, b, n) memcpy((b), (p), (n))
#define FROM_BUF(p, b, n) memcpy((p), (b), (n))

/* Point by point through an index list (channels of short runs): no branch
 * per point, a constant-size move in the specialized cases (PETSc's
 * sfpack.c does the same). */
#define COPY_IDX(SZ, MOVE)                                                     \
    for (int64_t i = 0; i < n; i++)                                            \
        MOVE(x + (int64_t)idx[i] * (SZ), b + i * (SZ), (SZ));

static void pack(const hm_chan *c, char *restrict b, char *restrict x, int esz)
{
    if (c->idx) {
        const int32_t *restrict idx = c->idx;
        int64_t n = c->count;
        BY_POINT_SIZE(esz, COPY_IDX, TO_BUF)
        return;
    }
    BY_POINT_SIZE(esz, COPY_RUNS, TO_BUF)
}

/* Add point by point through an index list, `PP` values of type T per
 * point: x's point idx[i] gets the point at SRC (an expression of i).  The
 * assembly's reverse update, with no call per point. */
#define ADD_POINTS(T, PP, SRC)                                                 \
    for (int64_t i = 0; i < n; i++) {                                          \
        T *restrict d = (T *)(x + (int64_t)idx[i] * esz);                      \
        const T *restrict s = (const T *)(SRC);                                \
        for (int k = 0; k < (PP); k++)                                         \
            d[k] = d[k] + s[k];                                                \
    }

#define ADD_POINTS_TYPE(T, SRC)                                                \
    do {                                                                       \
        int pp = esz / (int)sizeof(T);                                         \
        if (pp == 1) ADD_POINTS(T, 1, SRC)                                     \
        else if (pp == 2) ADD_POINTS(T, 2, SRC)                                \
        else if (pp == 3) ADD_POINTS(T, 3, SRC)                                \
        else ADD_POINTS(T, pp, SRC)                                            \
    } while (0)

static void unpack(const hm_chan *c, const char *restrict buf, char *restrict x, int esz,
                   int dtype, int op)
{
    const char *b = buf;
    if (c->idx) {
        const int32_t *restrict idx = c->idx;
        int64_t n = c->count;
        if (op == HM_INSERT) {
            BY_POINT_SIZE(esz, COPY_IDX, FROM_BUF)
            return;
        }
        if (op == HM_SUM && dtype == HM_F64) {
            ADD_POINTS_TYPE(double, b + i * esz);
            return;
        }
        if (op == HM_SUM && dtype == HM_F32) {
            ADD_POINTS_TYPE(float, b + i * esz);
            return;
        }
        uint64_t per_point = (uint64_t)esz / hm_dtype_size(dtype);
        for (int64_t i = 0; i < n; i++)
            hm_combine(x + (int64_t)idx[i] * esz, b + i * esz, per_point, dtype, op);
        return;
    }
    if (op == HM_INSERT) {
        BY_POINT_SIZE(esz, COPY_RUNS, FROM_BUF)
        return;
    }
    uint64_t per_point = (uint64_t)esz / hm_dtype_size(dtype);
    for (int64_t k = 0; k < c->nruns; k++) {
        int64_t len = c->run_len[k];
        hm_combine(x + c->run_start[k] * esz, b, (uint64_t)len * per_point, dtype, op);
        b += len * esz;
    }
}

static int xchg_fail(hm_xchg *s, const hm_chan *c, int code, int cnt, uint64_t e, uint64_t seen)
{
    return wait_failed(&s->err, &s->policy, code, c->peer, cnt, e, seen);
}

/* Whether a counter read as v carries its writer's error bits from before it reached e.  A
 * writer that had published e (packed call e, or read it) before its comm broke left valid
 * data or a free buffer: the call goes on, and the next one meets the bits.  (A shared
 * vector, read in place, is not taken this way: pull_one.) */
static inline int broke_before(uint64_t v, uint64_t e)
{
    return (v & HM_FLAGS) && (v & ~HM_FLAGS) < e;
}

/* The start of a sender's call of epoch e: no error yet, and e in `entered` when it is set
 * (what a hang's report reads). */
static inline void call_start(hm_error *err, void *entered, uint64_t e)
{
    err->code = HM_OK;
    if (entered)
        atomic_store_explicit((hm_counter *)entered, e, memory_order_relaxed);
}

/* The tag slot of epoch e's parity (docs/protocol.md: "tag slots"). */
static inline _Atomic int64_t *tag_slot(void *tag, uint64_t e)
{
    return (_Atomic int64_t *)((char *)tag + 16 * (e & 1));
}

int hm_xchg_send(hm_xchg *s, const void *x, uint64_t e)
{
    HM_PROFILED;
    int ord = s->policy.order, esz = s->esz;
    char *buf = (char *)x;
    call_start(&s->err, s->entered, e);
    for (int i = 0; i < s->n; i++) {
        hm_chan *c = &s->chan[i];
        uint64_t seen = 0;
        if (c->done && e > 2) {
            if (wait_geq((const hm_counter *)c->done, e - 2, &s->policy, &seen) != HM_OK)
                return xchg_fail(s, c, HM_ETIMEOUT, HM_CNT_DONE, e - 2, seen);
            if (broke_before(seen, e - 2))
                return xchg_fail(s, c, HM_EPEER, HM_CNT_DONE, e - 2, seen);
        }
        CHAOS();
        pack(c, c->buf[e & 1], buf, esz);
        if (c->tag)
            atomic_store_explicit(tag_slot(c->tag, e), HM_TAG_PRIVATE, memory_order_relaxed);
        if (c->ready)
            store_rel((hm_counter *)c->ready, e, ord);
    }
    return HM_OK;
}

/* HM_EMISMATCH (err filled) when channel c's sender published a shared vector or an
 * invalid call's mark instead of packing call e, else HM_OK. */
static inline int packed_tag(hm_xchg *s, hm_chan *c, uint64_t e)
{
    if (c->tag) {
        int64_t t = atomic_load_explicit(tag_slot(c->tag, e), memory_order_relaxed);
        if (t != HM_TAG_PRIVATE) {
            /* the peer published a shared vector: nothing was packed */
            s->err.code = HM_EMISMATCH;
            s->err.peer = c->peer;
            s->err.tag = t;
            return HM_EMISMATCH;
        }
    }
    return HM_OK;
}

static inline int take(hm_xchg *s, hm_chan *c, char *x, uint64_t e, int op)
{
    CHAOS();
    int bad = packed_tag(s, c, e);
    if (bad)
        return bad;
    unpack(c, c->buf[e & 1], x, s->esz, s->dtype, op);
    CHAOS();
    if (c->done)
        store_rel((hm_counter *)c->done, e, s->policy.order);
    return HM_OK;
}

/* Take channel i of `s` if its READY shows epoch e: 1 taken, 0 not yet,
 * or a negative error code. */
static inline int try_take(hm_xchg *s, hm_chan *c, char *x, uint64_t e, int op, uint64_t v)
{
    if (v < e)
        return 0;
    if (broke_before(v, e))
        return -xchg_fail(s, c, HM_EPEER, HM_CNT_READY, e, v);
    int rc = take(s, c, x, e, op);
    return rc ? -rc : 1;
}

/* Whether a receive can combine with op: insert, sum, min or max. */
static inline int recv_op(int op)
{
    return op == HM_INSERT || (op >= 0 && op < HM_NOPS && op != HM_PROD);
}

/* Take every channel, whichever is ready first, so that one slow sender does
 * not hold up the copies from the others; the waiting policy is the one of
 * wait_geq, applied to the set still pending.  word(ctx, i) is channel i's
 * READY word (NULL: a message's channel, taken at once); take(ctx, i, v),
 * with v the value read, returns 1 once it took the channel, 0 while not
 * ready, or a negative error code.  Returns HM_OK, the error code, or
 * HM_ETIMEOUT with *late the channel read last and *seen its value.
 * Inlined into each caller with its own word and take, so no call is
 * indirect. */
static inline __attribute__((always_inline)) int
ready_first(int n, const hm_wait_policy *pol, uint64_t e, const void *(*word)(void *, int),
            int (*take)(void *, int, uint64_t), void *ctx, int *late, uint64_t *seen)
{
    unsigned char left[n + 1];
    for (int i = 0; i < n; i++)
        left[i] = 1;
    int64_t polls = 0, pending = n;
    HM_SLOW(w);
    int last = 0;
    while (pending) {
        int got = 0;
        for (int i = 0; i < n; i++) {
            if (!left[i])
                continue;
            const void *r = word(ctx, i);
            int rc = take(ctx, i, r ? load_acq((const hm_counter *)r, pol->order) : e);
            if (rc < 0)
                return -rc;
            if (rc) {
                left[i] = 0;
                pending--;
                got = 1;
            } else {
                last = i;
            }
        }
        if (got || !pending)
            continue;
        if (idle_poll(&polls, &w, pol, word(ctx, last), e, seen)) {
            *late = last;
            return HM_ETIMEOUT;
        }
    }
    return HM_OK;
}

/* Take every channel in order (the fixed combination order of reverse
 * updates), once every channel's READY word showed epoch e (none: at once)
 * and check(ctx, i, v) found nothing wrong with it (error bits, another
 * tag): an owned entry combines every sender's values or, when one of them
 * failed or was invalid, none (it would hold a partial sum).  The arguments
 * and returns of ready_first. */
static inline __attribute__((always_inline)) int
in_order(int n, const hm_wait_policy *pol, uint64_t e, const void *(*word)(void *, int),
         int (*check)(void *, int, uint64_t), int (*take)(void *, int, uint64_t), void *ctx,
         int *late, uint64_t *seen)
{
    uint64_t got[n + 1];
    for (int i = 0; i < n; i++) {
        const void *w = word(ctx, i);
        uint64_t v = e;
        if (w && wait_geq((const hm_counter *)w, e, pol, &v) != HM_OK) {
            *late = i;
            *seen = v;
            return HM_ETIMEOUT;
        }
        int rc = check(ctx, i, v);
        if (rc < 0)
            return -rc;
        got[i] = v;
    }
    for (int i = 0; i < n; i++) {
        int rc = take(ctx, i, got[i]);
        if (rc < 0)
            return -rc;
    }
    return HM_OK;
}

/* A whole receive: in_order or ready_first. */
static inline __attribute__((always_inline)) int
receive(int n, const hm_wait_policy *pol, uint64_t e, int ordered, const void *(*word)(void *, int),
        int (*check)(void *, int, uint64_t), int (*take)(void *, int, uint64_t), void *ctx,
        int *late, uint64_t *seen)
{
    if (ordered)
        return in_order(n, pol, e, word, check, take, ctx, late, seen);
    return ready_first(n, pol, e, word, take, ctx, late, seen);
}

/* What ready_first's word and take need: the channels (an hm_xchg or an
 * hm_pulls) and the call's vector, tag, epoch and op. */
typedef struct {
    void *set;
    char *x;
    int64_t tag;
    uint64_t e;
    int op;
} recv_ctx;

static inline const void *xchg_word(void *ctx, int i)
{
    return ((hm_xchg *)((recv_ctx *)ctx)->set)->chan[i].ready;
}

static inline int xchg_check(void *ctx, int i, uint64_t v)
{
    recv_ctx *t = ctx;
    hm_xchg *s = t->set;
    hm_chan *c = &s->chan[i];
    if (broke_before(v, t->e))
        return -xchg_fail(s, c, HM_EPEER, HM_CNT_READY, t->e, v);
    return -packed_tag(s, c, t->e);
}

static inline int xchg_take(void *ctx, int i, uint64_t v)
{
    recv_ctx *t = ctx;
    hm_xchg *s = t->set;
    return try_take(s, &s->chan[i], t->x, t->e, t->op, v);
}

int hm_xchg_recv(hm_xchg *s, void *x, uint64_t e, int op, int ordered)
{
    HM_PROFILED;
    s->err.code = HM_OK;
    if (!recv_op(op))
        return HM_EARG;
    recv_ctx ctx = {s, x, 0, e, op};
    int late = 0;
    uint64_t seen = 0;
    int rc = receive(s->n, &s->policy, e, ordered, xchg_word, xchg_check, xchg_take, &ctx, &late,
                     &seen);
    return rc == HM_ETIMEOUT ? xchg_fail(s, &s->chan[late], rc, HM_CNT_READY, e, seen) : rc;
}

int hm_xchg_both(hm_xchg *s, hm_xchg *r, void *x, uint64_t e, int op, int ordered)
{
    HM_PROFILED;
    int rc = hm_xchg_send(s, x, e);
    return rc != HM_OK ? rc : hm_xchg_recv(r, x, e, op, ordered);
}

int hm_xchg_update(hm_xchg *s, hm_xchg *r, void *x, uint64_t e)
{
    return hm_xchg_both(s, r, x, e, HM_INSERT, 0);
}

void hm_poison(int n, void **words, uint64_t bits)
{
    for (int i = 0; i < n; i++)
        atomic_fetch_or_explicit((hm_counter *)words[i], bits, memory_order_seq_cst);
}

/* ------------------------------------------------------------------ zero-copy (shared vectors) */

/* Copy or combine the runs of (mine, theirs) pairs of one channel.  Long
 * runs move with memcpy; the point sizes of block 1 and 3 get their own
 * loops, so scattered points cost a few moves each, not a memcpy call. */
#define PULL_RUNS(SZ, _)                                                       \
    for (int64_t k = 0; k < c->nruns; k++) {                                   \
        int64_t len = c->len[k];                                               \
        char *d = x + c->mine[k] * (SZ);                                       \
        const char *s = c->src + c->theirs[k] * (SZ);                          \
        if (len == 1)                                                          \
            memcpy(d, s, (SZ));                                                \
        else                                                                   \
            memcpy(d, s, (size_t)len * (SZ));                                  \
    }

#define PULL_IDX(SZ, _)                                                        \
    for (int64_t i = 0; i < n; i++)                                            \
        memcpy(x + (int64_t)idx[i] * (SZ), c->src + (int64_t)it[i] * (SZ), (SZ));

static void pull(const hm_pull *c, char *restrict x, int esz, int dtype, int op)
{
    if (c->imine) {
        const int32_t *restrict idx = c->imine, *restrict it = c->itheirs;
        int64_t n = c->count;
        if (op == HM_SUM && dtype == HM_F64) {
            ADD_POINTS_TYPE(double, c->src + (int64_t)it[i] * esz);
            return;
        }
        if (op != HM_INSERT) {
            uint64_t per_point = (uint64_t)esz / hm_dtype_size(dtype);
            for (int64_t i = 0; i < n; i++)
                hm_combine(x + (int64_t)idx[i] * esz, c->src + (int64_t)it[i] * esz, per_point,
                           dtype, op);
            return;
        }
        BY_POINT_SIZE(esz, PULL_IDX, 0)
        return;
    }
    if (op == HM_INSERT) {
        BY_POINT_SIZE(esz, PULL_RUNS, 0)
        return;
    }
    uint64_t per_point = (uint64_t)esz / hm_dtype_size(dtype);
    for (int64_t k = 0; k < c->nruns; k++)
        hm_combine(x + c->mine[k] * esz, c->src + c->theirs[k] * esz,
                   (uint64_t)c->len[k] * per_point, dtype, op);
}

int hm_cma_probe(int pid, const void *remote, void *local, uint64_t len)
{
    struct iovec l = {local, len}, r = {(void *)remote, len};
    return process_vm_readv(pid, &l, 1, &r, 1, 0) == (ssize_t)len;
}

/* Copy the runs of one channel from the peer's private array at `base` with
 * process_vm_readv, IOV_MAX runs per call.  Returns 0 or errno. */
static int pull_cma(const hm_pull *c, char *x, const char *base, int esz)
{
    enum { CHUNK = 1024 };
    struct iovec l[CHUNK], r[CHUNK];
    for (int64_t k0 = 0; k0 < c->nruns; k0 += CHUNK) {
        int m = c->nruns - k0 < CHUNK ? (int)(c->nruns - k0) : CHUNK;
        ssize_t want = 0;
        for (int j = 0; j < m; j++) {
            size_t n = (size_t)c->len[k0 + j] * esz;
            l[j].iov_base = x + c->mine[k0 + j] * esz;
            r[j].iov_base = (void *)(base + c->theirs[k0 + j] * esz);
            l[j].iov_len = r[j].iov_len = n;
            want += (ssize_t)n;
        }
        ssize_t got = process_vm_readv(c->pid, l, m, r, m, 0);
        if (got != want)
            return got < 0 ? errno : EFAULT;
    }
    return 0;
}

static int pull_fail(hm_pulls *p, const hm_pull *c, int code, int cnt, uint64_t e, uint64_t seen)
{
    return wait_failed(&p->err, &p->policy, code, c->peer, cnt, e, seen);
}

/* Copy channel c of epoch e once READY showed `v` >= e: 1 taken, or a
 * negative error code. */
static int pull_one(hm_pulls *p, hm_pull *c, char *x, int64_t tag, uint64_t e, int op, uint64_t v)
{
    if (v & HM_FLAGS)
        return -pull_fail(p, c, HM_EPEER, HM_CNT_READY, e, v);
    CHAOS();
    _Atomic int64_t *slot = tag_slot(c->tag, e);
    int64_t t = atomic_load_explicit(slot, memory_order_relaxed);
    if (t != tag) {
        p->err.code = HM_EMISMATCH;
        p->err.peer = c->peer;
        p->err.tag = t;
        return -HM_EMISMATCH;
    }
    if (p->cma) {
        const char *base = (const char *)atomic_load_explicit((_Atomic intptr_t *)(slot + 1),
                                                              memory_order_relaxed);
        int bad = pull_cma(c, x, base, p->esz);
        if (bad) {
            p->err.code = HM_ECMA;
            p->err.peer = c->peer;
            p->err.errnum = bad;
            return -HM_ECMA;
        }
    } else {
        pull(c, x, p->esz, p->dtype, op);
    }
    CHAOS();
    /* The owner stays in its call until this rank's DONE, unless it failed:
     * then it poisoned READY before it returned, and the values just copied
     * may be torn (a sequence lock's second read). */
    atomic_thread_fence(memory_order_acquire);
    uint64_t again = atomic_load_explicit((const hm_counter *)c->ready, memory_order_relaxed);
    if (again & HM_FLAGS)
        return -pull_fail(p, c, HM_EPEER, HM_CNT_READY, e, again);
    store_rel((hm_counter *)c->done, e, p->policy.order);
    return 1;
}

static inline int pull_check(void *ctx, int i, uint64_t v)
{
    recv_ctx *t = ctx;
    hm_pulls *p = t->set;
    hm_pull *c = &p->chan[i];
    if (v & HM_FLAGS)
        return -pull_fail(p, c, HM_EPEER, HM_CNT_READY, t->e, v);
    int64_t tag = atomic_load_explicit(tag_slot(c->tag, t->e), memory_order_relaxed);
    if (tag != t->tag) {
        p->err.code = HM_EMISMATCH;
        p->err.peer = c->peer;
        p->err.tag = tag;
        return -HM_EMISMATCH;
    }
    return 0;
}

static inline const void *pull_word(void *ctx, int i)
{
    return ((hm_pulls *)((recv_ctx *)ctx)->set)->chan[i].ready;
}

static inline int pull_take(void *ctx, int i, uint64_t v)
{
    recv_ctx *t = ctx;
    hm_pulls *p = t->set;
    if (v < t->e)
        return 0;
    int rc = pull_one(p, &p->chan[i], t->x, t->tag, t->e, t->op, v);
    return rc < 0 ? rc : 1;
}

int hm_pull_recv(hm_pulls *p, void *x, int64_t tag, uint64_t e, int op, int ordered)
{
    HM_PROFILED;
    p->err.code = HM_OK;
    if (!recv_op(op))
        return HM_EARG;
    recv_ctx ctx = {p, x, tag, e, op};
    int late = 0;
    uint64_t seen = 0;
    int rc = receive(p->n, &p->policy, e, ordered, pull_word, pull_check, pull_take, &ctx, &late,
                     &seen);
    if (rc == HM_ETIMEOUT)
        return pull_fail(p, &p->chan[late], rc, HM_CNT_READY, e, seen);
    return rc;
}

int hm_wait_done(hm_pulls *p, uint64_t e)
{
    HM_PROFILED;
    p->err.code = HM_OK;
    for (int i = 0; i < p->n; i++) {
        hm_pull *c = &p->chan[i];
        uint64_t seen = 0;
        if (wait_geq((const hm_counter *)c->done, e, &p->policy, &seen) != HM_OK)
            return pull_fail(p, c, HM_ETIMEOUT, HM_CNT_DONE, e, seen);
        if (seen & HM_FLAGS)
            return pull_fail(p, c, HM_EPEER, HM_CNT_DONE, e, seen);
    }
    return HM_OK;
}

int hm_zc_publish(hm_pulls *readers, void **ready, void **tag, int64_t tagval, const void *x,
                  uint64_t e)
{
    HM_PROFILED;
    int order = readers->policy.order;
    call_start(&readers->err, readers->entered, e);
    for (int i = 0; i < readers->n; i++) {
        hm_pull *c = &readers->chan[i];
        uint64_t seen = 0;
        if (e > 2) {
            if (wait_geq((const hm_counter *)c->done, e - 2, &readers->policy, &seen) != HM_OK)
                return pull_fail(readers, c, HM_ETIMEOUT, HM_CNT_DONE, e - 2, seen);
            if (seen & HM_FLAGS)
                return pull_fail(readers, c, HM_EPEER, HM_CNT_DONE, e - 2, seen);
        }
        CHAOS();
        _Atomic int64_t *slot = tag_slot(tag[i], e);
        atomic_store_explicit(slot, tagval, memory_order_relaxed);
        if (tagval == HM_TAG_CMA)
            atomic_store_explicit((_Atomic intptr_t *)(slot + 1), (intptr_t)x, memory_order_relaxed);
        store_rel((hm_counter *)ready[i], e, order);
    }
    return HM_OK;
}

int hm_zc_update(hm_pulls *pulls, hm_pulls *readers, void **ready, void **tag,
                 int64_t tagval, void *x, uint64_t e)
{
    HM_PROFILED;
    int rc = hm_zc_publish(readers, ready, tag, tagval, x, e);
    if (rc == HM_OK)
        rc = hm_pull_recv(pulls, x, tagval, e, HM_INSERT, 0);
    else
        pulls->err = readers->err;
    if (rc != HM_OK)
        return rc;
    rc = hm_wait_done(readers, e);
    if (rc != HM_OK)
        pulls->err = readers->err;
    return rc;
}
