/* hybridmpi's PMPI library: the neighbourhood collectives on the core (docs/pmpi.md,
 * "Neighbourhood collectives").
 *
 * MPI_Neighbor_alltoallv, _alltoall, _allgather and _allgatherv, blocking and non-blocking,
 * on distributed-graph, graph and Cartesian communicators.  The edges from one rank to a peer
 * of its node (a pair) are staged: the sender copies them, packed if their type is not
 * contiguous, into its own area of the node's segment for the call's slot and publishes the
 * slot, and the receiver copies them out.  An edge across nodes, and a pair of more than
 * g->stage bytes, go as the MPI's messages (PMPI_Isend/Irecv on a duplicate of the
 * communicator), posted by both ends when they post.
 *
 * A sender never waits for a receiver: a pair whose slot its receiver has not taken yet (more
 * than SLOTS calls outstanding), or that finds no room in /dev/shm, goes as one buffered
 * message (the pair's bytes behind their hash), which the sender does not wait for and the
 * receiver finds by probing.  So a program may post any number of calls, make blocking
 * point-to-point calls, and only then wait.  Every message's tag names its call (tag_of), so a
 * message can only be taken by the call that sent it, whatever route each end chose: counts
 * that differ on an edge (erroneous) end in a completion on both ends.
 *
 * A non-blocking call returns a generalized request (MPI_Grequest_start); the completion calls
 * (MPI_Wait, Waitall, Waitany, Waitsome, the Test family, MPI_Request_get_status,
 * MPI_Request_free) are defined here too: they drive this library's calls, then hand the
 * request to the MPI's own.  A request that is not the library's costs one relaxed load (no
 * call of the library pending), or a load of a filter word more.
 *
 * Whether a call goes to the core depends only on the communicator (set up, collectively, as
 * for the allreduce, then over its graph once), never on a call's arguments: every rank
 * chooses alike.  Datatypes other than named ones are duplicated for as long as the library
 * uses them (a program may free its type once it has posted), and MPI_Type_free is defined
 * here: a freed handle may name another type later, so plans of such types are made again. */
#define _GNU_SOURCE
#include "hm_pmpi.h"
#include "hm_wait.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

enum { N_FAST, N_NEXT, N_REFUSED };
enum { F_ALLTOALLV, F_ALLTOALL, F_ALLGATHER, F_ALLGATHERV };
static const char *const call_names[2][4] = {
    {"MPI_Neighbor_alltoallv", "MPI_Neighbor_alltoall", "MPI_Neighbor_allgather",
     "MPI_Neighbor_allgatherv"},
    {"MPI_Ineighbor_alltoallv", "MPI_Ineighbor_alltoall", "MPI_Ineighbor_allgather",
     "MPI_Ineighbor_allgatherv"}};

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
static int tag_of(const struct ngh *g, uint64_t e, int key)
{
    return (int)((int64_t)(e % (uint64_t)g->calls) * g->keys + key);
}

/* ------------------------------------------------------------------ the graph, once */

/* The communicator's edges (0), or 1 when it has no graph the library serves. */
static int read_graph(ngh *g, MPI_Comm comm)
{
    int topo = MPI_UNDEFINED;
    PMPI_Topo_test(comm, &topo);
    int *src = NULL, *dst = NULL, nin = 0, nout = 0, cart = topo == MPI_CART;
    if (topo == MPI_DIST_GRAPH) {
        int weighted = 0;
        PMPI_Dist_graph_neighbors_count(comm, &nin, &nout, &weighted);
        src = malloc(sizeof(int) * (size_t)(nin + 1));
        dst = malloc(sizeof(int) * (size_t)(nout + 1));
        int *sw = weighted ? malloc(sizeof(int) * (size_t)(nin + 1)) : NULL;
        int *dw = weighted ? malloc(sizeof(int) * (size_t)(nout + 1)) : NULL;
        if (src && dst && (!weighted || (sw && dw)))
            PMPI_Dist_graph_neighbors(comm, nin, src, weighted ? sw : MPI_UNWEIGHTED, nout, dst,
                                      weighted ? dw : MPI_UNWEIGHTED);
        free(sw);
        free(dw);
    } else if (topo == MPI_GRAPH) {   /* (an edge in both directions) */
        int rank;
        PMPI_Comm_rank(comm, &rank);
        PMPI_Graph_neighbors_count(comm, rank, &nin);
        nout = nin;
        src = malloc(sizeof(int) * (size_t)(nin + 1));
        dst = malloc(sizeof(int) * (size_t)(nout + 1));
        if (src && dst) {
            PMPI_Graph_neighbors(comm, rank, nin, src);
            memcpy(dst, src, sizeof(int) * (size_t)nin);
        }
    } else if (cart) {
        int nd = 0;
        PMPI_Cartdim_get(comm, &nd);
        nin = nout = 2 * nd;
        src = malloc(sizeof(int) * (size_t)(nin + 1));
        dst = malloc(sizeof(int) * (size_t)(nout + 1));
        for (int d = 0; src && dst && d < nd; d++) {
            PMPI_Cart_shift(comm, d, 1, &src[2 * d], &src[2 * d + 1]);
            dst[2 * d] = src[2 * d], dst[2 * d + 1] = src[2 * d + 1];
        }
    } else {
        return 1;
    }
    g->in = calloc((size_t)nin + 1, sizeof(edge));
    g->out = calloc((size_t)nout + 1, sizeof(edge));
    int bad = !src || !dst || !g->in || !g->out;
    for (int j = 0; !bad && j < nin; j++) {
        g->in[j].peer = src[j];
        g->in[j].key = cart ? j ^ 1 : 0;
        for (int k = 0; !cart && k < j; k++)
            g->in[j].key += src[k] == src[j];
    }
    for (int i = 0; !bad && i < nout; i++) {
        g->out[i].peer = dst[i];
        g->out[i].key = cart ? i : 0;
        for (int k = 0; !cart && k < i; k++)
            g->out[i].key += dst[k] == dst[i];
    }
    g->nin = nin, g->nout = nout;
    free(src);
    free(dst);
    return bad ? -1 : 0;
}

/* Each edge's node rank; 0, or -1 when MPI could not say. */
static int find_nodes(ngh *g, MPI_Comm comm, MPI_Comm node)
{
    MPI_Group cg, ng;
    if (PMPI_Comm_group(comm, &cg) != MPI_SUCCESS || PMPI_Comm_group(node, &ng) != MPI_SUCCESS)
        return -1;
    int rc = 0;
    for (int side = 0; side < 2; side++) {
        int n = side ? g->nout : g->nin;
        edge *e = side ? g->out : g->in;
        for (int i = 0; i < n && rc == 0; i++) {
            int r = e[i].peer, t = MPI_UNDEFINED;
            if (r != MPI_PROC_NULL && PMPI_Group_translate_ranks(cg, 1, &r, ng, &t) != MPI_SUCCESS)
                rc = -1;
            e[i].node = r == MPI_PROC_NULL || t == MPI_UNDEFINED ? -1 : t;
        }
    }
    PMPI_Group_free(&cg);
    PMPI_Group_free(&ng);
    return rc;
}

/* Whether every edge is in both ranks' lists, as MPI requires: 0, else 1 with g->why set
 * (the first rank whose count of edges from this rank differs from this rank's count). */
static int asymmetric(ngh *g, MPI_Comm comm, int size, int rank, int *failed)
{
    int *mine = calloc((size_t)size, sizeof(int)), *theirs = calloc((size_t)size, sizeof(int));
    int *from = calloc((size_t)size, sizeof(int)), bad = 0;
    if (!mine || !theirs || !from)
        *failed = 1;
    for (int i = 0; !*failed && i < g->nout; i++)
        if (g->out[i].peer != MPI_PROC_NULL)
            mine[g->out[i].peer]++;
    for (int j = 0; !*failed && j < g->nin; j++)
        if (g->in[j].peer != MPI_PROC_NULL)
            from[g->in[j].peer]++;
    /* theirs[q]: how many edges rank q lists to this rank */
    if (PMPI_Alltoall(mine ? mine : from, 1, MPI_INT, theirs ? theirs : from, 1, MPI_INT, comm) !=
        MPI_SUCCESS)
        *failed = 1;
    for (int q = 0; !*failed && q < size && !bad; q++)
        if (theirs[q] != from[q]) {
            snprintf(g->why, sizeof g->why,
                     "the graph's edges do not match: rank %d lists rank %d as a destination %d "
                     "time(s), and rank %d lists rank %d as a source %d time(s) (MPI requires "
                     "every edge in both lists)", q, rank, theirs[q], rank, q, from[q]);
            bad = 1;
        }
    free(mine);
    free(theirs);
    free(from);
    return bad;
}


static void plan_unref(plan *p);

/* Buffered messages that outlived their communicator's part (it was freed before its peers
 * took them): tested in later calls, never waited for. */
static pthread_mutex_t orphan_lock = PTHREAD_MUTEX_INITIALIZER;
static sent *orphans;

/* The buffered messages of `*list` that completed are freed (with `keep_broken`, those of a
 * revoked communicator are not tested: MPI may still read them).  The number left. */
