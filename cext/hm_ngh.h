/* hybridmpi's PMPI library, the neighbourhood collectives: what the files of the extension
 * share (hm_pmpi_ngh.c says how it works and which file does what).  Internal: every name
 * outside the MPI entry points is hidden in the library (-fvisibility=hidden). */
#ifndef HM_NGH_H
#define HM_NGH_H

#include "hm_pmpi_common.h"
#include "hm_wait.h"

#include <pthread.h>
#include <stdint.h>

enum { N_FAST, N_NEXT, N_REFUSED };
enum { F_ALLTOALLV, F_ALLTOALL, F_ALLGATHER, F_ALLGATHERV };


/* One edge seen from this rank: its peer (MPI_PROC_NULL: none), the peer's node rank (-1:
 * another node) and its key, the same at both ends: part of the tag of its messages and its
 * place among the edges between the two (Cartesian: the sender's index of the edge, as the -1
 * neighbour receives in its +1 slot; a graph: its rank among the edges to, or from, that
 * peer, as MPI matches repeated edges in order). */
typedef struct {
    int peer, node, key;
} edge;

/* A rank stages a pair's call e in slot e % SLOTS (a header and an area each); a slot its
 * peer has not taken since is busy, and the call's pairs go as buffered messages. */
enum { SLOTS = 16 };

/* Rank q's slots for rank r, hdr(q)[r]: every word is q's but `done`, which r writes once it
 * took the call staged in the slot.  Error bits in either: that rank failed. */
typedef struct {
    _Atomic uint64_t ready[SLOTS]; /* by slot: the call staged there (0: none yet) */
    _Atomic int64_t off[SLOTS];    /* by slot: where in the slot's area */
    _Atomic uint64_t sig[SLOTS];   /* by slot: the edges' keys and sizes, hashed (both ends) */
    char pad[64];
    _Atomic uint64_t done[SLOTS];  /* r's: by slot, the call it took */
} pairhdr;

/* A peer on this node and the edges to (or from) it, in key order. */
typedef struct {
    int node, peer, n;
    int *edge;               /* the edges' indices in the call's arrays, by key */
    int64_t *len;            /* their bytes */
    uint64_t bytes, sig;
    int msg;                 /* more than g->stage bytes: the MPI's messages (both ends) */
} pair;

/* How one call moves: its arguments (the key of the cache) and what they give. */
typedef struct plan {
    int refs, form;
    int64_t *sc, *sd, *rc, *rd;  /* per edge: counts and displacements, in elements */
    MPI_Datatype ust, urt;       /* the program's handles (the key) */
    MPI_Datatype st, rt;         /* the library's: the same named types, or duplicates */
    int dup_st, dup_rt;
    uint64_t types_freed;        /* type_frees when made (a plan of derived types) */
    MPI_Aint sext, rext;
    int64_t ssz, rsz;
    int scontig, rcontig;
    int nsp, nrp;
    pair *sp, *rp;           /* on-node peers: sent to, received from */
} plan;

struct ngh;

/* Where a receive pair's call stands (op.route). */
enum { R_OPEN, R_SLOT, R_EDGES, R_BUFFERED, R_DRAIN };

/* One call in flight. */
typedef struct op {
    struct ngh *g;
    state *s;
    plan *p;
    uint64_t e;
    const char *sb;
    char *rb;
    int left, done, rc, form;
    unsigned char *route;    /* per receive pair (R_*) */
    MPI_Request *req;        /* messages */
    MPI_Status *st;
    int64_t *expect;         /* per message: bytes it must carry (-1: a send; -2: a buffered
                                pair's message, into bufs[pairof]) */
    int *from;               /* per message: the peer */
    int *pairof;             /* per message: its receive pair (-1: none) */
    char **tmp;              /* per message: a drained edge's buffer (expect -3) */
    char **bufs;             /* per receive pair: its buffered message */
    int *drained;            /* per receive pair: its edges drained so far */
    int soft, soft_peer;     /* an erroneous call whose protocol held (counts that differ on
                                an edge): reported when it completes, the communicator kept */
    int nreq;
    unsigned polls;
    MPI_Request greq;        /* the program's request (MPI_REQUEST_NULL: a blocking call) */
    int slot;                /* its live slot (-1: none) */
    _Atomic int refs;        /* the communicator's list, and MPI's request */
    struct op *next, *reg_next;
} op;

