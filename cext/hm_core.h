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

/* Element types and reduction operations.  HM_PYINT: a Python int carried as a double
 * (exact below 2**53), reduced as HM_F64 but a distinct type in the call signatures, so
 * that an int on one rank and a float on another is a mismatch. */
enum { HM_F64 = 0, HM_F32 = 1, HM_I64 = 2, HM_I32 = 3, HM_C128 = 4, HM_PYINT = 5,
       HM_U64 = 6, HM_U32 = 7, HM_I16 = 8, HM_U16 = 9, HM_I8 = 10, HM_U8 = 11,
       HM_NTYPES = 12 };
/* HM_SUM .. HM_MAX on every type but the complex one's MIN and MAX; the logical and bitwise
 * operations (HM_LAND .. HM_BXOR, as MPI's) on the integer types only.  Code 4 is the ghost
 * update's HM_INSERT, never a reduction. */
enum { HM_SUM = 0, HM_PROD = 1, HM_MIN = 2, HM_MAX = 3, HM_NOPS = 4,
       HM_LAND = 5, HM_LOR = 6, HM_LXOR = 7, HM_BAND = 8, HM_BOR = 9, HM_BXOR = 10 };

/* Return codes. */
/* HM_EPEER: a word waited on carries a peer's error bits (docs/protocol.md):
 * err.peer is that peer, err.seen the word's value. */
enum { HM_OK = 0, HM_ETIMEOUT = 1, HM_EMISMATCH = 2, HM_EARG = 3, HM_ECMA = 4, HM_EPEER = 5 };

/* Error bits of a counter (docs/protocol.md): a rank that fails inside a call
 * ORs HM_ERRBIT into every word its peers wait on, with HM_MISBIT too when the
 * failure is an argument mismatch.  A poisoned word is above every epoch, so
 * a wait on it ends at once and the waiter checks the bits.  Defined here
 * only: Python reads them (hybridmpi/_native/errmap.py). */
#define HM_ERRBIT (1ULL << 62)
#define HM_MISBIT (1ULL << 63)

/* bad_rank of a mismatch found on another node: other arguments there, or a rank whose
 * arguments were invalid (every rank's comm then breaks). */
enum { HM_BAD_ELSEWHERE = -2, HM_BAD_INVALID_ELSEWHERE = -3 };

/* Which counter a timed-out wait was watching (HM_CNT_ROUND: a peer's
 * signal of a dissemination round or recursive-doubling step, which holds
 * the last call it reached). */
enum { HM_CNT_ARRIVE = 1, HM_CNT_RELEASE = 2, HM_CNT_LINEAR = 3, HM_CNT_ROUND = 6 };

/* Rounds of the dissemination barrier and steps of the recursive-doubling
 * allreduce (2^16 ranks per node), and the largest payload of the latter. */
enum { HM_STEPS = 16, HM_RD_BYTES = 96 };

/* The direct allreduce (hm_allreduce_node): each rank's buffer (two, by epoch parity) holds
 * up to HM_DIRECT_BYTES (at most the slot's capacity), and a call takes it while the node's
 * ranks times the payload is at most its gate, HM_DIRECT_TOTAL bytes unless a tuning table
 * chose another (hm_coll_set_direct_total, at most HM_DIRECT_TOTAL_MAX). */
enum { HM_DIRECT_BYTES = 16384, HM_DIRECT_TOTAL = 32768, HM_DIRECT_TOTAL_MAX = 1 << 30 };

/* Wait policy: spin `spin` polls with a pause instruction, then
 * sched_yield until `yield_ns` have passed since the wait began, then
 * sleep `sleep_ns` at a time.  A wait gives up at `timeout_ns` (0: never). */
typedef struct hm_wait_policy {
    int64_t spin;
    int64_t yield_ns;
    int64_t sleep_ns;
    int64_t timeout_ns;
    int64_t warn_ns;          /* call the warn hook once a wait lasted this long (0: never) */
    int order;
} hm_wait_policy;

/* The node's wait policy, the same in both front-ends (HybridComm, the PMPI library): spin
 * HM_SPIN_DEDICATED polls where each rank of the physical node has a core of its own (a poll
 * costs less than a wake-up), HM_SPIN_SHARED where ranks outnumber cores (the peer a wait
 * needs may be the one that is not running), then yield for 1 ms, then sleep 50 us at a time;
 * acquire/release order, no deadline, no warning.  The front-ends then set what their
 * settings say (HYBRIDMPI_SPIN, the timeouts). */