static int reap(sent **list, int keep_broken)
{
    int left = 0;
    for (sent **at = list; *at; left++) {
        if (keep_broken && (*at)->broken) {
            at = &(*at)->next;
            continue;
        }
        int flag = 0;
        if (PMPI_Test(&(*at)->req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || flag) {
            sent *x = *at;
            *at = x->next;
            free(x);
            left--;
        } else {
            at = &(*at)->next;
        }
    }
    return left;
}

static void reap_orphans(void)
{
    if (atomic_load_explicit((_Atomic(sent *) *)&orphans, memory_order_relaxed) == NULL ||
        pthread_mutex_trylock(&orphan_lock))
        return;
    reap(&orphans, 0);
    pthread_mutex_unlock(&orphan_lock);
}

/* Frees what set_up made (the shared segment, the messages' communicator, the edges); the
 * buffered messages not yet sent become orphans (`broken`: of a revoked communicator). */
static void drop(ngh *g, int broken)
{
    reap(&g->sends, 0);
    if (g->sends) {   /* (MPI completes them after the free of their communicator) */
        pthread_mutex_lock(&orphan_lock);
        sent *last = g->sends;
        for (sent *x = g->sends; x; x = x->next)
            x->broken = broken, last = x;
        last->next = orphans;
        orphans = g->sends;
        pthread_mutex_unlock(&orphan_lock);
        g->sends = NULL;
    }
    if (g->base != NULL)
        munmap(g->base, g->bytes);
    g->base = NULL;
    if (g->fd >= 0)
        close(g->fd);
    g->fd = -1;
    if (g->msgs != MPI_COMM_NULL)
        PMPI_Comm_free(&g->msgs);
    free(g->in);
    free(g->out);
    g->in = g->out = NULL;
    g->nin = g->nout = 0;
    if (g->last)
        plan_unref(g->last);
    g->last = NULL;
}

static void ngh_unref(ngh *g)
{
    if (atomic_fetch_sub(&g->refs, 1) != 1)
        return;
    pthread_mutex_destroy(&g->lock);
    free(g);
}

/* This rank's area of `slot` holds `bytes` (at most g->cap) in /dev/shm, reserved before it
 * is written (a full /dev/shm fails here, and the pairs go as buffered messages): 1, else 0. */
static int reserve(ngh *g, int slot, uint64_t bytes)
{
    if (bytes <= g->reserved[slot])
        return 1;
    bytes = (bytes + 65535) & ~(uint64_t)65535;
    if (bytes < 2 * g->reserved[slot])   /* (grows by doubling at least) */
        bytes = 2 * g->reserved[slot];
    if (bytes > g->cap)
        bytes = g->cap;
    off_t at = (off_t)(g->per * (size_t)g->me + g->hdr + (size_t)slot * g->cap);
    if (posix_fallocate(g->fd, at, (off_t)bytes))
        return 0;
    g->reserved[slot] = bytes;
    return 1;
}

/* Sets up s->ngh, collectively over the communicator, in the call that made it (every rank
 * is in it, so this waits for no rank that would not be waited for anyway): N_FAST, N_NEXT
 * (every rank's calls go to MPI: a communicator without a graph, or one whose set-up failed
 * on some rank), or N_REFUSED (the graph's edges do not match: every call fails). */
static void set_up(state *s)
{
    ngh spare, *g = calloc(1, sizeof *g);
    int oom = g == NULL;   /* (this rank still takes its part in the agreement: it fails it) */
    if (oom)
        g = memset(&spare, 0, sizeof spare);
    s->ngh = oom ? NULL : g;
    g->phase = N_NEXT;
    g->refs = 1;
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&g->lock, &attr);
    pthread_mutexattr_destroy(&attr);
    g->msgs = MPI_COMM_NULL;
    g->fd = -1;
    MPI_Comm comm = s->comm, node = MPI_COMM_NULL;
    int rank, size, failed = 0;
    PMPI_Comm_rank(comm, &rank);
    PMPI_Comm_size(comm, &size);
    g->rank = rank;
    int r = read_graph(g, comm);
    if (r == 1)   /* no graph on any rank: nothing collective happens */
        return;
    MPI_Errhandler was;
    PMPI_Comm_get_errhandler(comm, &was);
    PMPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    failed = oom || r != 0 || pmpi_split_node(comm, rank, &node, NULL, NULL) != 0;
    if (!failed) {
        PMPI_Comm_rank(node, &g->me);
        PMPI_Comm_size(node, &g->nn);
        failed = find_nodes(g, comm, node) != 0 || g->nn != s->c.size || g->me != s->c.rank;
    }
    int asym = asymmetric(g, comm, size, rank, &failed);
    int maxkey = 0;
    for (int i = 0; i < g->nout; i++)
        maxkey = g->out[i].key > maxkey ? g->out[i].key : maxkey;
    /* the areas, a slot's room for a call's staged edges (each peer's, cfg.ngh_stage at most;
     * all of them, cfg.ngh_bytes at most), mapped whole: each rank reserves its own header, and
     * of its areas what its calls use, as they grow */
    const char *why = NULL;
    if (node != MPI_COMM_NULL) {
        /* every node rank maps, or none goes on; the settings that size the segment and choose
         * staging are the node's least (a setting given to some ranks only changes nothing) */
        int64_t mine[3] = {failed, -(int64_t)cfg.ngh_stage, -(int64_t)cfg.ngh_bytes}, all3[3] = {1, 0, 0};
        if (PMPI_Allreduce(mine, all3, 3, MPI_INT64_T, MPI_MAX, node) != MPI_SUCCESS)
            all3[0] = 1;
        int any = all3[0] != 0;
        g->stage = (uint64_t)-all3[1];
        uint64_t most = (uint64_t)g->nn * g->stage, room = (uint64_t)-all3[2];
        g->cap = ((most < room ? most : room) + 4095) & ~(uint64_t)4095;
        g->hdr = ((size_t)g->nn * sizeof(pairhdr) + 4095) & ~(size_t)4095;
        g->per = g->hdr + SLOTS * g->cap;
        g->bytes = g->per * (size_t)g->nn;
        if (!any) {
            g->base = pmpi_map_segment(node, g->bytes, 0, &why, &g->fd);
            if (g->base != NULL && posix_fallocate(g->fd, (off_t)(g->per * (size_t)g->me), (off_t)g->hdr))
                failed = 1, why = "no room for the node's shared segment";
            failed |= g->base == NULL;
        }
        PMPI_Comm_free(&node);
    }
    if (PMPI_Comm_dup(comm, &g->msgs) != MPI_SUCCESS)
        g->msgs = MPI_COMM_NULL, failed = 1;
    else
        PMPI_Comm_set_errhandler(g->msgs, MPI_ERRORS_RETURN);
    int local[3] = {failed, asym, maxkey}, all[3] = {1, 0, 0};
    if (PMPI_Allreduce(local, all, 3, MPI_INT, MPI_MAX, comm) != MPI_SUCCESS)
        all[0] = 1;
    PMPI_Comm_set_errhandler(comm, was);
    PMPI_Errhandler_free(&was);
    /* tags: call number (modulo g->calls) and key; the bound is the communicator's, alike on
     * every rank */
    int *ub = NULL, found = 0;
    if (g->msgs != MPI_COMM_NULL)
        PMPI_Comm_get_attr(g->msgs, MPI_TAG_UB, &ub, &found);
    g->keys = all[2] + 2;
    g->calls = ((int64_t)(found ? *ub : 32767) + 1) / g->keys;
    if (g->calls > (1 << 20))
        g->calls = 1 << 20;
    if (all[0] == 0 && all[1] == 0 && g->calls >= 4 * SLOTS) {
        g->phase = N_FAST;
        return;
    }
    drop(g, 0);
    if (oom)
        return;
    if (all[0] == 0 && all[1] != 0) {   /* every rank could have: the graph is wrong */
        g->phase = N_REFUSED;
        if (!asym)
            snprintf(g->why, sizeof g->why, "the graph's edges do not match on another rank (MPI "
                     "requires every edge in both ranks' lists)");
    } else if (cfg.stats && (failed || all[0] == 0)) {
        fprintf(stderr, "hybridmpi pmpi: rank %d: neighbourhood collectives stay on MPI: %s\n", rank,
                why ? why : failed ? "the set-up failed" : "too many edges between two ranks for the tags");
    }
}

/* ------------------------------------------------------------------ plans */

/* Every MPI_Type_free the program makes (its handle may name another type next). */
static _Atomic uint64_t type_frees;

/* Whether t's elements are its bytes in order, back to back: a named type whose extent is its
 * size, or a contiguous or duplicated one of such a type (other types, even gapless ones, may
 * order their bytes otherwise: an hindexed {4, 0} has no gap). */
static int as_bytes(MPI_Datatype t, int depth)
{
    int ni, na, nd, combiner;
    MPI_Count size;
    MPI_Aint lb, ext;
    if (depth > 8 || PMPI_Type_get_envelope(t, &ni, &na, &nd, &combiner) != MPI_SUCCESS ||
        PMPI_Type_size_x(t, &size) != MPI_SUCCESS || PMPI_Type_get_extent(t, &lb, &ext) != MPI_SUCCESS ||
        lb != 0 || ext != size)
        return 0;
    if (combiner == MPI_COMBINER_NAMED)
        return 1;
    if ((combiner != MPI_COMBINER_CONTIGUOUS && combiner != MPI_COMBINER_DUP) || ni > 1 || na || nd != 1)
        return 0;
    int count;
    MPI_Datatype base;
    if (PMPI_Type_get_contents(t, ni, na, nd, &count, NULL, &base) != MPI_SUCCESS)
        return 0;
    int yes = as_bytes(base, depth + 1), bni, bna, bnd, bcomb;
    if (PMPI_Type_get_envelope(base, &bni, &bna, &bnd, &bcomb) == MPI_SUCCESS && bcomb != MPI_COMBINER_NAMED)
        PMPI_Type_free(&base);
    return yes;
}

/* t's combiner: 0, else -1 (MPI does not know t). */
static int combiner_of(MPI_Datatype t, int *combiner)
{
    int ni, na, nd;
    if (PMPI_Type_get_envelope(t, &ni, &na, &nd, combiner) == MPI_SUCCESS)
        return 0;
#if MPI_VERSION >= 4
    MPI_Count cni, cna, cnc, cnd;   /* (a type made by a large-count constructor) */
    if (PMPI_Type_get_envelope_c(t, &cni, &cna, &cnc, &cnd, combiner) == MPI_SUCCESS)
        return 0;
#endif
    return -1;
}

