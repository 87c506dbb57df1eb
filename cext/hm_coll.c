/* hybridmpi C core: epoch counters, wait policy, node barrier and allreduce (the reduction
 * operators they combine with: hm_ops.c).  See hm_core.h for the contract of each exported
 * function. */
#define _GNU_SOURCE
#include "hm_wait.h"

#include <string.h>

int hm_lock_free(void)
{
    hm_counter probe;
    atomic_init(&probe, 0);
    return ATOMIC_LLONG_LOCK_FREE == 2 && atomic_is_lock_free(&probe) ? 1 : 0;
}

uint64_t hm_load(const void *addr, int order) { return load_acq((const hm_counter *)addr, order); }

void hm_store(void *addr, uint64_t value, int order) { store_rel((hm_counter *)addr, value, order); }

static uint64_t extra_offset(uint64_t capacity)
{
    return ((HM_OFF_DATA + capacity + HM_REGION - 1) / HM_REGION) * HM_REGION;
}

/* The direct allreduce's buffer: its stamp (the call number, stored last with release) and
 * signature, then the value, in one run of cache lines. */
typedef struct direct_head {
    hm_counter stamp;
    int64_t sig;
} direct_head;

enum { DIRECT_AT = (HM_STEPS + 2 * (HM_STEPS + 2)) * HM_REGION };  /* after the extra regions */

/* The payload a direct buffer holds: HM_DIRECT_BYTES, or the slot's capacity if less (the PMPI
 * library's segments hold what it reduces), and the bytes of one buffer with its head. */
static inline uint64_t direct_bytes(uint64_t capacity)
{
    return capacity < HM_DIRECT_BYTES ? capacity : HM_DIRECT_BYTES;
}

static inline uint64_t direct_span(uint64_t capacity)
{
    return ((sizeof(direct_head) + direct_bytes(capacity) + HM_REGION - 1) / HM_REGION) * HM_REGION;
}

uint64_t hm_coll_segment_bytes(uint64_t capacity)
{
    return extra_offset(capacity) + (uint64_t)DIRECT_AT + 2 * direct_span(capacity);
}

void hm_policy_init(hm_wait_policy *p, int shared_cores)
{
    *p = (hm_wait_policy){.spin = shared_cores ? HM_SPIN_SHARED : HM_SPIN_DEDICATED,
                          .yield_ns = 1000000, .sleep_ns = 50000, .order = HM_ACQ_REL};
}

int hm_coll_set_radix(hm_coll *c, int radix)
{
    if (radix < 2 || radix > HM_MAX_RADIX)
        return HM_EARG;
    c->radix = radix;
    c->parent = c->rank == 0 ? -1 : (c->rank - 1) / radix;
    c->nchildren = 0;
    for (int k = 1; k <= radix; k++) {
        long child = (long)c->rank * radix + k;
        if (child < c->size)
            c->children[c->nchildren++] = (int)child;
    }
    return HM_OK;
}

int hm_coll_init(hm_coll *c, int rank, int size, int radix, char **seg, uint64_t capacity)
{
    /* a capacity near 2^64 would wrap the segment's size (extra_offset) */
    if (size < 1 || rank < 0 || rank >= size || radix < 2 || radix > HM_MAX_RADIX || !seg ||
        capacity > (uint64_t)INT64_MAX / 2)
        return HM_EARG;
    memset(c, 0, sizeof *c);
    c->rank = rank;
    c->size = size;
    c->seg = seg;
    c->capacity = capacity;
    c->extra = extra_offset(capacity);
    hm_coll_set_radix(c, radix);
    hm_policy_init(&c->policy, 0);
    memset(seg[rank], 0, hm_coll_segment_bytes(capacity));
    return HM_OK;
}

static inline hm_counter *counter(const hm_coll *c, int rank, int off)
{
    return (hm_counter *)(c->seg[rank] + off);
}

/* Allreduce arguments of a rank, and the first mismatch seen in its
 * subtree (bad_rank >= 0).  Five 8-byte words: fits before HM_OFF_DATA. */
typedef struct header {
    int64_t count;
    int32_t dtype, op;
    int32_t bad_rank, bad_dtype;
    int64_t bad_count;
    int32_t bad_op;
    uint32_t epoch;   /* the allreduce call that wrote it (low half): other_collective */
} header;

_Static_assert(HM_OFF_HEADER + sizeof(header) <= HM_OFF_DATA, "header overlaps data");
_Static_assert(HM_OFF_DATA % 16 == 0, "data slot must be 16-byte aligned");

static inline header *hdr(const hm_coll *c, int rank) { return (header *)(c->seg[rank] + HM_OFF_HEADER); }

void *hm_coll_slot(hm_coll *c, int rank) { return c->seg[rank] + HM_OFF_DATA; }

/* A rank's signature of its current call, after the call number in its
 * ENTERED region (docs/protocol.md). */
typedef struct entered {
    hm_counter call;
    _Atomic int64_t kind, count, dtype, op;
    hm_counter done;   /* the last call this rank completed (its part returned HM_OK) */
} entered;

_Static_assert(sizeof(entered) <= HM_REGION, "ENTERED region too small");

static inline entered *ent(const hm_coll *c, int rank) { return (entered *)(c->seg[rank] + HM_OFF_ENTERED); }