enum { HM_SPIN_DEDICATED = 2000, HM_SPIN_SHARED = 16 };
void hm_policy_init(hm_wait_policy *p, int shared_cores);

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
    /* which collective (HM_K_*) each of the two passed, when they differ */
    int64_t bad_kind, root_kind;
    /* ghost exchange, HM_EMISMATCH: the tag found where this rank's was expected */
    int64_t tag;
    /* HM_ECMA: errno of process_vm_readv */
    int errnum;
} hm_error;

/* What a rank entered at a collective call (its signature, in the ENTERED
 * region after the call number): a peer that waits on it compares
 * signatures, so ranks in different collectives or with different
 * arguments raise instead of waiting for each other.  HM_K_BAD: a rank
 * that found its own arguments invalid (hm_coll_bad). */
enum { HM_K_BARRIER_TREE = 1, HM_K_BARRIER_LINEAR = 2, HM_K_BARRIER_DISS = 3,
       HM_K_ALLREDUCE_TREE = 4, HM_K_ALLREDUCE_RD = 5, HM_K_ALLREDUCE_DIRECT = 6, HM_K_BAD = 7,
       HM_K_ALLREDUCE_RSAG = 8 };

/* Per-rank state of the node collectives (private memory). */
typedef struct hm_coll {
    int rank;                 /* rank in the node communicator */
    int size;                 /* ranks in the node communicator */
    int radix;
    int parent;               /* -1 at the root */
    int nchildren;
    int children[HM_MAX_RADIX];
    char **seg;               /* seg[r]: address of rank r's segment */
    uint64_t capacity;        /* bytes of each rank's data slot */
    uint64_t extra;           /* offset of the dissemination and recursive-doubling regions */
    uint64_t epoch;           /* collective calls made so far */
    uint64_t linear_calls;    /* linear barriers made so far */
    uint64_t mark;            /* 0, or HM_BADBIT in a call with invalid arguments (hm_coll_bad) */
    hm_wait_policy policy;
    hm_error err;
    void *net;                /* MPI's own calls: their hm_net (hm_barrier_mpi), else NULL */
    uint64_t direct_total;    /* the direct allreduce's gate (hm_coll_set_direct_total) */
} hm_coll;

/* The profile clock (hybridmpi.profile): while hm_prof[2] is nonzero, each synchronizing
 * entry point of the C core stores CLOCK_MONOTONIC nanoseconds at its entry into
 * hm_prof[0] when that is 0 (the caller zeroes it before a call it times), and at its
 * return into hm_prof[1].  Off, it costs one load and one branch per call. */
extern int64_t hm_prof[3];
/* Profiled entry points active (nested calls stamp only at the outermost). */
extern int hm_prof_nest;

/* A profiled operation's calls (hybridmpi.profile): records of 6 int64 (Python entry,
 * C core entry, C core return, Python return, sequence number, bytes), at most `limit`;
 * the calls beyond are summed in `over` (calls, bytes, time, wait). */
typedef struct hm_prof_log {
    int64_t *rec;
    int64_t n;
    int64_t cap;
    int64_t limit;
    int64_t nbytes;           /* bytes of each call (hm_prof_end) */
    int64_t over[4];
} hm_prof_log;

/* Start a profiled call (calls nest): note the time, zero hm_prof[0..1]. */
void hm_prof_begin(void);
/* The profiled call begun last raised: forget it. */
void hm_prof_abort(void);
/* End the profiled call begun last: append its record with log->nbytes, or with
 * `nbytes` (0, or -1 when out of memory: the call is summed in `over`). */
int hm_prof_end(hm_prof_log *log);
int hm_prof_end_bytes(hm_prof_log *log, int64_t nbytes);
void hm_prof_free(hm_prof_log *log);

/* 1 if 64-bit atomics are lock-free (required across processes). */
int hm_lock_free(void);

/* OR `bits` into every word this rank writes and node peers wait on in
 * the collectives (its counter, its dissemination signals, its
 * recursive-doubling stamps, its share of the linear counter): each peer
 * then fails at its next poll.  The C core does it itself when a call
 * fails; Python calls it when a call fails outside the C core. */
void hm_coll_poison(hm_coll *c, uint64_t bits);