/* A datatype's size and extent; whether it moves as bytes (else packed); whether it is named
 * (never freed, so a handle seen before means what it meant). */
static int type_info(MPI_Datatype t, int64_t *size, MPI_Aint *ext, int *contig, int *named)
{
    MPI_Aint lb;
    MPI_Count sz;
    int combiner;
    if (PMPI_Type_size_x(t, &sz) != MPI_SUCCESS || PMPI_Type_get_extent(t, &lb, ext) != MPI_SUCCESS ||
        combiner_of(t, &combiner))
        return -1;
    *size = (int64_t)sz;
    *named = combiner == MPI_COMBINER_NAMED;
    *contig = as_bytes(t, 0);
    return 0;
}

/* Whether t is one of the predefined types DOLFINx, PETSc and mpi4py send (the plan's check
 * skips its queries). */
static int predefined(MPI_Datatype t)
{
    static const MPI_Datatype known[] = {MPI_DOUBLE, MPI_FLOAT, MPI_INT, MPI_LONG, MPI_LONG_LONG,
                                         MPI_BYTE, MPI_CHAR, MPI_INT32_T, MPI_INT64_T,
                                         MPI_C_DOUBLE_COMPLEX, MPI_UNSIGNED_CHAR};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (t == known[i])
            return 1;
    return 0;
}

/* The count and displacement of edge i for a call's form: uniform forms have one count, and
 * allgathers send the same block along every edge. */
static void edge_args(int form, int big, int send, int i, const void *c, const void *d, int64_t n,
                      int64_t *cnt, int64_t *dsp)
{
    int uniform = form == F_ALLTOALL || form == F_ALLGATHER || (send && form == F_ALLGATHERV);
    *cnt = uniform ? n : big ? ((const MPI_Count *)c)[i] : ((const int *)c)[i];
    *dsp = send && (form == F_ALLGATHER || form == F_ALLGATHERV) ? 0
           : uniform ? i * n
           : d == NULL ? 0   /* (counts only) */
           : big ? ((const MPI_Aint *)d)[i] : ((const int *)d)[i];
}

static void plan_unref(plan *p)
{
    if (p == NULL || --p->refs > 0)
        return;
    for (int k = 0; k < p->nsp + p->nrp; k++) {
        pair *q = k < p->nsp ? &p->sp[k] : &p->rp[k - p->nsp];
        free(q->edge);
        free(q->len);
    }
    if (p->dup_st)
        PMPI_Type_free(&p->st);
    if (p->dup_rt)
        PMPI_Type_free(&p->rt);
    free(p->sp);
    free(p->rp);
    free(p->sc);
    free(p->sd);
    free(p->rc);
    free(p->rd);
    free(p);
}

/* The hash of a pair's edges (key, bytes) in key order: equal at both ends when their counts
 * match edge by edge. */
static uint64_t sig_add(uint64_t h, int key, uint64_t bytes)
{
    return (h ^ ((uint64_t)key << 48 ^ bytes)) * 0x100000001b3ULL;
}

/* The on-node peers of one side: pairs in order of first edge, edges in key order. */
static int make_pairs(const ngh *g, plan *p, int send)
{
    int n = send ? g->nout : g->nin;
    const edge *e = send ? g->out : g->in;
    const int64_t *c = send ? p->sc : p->rc;
    int64_t esz = send ? p->ssz : p->rsz;
    pair *pr = calloc((size_t)n + 1, sizeof(pair));
    if (pr == NULL)
        return -1;
    int np = 0, rc = 0;
    for (int i = 0; i < n; i++) {
        if (e[i].node < 0)
            continue;
        int k = 0;
        while (k < np && pr[k].node != e[i].node)
            k++;
        if (k == np)
            pr[np].node = e[i].node, pr[np++].peer = e[i].peer;
        pr[k].n++;
    }
    for (int k = 0; k < np && rc == 0; k++) {
        pair *q = &pr[k];
        q->edge = malloc(sizeof(int) * (size_t)q->n);
        q->len = malloc(sizeof(int64_t) * (size_t)q->n);
        if (!q->edge || !q->len) {
            rc = -1;
            break;
        }
        int m = 0;
        for (int i = 0; i < n; i++)
            if (e[i].node == q->node)
                q->edge[m++] = i;
        for (int a = 1; a < m; a++)   /* by key (insertion sort: a handful of edges) */
            for (int b = a; b > 0 && e[q->edge[b]].key < e[q->edge[b - 1]].key; b--) {
                int t = q->edge[b];
                q->edge[b] = q->edge[b - 1], q->edge[b - 1] = t;
            }
        q->sig = 0xcbf29ce484222325ULL;
        for (int a = 0; a < m; a++) {
            int i = q->edge[a];
            q->len[a] = (c[i] > 0 ? c[i] : 0) * esz;
            q->bytes += (uint64_t)q->len[a];
            q->sig = sig_add(q->sig, e[i].key, (uint64_t)q->len[a]);
        }
        /* staged (two copies, never waiting on the peer) up to g->stage bytes; past that the
         * MPI's own messages, which copy once on a node (docs: "How a call moves") */
        q->msg = q->bytes > g->stage;
    }
    if (send)
        p->sp = pr, p->nsp = np;
    else
        p->rp = pr, p->nrp = np;
    return rc;
}

/* Whether plan p serves a call with these arguments. */
static int plan_fits(const ngh *g, const plan *p, int form, int big, const void *sc, const void *sd,
                     int64_t scount, MPI_Datatype st, const void *rc, const void *rd, int64_t rcount,
                     MPI_Datatype rt)
{
    if (p->ust != st || p->urt != rt || p->form != form)
        return 0;
    if (!(predefined(st) && predefined(rt))) {
        /* a handle freed since may name another type now; and one freed by a way this library
         * does not see (its sizes at least) */
        int64_t ssz, rsz;
        int sc_, rc_, sn, rn;
        MPI_Aint sext, rext;
        if ((p->dup_st || p->dup_rt) && p->types_freed != atomic_load(&type_frees))
            return 0;
        if (type_info(st, &ssz, &sext, &sc_, &sn) || type_info(rt, &rsz, &rext, &rc_, &rn) ||
            ssz != p->ssz || rsz != p->rsz || sext != p->sext || rext != p->rext ||
            sc_ != p->scontig || rc_ != p->rcontig || sn == p->dup_st || rn == p->dup_rt)
            return 0;
    }
    int64_t cnt, dsp;
    for (int i = 0; i < g->nout + g->nin; i++) {
        int send = i < g->nout, k = send ? i : i - g->nout;
        edge_args(form, big, send, k, send ? sc : rc, send ? sd : rd, send ? scount : rcount, &cnt, &dsp);
        if (cnt != (send ? p->sc : p->rc)[k] || dsp != (send ? p->sd : p->rd)[k])
            return 0;
    }
    return 1;
}

/* The plan of a call: the last one when its arguments are the same, else a new one. */
static plan *plan_for(ngh *g, int form, int big, const void *sc, const void *sd, int64_t scount,
                      MPI_Datatype st, const void *rc, const void *rd, int64_t rcount, MPI_Datatype rt)
{
    int no = g->nout, ni = g->nin;
    plan *p = g->last;
    if (p && plan_fits(g, p, form, big, sc, sd, scount, st, rc, rd, rcount, rt)) {
        p->refs++;
        return p;
    }
    p = calloc(1, sizeof *p);
    if (p == NULL)
        return NULL;
    p->refs = 1;
    p->form = form;
    p->ust = p->st = st, p->urt = p->rt = rt;
    p->types_freed = atomic_load(&type_frees);
    p->sc = malloc(sizeof(int64_t) * ((size_t)no + 1));
    p->sd = malloc(sizeof(int64_t) * ((size_t)no + 1));
    p->rc = malloc(sizeof(int64_t) * ((size_t)ni + 1));
    p->rd = malloc(sizeof(int64_t) * ((size_t)ni + 1));
    int sn = 1, rn = 1;
    int bad = !p->sc || !p->sd || !p->rc || !p->rd ||
              type_info(st, &p->ssz, &p->sext, &p->scontig, &sn) ||
              type_info(rt, &p->rsz, &p->rext, &p->rcontig, &rn);
    /* the library's own handles of derived types: the program may free its own once posted */
    if (!bad && !sn)
        bad = PMPI_Type_dup(st, &p->st) != MPI_SUCCESS, p->dup_st = !bad;
    if (!bad && !rn)
        bad = PMPI_Type_dup(rt, &p->rt) != MPI_SUCCESS, p->dup_rt = !bad;
    for (int i = 0; !bad && i < no; i++)
        edge_args(form, big, 1, i, sc, sd, scount, &p->sc[i], &p->sd[i]);
    for (int j = 0; !bad && j < ni; j++)
        edge_args(form, big, 0, j, rc, rd, rcount, &p->rc[j], &p->rd[j]);
    if (bad || make_pairs(g, p, 1) || make_pairs(g, p, 0)) {
        plan_unref(p);
        return NULL;
    }
    if (g->last)
        plan_unref(g->last);
    g->last = p;
    p->refs++;
    return p;
}

/* ------------------------------------------------------------------ calls in flight */

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static op *registry;            /* every call whose request MPI has not freed */
static _Atomic int registered;
/* By a hash of the request: how many of the registry's requests have it.  A request whose word
 * is 0 is not the library's, seen without a lock. */
enum { FILTER_BITS = 12 };
static _Atomic uint16_t filter[1 << FILTER_BITS];

static inline unsigned request_hash(MPI_Request r)
{
    uint64_t x = (uint64_t)(uintptr_t)r;
    return (unsigned)((x * 0x9E3779B97F4A7C15ULL) >> (64 - FILTER_BITS));
}

/* The registry's first LIVE requests, by slot (a slot keeps its request until MPI frees it):
 * the array calls compare each entry with them, in a loop the compiler vectorises. */