/* A rank's record of an allreduce it abandoned (abandon(), below): the call number, stored
 * last with release, and its argument signature.  Two, by the call's parity, in the ENTERED
 * region after the leader's word: a rank writes the record of parity e & 1 again only in call
 * e + 2, which it reaches after every rank left call e + 1, so after every rank read call e's. */
typedef struct quit_rec {
    hm_counter stamp;
    _Atomic int64_t sig;
} quit_rec;

enum { QUIT_AT = HM_OFF_LEADER_WAIT + 16 };
_Static_assert(sizeof(entered) <= HM_OFF_LEADER_WAIT, "ENTERED overlaps the leader's word");
_Static_assert(QUIT_AT + 2 * sizeof(quit_rec) <= HM_REGION, "ENTERED region too small");

static inline quit_rec *quit(const hm_coll *c, int rank, uint64_t e)
{
    return (quit_rec *)(c->seg[rank] + HM_OFF_ENTERED + QUIT_AT + (e & 1) * sizeof(quit_rec));
}

static inline int is_allreduce(int64_t kind)
{
    return kind == HM_K_ALLREDUCE_TREE || kind == HM_K_ALLREDUCE_RD || kind == HM_K_ALLREDUCE_DIRECT ||
           kind == HM_K_ALLREDUCE_RSAG;
}

/* The end of this rank's part of call c->epoch: rc, and when it is HM_OK, the call stored as
 * done (before any later poisoning, which is sequentially consistent), so that a slow peer
 * that meets this rank's error bits beside the call's value knows the call completed here. */
static inline int finish(hm_coll *c, int rc)
{
    if (rc == HM_OK)
        atomic_store_explicit(&ent(c, c->rank)->done, c->epoch, memory_order_release);
    return rc;
}

/* Whether node rank `peer` finished call e: it completed it, or entered a later one (a
 * rank enters call e + 1 only after its part of e returned). */
static inline int finished(const hm_coll *c, int peer, uint64_t e)
{
    const entered *p = ent(c, peer);
    return atomic_load_explicit(&p->done, memory_order_acquire) >= e ||
           atomic_load_explicit(&p->call, memory_order_acquire) > e;
}

static inline void enter(hm_coll *c, uint64_t e, int kind, uint64_t count, int dtype, int op)
{
    entered *m = ent(c, c->rank);
    /* A seqlock: the call number reads 0 while the signature changes, so a reader that
     * saw the old number beside a new field sees the number change (other_call). */
    atomic_store_explicit(&m->call, 0, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&m->kind, kind, memory_order_relaxed);
    atomic_store_explicit(&m->count, (int64_t)count, memory_order_relaxed);
    atomic_store_explicit(&m->dtype, dtype, memory_order_relaxed);
    atomic_store_explicit(&m->op, op, memory_order_relaxed);
    atomic_store_explicit(&m->call, e, memory_order_release);
}

static int fail(hm_coll *c, int code, uint64_t bits)
{
    c->err.code = code;
    hm_coll_poison(c, bits);
    return code;
}

static int timed_out(hm_coll *c, int peer, int cnt, uint64_t seen)
{
    wait_failed(&c->err, &c->policy, HM_ETIMEOUT, peer, cnt, c->epoch, seen);
    return fail(c, HM_ETIMEOUT, HM_ERRBIT);
}

/* A peer's word carried error bits: fail too, passing the same bits on. */
static int peer_failed(hm_coll *c, int peer, int cnt, uint64_t seen)
{
    wait_failed(&c->err, &c->policy, HM_EPEER, peer, cnt, c->epoch, seen);
    return fail(c, HM_EPEER, seen & HM_FLAGS);
}

/* The signature in an ENTERED region: kind, count, dtype, op (relaxed: the
 * call number's acquire load, the fence and the second load of the call number
 * (other_call) make a seqlock with enter's). */
static void load_sig(entered *e, int64_t sig[4])
{
    sig[0] = atomic_load_explicit(&e->kind, memory_order_relaxed);
    sig[1] = atomic_load_explicit(&e->count, memory_order_relaxed);
    sig[2] = atomic_load_explicit(&e->dtype, memory_order_relaxed);
    sig[3] = atomic_load_explicit(&e->op, memory_order_relaxed);
}

/* Whether node rank `peer` is in this rank's call number with another kind
 * of call (then err holds both signatures and the call fails with
 * HM_EMISMATCH). */
static int other_call(hm_coll *c, int peer)
{
    entered *p = ent(c, peer);
    if (atomic_load_explicit(&p->call, memory_order_acquire) != c->epoch)
        return 0;
    int64_t theirs[4], mine[4];
    load_sig(p, theirs);
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&p->call, memory_order_relaxed) != c->epoch)
        return 0;
    load_sig(ent(c, c->rank), mine);
    /* Ranks in the same algorithm with different arguments reach one verdict
     * by the algorithm's own comparison; only different calls meet here. */
    if (theirs[0] == mine[0])
        return 0;
    c->err.bad_rank = peer;
    c->err.epoch = c->epoch;
    c->err.bad_kind = theirs[0];
    c->err.bad_count = theirs[1];
    c->err.bad_dtype = theirs[2];
    c->err.bad_op = theirs[3];
    c->err.peer = c->rank;
    c->err.root_kind = mine[0];
    c->err.root_count = mine[1];
    c->err.root_dtype = mine[2];
    c->err.root_op = mine[3];
    return 1;
}

static int abandon(hm_coll *c);