/* A call of a rank whose arguments were invalid: one node-wide
 * dissemination barrier with signature HM_K_BAD, which completes (HM_OK)
 * when every rank of the node found its arguments invalid, and fails with
 * HM_EMISMATCH on every rank otherwise.  One node only. */
int hm_coll_bad(hm_coll *c);

/* Bytes of one rank's collective segment for a data slot of `capacity`
 * (the slot, then HM_STEPS dissemination regions, then two sets, by epoch
 * parity, of HM_STEPS + 2 recursive-doubling regions, then the two buffers of
 * the direct allreduce). */
uint64_t hm_coll_segment_bytes(uint64_t capacity);

/* Set up `c` for node rank `rank` of `size`, tree of arity `radix`;
 * `seg` must stay valid while `c` is used.  Zeroes this rank's segment.
 * Returns HM_EARG for bad sizes. */
int hm_coll_init(hm_coll *c, int rank, int size, int radix, char **seg,
                 uint64_t capacity);

/* The node tree's arity: `radix` (2..HM_MAX_RADIX, else HM_EARG), set by hm_coll_init; changed
 * only before the first collective call, to the same value on every node rank (the PMPI
 * library takes a tuning table's after its set-up has read the table). */
int hm_coll_set_radix(hm_coll *c, int radix);

/* The direct allreduce's gate: node ranks times bytes at most `bytes` (0..HM_DIRECT_TOTAL_MAX,
 * else HM_EARG; HM_DIRECT_TOTAL by hm_coll_init; 0: never direct).  Changed only before the
 * first collective call, to the same value on every node rank (a tuning table's). */
int hm_coll_set_direct_total(hm_coll *c, int64_t bytes);

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

/* The node's whole allreduce of `count` elements, the algorithm chosen by size: with `any`
 * set (one node; the Python library's allreduce="recursive_doubling", and the PMPI library on
 * one node), recursive doubling up to HM_RD_BYTES, the direct allreduce while node ranks times
 * bytes is at most the gate (hm_coll_set_direct_total), else the reduce-scatter and allgather
 * in chunks of half the slot; with `any` 0 the tree (hm_allreduce) in slot-sized chunks only (a rank of a node
 * whose leader joins other nodes between its phases).  Direct: every rank publishes its value
 * and signature in its own buffer (two, by epoch parity, so one round of stamps is the whole
 * synchronization) and combines every rank's value in rank order, so every rank computes the
 * same bits; ranks that passed different arguments all get HM_EMISMATCH as in
 * hm_allreduce_rd.  Reduce-scatter and allgather: every rank publishes its chunk in the half
 * of its slot of the call's parity, with its signature in its header, and stamps SYNC with
 * 2e - 1; rank r then reduces the r-th of n equal parts of every rank's chunk, in rank order
 * (the direct allreduce's bits), into its own half and stamps 2e; every rank copies the other
 * parts from their owners.  No rank reads all the data (each reads about twice the chunk,
 * against n times for the direct one).  Every rank of the node must pass the same `any`.
 * `send` may equal `recv`.  HM_EARG for an invalid type or op. */
int hm_allreduce_node(hm_coll *c, const void *send, void *recv, uint64_t count, int dtype, int op,
                      int any);

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

/* hm_allreduce of one chunk of a longer reduction of `total` elements:
 * the signature that ranks compare holds `total`, so ranks that passed
 * different lengths fail at the first chunk. */
