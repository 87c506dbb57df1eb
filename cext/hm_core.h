/* hybridmpi C core: the only header.  Every exported name starts with hm_.
 *
 * The core knows nothing of MPI or Python: it receives the addresses of
 * shared segments (mapped by MPI_Win_allocate_shared on the Python side)
 * and works on them with C11 atomics.  This header is also fed to cffi's
 * cdef after its preprocessor lines are stripped, so it uses plain types
 * only (no _Atomic, no macros in declarations).
 */
#ifndef HM_CORE_H
#define HM_CORE_H

#include <stddef.h>
#include <stdint.h>

/* Maximum tree arity. */
#define HM_MAX_RADIX 16

/* Byte layout of one rank's collective segment.  ENTERED and LINEAR own a
 * 128-byte region each (a pair of cache lines, which Intel's spatial
 * prefetcher moves together).  SYNC holds the rank's one epoch counter,
 * followed in the same line by the allreduce header and the first bytes of
 * its data slot, so that a small reduction moves in the line that carries
 * the signal.  The counter has a single writer, its owner: 2e-1 once the
 * owner (and its subtree) arrived at collective call e, 2e once it released
 * its children from call e.  It only grows, so nothing is ever reset.  The
 * linear-barrier counter at the root is the one counter that several ranks
 * write (fetch_add). */
enum {
    HM_REGION = 128,
    HM_OFF_ENTERED = 0,
    HM_OFF_LINEAR = 128,
    HM_OFF_SYNC = 256,
    HM_OFF_HEADER = 264,
    HM_OFF_DATA = 304
};

/* Memory orders. */
enum { HM_ACQ_REL = 0, HM_SEQ_CST = 1 };

/* Barrier methods and collective phases.  Dissemination runs only as a
 * whole barrier (HM_BOTH). */
enum { HM_TREE = 0, HM_LINEAR = 1, HM_DISSEMINATION = 2 };
enum { HM_GATHER = 1, HM_RELEASE = 2, HM_BOTH = 3 };

/* Element types and reduction operations. */
enum { HM_F64 = 0, HM_F32 = 1, HM_I64 = 2, HM_I32 = 3, HM_C128 = 4, HM_NTYPES = 5 };
enum { HM_SUM = 0, HM_PROD = 1, HM_MIN = 2, HM_MAX = 3, HM_NOPS = 4 };

/* Return codes. */
enum { HM_OK = 0, HM_ETIMEOUT = 1, HM_EMISMATCH = 2, HM_EARG = 3, HM_ECMA = 4 };

/* bad_rank of a mismatch found on another node. */
enum { HM_BAD_ELSEWHERE = -2 };

/* Which counter a timed-out wait was watching (HM_CNT_ROUND: a peer's
 * signal of a dissemination round or recursive-doubling step, which holds
 * the last call it reached). */
enum { HM_CNT_ARRIVE = 1, HM_CNT_RELEASE = 2, HM_CNT_LINEAR = 3, HM_CNT_ROUND = 6 };

/* Rounds of the dissemination barrier and steps of the recursive-doubling
 * allreduce (2^16 ranks per node), and the largest payload of the latter. */
enum { HM_STEPS = 16, HM_RD_BYTES = 96 };

/* Wait policy: spin `spin` polls with a pause instruction, then
 * sched_yield until `yield_ns` have passed since the wait began, then
 * sleep `sleep_ns` at a time.  A wait gives up at `timeout_ns` (0: never). */
typedef struct hm_wait_policy {
    int64_t spin;
    int64_t yield_ns;
    int64_t sleep_ns;
    int64_t timeout_ns;
    int order;
} hm_wait_policy;

/* What a failed call leaves behind for the error message. */
typedef struct hm_error {
    int code;
    int peer;          /* node rank whose counter was watched, -1 if several */
    int counter;       /* HM_CNT_* */
    uint64_t epoch;    /* the collective call (1, 2, ...) that timed out */
    uint64_t seen;     /* value of the watched counter last read */
    double waited_s;   /* seconds waited */
    /* allreduce argument mismatch: the offending rank and what it passed,
     * and what the node root passed */
    int bad_rank;
    int64_t bad_count, bad_dtype, bad_op;
    int64_t root_count, root_dtype, root_op;
} hm_error;