/* While a wait is slow: whether a rank of the node is in this call number with another
 * collective (node rank `peer`, or any for -1), or abandoned this allreduce.  Ranks in
 * allreduces of different algorithms (their sizes fell on either side of a threshold: a
 * count mismatch) abandon the call together (abandon()): a ValueError on every rank, the
 * comm usable, as for a mismatch inside one algorithm.  Other calls break the comm. */
static int call_differs(hm_coll *c, int peer)
{
    for (int r = peer < 0 ? 0 : peer; r < (peer < 0 ? c->size : peer + 1); r++)
        if (r != c->rank && other_call(c, r))
            return is_allreduce(c->err.bad_kind) && is_allreduce(c->err.root_kind)
                   ? abandon(c) : fail(c, HM_EMISMATCH, HM_ERRBIT | HM_MISBIT);
    if (!is_allreduce(atomic_load_explicit(&ent(c, c->rank)->kind, memory_order_relaxed)))
        return HM_OK;
    for (int r = 0; r < c->size; r++)
        if (r != c->rank && load_acq(&quit(c, r, c->epoch)->stamp, HM_ACQ_REL) == c->epoch)
            return abandon(c);
    return HM_OK;
}

/* Wait until *p >= value, p being written by node rank `peer` (-1: by
 * several).  While it waits long enough to stop spinning, it compares the
 * signature of the peer's call (of every rank, for -1) with its own (call_differs). */
static int coll_wait(hm_coll *c, const hm_counter *p, uint64_t value, int peer, int cnt)
{
    const hm_wait_policy *pol = &c->policy;
    uint64_t v;
    for (int64_t i = 0;; i++) {
        v = load_acq(p, pol->order);
        if ((v & ~HM_BADBIT) >= value)
            goto got;
        if (i >= pol->spin)
            break;
        cpu_relax();
    }
    HM_SLOW(w);
    slow_start(&w, pol);
    for (;;) {
        v = load_acq(p, pol->order);
        if ((v & ~HM_BADBIT) >= value)
            goto got;
        int rc = call_differs(c, peer);
        if (rc)
            return rc;
        if (slow_tick(&w, pol, p, value, v))
            return timed_out(c, peer, cnt, v);
    }
got:
    if (v & HM_FLAGS) {
        /* A peer that finished this call (completed it, or entered a later one) before its
         * comm broke had stored its value for it: the error bits came from later, in a
         * collective or anywhere else (a Halo call, a with block left on an exception).  This
         * call completed here too, and the next one raises.  (ENTERED is never poisoned.) */
        if (peer < 0 || !finished(c, peer, c->epoch) || ((v & ~(HM_FLAGS | HM_BADBIT)) < value))
            return peer_failed(c, peer, cnt, v);
        v &= ~HM_FLAGS;
    }
    /* In the same call (a peer already in a later one has finished this one): the peer's
     * arguments were invalid and not this rank's, or the other way round. */
    if ((v & ~HM_BADBIT) == value && (v & HM_BADBIT) != c->mark)
        return peer_failed(c, peer, cnt, v | HM_ERRBIT | HM_MISBIT);
    return HM_OK;
}

static inline int wait_counter(hm_coll *c, int peer, int cnt, uint64_t value)
{
    return coll_wait(c, counter(c, peer, HM_OFF_SYNC), value, peer, cnt);
}

/* A tree barrier and a tree allreduce arrive on the same word (SYNC): a child's arrival at
 * call e may come from the other collective.  The child's header, in SYNC's cache line, tells:
 * an allreduce stamps it with its call before it arrives, a barrier never does.  Checked at
 * every arrival (a wait that stops spinning compares signatures too, but in the fast path the
 * allreduce would take the barrier child's stale slot as its value). */
static int other_collective(hm_coll *c, int child, uint64_t e, int in_allreduce)
{
    if ((hdr(c, child)->epoch == (uint32_t)e) == in_allreduce)
        return HM_OK;
    other_call(c, child);   /* its signature, for the error (err.bad_*) */
    return fail(c, HM_EMISMATCH, HM_ERRBIT | HM_MISBIT);
}

/* Tree barrier (paper Algorithm 2, with epochs): arrivals go up the tree,
 * the release comes down it. */
static int barrier_tree(hm_coll *c, int part, uint64_t e)
{
    int rc, ord = c->policy.order;
    hm_counter *mine = counter(c, c->rank, HM_OFF_SYNC);
    if (part & HM_GATHER) {
        for (int i = 0; i < c->nchildren; i++)
            if ((rc = wait_counter(c, c->children[i], HM_CNT_ARRIVE, 2 * e - 1)) ||
                (rc = other_collective(c, c->children[i], e, 0)))
                return rc;
        if (c->parent >= 0) {
            store_rel(mine, 2 * e - 1, ord);
            if ((rc = wait_counter(c, c->parent, HM_CNT_RELEASE, 2 * e)))
                return rc;
        }
    }
    if ((part & HM_RELEASE) && (c->nchildren > 0 || c->parent < 0))
        store_rel(mine, 2 * e, ord);
    return HM_OK;
}

/* Linear barrier (paper Algorithm 1, with epochs): every rank adds one to
 * the root's counter, the root waits for all of them and publishes the
 * release, which everyone else reads.  The counter only grows, so it never
 * needs a reset. */