int hm_allreduce_chunk(hm_coll *c, const void *send, void *recv, uint64_t count, uint64_t total,
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
/* 1 if `op` reduces elements of `dtype` (what hm_combine accepts), else 0. */
int hm_op_valid(int dtype, int op);

/* Combine src into dst elementwise: dst[i] = dst[i] op src[i]. */
int hm_combine(void *dst, const void *src, uint64_t count, int dtype, int op);

/* Acquire-load (or seq_cst) the counter at `addr`. */
uint64_t hm_load(const void *addr, int order);

/* Release-store (or seq_cst) `value` into the counter at `addr`. */
void hm_store(void *addr, uint64_t value, int order);

/* The ghost exchange and its zero-copy paths: hm_core_halo.h (part of this header's contract,
 * where cffi reads it too). */
#include "hm_core_halo.h"

/* ------------------------------------------------------------------ global memory */

/* Let waits that stopped spinning call `fn` between polls (NULL: none).
 * Process-wide; the Python side passes a function that drives MPI
 * progress while RMA windows span several nodes. */
void hm_set_progress(void (*fn)(void));

/* Interrupts.  A wait that has stopped spinning ends, as at its deadline (its
 * caller's timeout path), once hm_interrupt(sig) was called (by the progress
 * hook, which caught the signal's Python exception) or once a signal caught
 * by hm_catch_signal arrived.  hm_catch_signal(sig) installs a handler for
 * `sig` (SIGTERM) that records it while a wait of the library is in progress
 * (past its spin) and, outside one, restores the default action and raises it
 * again, so the program dies as it would have; 1 installed, 0 not.
 * hm_interrupted() is the signal recorded (0: none), hm_interrupt(0) clears
 * it; hm_wait_tick(1) marks a wait of Python's in progress, hm_wait_tick(0)
 * its end; both return hm_interrupted(). */
int hm_catch_signal(int sig);
void hm_interrupt(int sig);
int hm_interrupted(void);
int hm_wait_tick(int on);

/* Sequentially consistent atomics on an int64 in shared memory; both return
 * the old value. */
int64_t hm_fetch_add(void *addr, int64_t value);
int64_t hm_compare_swap(void *addr, int64_t expected, int64_t value);

/* Pairwise epoch counters (sync_images inside a node).  For every i:
 * calls[peer[i]] += 1, then release-store that count into signal[i] (the
 * counter of this rank in the peer's segment); then wait until each
 * wait[i] (the peer's counter in this rank's segment) reached the same
 * count (acquire).  On timeout err.peer is the index i and err.counter
 * HM_CNT_SYNC_IMAGES. */
enum { HM_CNT_SYNC_IMAGES = 7 };

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
/* An invalid sync_images on this rank, counted as a call naming each of p's peers: each
 * counter stored with the call's invalid mark, nothing waited.  A peer's hm_signal_wait whose
 * call matches it returns HM_EMISMATCH (err.peer: its index) instead of HM_OK. */
void hm_signal_invalid(hm_pairs *p);

/* ------------------------------------------------------------------ between the nodes */

/* The protocol between the nodes, one implementation for the Python library and the PMPI
 * library (docs/protocol.md, "Between the nodes").  A node's leader (node rank 0) joins
 * the other nodes' leaders between its node's gather and release phases: first the leaders
 * agree, in one allreduce of one element of a fixed type (HM_NET_WORDS, below), on a status
 * and on what each node was called for ([failed, kind, -kind, count, -count, dtype, -dtype,
 * op, -op], by max), and a small allreduce whose combination is exact in any order is
 * combined in that same call; then, only when every node is well and called the same, a
 * larger allreduce's data step, a reduce to the first leader and its broadcast, so that every
 * leader gets the same bits (MPICH's allreduce may give them different ones: the sign of a
 * zero minimum, which NaN, the last bit of a sum).  Floating min and max and the
 * complex product go there through user-defined ops of the core's own combination
 * (hm_net_make_ops), so that the result does not depend on how many nodes there are: MPI
 * leaves a NaN's min and max unspecified (MPICH's MPI_MIN gives the other operand in one of
 * the two orders), and the complex product to the library.  A failure or a disagreement
 * anywhere poisons every node, so that every rank of every node fails the same call.
 *
 * The core is built without mpi.h: it reaches the MPI through the entry points and handles
 * of an hm_net, which the PMPI library fills with PMPI_* and its handles, and the Python
 * library with the addresses of mpi4py's MPI's functions and mpi4py's handles.  Handles
 * pass as intptr_t (MPICH's int handles and Open MPI's pointers alike: in the x86-64 and
 * AArch64 calling conventions an int argument is the low half of its register or stack
 * slot); requests are zeroed 8-byte words, statuses 64-byte buffers. */
typedef int (*hm_mpi_iallreduce)(const void *send, void *recv, int count, intptr_t type,
                                 intptr_t op, intptr_t comm, void *request);
typedef int (*hm_mpi_ireduce)(const void *send, void *recv, int count, intptr_t type,
                              intptr_t op, int root, intptr_t comm, void *request);
typedef int (*hm_mpi_ibcast)(void *buf, int count, intptr_t type, int root, intptr_t comm,
                             void *request);
typedef int (*hm_mpi_test)(void *request, int *flag, void *status);
typedef int (*hm_mpi_allreduce)(const void *send, void *recv, int count, intptr_t type,
                                intptr_t op, intptr_t comm);
typedef int (*hm_mpi_reduce)(const void *send, void *recv, int count, intptr_t type, intptr_t op,
                             int root, intptr_t comm);
typedef int (*hm_mpi_bcast)(void *buf, int count, intptr_t type, int root, intptr_t comm);
typedef int (*hm_mpi_ibarrier)(intptr_t comm, void *request);
typedef int (*hm_mpi_barrier)(intptr_t comm);
/* An MPI_User_function (its MPI_Datatype * as void *), MPI_Op_create and MPI_Op_free.  An op
 * made is written into a zeroed intptr_t (MPICH's int handle into its low half). */
typedef void (*hm_mpi_user_fn)(void *in, void *inout, int *len, void *type);
typedef int (*hm_mpi_op_create)(hm_mpi_user_fn fn, int commute, void *op);
typedef int (*hm_mpi_op_free)(void *op);
/* MPI_Type_contiguous, MPI_Type_commit and MPI_Type_free: a type made is written into a zeroed
 * intptr_t, as an op. */
typedef int (*hm_mpi_type_contiguous)(int count, intptr_t old, void *type);
typedef int (*hm_mpi_type_commit)(void *type);
typedef int (*hm_mpi_type_free)(void *type);

/* The leaders' first call of every collective is one allreduce of one element of a fixed
 * type: HM_NET_WORDS int64 words, the call's signature (9 words: a node's status, then kind,
 * count, dtype and op each with its negation, combined by max, so that every leader learns
 * whether all agree), whether the payload goes inline (with its negation), the lowest leader
 * rank whose part is in the element, and an inline payload of up to HM_NET_INLINE bytes,
 * which an allreduce of that size combines in the same call (by hm_combine, in a user-defined
 * op that combines only between nodes that agree, the lower leaders' part first).  Inline goes
 * only what every leader gets with the same bits whatever the order MPI combines in: min and
 * max, the integer types, and anything between two leaders (a float sum of three parts in two
 * orders may differ in its last bit: those take the reduce and broadcast after the agreement).  Every collective, barrier or allreduce of any size, makes the
 * same first call, so nodes that disagree always meet in it. */
#define HM_NET_INLINE 256
#define HM_NET_WORDS 44

/* Return codes of the calls between the nodes, beside the core's: MPI failed between the
 * nodes; the call failed on another node; another node called another collective or with
 * other arguments (sig[1] == HM_K_BAD: a rank there found its arguments invalid); a peer's
 * failure notice ended the wait (err.peer: its rank). */
enum { HM_ENET = 6, HM_EELSEWHERE = 7, HM_EDIFFERS = 8, HM_ENOTICE = 9 };
/* err.counter of a wait between the nodes that timed out */
enum { HM_CNT_NET = 8 };
/* The word of its segment in which a leader publishes the collective call whose part
 * between the nodes it waits on (the second cache line of its ENTERED region), for a rank
 * of its node that timed out waiting for it. */
enum { HM_OFF_LEADER_WAIT = 64 };

typedef struct hm_net {
    hm_mpi_iallreduce iallreduce;
    hm_mpi_ireduce ireduce;
    hm_mpi_ibcast ibcast;
    hm_mpi_test test;
    /* The same calls blocking, or NULL.  Taken where a wait could not end early anyway: no
     * deadline (the node's policy) and no notices (the PMPI library without
     * HYBRIDMPI_PMPI_TIMEOUT: MPICH's blocking allreduce of two leaders takes 0.8 us where its
     * nonblocking one, completed by MPI_Test, takes 2). */
    hm_mpi_allreduce allreduce;
    hm_mpi_reduce reduce;
    hm_mpi_bcast bcast;
    hm_mpi_op_create op_create;     /* for hm_net_make_ops and hm_net_free_ops */
    hm_mpi_op_free op_free;
    hm_mpi_type_contiguous type_contiguous;   /* the same */
    hm_mpi_type_commit type_commit;
    hm_mpi_type_free type_free;
    intptr_t comm;                  /* the leaders' communicator */
    int rank;                       /* this leader's rank in it */
    int size;                       /* the number of leaders */
    intptr_t int64, max, in_place;  /* MPI_INT64_T, MPI_MAX, MPI_IN_PLACE */
    intptr_t types[12];             /* by the core's type code (HM_NTYPES): an MPI type of its
                                     * size and kind, 0 where the caller has none */
    intptr_t ops[11];               /* by the core's op code (through HM_BXOR), 0: none */
    intptr_t own_ops[5];            /* made by hm_net_make_ops, 0 before: taken instead of ops[]
                                     * for float and double min and max, complex prod */
    intptr_t first_type, first_op;  /* the first call's type and op (hm_net_make_ops) */
    /* Polled every 64th poll of a wait that stopped spinning: the rank whose failure notice
     * came, else -1 (NULL: none).  A wait goes on for 0.2 s after a notice came (a peer that
     * failed in a later call may have sent what this one needs). */
    int (*notice)(void *arg);
    void *notice_arg;
    /* MPI_Ibarrier and MPI_Barrier (NULL where unused): MPI's own barrier (hm_net_mpi_barrier) */
    hm_mpi_ibarrier ibarrier;
    hm_mpi_barrier barrier;
    int64_t mine[44];               /* this node's first call (HM_NET_WORDS): its signature */
    int64_t sig[44];                /* the agreed one (the maxima): read by the errors */
    int64_t req[2];
} hm_net;

/* A barrier of a leader across nodes: the node's gather (`method`: HM_TREE or HM_LINEAR),
 * the leaders' agreement, which is the barrier between the nodes (`kind`: the HM_K_BARRIER_*
 * the other nodes must have called), the node's release. */
int hm_net_barrier(hm_coll *c, hm_net *n, int method, int kind);
/* An allreduce of a leader across nodes, in chunks of the slot's size (one chunk, of no
 * element, for count 0) as hm_allreduce_node with `any` 0 at the node's other ranks.  `send`
 * may equal `recv`; n->types[dtype] and n->ops[op] must be set. */
int hm_net_allreduce(hm_coll *c, hm_net *n, const void *send, void *recv, uint64_t count,
                     int dtype, int op);
/* After hm_coll_bad returned HM_OK at a leader across nodes (every rank of its node found
 * its arguments invalid): HM_OK when every node's did, else HM_EDIFFERS (and the node is
 * poisoned) or the agreement's failure. */
int hm_net_bad(hm_coll *c, hm_net *n);
/* MPI's own calls, where a tuning table chose them for the layout (docs/guide/tuning.md): an
 * allreduce and a barrier over n->comm, the whole communicator, for every rank (each its own
 * "leader"; c is only its wait policy and error record).  The allreduce combines float and
 * double min and max and the complex product with n's own ops, so that its results keep the
 * library's rules; counts past INT_MAX go in chunks.  Both block in MPI where no wait could end
 * early (n->allreduce set, no deadline, no notices), else complete a nonblocking call under the
 * deadline and the notices; HM_OK, or HM_EARG, HM_ENET, HM_ETIMEOUT, HM_ENOTICE. */
int hm_net_mpi_allreduce(hm_coll *c, hm_net *n, const void *send, void *recv, uint64_t count,
                         int dtype, int op);
int hm_net_mpi_barrier(hm_coll *c, hm_net *n);
/* The same over c->net, in the forms of the node's calls (hm_barrier_dissemination,
 * hm_allreduce_f64, hm_allreduce_node), so that one C call serves either path. */
int hm_barrier_mpi(hm_coll *c);
double hm_allreduce_mpi_f64(hm_coll *c, double x, int op);
int hm_allreduce_mpi(hm_coll *c, const void *send, void *recv, uint64_t count, int dtype, int op,
                     int any);
/* Make n's own_ops: commutative user-defined ops (n->op_create) that combine float and double
 * min and max and the complex product by hm_combine, and the first call's type and op
 * (n->type_contiguous, n->type_commit); HM_OK, or HM_ENET with none made.  Once,
 * before n's first allreduce, on a zeroed hm_net (else its allreduces of those fail with
 * HM_EARG); hm_net_free_ops frees them (n->op_free), while MPI still runs and no request of
 * n's is pending (hm_net_pending). */
int hm_net_make_ops(hm_net *n);
void hm_net_free_ops(hm_net *n);
/* 1 while a request of n's is incomplete (a wait that failed left it): MPI may still write
 * into n's buffers and the node's slot, and use the leaders' communicator, so none of these
 * may be freed (MPI offers no cancel for a collective). */
int hm_net_pending(const hm_net *n);

#endif
