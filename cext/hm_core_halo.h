/* hybridmpi C core, part of hm_core.h (which includes it in its place; not a header on its own):
 * the ghost exchange (hm_halo.c) and its zero-copy paths, shared vectors read in place and
 * private arrays read by cross-memory attach.  cffi reads it as part of hm_core.h
 * (cext/build_shim.py). */
#ifndef HM_CORE_HALO_H
#define HM_CORE_HALO_H

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
    void *tag;                /* next to READY: two slots by epoch parity, each a tag (which
                                 vector was published, HM_TAG_PRIVATE for a packed buffer)
                                 and an address (the array read by cross-memory attach);
                                 NULL when nothing checks it */
} hm_chan;

/* The tag of a packed (private-array) update; shared vectors are numbered 0, 1, ... */
/* HM_TAG_BAD: a rank whose arguments were invalid publishes it instead of
 * data (Halo._bad_call), so that its peers raise too. */
enum { HM_TAG_PRIVATE = -1, HM_TAG_CMA = -2, HM_TAG_BAD = -3 };

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
 * its DONE counter reached epoch - 2 (the buffer and tag slot of this parity
 * are free), pack the points of `x` into buf[epoch & 1], write the tag slot
 * and publish READY = epoch with a release store.  Private channels are
 * only packed.  HM_EPEER if a reader's DONE carries error bits. */
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

/* hm_xchg_both(s, r, x, epoch, HM_INSERT, 0): a whole forward update, its
 * arguments in the order of hm_zc_update's last two (Halo.update's hot path
 * binds the first ones once). */
int hm_xchg_update(hm_xchg *s, hm_xchg *r, void *x, uint64_t epoch);

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
    hm_error err;             /* peer: the channel's peer; tag: the tag found;
                                 HM_ECMA: errnum */
    void *entered;            /* readers of hm_zc_publish: if set, receives the epoch
                                 first (as hm_xchg.entered) */
} hm_pulls;

/* Publish vector `tagval` at epoch e to each of the readers->n readers:
 * wait until the reader's DONE reached e - 2 (the tag slot of this parity
 * is free), write the tag slot of ready[i]'s channel (tag[i]: with
 * HM_TAG_CMA also the address of `x`, for readers that copy with
 * process_vm_readv), then READY = e with a release store (readers->entered, if set,
 * receives e first).  HM_EPEER (or
 * HM_ETIMEOUT) in readers->err. */
int hm_zc_publish(hm_pulls *readers, void **ready, void **tag, int64_t tagval, const void *x,
                  uint64_t epoch);

/* A whole zero-copy forward update on one node in one call: hm_zc_publish,
 * pull from every peer whichever is ready first, then wait until this rank's
 * readers are done.  Errors of the readers' waits are copied into pulls->err. */
int hm_zc_update(hm_pulls *pulls, hm_pulls *readers, void **ready, void **tag,
                 int64_t tagval, void *x, uint64_t epoch);

/* OR `bits` into each of the `n` words (sequentially consistent): the error
 * bits a failing rank leaves in every word its peers wait on. */
void hm_poison(int n, void **words, uint64_t bits);

/* The chaos hook for drift tests: with `max_ns` > 0, waits and protocol
 * points sleep or yield at random (a per-process generator seeded with
 * `seed`), up to `max_ns` at a time; 0 turns it off. */
void hm_set_chaos(uint64_t seed, int64_t max_ns);

/* The hook called once per wait that lasted its policy's warn_ns (NULL: none). */
void hm_set_warn(void (*fn)(const void *, uint64_t, uint64_t, double));

/* 1 if this process can read `len` bytes at `remote` in process `pid` with
 * process_vm_readv into `local` (the cross-memory-attach probe). */
int hm_cma_probe(int pid, const void *remote, void *local, uint64_t len);

/* For each channel: acquire-wait READY >= e, check that the tag slot of
 * e's parity is `tag` (else HM_EMISMATCH, and the error bits go into DONE
 * so the peer learns it too), copy (op HM_INSERT) or combine the pairs
 * straight from the peer's vector into x, check that READY carries no error
 * bits (the owner did not fail and change its values meanwhile), then
 * release-store DONE = e.  `ordered`: in channel order (a fixed combination
 * order), else whichever is ready first.  HM_EPEER: READY carries error
 * bits. */
int hm_pull_recv(hm_pulls *p, void *x, int64_t tag, uint64_t epoch, int op, int ordered);

/* Wait until every DONE counter (the readers', in this rank's segment)
 * reached e; HM_EPEER (err.peer, err.seen) if a reader left error bits. */
int hm_wait_done(hm_pulls *p, uint64_t epoch);

#endif