static int barrier_linear(hm_coll *c, int part, uint64_t e)
{
    int ord = c->policy.order;
    hm_counter *lin = counter(c, 0, HM_OFF_LINEAR);
    if (part & HM_GATHER) {
        uint64_t n = ++c->linear_calls;
        if (c->rank != 0) {
            atomic_fetch_add_explicit(lin, 1, ord == HM_SEQ_CST ? memory_order_seq_cst
                                                                 : memory_order_acq_rel);
            return wait_counter(c, 0, HM_CNT_RELEASE, 2 * e);
        }
        int rc = coll_wait(c, lin, n * (uint64_t)(c->size - 1), -1, HM_CNT_LINEAR);
        if (rc)
            return rc;
    }
    if ((part & HM_RELEASE) && c->rank == 0)
        store_rel(counter(c, 0, HM_OFF_SYNC), 2 * e, ord);
    return HM_OK;
}

/* Region k of `rank`'s dissemination signals (written by rank - 2^k only). */
static inline hm_counter *diss(const hm_coll *c, int rank, int k)
{
    return (hm_counter *)(c->seg[rank] + c->extra + (uint64_t)k * HM_REGION);
}

static inline int wait_round(hm_coll *c, hm_counter *p, int peer, uint64_t e)
{
    return coll_wait(c, p, e, peer, HM_CNT_ROUND);
}

static int barrier_dissemination(hm_coll *c, uint64_t e)
{
    int n = c->size, r = c->rank, ord = c->policy.order, rc;
    for (int k = 0, d = 1; d < n; k++, d <<= 1) {
        CHAOS();
        store_rel(diss(c, (r + d) % n, k), e | c->mark, ord);
        if ((rc = wait_round(c, diss(c, r, k), (r - d + n) % n, e)))
            return rc;
    }
    return HM_OK;
}

static const int barrier_kind[] = {HM_K_BARRIER_TREE, HM_K_BARRIER_LINEAR, HM_K_BARRIER_DISS};

int hm_barrier(hm_coll *c, int method, int part)
{
    HM_PROFILED;
    if (part < HM_GATHER || part > HM_BOTH || (c->rank != 0 && part != HM_BOTH) || method < 0 ||
        method > HM_DISSEMINATION)
        return HM_EARG;
    uint64_t e = (part & HM_GATHER) ? ++c->epoch : c->epoch;
    if (part & HM_GATHER)
        enter(c, e, barrier_kind[method], 0, 0, 0);
    c->err.code = HM_OK;
    if (c->size == 1)
        return HM_OK;
    int rc = method == HM_LINEAR ? barrier_linear(c, part, e)
             : method == HM_TREE ? barrier_tree(c, part, e)
             : part == HM_BOTH ? barrier_dissemination(c, e) : HM_EARG;
    return (part & HM_RELEASE) ? finish(c, rc) : rc;
}

int hm_barrier_tree(hm_coll *c) { return hm_barrier(c, HM_TREE, HM_BOTH); }

int hm_barrier_linear(hm_coll *c) { return hm_barrier(c, HM_LINEAR, HM_BOTH); }

int hm_barrier_dissemination(hm_coll *c)
{
    HM_PROFILED;
    uint64_t e = ++c->epoch;
    enter(c, e, HM_K_BARRIER_DISS, 0, 0, 0);
    c->err.code = HM_OK;
    return c->size == 1 ? HM_OK : finish(c, barrier_dissemination(c, e));
}

int hm_coll_bad(hm_coll *c)
{
    uint64_t e = ++c->epoch;
    enter(c, e, HM_K_BAD, 0, 0, 0);
    c->err.code = HM_OK;
    if (c->size == 1)
        return HM_OK;
    c->mark = HM_BADBIT;
    int rc = barrier_dissemination(c, e);
    c->mark = 0;
    return rc;
}

static inline int same_args(const header *a, const header *b)
{
    return a->count == b->count && a->dtype == b->dtype && a->op == b->op;
}

/* Takes a child's verdict on the arguments into this rank's header. */
static void check_child(header *mine, const header *child, int child_rank)
{
    if (mine->bad_rank >= 0)
        return;
    if (child->bad_rank >= 0) {
        mine->bad_rank = child->bad_rank;
        mine->bad_count = child->bad_count;
        mine->bad_dtype = child->bad_dtype;
        mine->bad_op = child->bad_op;
    } else if (!same_args(mine, child)) {
        mine->bad_rank = child_rank;
        mine->bad_count = child->count;
        mine->bad_dtype = child->dtype;
        mine->bad_op = child->op;
    }
}

static int mismatch(hm_coll *c)
{
    const header *root = hdr(c, 0);
    c->err.code = HM_EMISMATCH;
    c->err.bad_kind = c->err.root_kind = HM_K_ALLREDUCE_TREE;
    c->err.bad_rank = (int)root->bad_rank;
    c->err.bad_count = root->bad_count;
    c->err.bad_dtype = root->bad_dtype;
    c->err.bad_op = root->bad_op;
    c->err.root_count = root->count;
    c->err.root_dtype = root->dtype;
    c->err.root_op = root->op;
    return HM_EMISMATCH;
}

/* Tree allreduce (paper Algorithm 3, with epochs).  A non-root rank's slot
 * is read only by its parent, before the parent arrives, hence before this
 * rank can leave the call and write the slot again.  The root's slot holds
 * the result that everyone reads, so the root writes it only after all its
 * children arrived for this epoch, i.e. after everyone finished reading the
 * previous result. */
