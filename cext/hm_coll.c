/* hybridmpi C core: epoch counters, wait policy, the node's set-up, its waits and errors (the
 * verdict of a mismatch, an abandoned allreduce, the poisoning of every word), its barriers and
 * its tree allreduce; hm_coll_node.c the node's allreduce by recursive doubling, direct and by
 * reduce-scatter and allgather (hm_segment.h: what the two share; the reduction
 * operators they combine with: hm_ops.c).  See hm_core.h for the contract of each exported
 * function. */
#define _GNU_SOURCE
#include "hm_segment.h"

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

uint64_t hm_coll_segment_bytes(uint64_t capacity)
{
    return extra_offset(capacity) + (uint64_t)DIRECT_AT + 2 * direct_span(capacity);
}

void *hm_coll_slot(hm_coll *c, int rank) { return c->seg[rank] + HM_OFF_DATA; }

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

int hm_coll_set_direct_total(hm_coll *c, int64_t bytes)
{
    if (bytes < 0 || bytes > HM_DIRECT_TOTAL_MAX)
        return HM_EARG;
    c->direct_total = (uint64_t)bytes;
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
    c->direct_total = HM_DIRECT_TOTAL;
    hm_policy_init(&c->policy, 0);
    memset(seg[rank], 0, hm_coll_segment_bytes(capacity));
    return HM_OK;
}

int coll_fail(hm_coll *c, int code, uint64_t bits)
{
    c->err.code = code;
    hm_coll_poison(c, bits);
    return code;
}

int coll_timed_out(hm_coll *c, int peer, int cnt, uint64_t seen)
{
    wait_failed(&c->err, &c->policy, HM_ETIMEOUT, peer, cnt, c->epoch, seen);
    return coll_fail(c, HM_ETIMEOUT, HM_ERRBIT);
}

/* A peer's word carried error bits: fail too, passing the same bits on. */
int coll_peer_failed(hm_coll *c, int peer, int cnt, uint64_t seen)
{
    wait_failed(&c->err, &c->policy, HM_EPEER, peer, cnt, c->epoch, seen);
    return coll_fail(c, HM_EPEER, seen & HM_FLAGS);
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
int coll_other_call(hm_coll *c, int peer)
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

static int coll_abandon(hm_coll *c);

/* A wait on node rank `peer`'s SYNC word (counter `cnt`), and on a round's word. */
static inline int wait_counter(hm_coll *c, int peer, int cnt, uint64_t value)
{
    return coll_wait(c, counter(c, peer, HM_OFF_SYNC), value, peer, cnt);
}

static inline int wait_round(hm_coll *c, hm_counter *p, int peer, uint64_t e)
{
    return coll_wait(c, p, e, peer, HM_CNT_ROUND);
}

/* While a wait is slow: whether a rank of the node is in this call number with another
 * collective (node rank `peer`, or any for -1), or abandoned this allreduce.  Ranks in
 * allreduces of different algorithms (their sizes fell on either side of a threshold: a
 * count mismatch) abandon the call together (coll_abandon()): a ValueError on every rank, the
 * comm usable, as for a mismatch inside one algorithm.  Other calls break the comm. */
static int call_differs(hm_coll *c, int peer)
{
    for (int r = peer < 0 ? 0 : peer; r < (peer < 0 ? c->size : peer + 1); r++)
        if (r != c->rank && coll_other_call(c, r))
            return is_allreduce(c->err.bad_kind) && is_allreduce(c->err.root_kind)
                   ? coll_abandon(c) : coll_fail(c, HM_EMISMATCH, HM_ERRBIT | HM_MISBIT);
    if (!is_allreduce(atomic_load_explicit(&ent(c, c->rank)->kind, memory_order_relaxed)))
        return HM_OK;
    for (int r = 0; r < c->size; r++)
        if (r != c->rank && load_acq(&quit(c, r, c->epoch)->stamp, HM_ACQ_REL) == c->epoch)
            return coll_abandon(c);
    return HM_OK;
}

/* Wait until *p >= value, p being written by node rank `peer` (-1: by
 * several).  While it waits long enough to stop spinning, it compares the
 * signature of the peer's call (of every rank, for -1) with its own (call_differs). */
int coll_wait(hm_coll *c, const hm_counter *p, uint64_t value, int peer, int cnt)
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
            return coll_timed_out(c, peer, cnt, v);
    }
got:
    if (v & HM_FLAGS) {
        /* A peer that finished this call (completed it, or entered a later one) before its
         * comm broke had stored its value for it: the error bits came from later, in a
         * collective or anywhere else (a Halo call, a with block left on an exception).  This
         * call completed here too, and the next one raises.  (ENTERED is never poisoned.) */
        if (peer < 0 || !finished(c, peer, c->epoch) || ((v & ~(HM_FLAGS | HM_BADBIT)) < value))
            return coll_peer_failed(c, peer, cnt, v);
        v &= ~HM_FLAGS;
    }
    /* In the same call (a peer already in a later one has finished this one): the peer's
     * arguments were invalid and not this rank's, or the other way round. */
    if ((v & ~HM_BADBIT) == value && (v & HM_BADBIT) != c->mark)
        return coll_peer_failed(c, peer, cnt, v | HM_ERRBIT | HM_MISBIT);
    return HM_OK;
}

/* A tree barrier and a tree allreduce arrive on the same word (SYNC): a child's arrival at
 * call e may come from the other collective.  The child's header, in SYNC's cache line, tells:
 * an allreduce stamps it with its call before it arrives, a barrier never does.  Checked at
 * every arrival (a wait that stops spinning compares signatures too, but in the fast path the
 * allreduce would take the barrier child's stale slot as its value). */
int coll_other_collective(hm_coll *c, int child, uint64_t e, int in_allreduce)
{
    if ((hdr(c, child)->epoch == (uint32_t)e) == in_allreduce)
        return HM_OK;
    coll_other_call(c, child);   /* its signature, for the error (err.bad_*) */
    return coll_fail(c, HM_EMISMATCH, HM_ERRBIT | HM_MISBIT);
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
                (rc = coll_other_collective(c, c->children[i], e, 0)))
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
                (rc = coll_other_collective(c, c->children[i], e, 1)))
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
                          (rc = coll_other_collective(c, ch, e, 1))))
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

/* Ranks of an allreduce of `kind` that saw every rank's signature (recursive doubling, direct)
 * passed different ones: the largest's rank and arguments in err.bad_*, the smallest's in
 * err.peer and err.root_*, alike on every rank. */
int coll_spread_mismatch(hm_coll *c, int kind, const rd_sig *sig)
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
static int coll_abandon(hm_coll *c)
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
                return coll_peer_failed(c, r, HM_CNT_ROUND, sync);
            if (coll_other_call(c, r) && !is_allreduce(c->err.bad_kind))
                return coll_fail(c, HM_EMISMATCH, HM_ERRBIT | HM_MISBIT);
            if (slow_tick(&w, pol, &h->stamp, e, v))
                return coll_timed_out(c, r, HM_CNT_ROUND, v);
        }
        rd_head seen = {.sig_max = atomic_load_explicit(&h->sig, memory_order_relaxed),
                        .max_rank = r, .min_rank = r};
        seen.sig_neg = -seen.sig_max;
        rd_merge(&sig, &seen);
    }
    return coll_spread_mismatch(c, HM_K_ALLREDUCE_DIRECT, &sig);
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