/* Per-rank state of the node collectives (private memory). */
typedef struct hm_coll {
    int rank;                 /* rank in the node communicator */
    int size;                 /* ranks in the node communicator */
    int radix;
    int parent;               /* -1 at the root */
    int nchildren;
    int children[16];
    char **seg;               /* seg[r]: address of rank r's segment */
    uint64_t capacity;        /* bytes of each rank's data slot */
    uint64_t extra;           /* offset of the dissemination and recursive-doubling regions */
    uint64_t epoch;           /* collective calls made so far */
    uint64_t linear_calls;    /* linear barriers made so far */
    hm_wait_policy policy;
    hm_error err;
} hm_coll;

/* 1 if 64-bit atomics are lock-free (required across processes). */
int hm_lock_free(void);

/* Bytes of one rank's collective segment for a data slot of `capacity`
 * (the slot, then HM_STEPS dissemination regions, then two sets, by epoch
 * parity, of HM_STEPS + 2 recursive-doubling regions). */
uint64_t hm_coll_segment_bytes(uint64_t capacity);

/* Set up `c` for node rank `rank` of `size`, tree of arity `radix`;
 * `seg` must stay valid while `c` is used.  Zeroes this rank's segment.
 * Returns HM_EARG for bad sizes. */
int hm_coll_init(hm_coll *c, int rank, int size, int radix, char **seg,
                 uint64_t capacity);

/* Barrier over the node.  `part` = HM_BOTH for a whole barrier; the root
 * may split it into HM_GATHER (returns once every rank arrived) and
 * HM_RELEASE (lets everyone go).  Guarantees: every write made by any
 * rank before the barrier is visible to every rank after it. */
int hm_barrier(hm_coll *c, int method, int part);

/* hm_barrier(c, HM_TREE | HM_LINEAR | HM_DISSEMINATION, HM_BOTH) with one
 * argument: every argument costs a conversion on the
 * Python side of the hottest call.  Dissemination: in round k each rank
 * release-stores the call number into its own region of rank + 2^k and
 * acquire-waits for rank - 2^k's store into its region k; ceil(log2 n)
 * rounds, one hop at two ranks. */
int hm_barrier_tree(hm_coll *c);
int hm_barrier_linear(hm_coll *c);
int hm_barrier_dissemination(hm_coll *c);

/* Allreduce of up to HM_RD_BYTES by recursive doubling (whole node, no
 * release phase): the ranks above the largest power of two first hand
 * their value to rank - 2^m and get the result back at the end; in step k
 * rank r exchanges its partial result with r ^ 2^k through epoch-stamped
 * regions (two sets, by epoch parity) and combines lower rank's value op
 * higher rank's value, so every rank computes the same bits.  The
 * arguments travel as a signature whose maximum and minimum (with the
 * lowest rank holding each) are reduced along: ranks that passed different
 * ones all get HM_EMISMATCH, with err.bad_rank and err.bad_* the largest
 * signature's rank and arguments, err.peer and err.root_* the smallest's.
 * HM_EARG if the payload is too large. */
int hm_allreduce_rd(hm_coll *c, const void *send, void *recv, uint64_t count, int dtype, int op);

/* hm_allreduce_rd of one double, by value; NaN and c->err.code on failure,
 * as hm_allreduce_f64. */
double hm_allreduce_rd_f64(hm_coll *c, double x, int op);

/* Allreduce of `count` elements of type `dtype` over the node with `op`,
 * combined in a fixed order (own value, then children in rank order), so
 * the result has the same bits on every run.  count * size(dtype) must
 * not exceed the slot capacity.  `send` may equal `recv`.  The root may
 * split the call as for hm_barrier: after HM_GATHER the node's reduction
 * lies in its slot (hm_coll_slot), where it may be combined further
 * before HM_RELEASE, which is called with send = NULL. */
int hm_allreduce(hm_coll *c, const void *send, void *recv, uint64_t count,
                 int dtype, int op, int part);

/* hm_allreduce of one double, by value (saves the caller two buffer
 * accesses on the hottest path).  On failure it returns NaN and sets
 * c->err.code; a NaN result with c->err.code == HM_OK is a real NaN. */
double hm_allreduce_f64(hm_coll *c, double x, int op);

/* At the node root, between HM_GATHER and HM_RELEASE of hm_allreduce:
 * returns the node rank that passed arguments different from the root's,
 * -1 if none; with `elsewhere` set, first records that another node
 * disagreed (HM_BAD_ELSEWHERE), so the release fails on every rank. */