int hm_allreduce(hm_coll *c, const void *send, void *recv, uint64_t count, int dtype, int op,
                 int part)
{
    return hm_allreduce_chunk(c, send, recv, count, count, dtype, op, part);
}

int hm_allreduce_chunk(hm_coll *c, const void *send, void *recv, uint64_t count, uint64_t total,
                       int dtype, int op, int part)
{
    HM_PROFILED;
    size_t esz = hm_dtype_size(dtype);
    if (!hm_op_valid(dtype, op) || part < HM_GATHER || part > HM_BOTH ||
        (c->rank != 0 && part != HM_BOTH) || count > c->capacity / esz)  /* count * esz may wrap */
        return HM_EARG;
    int rc, ord = c->policy.order;
    uint64_t nbytes = count * esz;
    char *slot = hm_coll_slot(c, c->rank);
    header *mine = hdr(c, c->rank);
    c->err.code = HM_OK;
    if (part & HM_GATHER) {
        uint64_t e = ++c->epoch;
        enter(c, e, HM_K_ALLREDUCE_TREE, total, dtype, op);
        int root = c->rank == 0;
        /* the root writes its slot only once every child arrived (see above) */
        for (int i = 0; root && i < c->nchildren; i++)
            if ((rc = wait_counter(c, c->children[i], HM_CNT_ARRIVE, 2 * e - 1)) ||
                (rc = other_collective(c, c->children[i], e, 1)))
                return rc;
        mine->count = (int64_t)total;
        mine->dtype = dtype;
        mine->op = op;
        mine->bad_rank = -1;
        mine->epoch = (uint32_t)e;
        if (slot != (const char *)send)
            memcpy(slot, send, nbytes);
        for (int i = 0; i < c->nchildren; i++) {
            int ch = c->children[i];
            if (!root && ((rc = wait_counter(c, ch, HM_CNT_ARRIVE, 2 * e - 1)) ||
                          (rc = other_collective(c, ch, e, 1))))
                return rc;
            check_child(mine, hdr(c, ch), ch);
            if (mine->bad_rank < 0)
                hm_combine(slot, hm_coll_slot(c, ch), count, dtype, op);
        }
        if (!root) {
            CHAOS();
            store_rel(counter(c, c->rank, HM_OFF_SYNC), 2 * e - 1, ord);
            if ((rc = wait_counter(c, c->parent, HM_CNT_RELEASE, 2 * e)))
                return rc;
            if (c->nchildren > 0)
                store_rel(counter(c, c->rank, HM_OFF_SYNC), 2 * e, ord);
            if (hdr(c, 0)->bad_rank != -1)
                return mismatch(c);
            memcpy(recv, hm_coll_slot(c, 0), nbytes);
            return finish(c, HM_OK);
        }
    }
    if (part & HM_RELEASE) {
        if (c->size > 1)
            store_rel(counter(c, 0, HM_OFF_SYNC), 2 * c->epoch, ord);
        if (mine->bad_rank != -1)
            return mismatch(c);
        if (recv != slot)
            memcpy(recv, slot, nbytes);
        return finish(c, HM_OK);
    }
    return HM_OK;
}

double hm_allreduce_f64(hm_coll *c, double x, int op)
{
    double r;
    if (hm_allreduce(c, &x, &r, 1, HM_F64, op, HM_BOTH) != HM_OK) {
        if (c->err.code == HM_OK)
            c->err.code = HM_EARG;
        return __builtin_nan("");
    }
    return r;
}

int hm_allreduce_verdict(hm_coll *c, int elsewhere)
{
    header *mine = hdr(c, c->rank);
    if (c->rank != 0)
        return HM_EARG;
    if (elsewhere && mine->bad_rank == -1)
        mine->bad_rank = elsewhere == 2 ? HM_BAD_INVALID_ELSEWHERE : HM_BAD_ELSEWHERE;
    return (int)mine->bad_rank;
}

/* ------------------------------------------------------------------ recursive doubling */

/* One step's region: the stamp (the call number, stored last with release),
 * the running maximum of the argument signatures and of their negations,
 * then the partial result. */
typedef struct rd_head {
    hm_counter stamp;
    int64_t sig_max, sig_neg;
    int32_t max_rank, min_rank;
} rd_head;

/* The running extremes of the argument signatures and who holds them. */
typedef struct rd_sig {
    int64_t max, neg;
    int32_t max_rank, min_rank;
} rd_sig;

static inline void rd_merge(rd_sig *s, const rd_head *h)
{
    if (h->sig_max > s->max || (h->sig_max == s->max && h->max_rank < s->max_rank)) {
        s->max = h->sig_max;
        s->max_rank = h->max_rank;
    }
    if (h->sig_neg > s->neg || (h->sig_neg == s->neg && h->min_rank < s->min_rank)) {
        s->neg = h->sig_neg;
        s->min_rank = h->min_rank;
    }
}

_Static_assert(sizeof(rd_head) + HM_RD_BYTES <= HM_REGION, "recursive-doubling region too small");

enum { RD_FOLD = HM_STEPS, RD_RESULT = HM_STEPS + 1 };

static inline rd_head *rd(const hm_coll *c, int rank, int k, uint64_t e)
{
    return (rd_head *)(c->seg[rank] + c->extra +
                       (uint64_t)(HM_STEPS + (e & 1) * (HM_STEPS + 2) + k) * HM_REGION);
}

