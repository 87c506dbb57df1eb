/* hybridmpi's PMPI library, the neighbourhood collectives (hm_pmpi_ngh.c): a call in flight
 * (its messages, its pairs staged in the node's slots or buffered, its steps and its failure),
 * and the buffered messages that outlive their communicator. */
#define _GNU_SOURCE
#include "hm_ngh.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <limits.h>

static const char *const call_names[2][4] = {
    {"MPI_Neighbor_alltoallv", "MPI_Neighbor_alltoall", "MPI_Neighbor_allgather",
     "MPI_Neighbor_allgatherv"},
    {"MPI_Ineighbor_alltoallv", "MPI_Ineighbor_alltoall", "MPI_Ineighbor_allgather",
     "MPI_Ineighbor_allgatherv"}};

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

/* The buffered messages of g not yet sent become orphans (`broken`: of a revoked
 * communicator): MPI completes them after the free of their communicator. */
void ngh_orphan(ngh *g, int broken)
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
}

/* MPI_Finalize: the buffered messages still on their way are sent first (their receivers take
 * them in calls that must complete before their own MPI_Finalize; a program that ends with them
 * pending lost them in a rendezvous).  Those of revoked communicators are not waited for, and
 * HYBRIDMPI_PMPI_TIMEOUT bounds the wait. */
void ngh_drain(void)
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

/* A communicator's part lives while its state or a call holds it. */
void ngh_unref(ngh *g)
{
    if (atomic_fetch_sub(&g->refs, 1) != 1)
        return;
    pthread_mutex_destroy(&g->lock);
    free(g);
}

void ngh_op_unref(op *o)
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
int ngh_fail(op *o, int code, int peer)
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
        return ngh_fail(o, HM_ENET, peer);
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
        return ngh_fail(o, HM_ENET, q->peer);
    x->data[0] = q->sig;
    pack_pair(o, q, (char *)&x->data[1]);
    if (PMPI_Isend(x->data, (int)(8 + q->bytes), MPI_BYTE, q->peer, tag_of(g, o->e, g->keys - 1), g->msgs,
                   &x->req) != MPI_SUCCESS) {
        free(x);
        return ngh_fail(o, HM_ENET, q->peer);
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
            return ngh_fail(o, HM_EPEER, p->sp[k].peer);
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
        return ngh_fail(o, HM_EPEER, q->peer);
    if (o->polls % 16 != 1)
        return HM_OK;
    int found = 0;
    MPI_Status st;
    if (PMPI_Iprobe(q->peer, tag_of(g, o->e, g->keys - 1), g->msgs, &found, &st) != MPI_SUCCESS)
        return ngh_fail(o, HM_ENET, q->peer);
    if (found) {
        MPI_Count n = 0;
        PMPI_Get_elements_x(&st, MPI_BYTE, &n);
        o->bufs[k] = n <= INT_MAX ? malloc((size_t)n + 8) : NULL;
        if (o->bufs[k] == NULL)
            return ngh_fail(o, HM_ENET, q->peer);
        if (q->msg)   /* (its sender staged what this end sends: erroneous) */
            cancel_pair(o, k);
        o->route[k] = R_BUFFERED;
        return message(o, 0, o->bufs[k], n, MPI_BYTE, q->peer, tag_of(g, o->e, g->keys - 1), -2, k);
    }
    if (q->msg)
        return HM_OK;
    if (PMPI_Iprobe(q->peer, tag_of(g, o->e, g->in[q->edge[0]].key), g->msgs, &found, MPI_STATUS_IGNORE) !=
        MPI_SUCCESS)
        return ngh_fail(o, HM_ENET, q->peer);
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
            return ngh_fail(o, HM_ENET, q->peer), 1;
        if (!found)
            return 0;
        PMPI_Get_elements_x(&st, MPI_BYTE, &n);
        char *buf = n <= INT_MAX ? malloc((size_t)n + 1) : NULL;
        if (buf == NULL || PMPI_Imrecv(buf, (int)n, MPI_BYTE, &m, &o->req[o->nreq]) != MPI_SUCCESS)
            return ngh_fail(o, HM_ENET, q->peer), 1;
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
            return ngh_fail(o, HM_ENET, truncated), 0;
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
        return ngh_fail(o, HM_EELSEWHERE, -1), 1;
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
void ngh_retire(ngh *g, op *o)
{
    g->head = o->next;
    if (g->head == NULL)
        g->tail = NULL;
    if (o->nreq == 0) {   /* (a failed call's buffers may still be MPI's: kept) */
        for (int k = 0; k < o->p->nrp; k++)
            free(o->bufs[k]);
    }
    ngh_plan_unref(o->p);   /* (under g's lock, as plans are made) */
    o->p = NULL;
    ngh_op_unref(o);
}

/* The communicator's calls, each a step (each completes when it can), retired in order; with `block`, until `upto` is
 * complete, waiting under the node's policy (a timeout, a peer's process gone). */
void ngh_advance(ngh *g, op *upto, int block)
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
            ngh_retire(g, g->head);
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
                ngh_fail(o, HM_EPEER, q->peer);
        }
        if (!o->done && slow_tick(&w, pol, NULL, 0, 0))
            ngh_fail(o, HM_ETIMEOUT, -1);
    }
}

/* Posts call o: its receives (edges across nodes, large pairs), its sends, its staged pairs.
 * It never waits. */
int ngh_post(op *o)
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