enum { LIVE = 8 };
static MPI_Request live[LIVE];
static _Atomic int live_used[LIVE];
static _Atomic int unlisted;    /* the registry's requests in no slot */

/* Whether r may be one of this library's calls (0: it is not). */
static inline int maybe_ours(MPI_Request r)
{
    return atomic_load_explicit(&registered, memory_order_relaxed) != 0 && r != MPI_REQUEST_NULL &&
           atomic_load_explicit(&filter[request_hash(r)], memory_order_relaxed) != 0;
}

static void op_unref(op *o)
{
    if (atomic_fetch_sub(&o->refs, 1) != 1)
        return;
    ngh *g = o->g;
    free(o);   /* (with its arrays; a failed call's messages are dropped, never freed) */
    ngh_unref(g);
}

/* The pairs' words of a failed call get the error bits: its peers on the node fail too. */
static void poison(op *o)
{
    plan *p = o->p;
    ngh *g = o->g;
    if (g->base == NULL)
        return;
    for (int k = 0; k < p->nsp + p->nrp; k++) {
        void *words[SLOTS];
        for (int slot = 0; slot < SLOTS; slot++)
            words[slot] = k < p->nsp ? (void *)&HDR(g, g->me, p->sp[k].node)->ready[slot]
                                     : (void *)&HDR(g, p->rp[k - p->nsp].node, g->me)->done[slot];
        hm_poison(SLOTS, words, HM_ERRBIT);
    }
}

/* Call o is complete (or failed): so is its request, for MPI (its place in the list is
 * given up in order, retire). */
static void finish(op *o)
{
    o->done = 1;
    if (o->greq != MPI_REQUEST_NULL)
        PMPI_Grequest_complete(o->greq);
}

/* A failed call: says why, revokes the communicator and reports through its error handler.
 * `peer`: the other rank, or -1. */
static int fail(op *o, int code, int peer)
{
    static const char *const why[] = {
        [HM_ETIMEOUT] = "a wait timed out (HYBRIDMPI_PMPI_TIMEOUT)",
        [HM_EMISMATCH] = "the ranks passed different counts for an edge, or called different "
                         "collectives",
        [HM_EPEER] = "a rank of the node failed or ended", [HM_ENET] = "MPI failed on a message",
        [HM_EELSEWHERE] = "an earlier call on the communicator failed"};
    state *s = o->s;
    o->rc = code;
    poison(o);
    finish(o);
    if (s->phase == S_BROKEN)   /* said once, by the call that failed first */
        return code;
    int rank = o->g->rank;
    char with[40] = "";
    if (peer >= 0)
        snprintf(with, sizeof with, "with rank %d, ", peer);
    fprintf(stderr, "hybridmpi pmpi: rank %d: %s: %s (%scall %llu); the communicator is revoked\n",
            rank, call_names[o->greq != MPI_REQUEST_NULL][o->form], why[code] ? why[code] : "failed",
            with, (unsigned long long)o->e);
    s->phase = S_BROKEN;
    pmpi_revoked(s);
    return code;
}

/* An erroneous call whose protocol held: said, and reported through the error handler; the
 * communicator stays (its peers never learn of it, and need not). */
static void report(op *o)
{
    int rank = o->g->rank;
    fprintf(stderr, "hybridmpi pmpi: rank %d: %s: rank %d sent a different count on an edge than this "
            "rank receives, or called another collective (call %llu); what it sent here is not all received\n",
            rank, call_names[o->greq != MPI_REQUEST_NULL][o->form], o->soft_peer,
            (unsigned long long)o->e);
    o->rc = o->soft;
    pmpi_revoked(o->s);
}

static void mismatch(op *o, int peer)
{
    if (!o->soft)
        o->soft = HM_EMISMATCH, o->soft_peer = peer;
}

/* A message of call o: a send from buf, or a receive into it that must carry `expect` bytes
 * (-2: a buffered pair's), for receive pair `k` (-1: none). */
static int message(op *o, int send, const char *buf, MPI_Count count, MPI_Datatype t, int peer, int tag,
                   int64_t expect, int k)
{
    MPI_Request *r = &o->req[o->nreq];
#if MPI_VERSION >= 4   /* (counts past 2^31 - 1: the _c forms' calls) */
    int rc = send ? PMPI_Isend_c(buf, count, t, peer, tag, o->g->msgs, r)
                  : PMPI_Irecv_c((void *)buf, count, t, peer, tag, o->g->msgs, r);
#else
    int rc = send ? PMPI_Isend(buf, (int)count, t, peer, tag, o->g->msgs, r)
                  : PMPI_Irecv((void *)buf, (int)count, t, peer, tag, o->g->msgs, r);
#endif
    if (rc != MPI_SUCCESS)
        return fail(o, HM_ENET, peer);
    o->from[o->nreq] = peer;
    o->pairof[o->nreq] = k;
    o->expect[o->nreq++] = send ? -1 : expect;
    return HM_OK;
}

/* The edges of an on-node pair as the MPI's messages, one per edge (receive pair k, or -1). */
static int edge_messages(op *o, const pair *q, int send, int k)
{
    plan *p = o->p;
    const edge *e = send ? o->g->out : o->g->in;
    for (int a = 0; a < q->n; a++) {
        int i = q->edge[a], tag = tag_of(o->g, o->e, e[i].key);
        int rc = send ? message(o, 1, o->sb + (MPI_Aint)p->sd[i] * p->sext, p->sc[i], p->st, q->peer, tag, -1, -1)
                      : message(o, 0, o->rb + (MPI_Aint)p->rd[i] * p->rext, p->rc[i], p->rt, q->peer, tag,
                                p->rc[i] * p->rsz, k);
        if (rc)
            return rc;
    }
    return HM_OK;
}

/* A pair's edges into `to`, back to back in key order (packed when their type is not
 * contiguous), or out of `from`. */
static void pack_pair(op *o, const pair *q, char *to)
{
    plan *p = o->p;
    for (int a = 0; a < q->n; a++) {
        int i = q->edge[a], pos = 0;
        const char *x = o->sb + (MPI_Aint)p->sd[i] * p->sext;
        if (p->scontig)
            memcpy(to, x, (size_t)q->len[a]);
        else if (q->len[a] > 0)   /* (at most g->stage bytes: an int) */
            PMPI_Pack(x, (int)p->sc[i], p->st, to, (int)q->len[a], &pos, o->g->msgs);
        to += q->len[a];
    }
}

static void unpack_pair(op *o, const pair *q, const char *from)
{
    plan *p = o->p;
    for (int a = 0; a < q->n; a++) {
        int i = q->edge[a], pos = 0;
        char *x = o->rb + (MPI_Aint)p->rd[i] * p->rext;
        if (p->rcontig)
            memcpy(x, from, (size_t)q->len[a]);
        else if (q->len[a] > 0)
            PMPI_Unpack(from, (int)q->len[a], &pos, x, (int)p->rc[i], p->rt, o->g->msgs);
        from += q->len[a];
    }
}

/* A pair that finds its slot busy, or no room: its bytes behind their hash as one message,
 * which the call does not wait for. */
static int buffered(op *o, const pair *q)
{
    ngh *g = o->g;
    sent *x = malloc(sizeof(sent) + 8 + q->bytes);
    if (x == NULL)
        return fail(o, HM_ENET, q->peer);
    x->data[0] = q->sig;
    pack_pair(o, q, (char *)&x->data[1]);
    if (PMPI_Isend(x->data, (int)(8 + q->bytes), MPI_BYTE, q->peer, tag_of(g, o->e, g->keys - 1), g->msgs,
                   &x->req) != MPI_SUCCESS) {
        free(x);
        return fail(o, HM_ENET, q->peer);
    }
    x->next = g->sends;
    g->sends = x;
    return HM_OK;
}

/* The send side of the staged pairs, at post: into this rank's area of the call's slot once
 * every peer took what the slot held last, else (or without room in /dev/shm) buffered. */
static int publish(op *o)
{
    ngh *g = o->g;
    plan *p = o->p;
    uint64_t e = o->e;
    int slot = (int)(e % SLOTS), free_ = 1;
    for (int k = 0; k < p->nsp; k++) {
        pairhdr *h = HDR(g, g->me, p->sp[k].node);
        uint64_t d = load_acq(&h->done[slot], HM_ACQ_REL);
        if (d & HM_FLAGS)
            return fail(o, HM_EPEER, p->sp[k].peer);
        free_ &= (atomic_load_explicit(&h->ready[slot], memory_order_relaxed) & ~HM_FLAGS) == d;
    }
    uint64_t off = 0;
    for (int k = 0; k < p->nsp; k++) {
        pair *q = &p->sp[k];
        if (q->msg)
            continue;
        if (free_ && off + q->bytes <= g->cap && reserve(g, slot, off + q->bytes)) {
            pairhdr *h = HDR(g, g->me, q->node);
            pack_pair(o, q, AREA(g, g->me, slot) + off);
            atomic_store_explicit(&h->off[slot], (int64_t)off, memory_order_relaxed);
            atomic_store_explicit(&h->sig[slot], q->sig, memory_order_relaxed);
            store_rel(&h->ready[slot], e, HM_ACQ_REL);
            off += (q->bytes + 63) & ~(uint64_t)63;
        } else if (buffered(o, q)) {
            return o->rc;
        }
    }
    return HM_OK;
}

/* The messages this call posted for receive pair k are cancelled (none will come). */
static void cancel_pair(op *o, int k)
{
    for (int i = 0; i < o->nreq; i++)
        if (o->pairof[i] == k && o->expect[i] >= 0 && o->req[i] != MPI_REQUEST_NULL)
            PMPI_Cancel(&o->req[i]);
}

/* Receive pair k: its sender's route, once seen.  The slot (call e staged there), a buffered
 * message, or (this end staging, that end sending) messages per edge; probing each few steps. */