static inline void rd_publish(rd_head *h, const void *acc, uint64_t nbytes, const rd_sig *s,
                              uint64_t e, int ord)
{
    CHAOS();
    h->sig_max = s->max;
    h->sig_neg = s->neg;
    h->max_rank = s->max_rank;
    h->min_rank = s->min_rank;
    memcpy(h + 1, acc, nbytes);
    store_rel(&h->stamp, e, ord);
}

static inline void sig_args(int64_t sig, int64_t *count, int64_t *dtype, int64_t *op)
{
    *count = (int64_t)((uint64_t)sig >> 8);
    *dtype = (sig >> 4) & 15;
    *op = sig & 15;
}

static inline int64_t sig_of(uint64_t count, int dtype, int op)
{
    return (int64_t)((count << 8) | ((uint64_t)dtype << 4) | (uint64_t)op);
}

/* Ranks of an allreduce of `kind` that saw every rank's signature (recursive doubling, direct)
 * passed different ones: the largest's rank and arguments in err.bad_*, the smallest's in
 * err.peer and err.root_*, alike on every rank. */
static int spread_mismatch(hm_coll *c, int kind, const rd_sig *sig)
{
    c->err.code = HM_EMISMATCH;
    c->err.bad_kind = c->err.root_kind = kind;
    c->err.bad_rank = sig->max_rank;
    sig_args(sig->max, &c->err.bad_count, &c->err.bad_dtype, &c->err.bad_op);
    c->err.peer = sig->min_rank;
    sig_args(-sig->neg, &c->err.root_count, &c->err.root_dtype, &c->err.root_op);
    return HM_EMISMATCH;
}

/* Leave allreduce call c->epoch, which ranks of the node entered with algorithms of different
 * sizes (call_differs): publish this rank's signature in its record of the call, wait for every
 * rank's, and fail with the same verdict as a mismatch found inside one algorithm
 * (spread_mismatch: the largest and smallest signatures and their ranks), alike on every rank.
 * No rank completes such a call (each algorithm reads every rank's part of it), so every rank
 * reaches this; their words of the call stay as they are (every later wait needs a later call
 * number, and the algorithms' regions are stamped with it).  A rank in another collective, or
 * one whose comm broke, breaks it; a rank that never comes, the deadline. */
static int abandon(hm_coll *c)
{
    uint64_t e = c->epoch;
    const hm_wait_policy *pol = &c->policy;
    entered *m = ent(c, c->rank);
    int64_t own = sig_of((uint64_t)atomic_load_explicit(&m->count, memory_order_relaxed),
                         (int)atomic_load_explicit(&m->dtype, memory_order_relaxed),
                         (int)atomic_load_explicit(&m->op, memory_order_relaxed));
    quit_rec *q = quit(c, c->rank, e);
    atomic_store_explicit(&q->sig, own, memory_order_relaxed);
    store_rel(&q->stamp, e, pol->order);
    rd_sig sig = {own, -own, c->rank, c->rank};
    for (int r = 0; r < c->size; r++) {
        if (r == c->rank)
            continue;
        quit_rec *h = quit(c, r, e);
        HM_SLOW(w);
        slow_start(&w, pol);
        uint64_t v;
        while ((v = load_acq(&h->stamp, pol->order)) != e) {
            uint64_t sync = load_acq(counter(c, r, HM_OFF_SYNC), pol->order);
            if (sync & HM_FLAGS)   /* its comm broke */
                return peer_failed(c, r, HM_CNT_ROUND, sync);
            if (other_call(c, r) && !is_allreduce(c->err.bad_kind))
                return fail(c, HM_EMISMATCH, HM_ERRBIT | HM_MISBIT);
            if (slow_tick(&w, pol, &h->stamp, e, v))
                return timed_out(c, r, HM_CNT_ROUND, v);
        }
        rd_head seen = {.sig_max = atomic_load_explicit(&h->sig, memory_order_relaxed),
                        .max_rank = r, .min_rank = r};
        seen.sig_neg = -seen.sig_max;
        rd_merge(&sig, &seen);
    }
    return spread_mismatch(c, HM_K_ALLREDUCE_DIRECT, &sig);
}

