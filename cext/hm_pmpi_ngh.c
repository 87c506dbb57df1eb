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
 * MPI_Request_free) are defined by the extension too: they drive this library's calls, then
 * hand the request to the MPI's own.  A request that is not the library's costs one relaxed load (no
 * call of the library pending), or a load of a filter word more.
 *
 * Whether a call goes to the core depends only on the communicator (set up, collectively, as
 * for the allreduce, then over its graph once), never on a call's arguments: every rank
 * chooses alike.  Datatypes other than named ones are duplicated for as long as the library
 * uses them (a program may free its type once it has posted), and MPI_Type_free is defined
 * by the extension: a freed handle may name another type later, so plans of such types are
 * made again.
 *
 * This file: the calls (their entry points, on the core or on to MPI), the communicators made
 * with a graph, and the extension's part in the base's release.  hm_pmpi_ngh_graph.c sets a
 * communicator's part up (its graph, once), hm_pmpi_ngh_plan.c makes the plans of its calls,
 * hm_pmpi_ngh_op.c moves a call in flight, hm_pmpi_ngh_req.c keeps the requests and defines the
 * completion calls; hm_ngh.h is what they share. */
#define _GNU_SOURCE
#include "hm_ngh.h"

#include <stdio.h>
#include <stdlib.h>

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
        ngh_edge_args(a->form, a->big, send, k, send ? a->sc : a->rc, send ? a->sd : a->rd,
                      send ? a->scount : a->rcount, &cnt, &dsp);
        if (cnt < 0)
            return 0;
    }
    return 1;
}
/* Call `a` on the core (PASS: on to MPI after all), under g's lock. */
static int start(ngh *g, state *s, const args *a, MPI_Request *req)
{
    plan *p = ngh_plan_for(g, a->form, a->big, a->sc, a->sd, a->scount, a->st, a->rc, a->rd,
                           a->rcount, a->rt);
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
            ngh_plan_unref(p);
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
        if (ngh_request(o))
            *req = o->greq;
        else
            req = NULL;   /* (no request: the call completes here) */
    }
    /* a non-blocking call is posted here, taken in a wait (the copies to this rank are the
     * wait's work) */
    if (ngh_post(o) != HM_OK || req == NULL)
        ngh_advance(g, o, 1);
    int rc = o->rc;
    if (req == NULL)
        ngh_op_unref(o);
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
            ngh_set_up(s);
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
        ngh_advance(g, last, 1);
        ngh_op_unref(last);
    }
    ngh_drop(g, s->phase == S_BROKEN);
    pthread_mutex_unlock(&g->lock);
    s->ngh = NULL;
    ngh_unref(g);
    return 1;
}

/* This extension's part in the base's release and MPI_Finalize (hm_pmpi_common.h, pmpi_extension). */
__attribute__((constructor)) static void ngh_register(void)
{
    static const pmpi_extension ngh_extension = {.release = ngh_release, .drain = ngh_drain};
    pmpi_extend(&ngh_extension);
}