static int take_pair(op *o, int k)
{
    ngh *g = o->g;
    plan *p = o->p;
    pair *q = &p->rp[k];
    int slot = (int)(o->e % SLOTS);
    pairhdr *h = HDR(g, q->node, g->me);
    uint64_t v = load_acq(&h->ready[slot], HM_ACQ_REL);
    if ((v & ~HM_FLAGS) == o->e) {
        if (atomic_load_explicit(&h->sig[slot], memory_order_relaxed) != q->sig || q->msg) {
            mismatch(o, q->peer);   /* counts that differ on an edge: nothing taken */
            cancel_pair(o, k);
        } else {
            unpack_pair(o, q, AREA(g, q->node, slot) + atomic_load_explicit(&h->off[slot], memory_order_relaxed));
        }
        store_rel(&h->done[slot], o->e, HM_ACQ_REL);
        o->route[k] = R_SLOT;
        return HM_OK;
    }
    if (v & HM_FLAGS)
        return fail(o, HM_EPEER, q->peer);
    if (o->polls % 16 != 1)
        return HM_OK;
    int found = 0;
    MPI_Status st;
    if (PMPI_Iprobe(q->peer, tag_of(g, o->e, g->keys - 1), g->msgs, &found, &st) != MPI_SUCCESS)
        return fail(o, HM_ENET, q->peer);
    if (found) {
        MPI_Count n = 0;
        PMPI_Get_elements_x(&st, MPI_BYTE, &n);
        o->bufs[k] = n <= INT_MAX ? malloc((size_t)n + 8) : NULL;
        if (o->bufs[k] == NULL)
            return fail(o, HM_ENET, q->peer);
        if (q->msg)   /* (its sender staged what this end sends: erroneous) */
            cancel_pair(o, k);
        o->route[k] = R_BUFFERED;
        return message(o, 0, o->bufs[k], n, MPI_BYTE, q->peer, tag_of(g, o->e, g->keys - 1), -2, k);
    }
    if (q->msg)
        return HM_OK;
    if (PMPI_Iprobe(q->peer, tag_of(g, o->e, g->in[q->edge[0]].key), g->msgs, &found, MPI_STATUS_IGNORE) !=
        MPI_SUCCESS)
        return fail(o, HM_ENET, q->peer);
    if (found) {   /* its sender sends what this end stages (erroneous): taken as they are */
        mismatch(o, q->peer);
        o->route[k] = R_DRAIN;
    }
    return HM_OK;
}

/* Receive pair k's messages per edge, of sizes this end does not know (its sender's counts
 * differ), each into a buffer of its own, dropped: 1 once every edge's is posted. */
static int drain(op *o, int k)
{
    ngh *g = o->g;
    pair *q = &o->p->rp[k];
    for (; o->drained[k] < q->n; o->drained[k]++) {
        int found = 0;
        MPI_Message m;
        MPI_Status st;
        MPI_Count n = 0;
        if (PMPI_Improbe(q->peer, tag_of(g, o->e, g->in[q->edge[o->drained[k]]].key), g->msgs, &found, &m,
                         &st) != MPI_SUCCESS)
            return fail(o, HM_ENET, q->peer), 1;
        if (!found)
            return 0;
        PMPI_Get_elements_x(&st, MPI_BYTE, &n);
        char *buf = n <= INT_MAX ? malloc((size_t)n + 1) : NULL;
        if (buf == NULL || PMPI_Imrecv(buf, (int)n, MPI_BYTE, &m, &o->req[o->nreq]) != MPI_SUCCESS)
            return fail(o, HM_ENET, q->peer), 1;
        o->from[o->nreq] = q->peer;
        o->pairof[o->nreq] = k;
        o->tmp[o->nreq] = buf;
        o->expect[o->nreq++] = -3;
    }
    return 1;
}

/* A buffered pair's message, received: its edges copied out when both ends agree on them. */
static void take_buffered(op *o, int k, const MPI_Status *st)
{
    pair *q = &o->p->rp[k];
    MPI_Count n = 0;
    PMPI_Get_elements_x(st, MPI_BYTE, &n);
    uint64_t sig = 0;
    if (n >= 8)
        memcpy(&sig, o->bufs[k], 8);
    if (q->msg || n != (MPI_Count)(8 + q->bytes) || sig != q->sig)
        mismatch(o, q->peer);
    else
        unpack_pair(o, q, o->bufs[k] + 8);
    free(o->bufs[k]);
    o->bufs[k] = NULL;
}

/* The messages: 1 once every one completed (with the bytes its edge expects, else the call is
 * reported). */
static int messages_done(op *o)
{
    if (o->nreq == 0)
        return 1;
    int flag = 0, pending = 0, truncated = -1;
    int rc = PMPI_Testall(o->nreq, o->req, &flag, o->st);
    if (rc != MPI_SUCCESS) {   /* a message longer than its receive (erroneous), or MPI failed */
        for (int i = 0; i < o->nreq; i++) {
            pending |= o->st[i].MPI_ERROR == MPI_ERR_PENDING;
            if (o->st[i].MPI_ERROR == MPI_ERR_TRUNCATE)
                truncated = o->from[i];
        }
        if (pending || truncated < 0)
            return fail(o, HM_ENET, truncated), 0;
        flag = 1;   /* every request completed: the call goes on, reported at its end */
        mismatch(o, truncated);
    }
    for (int i = 0; flag && i < o->nreq; i++) {
        int cancelled = 0;
        MPI_Count n = 0;
        PMPI_Test_cancelled(&o->st[i], &cancelled);
        if (o->expect[i] == -1 || cancelled)
            continue;
        if (o->expect[i] == -2) {
            take_buffered(o, o->pairof[i], &o->st[i]);
            continue;
        }
        if (o->expect[i] == -3) {   /* (a drained edge's) */
            free(o->tmp[i]);
            o->tmp[i] = NULL;
            continue;
        }
        PMPI_Get_elements_x(&o->st[i], MPI_BYTE, &n);
        if (n != o->expect[i])
            mismatch(o, o->from[i]);
    }
    if (flag)
        o->nreq = 0;
    return flag;
}

/* One step of call o, never waiting: 1 once it is complete (or failed). */
static int step(op *o)
{
    if (o->done)
        return 1;
    if (o->s->phase == S_BROKEN)
        return fail(o, HM_EELSEWHERE, -1), 1;
    o->polls++;
    for (int k = 0; k < o->p->nrp && !o->done; k++) {
        if (o->route[k] != R_OPEN)
            continue;
        /* a pair sent per edge by both ends is complete with its messages; until then its
         * sender may have chosen otherwise (erroneous counts) */
        if (o->p->rp[k].msg && o->nreq == 0)
            o->route[k] = R_EDGES;
        else if (take_pair(o, k))
            return 1;
        o->left -= o->route[k] != R_OPEN && o->route[k] != R_DRAIN && !o->p->rp[k].msg;
    }
    for (int k = 0; k < o->p->nrp && !o->done; k++)
        if (o->route[k] == R_DRAIN && drain(o, k) && !o->done)
            o->route[k] = R_EDGES, o->left--;
    if (!o->done && !o->left && messages_done(o) && !o->done) {
        if (o->soft)
            report(o);
        finish(o);
    }
    return o->done;
}

/* Call o, complete, is out of the communicator's list. */
static void retire(ngh *g, op *o)
{
    g->head = o->next;
    if (g->head == NULL)
        g->tail = NULL;
    if (o->nreq == 0) {   /* (a failed call's buffers may still be MPI's: kept) */
        for (int k = 0; k < o->p->nrp; k++)
            free(o->bufs[k]);
    }
    plan_unref(o->p);   /* (under g's lock, as plans are made) */
    o->p = NULL;
    op_unref(o);
}

/* The communicator's calls, each a step (each completes when it can), retired in order; with `block`, until `upto` is
 * complete, waiting under the node's policy (a timeout, a peer's process gone). */
static void advance(ngh *g, op *upto, int block)
{
    reap(&g->sends, 0);
    reap_orphans();
    if (g->head == NULL)
        return;
    state *s = g->head->s;
    const hm_wait_policy *pol = &s->c.policy;
    int64_t polls = 0;
    HM_SLOW(w);
    for (;;) {
        for (op *o = g->head; o; o = o->next)
            step(o);
        while (g->head && g->head->done)
            retire(g, g->head);
        if (!block || upto->done)
            return;
        if (polls++ < pol->spin) {
            cpu_relax();
            continue;
        }
        if (!w.start)
            slow_start(&w, pol);
        pmpi_poke(g->msgs);   /* MPI's progress, never on the program's communicator (it may
                                 be in its free, on another thread) */
        op *o = g->head;
        while (o->done)
            o = o->next;
        for (int k = 0; polls % 256 == 0 && k < o->p->nrp + o->p->nsp; k++) {
            pair *q = k < o->p->nrp ? &o->p->rp[k] : &o->p->sp[k - o->p->nrp];
            int waits = k < o->p->nrp ? o->route[k] == R_OPEN || o->route[k] == R_DRAIN : q->msg && o->nreq;
            if (waits && q->node != g->me && pmpi_gone(s, q->node))
                fail(o, HM_EPEER, q->peer);
        }
        if (!o->done && slow_tick(&w, pol, NULL, 0, 0))
            fail(o, HM_ETIMEOUT, -1);
    }
}

/* ------------------------------------------------------------------ generalized requests */

static int greq_query(void *extra, MPI_Status *st)
{
    op *o = extra;
    PMPI_Status_set_elements(st, MPI_BYTE, 0);
    PMPI_Status_set_cancelled(st, 0);
    st->MPI_SOURCE = MPI_UNDEFINED;
    st->MPI_TAG = MPI_UNDEFINED;
    st->MPI_ERROR = o->rc ? MPI_ERR_OTHER : MPI_SUCCESS;
    return MPI_SUCCESS;
}

