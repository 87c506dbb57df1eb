/* hybridmpi C core: what the files of the node's collectives share (hm_coll.c: the set-up, the
 * waits and errors, the barriers and the tree allreduce; hm_coll_node.c: the node's allreduce
 * by recursive doubling, direct and by reduce-scatter and allgather): the layout of a rank's
 * segment and its accessors, the signatures of allreduce calls, and the waits and errors of
 * hm_coll.c.  Internal: hidden from the library's users. */
#ifndef HM_SEGMENT_H
#define HM_SEGMENT_H

#include "hm_wait.h"

#include <string.h>

#define HM_INTERNAL __attribute__((visibility("hidden")))

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

/* A rank's signature of its current call, after the call number in its
 * ENTERED region (docs/protocol.md). */
typedef struct entered {
    hm_counter call;
    _Atomic int64_t kind, count, dtype, op;
    hm_counter done;   /* the last call this rank completed (its part returned HM_OK) */
} entered;

_Static_assert(sizeof(entered) <= HM_REGION, "ENTERED region too small");

static inline entered *ent(const hm_coll *c, int rank) { return (entered *)(c->seg[rank] + HM_OFF_ENTERED); }

/* A rank's record of an allreduce it abandoned (coll_abandon(), below): the call number, stored
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

static inline direct_head *direct(const hm_coll *c, int rank, uint64_t e)
{
    return (direct_head *)(c->seg[rank] + c->extra + DIRECT_AT + (e & 1) * direct_span(c->capacity));
}

/* hm_coll.c: fail with `code`, poisoning the node's words with `bits`; a wait that timed out;
 * a peer's word that carried error bits; whether `peer` is in this call number with another
 * kind of call; wait until *p >= value (written by node rank `peer`, -1: by several); whether
 * a tree child's arrival came from the other collective. */
HM_INTERNAL int coll_fail(hm_coll *c, int code, uint64_t bits);
HM_INTERNAL int coll_timed_out(hm_coll *c, int peer, int cnt, uint64_t seen);
HM_INTERNAL int coll_peer_failed(hm_coll *c, int peer, int cnt, uint64_t seen);
HM_INTERNAL int coll_other_call(hm_coll *c, int peer);
HM_INTERNAL int coll_wait(hm_coll *c, const hm_counter *p, uint64_t value, int peer, int cnt);
HM_INTERNAL int coll_other_collective(hm_coll *c, int child, uint64_t e, int in_allreduce);
/* hm_coll.c: ranks of an allreduce of `kind` that saw every rank's signature passed different
 * ones (sig: the extremes and their ranks): the verdict, alike on every rank */
HM_INTERNAL int coll_spread_mismatch(hm_coll *c, int kind, const rd_sig *sig);

/* Region k of `rank`'s dissemination signals (written by rank - 2^k only). */
static inline hm_counter *diss(const hm_coll *c, int rank, int k)
{
    return (hm_counter *)(c->seg[rank] + c->extra + (uint64_t)k * HM_REGION);
}

#endif
