/* hybridmpi C core: the node's allreduce (hm_core.h, hm_allreduce_node): recursive doubling up
 * to HM_RD_BYTES, the direct allreduce while the node's ranks times the payload is at most
 * the comm's gate (HM_DIRECT_TOTAL unless a table chose another), else the reduce-scatter
 * and allgather in chunks. */
#define _GNU_SOURCE
#include "hm_segment.h"

/* ------------------------------------------------------------------ recursive doubling */

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
        if ((rc = coll_wait(c, &h->stamp, e, r - p2, HM_CNT_ROUND)))
            return rc;
        rd_merge(&sig, h);
        memcpy(acc, h + 1, nbytes);
    } else {
        if (r + p2 < n) {
            rd_head *h = rd(c, r + p2, RD_FOLD, e);
            if ((rc = coll_wait(c, &h->stamp, e, r + p2, HM_CNT_ROUND)))
                return rc;
            rd_merge(&sig, h);
            if (sig.max == -sig.neg)
                hm_combine(acc, h + 1, count, dtype, op);
        }
        for (int k = 0, d = 1; d < p2; k++, d <<= 1) {
            int peer = r ^ d;
            rd_publish(rd(c, r, k, e), acc, nbytes, &sig, e, ord);
            rd_head *h = rd(c, peer, k, e);
            if ((rc = coll_wait(c, &h->stamp, e, peer, HM_CNT_ROUND)))
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
        return coll_spread_mismatch(c, HM_K_ALLREDUCE_RD, &sig);
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
        if (r != c->rank && (rc = coll_wait(c, &h->stamp, e, r, HM_CNT_ROUND)))
            return rc;
        rd_head seen = {.sig_max = h->sig, .sig_neg = -h->sig, .max_rank = r, .min_rank = r};
        rd_merge(&sig, &seen);
    }
    if (sig.max != -sig.neg)
        return coll_spread_mismatch(c, HM_K_ALLREDUCE_DIRECT, &sig);
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
        if (r != me && ((rc = coll_wait(c, counter(c, r, HM_OFF_SYNC), 2 * e - 1, r, HM_CNT_ARRIVE)) ||
                        (rc = coll_other_collective(c, r, e, 1))))
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
            if (r != me && (rc = coll_wait(c, counter(c, r, HM_OFF_SYNC), 2 * e, r, HM_CNT_RELEASE)))
                return rc;
        return coll_spread_mismatch(c, HM_K_ALLREDUCE_RSAG, &sig);
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
        if ((rc = coll_wait(c, counter(c, r, HM_OFF_SYNC), 2 * e, r, HM_CNT_RELEASE)))
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
        if (nbytes <= direct_bytes(c->capacity) && nbytes * (uint64_t)c->size <= c->direct_total)
            return allreduce_direct(c, send, recv, count, dtype, op);
        return in_chunks(c, send, recv, count, dtype, op, 1);
    }
    return in_chunks(c, send, recv, count, dtype, op, 0);
}