/* MPI freed the request: the call leaves the registry. */
static int greq_free(void *extra)
{
    op *o = extra;
    pthread_mutex_lock(&reg_lock);
    for (op **at = &registry; *at; at = &(*at)->reg_next)
        if (*at == o) {
            *at = o->reg_next;
            atomic_fetch_sub(&filter[request_hash(o->greq)], 1);
            if (o->slot >= 0)
                atomic_store(&live_used[o->slot], 0);
            else
                atomic_fetch_sub(&unlisted, 1);
            atomic_fetch_sub(&registered, 1);
            break;
        }
    pthread_mutex_unlock(&reg_lock);
    op_unref(o);
    return MPI_SUCCESS;
}

/* A collective call cannot be cancelled (MPI_Cancel of one is erroneous): nothing happens. */
static int greq_cancel(void *extra, int complete)
{
    (void)extra, (void)complete;
    return MPI_SUCCESS;
}

/* The call behind request r, with a reference the caller drops (op_unref), or NULL. */
static op *ours(MPI_Request r)
{
    if (!maybe_ours(r))
        return NULL;
    pthread_mutex_lock(&reg_lock);
    op *o = registry;
    while (o && o->greq != r)
        o = o->reg_next;
    if (o)
        atomic_fetch_add(&o->refs, 1);
    pthread_mutex_unlock(&reg_lock);
    return o;
}

/* ------------------------------------------------------------------ the calls */

/* A call's arguments, in the v form where it has one. */
typedef struct {
    int form;
    int big;   /* the _c forms: MPI_Count counts, MPI_Aint displacements */
    const void *sb;
    const void *sc, *sd;
    int64_t scount;
    MPI_Datatype st;
    void *rb;
    const void *rc, *rd;
    int64_t rcount;
    MPI_Datatype rt;
    MPI_Comm comm;
} args;

/* What neighbor() returns for a call that goes on to what comes next, as it came. */
enum { PASS = -1 };

/* Whether the counts are what MPI accepts (else MPI reports them, as ever: a negative count).
 * Any count MPI accepts goes to the core (a count past 2^31 - 1, as the _c forms take, goes as
 * a message of the _c point-to-point calls): a choice made from one rank's counts would send
 * some ranks of a call to MPI and others to the core. */
static int counts_valid(const args *a, const ngh *g)
{
    int64_t cnt, dsp;
    for (int i = 0; i < g->nout + g->nin; i++) {
        int send = i < g->nout, k = send ? i : i - g->nout;
        edge_args(a->form, a->big, send, k, send ? a->sc : a->rc, send ? a->sd : a->rd,
                  send ? a->scount : a->rcount, &cnt, &dsp);
        if (cnt < 0)
            return 0;
    }
    return 1;
}

/* Posts call o: its receives (edges across nodes, large pairs), its sends, its staged pairs.
 * It never waits. */
static int post(op *o)
{
    ngh *g = o->g;
    plan *p = o->p;
    for (int j = 0; j < g->nin; j++)
        if (g->in[j].peer != MPI_PROC_NULL && g->in[j].node < 0 &&
            message(o, 0, o->rb + (MPI_Aint)p->rd[j] * p->rext, p->rc[j], p->rt, g->in[j].peer,
                    tag_of(g, o->e, g->in[j].key), p->rc[j] * p->rsz, -1))
            return o->rc;
    for (int k = 0; k < p->nrp; k++)   /* the node's peers whose edges are large: the MPI's */
        if (p->rp[k].msg && edge_messages(o, &p->rp[k], 0, k))
            return o->rc;
    for (int i = 0; i < g->nout; i++)
        if (g->out[i].peer != MPI_PROC_NULL && g->out[i].node < 0 &&
            message(o, 1, o->sb + (MPI_Aint)p->sd[i] * p->sext, p->sc[i], p->st, g->out[i].peer,
                    tag_of(g, o->e, g->out[i].key), -1, -1))
            return o->rc;
    for (int k = 0; k < p->nsp; k++)
        if (p->sp[k].msg && edge_messages(o, &p->sp[k], 1, -1))
            return o->rc;
    return publish(o);
}

/* Call `a` on the core (PASS: on to MPI after all), under g's lock. */
static int start(ngh *g, state *s, const args *a, MPI_Request *req)
{
    plan *p = plan_for(g, a->form, a->big, a->sc, a->sd, a->scount, a->st, a->rc, a->rd, a->rcount,
                       a->rt);
    /* the call and its arrays in one block: messages (an edge's, and per receive pair a
     * buffered or drained one more), then per receive pair */
    size_t nm = (size_t)g->nout + 2 * (size_t)g->nin + 1, np = p ? (size_t)p->nrp + 1 : 0;
    size_t at_st = (sizeof(op) + nm * sizeof(MPI_Request) + 15) & ~(size_t)15;
    size_t at_x = (at_st + nm * sizeof(MPI_Status) + 15) & ~(size_t)15;   /* (a status: 20 bytes) */
    size_t at_tmp = at_x + nm * sizeof(int64_t), at_bufs = at_tmp + nm * sizeof(char *);
    size_t at_f = at_bufs + np * sizeof(char *), at_d = at_f + 2 * nm * sizeof(int);
    size_t at_r = at_d + np * sizeof(int);
    op *o = p ? calloc(1, at_r + np) : NULL;
    if (o == NULL) {   /* a type MPI does not know (it says so), or no memory */
        if (p)
            plan_unref(p);
        COUNT(C_NEXT_NEIGHBOR);
        return PASS;
    }
    *o = (op){.g = g, .s = s, .p = p, .e = ++g->epoch, .sb = a->sb, .rb = a->rb, .form = a->form,
              .greq = MPI_REQUEST_NULL, .refs = 2, .req = (MPI_Request *)(o + 1),
              .st = (MPI_Status *)((char *)o + at_st), .expect = (int64_t *)((char *)o + at_x),
              .tmp = (char **)((char *)o + at_tmp), .bufs = (char **)((char *)o + at_bufs),
              .from = (int *)((char *)o + at_f), .pairof = (int *)((char *)o + at_f) + nm,
              .drained = (int *)((char *)o + at_d), .route = (unsigned char *)o + at_r};
    for (int k = 0; k < p->nrp; k++)
        o->left += !p->rp[k].msg;
    atomic_fetch_add(&g->refs, 1);
    if (g->tail)
        g->tail->next = o;
    else
        g->head = o;
    g->tail = o;
    COUNT(C_FAST_NEIGHBOR);
    s->fast++;
    if (req != NULL) {
        if (PMPI_Grequest_start(greq_query, greq_free, greq_cancel, o, &o->greq) != MPI_SUCCESS) {
            o->greq = MPI_REQUEST_NULL;
            req = NULL;   /* (no request: the call completes here) */
        } else {
            pthread_mutex_lock(&reg_lock);
            o->reg_next = registry;
            registry = o;
            atomic_fetch_add(&filter[request_hash(o->greq)], 1);
            o->slot = -1;
            for (int i = 0; i < LIVE && o->slot < 0; i++)
                if (!atomic_load(&live_used[i])) {
                    __atomic_store_n(&live[i], o->greq, __ATOMIC_RELAXED);
                    atomic_store_explicit(&live_used[i], 1, memory_order_release);
                    o->slot = i;
                }
            if (o->slot < 0)
                atomic_fetch_add(&unlisted, 1);
            atomic_fetch_add(&registered, 1);
            pthread_mutex_unlock(&reg_lock);
            *req = o->greq;
        }
    }
    /* a non-blocking call is posted here, taken in a wait (the copies to this rank are the
     * wait's work) */
    if (post(o) != HM_OK || req == NULL)
        advance(g, o, 1);
    int rc = o->rc;
    if (req == NULL)
        op_unref(o);
    return rc == HM_OK || req != NULL ? MPI_SUCCESS : MPI_ERR_OTHER;
}

/* Call `a` on the core, or PASS: the entry point passes it on to what comes next (`name`,
 * found once into *next). */
static int neighbor(const args *a, MPI_Request *req, void **next, const char *name)
{
    if (*next == NULL) {
        char pname[64];
        snprintf(pname, sizeof pname, "P%s", name);
        *next = pmpi_next(name, pname);
    }
    state *s = pmpi_state(a->comm, 0);
    ngh *g = s ? s->ngh : NULL;   /* (set up when the communicator was made, else none) */
    if (s != NULL && s->phase == S_BROKEN && (g == NULL || g->phase != N_NEXT)) {
        if (req != NULL)   /* (a request the program may still pass to a completion call) */
            *req = MPI_REQUEST_NULL;
        return pmpi_revoked(s);
    }
    if (g == NULL || g->phase == N_NEXT || !counts_valid(a, g)) {
        COUNT(C_NEXT_NEIGHBOR);
        return PASS;
    }
    if (g->phase == N_REFUSED) {
        int rank;
        PMPI_Comm_rank(a->comm, &rank);
        fprintf(stderr, "hybridmpi pmpi: rank %d: %s: %s\n", rank, name, g->why);
        if (req != NULL)
            *req = MPI_REQUEST_NULL;
        return pmpi_revoked(s);
    }
    pthread_mutex_lock(&g->lock);
    int rc = start(g, s, a, req);
    pthread_mutex_unlock(&g->lock);
    return rc;
}

/* The entry points, C the count type and D the displacement type of each (the _c forms:
 * MPI_Count, MPI_Aint): the arguments in the v form, on the core or on as they came. */