int hm_allreduce_verdict(hm_coll *c, int elsewhere);

/* Address of rank `rank`'s data slot. */
void *hm_coll_slot(hm_coll *c, int rank);

/* Element size of a dtype code, 0 if unknown. */
size_t hm_dtype_size(int dtype);

/* Combine src into dst elementwise: dst[i] = dst[i] op src[i]. */
int hm_combine(void *dst, const void *src, uint64_t count, int dtype, int op);

/* Acquire-load (or seq_cst) the counter at `addr`. */
uint64_t hm_load(const void *addr, int order);

/* ------------------------------------------------------------------ ghost exchange */

/* Unpack operation that overwrites (forward ghost update); the combining
 * ones are HM_SUM, HM_MIN, HM_MAX. */
enum { HM_INSERT = 4 };

/* Which counter a timed-out exchange was watching. */
enum { HM_CNT_READY = 4, HM_CNT_DONE = 5 };

/* One direction of traffic with one peer: the local ids of the points
 * moved, stored as runs of consecutive ids (so contiguous data moves with
 * memcpy), and the buffer the points travel in.  Shared channels have two
 * buffers, used alternately by epoch parity, and two epoch counters:
 * READY (in the receiver's segment, written by the sender once buf holds
 * epoch e) and DONE (in the sender's segment, written by the receiver once
 * it has read epoch e).  Private channels (MPI messages, or buffers that
 * other code synchronizes) have ready = done = NULL. */
typedef struct hm_chan {
    int peer;                 /* rank of the other end, for error messages */
    int64_t count;            /* points moved */
    int64_t nruns;
    const int64_t *run_start; /* first local id of each run */
    const int64_t *run_len;   /* length of each run */
    const int32_t *idx;       /* if set: the `count` local ids, moved point by point
                                 (chosen for short runs; run_start/run_len unused) */
    char *buf[2];
    void *ready;
    void *done;
    void *tag;                /* next to READY: which vector was published (HM_TAG_PRIVATE
                                 for a packed buffer); NULL when nothing checks it */
} hm_chan;

/* The tag of a packed (private-array) update; shared vectors are numbered 0, 1, ... */
enum { HM_TAG_PRIVATE = -1, HM_TAG_CMA = -2 };

/* The channels that one call packs or unpacks, in order. */
typedef struct hm_xchg {
    int n;
    hm_chan *chan;
    int esz;                  /* bytes per point: item size * block */
    int dtype;                /* element type, for combining */
    void *entered;            /* if set, receives the epoch when a send starts
                                 (read by peers to name ranks that never came) */
    hm_wait_policy policy;
    hm_error err;             /* peer: rank of the channel that timed out */
} hm_xchg;

/* (A channel's tag, when set, is written by the sender before READY and
 * checked by the receiver after it: a receiver that finds another tag
 * (one rank passed a shared vector, the other a private array) returns
 * HM_EMISMATCH with err.peer set, and copies nothing.) */

/* Sender side of epoch `epoch` (1, 2, ...): record the epoch in `entered`
 * (relaxed; diagnostic only), then for each channel wait until
 * its DONE counter reached epoch - 2 (the buffer of this parity is free),
 * pack the points of `x` into buf[epoch & 1] and publish READY = epoch
 * with a release store.  Private channels are only packed. */
int hm_xchg_send(hm_xchg *s, const void *x, uint64_t epoch);

/* Receiver side of epoch `epoch`: for each channel, once READY >= epoch
 * (acquire), combine buf[epoch & 1] into the points of `x` with `op`
 * (HM_INSERT, HM_SUM, HM_MIN, HM_MAX) and publish DONE = epoch.  With
 * `ordered` the channels are taken in their order (a fixed combination
 * order); otherwise whichever is ready first. */
int hm_xchg_recv(hm_xchg *s, void *x, uint64_t epoch, int op, int ordered);

/* hm_xchg_send(s, ...) then hm_xchg_recv(r, ...): a whole exchange in one
 * call. */
int hm_xchg_both(hm_xchg *s, hm_xchg *r, void *x, uint64_t epoch, int op, int ordered);

/* ------------------------------------------------------------------ zero-copy (shared vectors) */