int hm_allreduce_rd(hm_coll *c, const void *send, void *recv, uint64_t count, int dtype, int op)
{
    HM_PROFILED;
    size_t esz = hm_dtype_size(dtype);
    if (!hm_op_valid(dtype, op) || count > HM_RD_BYTES / esz)  /* count * esz may wrap */
        return HM_EARG;
    uint64_t nbytes = count * esz;
    int n = c->size, r = c->rank, ord = c->policy.order, rc;
    uint64_t e = ++c->epoch;
    enter(c, e, HM_K_ALLREDUCE_RD, count, dtype, op);
    c->err.code = HM_OK;
    _Alignas(16) char acc[HM_RD_BYTES], tmp[HM_RD_BYTES];
    memcpy(acc, send, nbytes);
    int64_t own = sig_of(count, dtype, op);
    rd_sig sig = {own, -own, r, r};
    int p2 = 1;
    while (p2 * 2 <= n)
        p2 *= 2;
    if (r >= p2) {
        /* an extra rank: hand the value down, take the result back */
        rd_publish(rd(c, r, RD_FOLD, e), acc, nbytes, &sig, e, ord);
        rd_head *h = rd(c, r - p2, RD_RESULT, e);
        if ((rc = wait_round(c, &h->stamp, r - p2, e)))
            return rc;
        rd_merge(&sig, h);
        memcpy(acc, h + 1, nbytes);
    } else {
        if (r + p2 < n) {
            rd_head *h = rd(c, r + p2, RD_FOLD, e);
            if ((rc = wait_round(c, &h->stamp, r + p2, e)))
                return rc;
            rd_merge(&sig, h);
            if (sig.max == -sig.neg)
                hm_combine(acc, h + 1, count, dtype, op);
        }
        for (int k = 0, d = 1; d < p2; k++, d <<= 1) {
            int peer = r ^ d;
            rd_publish(rd(c, r, k, e), acc, nbytes, &sig, e, ord);
            rd_head *h = rd(c, peer, k, e);
            if ((rc = wait_round(c, &h->stamp, peer, e)))
                return rc;
            rd_merge(&sig, h);
            if (sig.max != -sig.neg)
                continue;
            if (peer > r) {
                hm_combine(acc, h + 1, count, dtype, op);
            } else {
                memcpy(tmp, h + 1, nbytes);
                hm_combine(tmp, acc, count, dtype, op);
                memcpy(acc, tmp, nbytes);
            }
        }
        if (r + p2 < n)
            rd_publish(rd(c, r, RD_RESULT, e), acc, nbytes, &sig, e, ord);
    }
    if (sig.max != -sig.neg)
        return spread_mismatch(c, HM_K_ALLREDUCE_RD, &sig);
    memcpy(recv, acc, nbytes);
    return finish(c, HM_OK);
}

double hm_allreduce_rd_f64(hm_coll *c, double x, int op)
{
    double r;
    if (hm_allreduce_rd(c, &x, &r, 1, HM_F64, op) != HM_OK) {
        if (c->err.code == HM_OK)
            c->err.code = HM_EARG;
        return __builtin_nan("");
    }
    return r;
}

/* ------------------------------------------------------------------ the node's allreduce */

static inline direct_head *direct(const hm_coll *c, int rank, uint64_t e)
{
    return (direct_head *)(c->seg[rank] + c->extra + DIRECT_AT + (e & 1) * direct_span(c->capacity));
}

_Static_assert(sizeof(direct_head) % 16 == 0, "the direct value must be 16-byte aligned");

/* The direct allreduce (hm_core.h, hm_allreduce_node): one round of stamps.  A rank writes
 * its buffer of parity e & 1 again only at call e + 2, after it saw every rank's stamp of
 * call e + 1, which each stores after it read every buffer of call e. */
static int allreduce_direct(hm_coll *c, const void *send, void *recv, uint64_t count, int dtype,
                            int op)
{
    uint64_t nbytes = count * hm_dtype_size(dtype);
    int n = c->size, rc;
    uint64_t e = ++c->epoch;
    enter(c, e, HM_K_ALLREDUCE_DIRECT, count, dtype, op);
    c->err.code = HM_OK;
    direct_head *mine = direct(c, c->rank, e);
    int64_t own = sig_of(count, dtype, op);
    mine->sig = own;
    memcpy(mine + 1, send, nbytes);
    CHAOS();
    store_rel(&mine->stamp, e, c->policy.order);
    rd_sig sig = {own, -own, c->rank, c->rank};
    for (int r = 0; r < n; r++) {
        direct_head *h = direct(c, r, e);
        if (r != c->rank && (rc = wait_round(c, &h->stamp, r, e)))
            return rc;
        rd_head seen = {.sig_max = h->sig, .sig_neg = -h->sig, .max_rank = r, .min_rank = r};
        rd_merge(&sig, &seen);
    }
    if (sig.max != -sig.neg)
        return spread_mismatch(c, HM_K_ALLREDUCE_DIRECT, &sig);
    memcpy(recv, direct(c, 0, e) + 1, nbytes);
    for (int r = 1; r < n; r++)
        hm_combine(recv, direct(c, r, e) + 1, count, dtype, op);
    return finish(c, HM_OK);
}

/* Reduce-scatter and allgather of one chunk of `count` elements of a call of `total`
 * (hm_core.h, hm_allreduce_node).  Rank r writes the half of its slot of parity e & 1 again
 * only in call e + 2, which it reaches after completing call e + 1, which no rank completes
 * before every rank entered it (every collective of a node reads every rank's part), so after
 * every rank copied what it needed of call e.  Its header (one, not by parity) is read in a
 * call only before the reader stamps 2e, and r leaves the call, completed or with a mismatch,
 * only after every rank stamped 2e. */