#define ENTRY(NAME, PARAMS, ARGS, FORM, BIG, REQ, ...)                                            \
    EXPORT int NAME(PARAMS)                                                                       \
    {                                                                                             \
        typedef int (*next_fn)(PARAMS);                                                           \
        static void *next_;                                                                       \
        args a = {FORM, BIG, __VA_ARGS__};                                                        \
        int got_ = neighbor(&a, REQ, &next_, #NAME);                                            \
        return got_ == PASS ? ((next_fn)next_)(ARGS) : got_;                                      \
    }
#define P_V(C, D) const void *sb, const C sc[], const D sd[], MPI_Datatype st, void *rb,          \
                  const C rc[], const D rd[], MPI_Datatype rt, MPI_Comm comm
#define P_U(C) const void *sb, C scount, MPI_Datatype st, void *rb, C rcount, MPI_Datatype rt,     \
               MPI_Comm comm
#define P_GV(C, D) const void *sb, C scount, MPI_Datatype st, void *rb, const C rc[], const D rd[], \
                   MPI_Datatype rt, MPI_Comm comm
#define P_IV(C, D) P_V(C, D), MPI_Request *req
#define P_IU(C) P_U(C), MPI_Request *req
#define P_IGV(C, D) P_GV(C, D), MPI_Request *req
#define G_V sb, sc, sd, st, rb, rc, rd, rt, comm
#define G_U sb, scount, st, rb, rcount, rt, comm
#define G_GV sb, scount, st, rb, rc, rd, rt, comm
#define G_IV G_V, req
#define G_IU G_U, req
#define G_IGV G_GV, req
#define A_V sb, sc, sd, 0, st, rb, rc, rd, 0, rt, comm
#define A_U sb, NULL, NULL, scount, st, rb, NULL, NULL, rcount, rt, comm
#define A_GV sb, NULL, NULL, scount, st, rb, rc, rd, 0, rt, comm
#define ENTRIES(S, C, D, BIG)                                                                     \
    ENTRY(MPI_Neighbor_alltoallv##S, P_V(C, D), G_V, F_ALLTOALLV, BIG, NULL, A_V)                 \
    ENTRY(MPI_Ineighbor_alltoallv##S, P_IV(C, D), G_IV, F_ALLTOALLV, BIG, req, A_V)               \
    ENTRY(MPI_Neighbor_alltoall##S, P_U(C), G_U, F_ALLTOALL, BIG, NULL, A_U)                      \
    ENTRY(MPI_Ineighbor_alltoall##S, P_IU(C), G_IU, F_ALLTOALL, BIG, req, A_U)                    \
    ENTRY(MPI_Neighbor_allgather##S, P_U(C), G_U, F_ALLGATHER, BIG, NULL, A_U)                    \
    ENTRY(MPI_Ineighbor_allgather##S, P_IU(C), G_IU, F_ALLGATHER, BIG, req, A_U)                  \
    ENTRY(MPI_Neighbor_allgatherv##S, P_GV(C, D), G_GV, F_ALLGATHERV, BIG, NULL, A_GV)            \
    ENTRY(MPI_Ineighbor_allgatherv##S, P_IGV(C, D), G_IGV, F_ALLGATHERV, BIG, req, A_GV)

ENTRIES(, int, int, 0)
#if MPI_VERSION >= 4
ENTRIES(_c, MPI_Count, MPI_Aint, 1)
#endif
/* ------------------------------------------------------------------ communicators with a graph */

/* A communicator made with a graph is set up in the (collective) call that made it: a
 * neighbourhood call, which must not wait for its peers, never sets anything up.  One made
 * otherwise (a duplicate) passes its neighbourhood calls on to MPI. */
static int made(int rc, const MPI_Comm *newcomm)
{
    if (rc == MPI_SUCCESS && *newcomm != MPI_COMM_NULL) {
        state *s = pmpi_state(*newcomm, 1);
        if (s != NULL && s->phase == S_FAST && s->ngh == NULL)
            set_up(s);
    }
    return rc;
}

#define MADE(NAME, PARAMS, ...)                                                                   \
    EXPORT int NAME(PARAMS)                                                                       \
    {                                                                                             \
        typedef int (*next_fn)(PARAMS);                                                           \
        static void *next_;                                                                       \
        if (next_ == NULL)                                                                        \
            next_ = pmpi_next(#NAME, "P" #NAME);                                                  \
        return made(((next_fn)next_)(__VA_ARGS__), newcomm);                                      \
    }
#define P_ADJ MPI_Comm old, int indeg, const int src[], const int sw[], int outdeg, const int dst[],  \
              const int dw[], MPI_Info info, int reorder, MPI_Comm *newcomm
#define P_DIST MPI_Comm old, int n, const int sources[], const int degrees[], const int dests[],      \
               const int weights[], MPI_Info info, int reorder, MPI_Comm *newcomm
#define P_CART MPI_Comm old, int ndims, const int dims[], const int periods[], int reorder,           \
               MPI_Comm *newcomm
#define P_GRAPH MPI_Comm old, int nnodes, const int index[], const int edges[], int reorder,         \
                MPI_Comm *newcomm
#define P_SUB MPI_Comm old, const int remain[], MPI_Comm *newcomm
MADE(MPI_Dist_graph_create_adjacent, P_ADJ, old, indeg, src, sw, outdeg, dst, dw, info, reorder, newcomm)
MADE(MPI_Dist_graph_create, P_DIST, old, n, sources, degrees, dests, weights, info, reorder, newcomm)
MADE(MPI_Cart_create, P_CART, old, ndims, dims, periods, reorder, newcomm)
MADE(MPI_Graph_create, P_GRAPH, old, nnodes, index, edges, reorder, newcomm)
MADE(MPI_Cart_sub, P_SUB, old, remain, newcomm)

/* ------------------------------------------------------------------ completion calls */

/* The completion calls drive this library's calls among `reqs` (all of them to their end with
 * `block`, else a step each), then hand the array to the MPI's own.  bad[i]: request i was
 * one of this library's calls, and it failed (bad may be NULL where none is the library's). */
static int drive(int n, const MPI_Request *reqs, int block, unsigned char *bad)
{
    int any = 0;
    for (int i = 0; i < n; i++) {
        if (bad)
            bad[i] = 0;
        op *o = maybe_ours(reqs[i]) ? ours(reqs[i]) : NULL;
        if (o == NULL)
            continue;
        any = 1;
        ngh *g = o->g;   /* (kept by the call's reference, past its communicator's free) */
        pthread_mutex_lock(&g->lock);
        if (!o->done)
            advance(g, o, block);
        if (bad)
            bad[i] = o->done && o->rc != HM_OK;
        pthread_mutex_unlock(&g->lock);
        op_unref(o);
    }
    return any;
}

/* Whether any of reqs[0:n] is one of l[0:LIVE]: no branch in the loop. */
__attribute__((optimize("O3"))) static int any_of(int n, const MPI_Request *reqs, const MPI_Request *l)
{
    int hit = 0;
    for (int i = 0; i < n; i++) {
        MPI_Request r = reqs[i];
        hit |= (r == l[0]) | (r == l[1]) | (r == l[2]) | (r == l[3]) | (r == l[4]) | (r == l[5]) |
               (r == l[6]) | (r == l[7]);
    }
    return hit;
}

/* Whether any of `reqs` may be this library's: compared with the live slots, or (more of the
 * library's requests than slots) a filter load each. */
static int any_ours(int n, const MPI_Request *reqs)
{
    if (atomic_load_explicit(&registered, memory_order_relaxed) == 0 || n <= 0)
        return 0;
    if (atomic_load_explicit(&unlisted, memory_order_relaxed) == 0) {
        MPI_Request l[LIVE];
        int k = 0;
        for (int i = 0; i < LIVE; i++)
            if (atomic_load_explicit(&live_used[i], memory_order_acquire))
                l[k++] = __atomic_load_n(&live[i], __ATOMIC_RELAXED);
        if (k == 0)   /* (one being registered now: not one of these) */
            return 0;
        for (int i = k; i < LIVE; i++)
            l[i] = l[0];
        return any_of(n, reqs, l);
    }
    for (int i = 0; i < n; i++)
        if (maybe_ours(reqs[i]))
            return 1;
    return 0;
}

/* What the MPI's call returned, with this library's failures: MPI_ERR_IN_STATUS and each
 * status's error for calls on arrays (every returned status's, as the standard wants),
 * MPI_ERR_OTHER for one request.  `idx`: the statuses' requests (Waitsome, Testsome; NULL:
 * status i is request i), `count` of them. */
static int with_failures(int rc, int count, const int *idx, const unsigned char *bad, MPI_Status *st,
                         int array)
{
    int any = 0;
    for (int k = 0; k < count; k++)
        any |= bad[idx ? idx[k] : k];
    if (!any)
        return rc;
    if (!array)
        return MPI_ERR_OTHER;
    for (int k = 0; st != MPI_STATUSES_IGNORE && k < count; k++)
        st[k].MPI_ERROR = bad[idx ? idx[k] : k] ? MPI_ERR_OTHER
                          : rc == MPI_ERR_IN_STATUS ? st[k].MPI_ERROR : MPI_SUCCESS;
    return MPI_ERR_IN_STATUS;
}

typedef int (*wait_fn)(MPI_Request *, MPI_Status *);
typedef int (*test_fn)(MPI_Request *, int *, MPI_Status *);
typedef int (*waitall_fn)(int, MPI_Request *, MPI_Status *);
typedef int (*testall_fn)(int, MPI_Request *, int *, MPI_Status *);
typedef int (*waitany_fn)(int, MPI_Request *, int *, MPI_Status *);
typedef int (*testany_fn)(int, MPI_Request *, int *, int *, MPI_Status *);
typedef int (*some_fn)(int, MPI_Request *, int *, int *, MPI_Status *);
typedef int (*free_fn)(MPI_Request *);
#define NEXT(T, name)                                                                            \
    static T f_;                                                                                 \
    if (__builtin_expect(f_ == NULL, 0))                                                         \
    f_ = (T)pmpi_next(name, "P" name)
/* One request that may be the library's (r may be NULL: MPI says so). */
#define MINE(r) __builtin_expect((r) != NULL && maybe_ours(*(r)), 0)

static int __attribute__((noinline)) wait_ours(MPI_Request *r, MPI_Status *st, wait_fn f)
{
    unsigned char bad;
    drive(1, r, 1, &bad);
    return with_failures(f(r, st), 1, NULL, &bad, st, 0);
}

EXPORT int MPI_Wait(MPI_Request *r, MPI_Status *st)
{
    NEXT(wait_fn, "MPI_Wait");
    if (!MINE(r))
        return f_(r, st);
    return wait_ours(r, st, f_);
}

EXPORT int MPI_Test(MPI_Request *r, int *flag, MPI_Status *st)
{
    NEXT(test_fn, "MPI_Test");
    if (!MINE(r))
        return f_(r, flag, st);
    unsigned char bad;
    drive(1, r, 0, &bad);
    int rc = f_(r, flag, st);
    return *flag ? with_failures(rc, 1, NULL, &bad, st, 0) : rc;
}

EXPORT int MPI_Request_get_status(MPI_Request r, int *flag, MPI_Status *st)
{
    typedef int (*status_fn)(MPI_Request, int *, MPI_Status *);
    NEXT(status_fn, "MPI_Request_get_status");
    if (!MINE(&r))
        return f_(r, flag, st);
    unsigned char bad;
    drive(1, &r, 0, &bad);
    int rc = f_(r, flag, st);
    return *flag ? with_failures(rc, 1, NULL, &bad, st, 0) : rc;
}

/* A freed call still completes: in later calls on its communicator, or when it is freed. */
EXPORT int MPI_Request_free(MPI_Request *r)
{
    NEXT(free_fn, "MPI_Request_free");
    if (MINE(r))
        drive(1, r, 0, NULL);
    return f_(r);
}

/* The calls on arrays: a flag per request on the stack for short arrays. */
#define BAD_FLAGS(n)                                                                             \
    unsigned char small_[64], *bad = (n) <= 64 ? small_ : malloc((size_t)(n));                   \
    if (bad == NULL)                                                                             \
        return MPI_ERR_NO_MEM

static void free_flags(unsigned char *bad, const unsigned char *small)
{
    if (bad != small)
        free(bad);
}

EXPORT int MPI_Waitall(int n, MPI_Request reqs[], MPI_Status st[])
{
    NEXT(waitall_fn, "MPI_Waitall");
    if (!any_ours(n, reqs))
        return f_(n, reqs, st);
    BAD_FLAGS(n);
    drive(n, reqs, 1, bad);
    int rc = with_failures(f_(n, reqs, st), n, NULL, bad, st, 1);
    free_flags(bad, small_);
    return rc;
}

EXPORT int MPI_Testall(int n, MPI_Request reqs[], int *flag, MPI_Status st[])
{
    NEXT(testall_fn, "MPI_Testall");
    if (!any_ours(n, reqs))
        return f_(n, reqs, flag, st);
    BAD_FLAGS(n);
    drive(n, reqs, 0, bad);
    int rc = f_(n, reqs, flag, st);
    if (*flag)
        rc = with_failures(rc, n, NULL, bad, st, 1);
    free_flags(bad, small_);
    return rc;
}

/* The library's calls among `reqs` that are still pending fail (HYBRIDMPI_PMPI_TIMEOUT). */
static void expire(int n, const MPI_Request *reqs)
{
    for (int i = 0; i < n; i++) {
        op *o = ours(reqs[i]);
        if (o == NULL)
            continue;
        ngh *g = o->g;
        pthread_mutex_lock(&g->lock);
        for (op *p = g->head; p && !o->done; p = g->head) {   /* (in order, up to it) */
            if (!p->done)
                fail(p, HM_ETIMEOUT, -1);
            retire(g, p);
        }
        pthread_mutex_unlock(&g->lock);
        op_unref(o);
    }
}

/* The wait of calls that are not one communicator's (the completion calls on arrays, the
 * buffered messages at MPI_Finalize): spin, then yield and sleep, HYBRIDMPI_PMPI_TIMEOUT. */
static hm_wait_policy plain_policy(void)
{
    return (hm_wait_policy){.spin = 1000, .yield_ns = 2000000000, .sleep_ns = 50000,
                            .timeout_ns = (int64_t)(cfg.timeout_s * 1e9)};
}

/* One idle turn of such a wait: 1 once its deadline passed. */
static int idle(int64_t *polls, hm_slow *w, const hm_wait_policy *pol)
{
    if ((*polls)++ < pol->spin) {
        cpu_relax();
        return 0;
    }
    if (!w->start)
        slow_start(w, pol);
    return slow_tick(w, pol, NULL, 0, 0);
}

/* Waitany and Waitsome (`block`), Testany and Testsome: this library's calls a step at a time
 * between tests of the whole array, so that whichever request completes first ends the wait
 * (as MPI's own).  *flagp: Testany's flag (NULL for the others). */
static int first_of(int n, MPI_Request reqs[], int *idx, int *flagp, int *outcount, int *indices,
                    MPI_Status *st, testany_fn any, some_fn some, int block)
{
    BAD_FLAGS(n);
    int rc, flag = 0;
    int64_t polls = 0;
    hm_wait_policy pol = plain_policy();
    HM_SLOW(w);
    for (;;) {
        int mine = drive(n, reqs, 0, bad);
        if (any) {
            rc = any(n, reqs, idx, &flag, st);
            if (flag && mine && *idx != MPI_UNDEFINED && bad[*idx] && rc == MPI_SUCCESS)
                rc = MPI_ERR_OTHER;
        } else {
            rc = some(n, reqs, outcount, indices, st);
            flag = *outcount != 0;
            if (mine && flag && *outcount != MPI_UNDEFINED)
                rc = with_failures(rc, *outcount, indices, bad, st, 1);
        }
        if (flag || rc != MPI_SUCCESS || !block)
            break;
        if (idle(&polls, &w, &pol) && mine)   /* the deadline: this library's calls fail */
            expire(n, reqs);
    }
    if (flagp)
        *flagp = flag;
    free_flags(bad, small_);
    return rc;
}

EXPORT int MPI_Waitany(int n, MPI_Request reqs[], int *idx, MPI_Status *st)
{
    NEXT(waitany_fn, "MPI_Waitany");
    static testany_fn any;
    if (!any_ours(n, reqs))
        return f_(n, reqs, idx, st);
    if (any == NULL)
        any = (testany_fn)pmpi_next("MPI_Testany", "PMPI_Testany");
    return first_of(n, reqs, idx, NULL, NULL, NULL, st, any, NULL, 1);
}

EXPORT int MPI_Waitsome(int n, MPI_Request reqs[], int *outcount, int indices[], MPI_Status st[])
{
    NEXT(some_fn, "MPI_Waitsome");
    static some_fn some;
    if (!any_ours(n, reqs))
        return f_(n, reqs, outcount, indices, st);
    if (some == NULL)
        some = (some_fn)pmpi_next("MPI_Testsome", "PMPI_Testsome");
    return first_of(n, reqs, NULL, NULL, outcount, indices, st, NULL, some, 1);
}

EXPORT int MPI_Testany(int n, MPI_Request reqs[], int *idx, int *flag, MPI_Status *st)
{
    NEXT(testany_fn, "MPI_Testany");
    if (!any_ours(n, reqs))
        return f_(n, reqs, idx, flag, st);
    return first_of(n, reqs, idx, flag, NULL, NULL, st, f_, NULL, 0);
}

EXPORT int MPI_Testsome(int n, MPI_Request reqs[], int *outcount, int indices[], MPI_Status st[])
{
    NEXT(some_fn, "MPI_Testsome");
    if (!any_ours(n, reqs))
        return f_(n, reqs, outcount, indices, st);
    return first_of(n, reqs, NULL, NULL, outcount, indices, st, NULL, f_, 0);
}

/* ------------------------------------------------------------------ datatypes */

/* A freed handle may name another type later: the plans of derived types are made again. */
typedef int (*type_free_fn)(MPI_Datatype *);
EXPORT int MPI_Type_free(MPI_Datatype *t)
{
    NEXT(type_free_fn, "MPI_Type_free");
    atomic_fetch_add(&type_frees, 1);
    return f_(t);
}

/* ------------------------------------------------------------------ teardown */

/* The communicator is freed: its calls still pending (requests freed, or never waited for)
 * complete first, under its lock (a thread may be waiting on one of them); the part itself
 * lives on while a call holds it. */
static int ngh_release(state *s)
{
    ngh *g = s->ngh;
    if (g == NULL)
        return 1;
    pthread_mutex_lock(&g->lock);
    if (g->head != NULL) {
        op *last = g->tail;
        atomic_fetch_add(&last->refs, 1);
        advance(g, last, 1);
        op_unref(last);
    }
    drop(g, s->phase == S_BROKEN);
    pthread_mutex_unlock(&g->lock);
    s->ngh = NULL;
    ngh_unref(g);
    return 1;
}

/* MPI_Finalize: the buffered messages still on their way are sent first (their receivers take
 * them in calls that must complete before their own MPI_Finalize; a program that ends with them
 * pending lost them in a rendezvous).  Those of revoked communicators are not waited for, and
 * HYBRIDMPI_PMPI_TIMEOUT bounds the wait. */
static void ngh_drain(void)
{
    pthread_mutex_lock(&orphan_lock);
    int64_t polls = 0;
    hm_wait_policy pol = plain_policy();
    HM_SLOW(w);
    for (;;) {
        int left = reap(&orphans, 1);
        for (sent *x = orphans; x; x = x->next)
            left -= x->broken;
        if (left <= 0 || idle(&polls, &w, &pol))
            break;
    }
    pthread_mutex_unlock(&orphan_lock);
}

/* This file's part in the base's release and MPI_Finalize (hm_pmpi.h, pmpi_extension). */
__attribute__((constructor)) static void ngh_register(void)
{
    static const pmpi_extension ngh_extension = {.release = ngh_release, .drain = ngh_drain};
    pmpi_extend(&ngh_extension);
}