/* One channel of a zero-copy update, seen from the rank that copies: the
 * peer's vector (in shared memory), the runs of (my point, peer's point)
 * pairs, the READY counter the peer publishes (in my segment, with the tag
 * word next to it) and the DONE counter this rank publishes (in the
 * peer's segment).  Forward: I copy the owner's values into my ghosts.
 * Reverse: I (the owner) combine the peer's ghost values into my points. */
typedef struct hm_pull {
    int peer;
    int64_t nruns;
    const int64_t *mine;      /* first point of each run in my vector */
    const int64_t *theirs;    /* first point of each run in the peer's vector */
    const int64_t *len;
    int64_t count;            /* points, when moved point by point: */
    const int32_t *imine;     /* if set: every point of mine and theirs (short runs; */
    const int32_t *itheirs;   /* nruns, mine, theirs and len are then unused) */
    const char *src;          /* the peer's vector */
    int pid;                  /* cross-memory attach (hm_pulls.cma): the peer's process, */
    void *addr;               /* and the word next to its tag where it publishes its array */
    void *ready;
    void *tag;
    void *done;
} hm_pull;

typedef struct hm_pulls {
    int n;
    hm_pull *chan;
    int esz;
    int dtype;
    int cma;                  /* 1: read the peers' private arrays with process_vm_readv
                                 (forward only; src unused) */
    hm_wait_policy policy;
    hm_error err;             /* peer: the channel's peer; bad_count: the tag found;
                                 HM_ECMA: bad_dtype holds errno */
} hm_pulls;

/* Publish vector `tag` at epoch e on each (ready, tag) pair: the tag word,
 * then READY = e with a release store (the values are in place). */
void hm_publish(int n, void **ready, void **tag, int64_t tagval, uint64_t epoch, int order);

/* hm_publish with tag HM_TAG_CMA and the address of this rank's array `x` in the
 * word after each tag, for readers that copy with process_vm_readv. */
void hm_publish_cma(int n, void **ready, void **tag, const void *x, uint64_t epoch, int order);

/* A whole zero-copy forward update on one node in one call: publish x on the
 * `n` (ready, tag) pairs (tag `tagval`, or with `pulls->cma` the address of x),
 * pull from every peer whichever is ready first, then wait until this rank's
 * readers are done.  Errors of the readers' wait are copied into pulls->err. */
int hm_zc_update(hm_pulls *pulls, hm_pulls *readers, int n, void **ready, void **tag,
                 int64_t tagval, void *x, uint64_t epoch);

/* 1 if this process can read `len` bytes at `remote` in process `pid` with
 * process_vm_readv into `local` (the cross-memory-attach probe). */
int hm_cma_probe(int pid, const void *remote, void *local, uint64_t len);

/* For each channel: acquire-wait READY >= e, check that the tag is `tag`
 * (else HM_EMISMATCH, and DONE is set to e | 2^63 so the peer learns it
 * too), copy (op HM_INSERT) or combine the pairs straight from the peer's
 * vector into x, release-store DONE = e.  `ordered`: in channel order (a
 * fixed combination order), else whichever is ready first. */
int hm_pull_recv(hm_pulls *p, void *x, int64_t tag, uint64_t epoch, int op, int ordered);

/* Wait until every DONE counter (the readers', in this rank's segment)
 * reached e; HM_EMISMATCH (err.peer) if a reader found another vector. */
int hm_wait_done(hm_pulls *p, uint64_t epoch);

/* ------------------------------------------------------------------ global memory */

/* Let waits that stopped spinning call `fn` between polls (NULL: none).
 * Process-wide; the Python side passes a function that drives MPI
 * progress while RMA windows span several nodes. */
void hm_set_progress(void (*fn)(void));

/* Sequentially consistent atomics on an int64 in shared memory; both return
 * the old value. */
int64_t hm_fetch_add(void *addr, int64_t value);
int64_t hm_compare_swap(void *addr, int64_t expected, int64_t value);

/* Pairwise epoch counters (sync_images inside a node).  For every i:
 * calls[peer[i]] += 1, then release-store that count into signal[i] (the
 * counter of this rank in the peer's segment); then wait until each
 * wait[i] (the peer's counter in this rank's segment) reached the same
 * count (acquire).  On timeout err.peer is the index i. */
typedef struct hm_pairs {
    int n;
    void **signal;
    void **wait;
    const int64_t *peer;
    uint64_t *calls;
    hm_wait_policy policy;
    hm_error err;
} hm_pairs;

int hm_signal_wait(hm_pairs *p);

#endif