/* A buffered pair's message: the sender does not wait for it. */
typedef struct sent {
    MPI_Request req;
    int broken;              /* its communicator was revoked: its peer may never take it */
    struct sent *next;
    uint64_t data[];         /* the pair's hash, then its bytes */
} sent;

typedef struct ngh {
    int phase;
    int nin, nout, nn, me, rank;   /* (rank: in the communicator) */
    edge *in, *out;
    char *base;
    size_t bytes, per, hdr;
    uint64_t cap;            /* bytes of each slot's area */
    uint64_t stage;          /* the most staged for one peer (the node's least setting) */
    uint64_t reserved[SLOTS]; /* of this rank's areas, the bytes reserved in /dev/shm */
    int fd;                  /* the segment's file, for the reservations (-1: none) */
    int keys;                /* keys per call in a tag: every edge's, and a buffered pair's */
    int64_t calls;           /* calls a tag tells apart (tag_of) */
    MPI_Comm msgs;
    uint64_t epoch;
    op *head, *tail;
    sent *sends;             /* buffered messages not yet complete */
    plan *last;
    char why[224];           /* N_REFUSED: what is wrong with the graph */
    _Atomic int refs;        /* the state's, and one per call */
    pthread_mutex_t lock;    /* (recursive) its calls and their list: threads may complete
                                requests of one communicator at once */
} ngh;

#define HDR(g, q, r) ((pairhdr *)((g)->base + (g)->per * (size_t)(q)) + (r))
#define AREA(g, q, slot) ((g)->base + (g)->per * (size_t)(q) + (g)->hdr + (size_t)(slot) * (g)->cap)

/* The tag of call e's messages along edges of key `key` (key g->keys - 1: a buffered pair). */
static inline int tag_of(const struct ngh *g, uint64_t e, int key)
{
    return (int)((int64_t)(e % (uint64_t)g->calls) * g->keys + key);
}

/* The MPI's own function `name` (NAME's P-form), found once, as f_ of type T. */
#define NEXT(T, name)                                                                            \
    static T f_;                                                                                 \
    if (__builtin_expect(f_ == NULL, 0))                                                         \
    f_ = (T)pmpi_next(name, "P" name)

/* The wait of calls that are not one communicator's (the completion calls on arrays, the
 * buffered messages at MPI_Finalize): spin, then yield and sleep, HYBRIDMPI_PMPI_TIMEOUT. */
static inline hm_wait_policy plain_policy(void)
{
    hm_wait_policy p;
    hm_policy_init(&p, 0);
    p.timeout_ns = (int64_t)(cfg.timeout_s * 1e9);
    return p;
}

/* One idle turn of such a wait: 1 once its deadline passed. */
static inline int idle(int64_t *polls, hm_slow *w, const hm_wait_policy *pol)
{
    if ((*polls)++ < pol->spin) {
        cpu_relax();
        return 0;
    }
    if (!w->start)
        slow_start(w, pol);
    return slow_tick(w, pol, NULL, 0, 0);
}

/* hm_pmpi_ngh_graph.c: a communicator's part, set up in the call that made it, and dropped */
void ngh_set_up(state *s);
void ngh_drop(ngh *g, int broken);

/* hm_pmpi_ngh_plan.c: the plan of a call's arguments (NULL: a type MPI does not know, or no
 * memory), and the counts and displacement of its edge i */
plan *ngh_plan_for(ngh *g, int form, int big, const void *sc, const void *sd, int64_t scount,
                   MPI_Datatype st, const void *rc, const void *rd, int64_t rcount, MPI_Datatype rt);
void ngh_plan_unref(plan *p);
void ngh_edge_args(int form, int big, int send, int i, const void *c, const void *d, int64_t n,
                   int64_t *cnt, int64_t *dsp);

/* hm_pmpi_ngh_op.c: a call in flight; a communicator's part let go */
void ngh_unref(ngh *g);
int ngh_post(op *o);
int ngh_fail(op *o, int code, int peer);
void ngh_retire(ngh *g, op *o);
void ngh_advance(ngh *g, op *upto, int block);
void ngh_op_unref(op *o);
void ngh_orphan(ngh *g, int broken);
void ngh_drain(void);

/* hm_pmpi_ngh_req.c: a non-blocking call's request, registered */
int ngh_request(op *o);

#endif