static int allreduce_rsag(hm_coll *c, const void *send, void *recv, uint64_t count, uint64_t total,
                          int dtype, int op)
{
    size_t esz = hm_dtype_size(dtype);
    int n = c->size, me = c->rank, ord = c->policy.order, rc;
    uint64_t e = ++c->epoch, half = (c->capacity / 2) & ~(uint64_t)63;
    enter(c, e, HM_K_ALLREDUCE_RSAG, total, dtype, op);
    c->err.code = HM_OK;
    header *mine = hdr(c, me);
    int64_t own = sig_of(total, dtype, op);
    mine->count = own;   /* (the signature: compared below, as the direct allreduce's) */
    mine->epoch = (uint32_t)e;
    memcpy((char *)hm_coll_slot(c, me) + (e & 1) * half, send, count * esz);
    CHAOS();
    store_rel(counter(c, me, HM_OFF_SYNC), 2 * e - 1, ord);
    rd_sig sig = {own, -own, me, me};
    for (int r = 0; r < n; r++) {
        if (r != me && ((rc = wait_counter(c, r, HM_CNT_ARRIVE, 2 * e - 1)) ||
                        (rc = other_collective(c, r, e, 1))))
            return rc;
        rd_head seen = {.sig_max = hdr(c, r)->count, .sig_neg = -hdr(c, r)->count,
                        .max_rank = r, .min_rank = r};
        rd_merge(&sig, &seen);
    }
    if (sig.max != -sig.neg) {
        /* every rank found it (each read every header): none leaves before all have read them,
         * since a rank's next call writes its header again (outside review) */
        store_rel(counter(c, me, HM_OFF_SYNC), 2 * e, ord);
        for (int r = 0; r < n; r++)
            if (r != me && (rc = wait_counter(c, r, HM_CNT_RELEASE, 2 * e)))
                return rc;
        return spread_mismatch(c, HM_K_ALLREDUCE_RSAG, &sig);
    }
    /* this rank's part: elements [lo, hi) of every rank's chunk, combined in rank order */
    uint64_t lo = count * (uint64_t)me / (uint64_t)n, hi = count * (uint64_t)(me + 1) / (uint64_t)n;
    char *out = (char *)recv + lo * esz;
    memcpy(out, (char *)hm_coll_slot(c, 0) + (e & 1) * half + lo * esz, (hi - lo) * esz);
    for (int r = 1; r < n; r++)
        hm_combine(out, (char *)hm_coll_slot(c, r) + (e & 1) * half + lo * esz, hi - lo, dtype, op);
    memcpy((char *)hm_coll_slot(c, me) + (e & 1) * half + lo * esz, out, (hi - lo) * esz);
    CHAOS();
    store_rel(counter(c, me, HM_OFF_SYNC), 2 * e, ord);
    for (int k = 1; k < n; k++) {   /* the other parts, from the next rank on */
        int r = (me + k) % n;
        if ((rc = wait_counter(c, r, HM_CNT_RELEASE, 2 * e)))
            return rc;
        uint64_t a = count * (uint64_t)r / (uint64_t)n, b = count * (uint64_t)(r + 1) / (uint64_t)n;
        memcpy((char *)recv + a * esz, (char *)hm_coll_slot(c, r) + (e & 1) * half + a * esz,
               (b - a) * esz);
    }
    return finish(c, HM_OK);
}

/* The node's allreduce of `count` elements in chunks (one, of no element, for count 0): of
 * half the slot by the reduce-scatter and allgather (`rsag`), else of the slot by the tree. */
static int in_chunks(hm_coll *c, const void *send, void *recv, uint64_t count, int dtype, int op,
                     int rsag)
{
    size_t esz = hm_dtype_size(dtype);
    uint64_t per = (rsag ? (c->capacity / 2) & ~(uint64_t)63 : c->capacity) / esz, start = 0;
    if (per == 0)
        return HM_EARG;
    do {
        uint64_t k = count - start < per ? count - start : per, at = start * esz;
        int rc = rsag ? allreduce_rsag(c, (const char *)send + at, (char *)recv + at, k, count, dtype, op)
                      : hm_allreduce_chunk(c, (const char *)send + at, (char *)recv + at, k, count, dtype,
                                           op, HM_BOTH);
        if (rc)
            return rc;
        start += k;
    } while (start < count);
    return HM_OK;
}

int hm_allreduce_node(hm_coll *c, const void *send, void *recv, uint64_t count, int dtype, int op,
                      int any)
{
    HM_PROFILED;
    size_t esz = hm_dtype_size(dtype);
    if (!hm_op_valid(dtype, op) || count > (uint64_t)INT64_MAX / esz)
        return HM_EARG;
    uint64_t nbytes = count * esz;
    if (any && c->size > 1) {
        if (nbytes <= HM_RD_BYTES)
            return hm_allreduce_rd(c, send, recv, count, dtype, op);
        if (nbytes <= direct_bytes(c->capacity) && nbytes * (uint64_t)c->size <= HM_DIRECT_TOTAL)
            return allreduce_direct(c, send, recv, count, dtype, op);
        return in_chunks(c, send, recv, count, dtype, op, 1);
    }
    return in_chunks(c, send, recv, count, dtype, op, 0);
}

void hm_coll_poison(hm_coll *c, uint64_t bits)
{
    int n = c->size, r = c->rank;
    if (n == 1)
        return;
    atomic_fetch_or_explicit(counter(c, r, HM_OFF_SYNC), bits, memory_order_seq_cst);
    atomic_fetch_or_explicit(counter(c, 0, HM_OFF_LINEAR), bits, memory_order_seq_cst);
    for (int k = 0, d = 1; d < n; k++, d <<= 1)
        atomic_fetch_or_explicit(diss(c, (r + d) % n, k), bits, memory_order_seq_cst);
    for (uint64_t par = 0; par < 2; par++) {
        for (int k = 0; k < HM_STEPS + 2; k++)
            atomic_fetch_or_explicit(&rd(c, r, k, par)->stamp, bits, memory_order_seq_cst);
        atomic_fetch_or_explicit(&direct(c, r, par)->stamp, bits, memory_order_seq_cst);
    }
}
