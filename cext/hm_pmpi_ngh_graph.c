/* hybridmpi's PMPI library, the neighbourhood collectives (hm_pmpi_ngh.c): a communicator's
 * part, set up once in the call that made it (its graph read and checked on every rank, the
 * node's segment of staging slots mapped), and dropped when it is freed. */
#define _GNU_SOURCE
#include "hm_ngh.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

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

/* Frees what set_up made (the shared segment, the messages' communicator, the edges); the
 * buffered messages not yet sent become orphans (`broken`: of a revoked communicator). */
void ngh_drop(ngh *g, int broken)
{
    ngh_orphan(g, broken);
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
        ngh_plan_unref(g->last);
    g->last = NULL;
}

/* Sets up s->ngh, collectively over the communicator, in the call that made it (every rank
 * is in it, so this waits for no rank that would not be waited for anyway): N_FAST, N_NEXT
 * (every rank's calls go to MPI: a communicator without a graph, or one whose set-up failed
 * on some rank), or N_REFUSED (the graph's edges do not match: every call fails). */
void ngh_set_up(state *s)
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
    ngh_drop(g, 0);
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
