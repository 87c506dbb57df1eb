/* hybridmpi's PMPI library, the neighbourhood collectives (hm_pmpi_ngh.c): the plan of a call
 * (its counts, displacements and types per edge, the pairs it stages), kept for the next call
 * with the same arguments; MPI_Type_free, after which a handle may name another type. */
#define _GNU_SOURCE
#include "hm_ngh.h"

#include <stdlib.h>
#include <string.h>

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
void ngh_edge_args(int form, int big, int send, int i, const void *c, const void *d, int64_t n,
                   int64_t *cnt, int64_t *dsp)
{
    int uniform = form == F_ALLTOALL || form == F_ALLGATHER || (send && form == F_ALLGATHERV);
    *cnt = uniform ? n : big ? ((const MPI_Count *)c)[i] : ((const int *)c)[i];
    *dsp = send && (form == F_ALLGATHER || form == F_ALLGATHERV) ? 0
           : uniform ? i * n
           : d == NULL ? 0   /* (counts only) */
           : big ? ((const MPI_Aint *)d)[i] : ((const int *)d)[i];
}

void ngh_plan_unref(plan *p)
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
        ngh_edge_args(form, big, send, k, send ? sc : rc, send ? sd : rd, send ? scount : rcount, &cnt, &dsp);
        if (cnt != (send ? p->sc : p->rc)[k] || dsp != (send ? p->sd : p->rd)[k])
            return 0;
    }
    return 1;
}

/* The plan of a call: the last one when its arguments are the same, else a new one. */
plan *ngh_plan_for(ngh *g, int form, int big, const void *sc, const void *sd, int64_t scount,
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
        ngh_edge_args(form, big, 1, i, sc, sd, scount, &p->sc[i], &p->sd[i]);
    for (int j = 0; !bad && j < ni; j++)
        ngh_edge_args(form, big, 0, j, rc, rd, rcount, &p->rc[j], &p->rd[j]);
    if (bad || make_pairs(g, p, 1) || make_pairs(g, p, 0)) {
        ngh_plan_unref(p);
        return NULL;
    }
    if (g->last)
        ngh_plan_unref(g->last);
    g->last = p;
    p->refs++;
    return p;
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
