/* hybridmpi's PMPI library: the C core's barrier, allreduce and neighbourhood collectives
 * under unchanged C, C++ and Fortran programs (docs/guide/pmpi.md).
 *
 * This file defines MPI_Allreduce, MPI_Allreduce_c (where the MPI has large-count calls) and
 * MPI_Barrier, and for Open MPI the Fortran mpi_allreduce_ and mpi_barrier_, and keeps each
 * communicator's state; hm_pmpi_setup.c sets a communicator up, hm_pmpi_tune.c reads the
 * tuning tables, hm_pmpi_ngh*.c are the neighbourhood collectives and the completion calls of
 * their requests (hm_pmpi_common.h: what they share).  A call goes to
 * the core when its communicator is set up and its arguments qualify; anything else goes to
 * what comes next (dlsym(RTLD_NEXT): another PMPI tool below this one, or the MPI library).
 * Whether a call qualifies depends only on what MPI requires to be equal on every rank (the
 * count, the type, the operation and the communicator), so every rank chooses alike.
 *
 * Per communicator, a state is kept as an attribute.  After HYBRIDMPI_PMPI_AFTER calls on a
 * communicator (5), its ranks set it up together: a node communicator, one shared segment per
 * node (POSIX shared memory whose room is reserved before use, so that a full /dev/shm fails
 * the set-up instead of the program), the node leaders' communicator; one allreduce over the
 * communicator agrees on the outcome, so every rank falls back together when one could not.
 * The attribute's delete callback frees it (MPI_Comm_free); an attribute on MPI_COMM_SELF,
 * whose callback MPI_Finalize runs first, frees what is left.
 *
 * Built by `hybridmpi pmpi path` with the MPI's compiler wrapper, together with the core's files
 * it runs (hybridmpi/tools/pmpi.py: SOURCES), all hidden but the MPI entry points: the core inside does not clash with the one
 * that a Python program using hybridmpi loads too. */
#define _GNU_SOURCE
#include "hm_pmpi_common.h"
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <strings.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

void hm_set_progress(void (*fn)(void));   /* hm_wait.c */

/* ------------------------------------------------------------------ settings and counters */

static int started;   /* start() ran */

/* Whether the program runs on the MPI standard ABI (libmpi_abi.so) while this library was
 * built for its MPI's own ABI: its handles would mean nothing here. */
static int other_abi_seen;
static int find_abi(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size, (void)data;
    const char *slash = info->dlpi_name ? strrchr(info->dlpi_name, '/') : NULL;
    const char *name = slash ? slash + 1 : info->dlpi_name;
    if (name && strncmp(name, "libmpi_abi.so", 13) == 0)
        other_abi_seen = 1;
    return other_abi_seen;
}

/* ------------------------------------------------------------------ what comes next */

typedef int (*allreduce_fn)(const void *, void *, int, MPI_Datatype, MPI_Op, MPI_Comm);
typedef int (*barrier_fn)(MPI_Comm);
static struct {
    allreduce_fn allreduce;
    barrier_fn barrier;
    void *allreduce_c;       /* MPI_Allreduce_c, when the MPI has it */
    void *f_allreduce, *f_barrier;
    void *f_in_place;        /* Open MPI's Fortran MPI_IN_PLACE (a common block) */
} next;

void *pmpi_next(const char *name, const char *pname)
{
    void *f = dlsym(RTLD_NEXT, name);
    return f != NULL ? f : dlsym(RTLD_DEFAULT, pname);
}

/* ------------------------------------------------------------------ per-communicator state */

static int keyval = MPI_KEYVAL_INVALID;
static int self_keyval = MPI_KEYVAL_INVALID;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static state *live;                 /* every state, for MPI_Finalize */
static _Atomic uint64_t generation; /* bumped whenever a state is freed (the caches below) */
static int finalizing;

/* Short-lived communicators (a dup, a few calls, a free) paid a set-up they never earned back
 * (5.5x without the library).  Each process remembers how many calls its last set-up
 * communicators served before their free; when most of them were freed young, its ranks
 * defer a new communicator's set-up (doubling the call count each time), together: the
 * decision is one allreduce (MIN) over the communicator, at a call count every rank shares. */
#define HM_HISTORY 8
#define HM_EARNED 256          /* calls on the core that pay back a set-up (about 0.5 ms) */
static long lifetimes[HM_HISTORY];
static int nlifetimes;

static void remember(long calls)
{
    pthread_mutex_lock(&lock);
    lifetimes[nlifetimes++ % HM_HISTORY] = calls;
    pthread_mutex_unlock(&lock);
}

/* This process's vote: 1 (set up now) unless most remembered communicators died young. */
static int worth_setting_up(void)
{
    pthread_mutex_lock(&lock);
    int n = nlifetimes < HM_HISTORY ? nlifetimes : HM_HISTORY, young = 0;
    for (int i = 0; i < n; i++)
        young += lifetimes[i] < HM_EARNED;
    pthread_mutex_unlock(&lock);
    return n < HM_HISTORY / 2 || 2 * young <= n;
}

/* The last communicator a thread called on, and its state. */
static __thread struct {
    MPI_Comm comm;
    state *st;
    uint64_t gen;
} cache;
/* The state a wait runs on (the progress hook). */
static __thread state *waiting;
static __thread int64_t idle_polls;

static int delete_state(MPI_Comm comm, int key, void *value, void *extra)
{
    (void)comm, (void)key, (void)extra;
    state *s = value;
    if (s->phase == S_FAST && !finalizing)
        remember(s->fast);
    pthread_mutex_lock(&lock);
    if (s->prev)
        s->prev->next = s->next;
    else
        live = s->next;
    if (s->next)
        s->next->prev = s->prev;
    atomic_fetch_add(&generation, 1);
    pthread_mutex_unlock(&lock);
    if (pmpi_release(s))
        free(s);
    return MPI_SUCCESS;
}

/* MPI_Finalize runs this first: every state still alive is freed (its attribute deleted). */
static void quiet_open(void);
static void quiet_close(void);

static int at_finalize(MPI_Comm comm, int key, void *value, void *extra)
{
    (void)comm, (void)key, (void)value, (void)extra;
    finalizing = 1;
    for (;;) {
        pthread_mutex_lock(&lock);
        state *s = live;
        pthread_mutex_unlock(&lock);
        if (s == NULL)
            break;
        if (PMPI_Comm_delete_attr(s->comm, keyval) != MPI_SUCCESS)   /* runs delete_state */
            delete_state(s->comm, keyval, s, NULL);
        pthread_mutex_lock(&lock);
        int stuck = live == s;   /* neither freed it: drop it, never loop */
        if (stuck)
            live = s->next;
        pthread_mutex_unlock(&lock);
        if (stuck)
            break;
    }
    pmpi_drain_extensions();
    quiet_close();
    if (cfg.stats)
        pmpi_print_counters(!other_abi_seen);
    return MPI_SUCCESS;
}

static void progress(void);

static void start(void)
{
#ifndef MPI_ABI_VERSION
    dl_iterate_phdr(find_abi, NULL);
    if (other_abi_seen) {   /* touch nothing of MPI: every call goes to the program's MPI */
        fprintf(stderr, "hybridmpi pmpi: this program uses the MPI standard ABI (libmpi_abi.so), "
                "and this library was built for another ABI: it stays off\n");
        cfg.off = 1;
        next.allreduce = (allreduce_fn)dlsym(RTLD_NEXT, "MPI_Allreduce");
        next.barrier = (barrier_fn)dlsym(RTLD_NEXT, "MPI_Barrier");
        next.allreduce_c = dlsym(RTLD_NEXT, "MPI_Allreduce_c");
        started = 1;
        return;
    }
#endif
    pmpi_read_settings();
    next.allreduce = (allreduce_fn)pmpi_next("MPI_Allreduce", "PMPI_Allreduce");
    next.barrier = (barrier_fn)pmpi_next("MPI_Barrier", "PMPI_Barrier");
    next.allreduce_c = pmpi_next("MPI_Allreduce_c", "PMPI_Allreduce_c");
    next.f_allreduce = pmpi_next("mpi_allreduce_", "pmpi_allreduce_");
    next.f_barrier = pmpi_next("mpi_barrier_", "pmpi_barrier_");
    next.f_in_place = dlsym(RTLD_DEFAULT, "mpi_fortran_in_place_");
    pmpi_types_init();
    PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_state, &keyval, NULL);
    /* teardown at MPI_Finalize, through MPI_COMM_SELF, which exists only once MPI_Init made
     * it: a sessions program (MPI_Session_init alone) frees each state with its communicator */
    int world = 0;
    PMPI_Initialized(&world);
    if (world) {
        PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, at_finalize, &self_keyval, NULL);
        PMPI_Comm_set_attr(MPI_COMM_SELF, self_keyval, NULL);
        quiet_open();
    }
    hm_set_progress(progress);
    started = 1;
}

static pthread_once_t once = PTHREAD_ONCE_INIT;

/* A rank that never called the entry points above prints its counters (all 0) here. */
EXPORT int MPI_Finalize(void)
{
    typedef int (*finalize_fn)(void);
    const char *v = getenv("HYBRIDMPI_PMPI_STATS");
    if (!started) {
        dl_iterate_phdr(find_abi, NULL);
        if (v != NULL && *v != '\0' && strcmp(v, "0") != 0)
            pmpi_print_counters(!other_abi_seen);
    }
    if (!started)
        finalizing = 1;   /* a first call from inside MPI_Finalize goes to MPI */
    return ((finalize_fn)pmpi_next("MPI_Finalize", "PMPI_Finalize"))();
}

/* The state of `comm` when its calls go to the core, else NULL (counting the call).  `now`: a
 * call that sets the communicator up at once (the neighbourhood collectives: a communicator
 * with a graph lives for its ghost updates). */
state *pmpi_state(MPI_Comm comm, int now)
{
    if (cache.comm == comm && cache.gen == atomic_load_explicit(&generation, memory_order_relaxed) &&
        cache.st != NULL && cache.st->phase == S_FAST)
        return cache.st;
    if (finalizing || comm == MPI_COMM_NULL)
        return NULL;
    pthread_once(&once, start);
    if (cfg.off)
        return NULL;
    state *s;
    int found = 0;
    if (PMPI_Comm_get_attr(comm, keyval, &s, &found) != MPI_SUCCESS)
        return NULL;
    if (!found) {
        int inter = 0, size = 1;
        PMPI_Comm_test_inter(comm, &inter);
        PMPI_Comm_size(comm, &size);
        s = calloc(1, sizeof *s);
        if (s == NULL)
            return NULL;
        s->comm = comm;
        s->node = s->leaders = MPI_COMM_NULL;
        s->phase = inter || size == 1 ? S_NEXT : S_COUNTING;
        s->set_up_at = cfg.after;
        if (PMPI_Comm_set_attr(comm, keyval, s) != MPI_SUCCESS) {
            free(s);
            return NULL;
        }
        pthread_mutex_lock(&lock);
        s->next = live;
        if (live)
            live->prev = s;
        live = s;
        pthread_mutex_unlock(&lock);
    }
    if (s->phase == S_COUNTING && (++s->calls > s->set_up_at || now)) {
        /* one that has lived long enough earns its set-up whatever the others did */
        int vote = s->calls > HM_EARNED || worth_setting_up(), all = 0;
        /* (no set-up has been paid yet: MIN agrees; a failed vote keeps MPI's path) */
        if (!now && cfg.adaptive && PMPI_Allreduce(&vote, &all, 1, MPI_INT, MPI_MIN, comm) == MPI_SUCCESS && !all)
            s->set_up_at = s->set_up_at > INT_MAX / 2 ? INT_MAX : 2 * s->set_up_at + 1;
        else
            pmpi_set_up(s);
    }
    cache.comm = comm;
    cache.st = s;
    cache.gen = atomic_load(&generation);
    return s->phase == S_FAST || s->phase == S_BROKEN ? s : NULL;
}

/* ------------------------------------------------------------------ waits and failures */

/* Called by the core between polls once a wait stopped spinning: drives MPI's progress (a peer
 * may wait for this rank's point-to-point traffic) and, now and then, looks for node peers
 * whose process ended: their words get the error bits, so the wait ends. */

static void progress(void)
{
    state *s = waiting;
    if (s == NULL)
        return;
    pmpi_poke(s->comm);
    if (++idle_polls % 256 || !s->watch)
        return;
    /* gone at two checks in a row, while this rank still waits: its words get the error bits */
    for (int r = 0; r < s->c.size; r++) {
        if (r == s->c.rank || !pmpi_gone(s, r))
            continue;
        hm_coll dead = s->c;
        dead.rank = r;
        hm_coll_poison(&dead, HM_ERRBIT);
    }
}

/* Whether node rank r's process ended, seen at two checks in a row: a process found gone is
 * suspect first, so that the polls until the next check read its last words, which are final
 * (a peer that finished its part and exited is no failure).  0 where processes are not
 * visible (s->watch). */
int pmpi_gone(state *s, int r)
{
    if (!s->watch || kill(s->pids[r], 0) == 0 || errno != ESRCH)
        return 0;
    if (!s->suspect[r]) {
        s->suspect[r] = 1;
        return 0;
    }
    return 1;
}

/* A failed call: says why on stderr, revokes the communicator (every later call on it fails
 * at once, without communicating: its ranks may have left this call at different points) and
 * reports through the communicator's error handler. */
int pmpi_failed(state *s, const char *call, int rc)
{
    static const char *const why[] = {
        [HM_ETIMEOUT] = "a wait timed out (HYBRIDMPI_PMPI_TIMEOUT)",
        [HM_EMISMATCH] = "the ranks passed different arguments or called different collectives",
        [HM_EARG] = "invalid arguments", [HM_EPEER] = "a rank of the node failed or ended",
        [HM_ENET] = "MPI failed between the nodes", [HM_EELSEWHERE] = "the call failed on another node",
        [HM_EDIFFERS] = "the ranks of another node passed different arguments or called a different "
                        "collective"};
    int rank;
    PMPI_Comm_rank(s->comm, &rank);
    const char *text = rc > 0 && rc < (int)(sizeof why / sizeof why[0]) && why[rc] ? why[rc]
                                                                                : "the call failed";
    if (rc == HM_ETIMEOUT && s->c.err.counter == HM_CNT_NET)
        text = "a wait between the nodes timed out (HYBRIDMPI_PMPI_TIMEOUT)";
    char peer[32] = "";
    int who = rc == HM_EMISMATCH ? s->c.err.bad_rank : s->c.err.peer;   /* the other rank */
    if (who >= 0)
        snprintf(peer, sizeof peer, "node rank %d, ", who);
    fprintf(stderr, "hybridmpi pmpi: rank %d: %s: %s (%scall %llu); the communicator is revoked\n",
            rank, call, text, peer, (unsigned long long)s->c.err.epoch);
    s->phase = S_BROKEN;
    COUNT(C_FAILED);
    PMPI_Comm_call_errhandler(s->comm, MPI_ERR_OTHER);
    return MPI_ERR_OTHER;
}

/* A call on a revoked communicator. */
int pmpi_revoked(state *s)
{
    COUNT(C_FAILED);
    PMPI_Comm_call_errhandler(s->comm, MPI_ERR_OTHER);
    return MPI_ERR_OTHER;
}

/* One turn of MPI's progress engine: MPI_Test on a receive that never completes, posted on a
 * communicator no message travels (a duplicate of MPI_COMM_SELF, where MPI_Init made one; else
 * a probe on `fallback`).  A probe for any message on a communicator with traffic matched the
 * first unexpected message, and a probe that matches drives no progress (Open MPI's ob1 runs
 * opal_progress only when nothing matched; MPICH likewise): this rank, spinning on shared
 * memory, never moved its own nonblocking calls that a peer waited for inside MPI (the Python
 * side's fuzz findings 41-42; cases.c progress).  A probe on a one-rank communicator does not
 * help either: MPICH answers it without its progress engine. */
static MPI_Comm quiet = MPI_COMM_NULL;
static MPI_Request never = MPI_REQUEST_NULL;
static char never_buf;

void pmpi_poke(MPI_Comm fallback)
{
    int flag = 0;
    if (never != MPI_REQUEST_NULL)
        PMPI_Test(&never, &flag, MPI_STATUS_IGNORE);
    else
        PMPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, fallback, &flag, MPI_STATUS_IGNORE);
}

/* The never-completing receive, at start-up (where MPI_Init made MPI_COMM_SELF) and its end at
 * MPI_Finalize. */
static void quiet_open(void)
{
    if (PMPI_Comm_dup(MPI_COMM_SELF, &quiet) != MPI_SUCCESS) {
        quiet = MPI_COMM_NULL;
        return;
    }
    if (PMPI_Irecv(&never_buf, 1, MPI_CHAR, MPI_ANY_SOURCE, MPI_ANY_TAG, quiet, &never) != MPI_SUCCESS)
        never = MPI_REQUEST_NULL;
}

static void quiet_close(void)
{
    if (never != MPI_REQUEST_NULL) {
        MPI_Request q = never;
        never = MPI_REQUEST_NULL;
        PMPI_Cancel(&q);
        PMPI_Wait(&q, MPI_STATUS_IGNORE);
    }
    if (quiet != MPI_COMM_NULL)
        PMPI_Comm_free(&quiet);
}

/* A barrier also turns MPI's progress once on entry and once on exit, as MPI's own does:
 * programs rely on it to complete what they started before it (an RMA epoch's Win_complete,
 * then a Win_test after the barrier on the target; mpi4py's suite does that). */
static int run_barrier(state *s)
{
    int rc;
    if (s->phase == S_BROKEN)
        return pmpi_revoked(s);
    waiting = s;
    if (!s->multi)
        rc = hm_barrier_dissemination(&s->c);
    else if (s->leaders == MPI_COMM_NULL)
        rc = hm_barrier(&s->c, HM_TREE, HM_BOTH);
    else
        rc = hm_net_barrier(&s->c, &s->net, HM_TREE, HM_K_BARRIER_TREE);
    waiting = NULL;
    pmpi_poke(s->comm);
    COUNT(C_FAST_BARRIER);
    s->fast++;
    return rc == HM_OK ? MPI_SUCCESS : pmpi_failed(s, "MPI_Barrier", rc);
}

static int run_allreduce(state *s, const void *send, void *recv, uint64_t count, int dt, int op)
{
    int rc;
    if (s->phase == S_BROKEN)
        return pmpi_revoked(s);
    if (send == MPI_IN_PLACE)
        send = recv;
    static char none[16];   /* count 0: buffers MPI allows to be anything */
    if (count == 0)
        send = recv = none;
    waiting = s;
    if (s->leaders == MPI_COMM_NULL)   /* the node's whole call: the core chooses how */
        rc = hm_allreduce_node(&s->c, send, recv, count, dt, op, !s->multi);
    else
        rc = hm_net_allreduce(&s->c, &s->net, send, recv, count, dt, op);
    waiting = NULL;
    COUNT(C_FAST_ALLREDUCE);
    s->fast++;
    return rc == HM_OK ? MPI_SUCCESS : pmpi_failed(s, "MPI_Allreduce", rc);
}

/* The state and the core's codes when this allreduce goes to the core (or the communicator
 * was revoked), else NULL. */
static state *allreduce_fast(const void *send, const void *recv, MPI_Count count, MPI_Datatype type,
                             MPI_Op op, MPI_Comm comm, int *dt, int *hop)
{
    /* buffers the MPI refuses (none, or the same without MPI_IN_PLACE): it says so, as ever */
    if (count > 0 && (recv == NULL || send == NULL || send == recv))
        return NULL;
    state *s = pmpi_state(comm, 0);
    if (s != NULL && s->phase == S_BROKEN)
        return s;
    if (s != NULL && s->mpi_calls) {   /* the layout's path: MPI's own call */
        COUNT(C_MPI_ALLREDUCE);
        return NULL;
    }
    /* count 0 goes to the core too: a rank with none where the others reduce some (or are in a
     * barrier) is a mismatch there, which MPI would let pass on that rank */
    if (s == NULL || count < 0 || (*dt = pmpi_type_code(type)) < 0 || (*hop = pmpi_op_code(op, *dt)) < 0 ||
        (uint64_t)count > cfg.max_bytes / hm_dtype_size(*dt))
        return NULL;
    return s;
}

/* The state when this barrier goes to the core (or the communicator was revoked), else NULL. */
static state *barrier_state(MPI_Comm comm)
{
    state *s = pmpi_state(comm, 0);
    if (s != NULL && s->mpi_calls && s->phase == S_FAST) {   /* the layout's path: MPI's own */
        COUNT(C_MPI_BARRIER);
        return NULL;
    }
    return s;
}

/* ------------------------------------------------------------------ the entry points */

EXPORT int MPI_Allreduce(const void *send, void *recv, int count, MPI_Datatype type, MPI_Op op,
                         MPI_Comm comm)
{
    int dt, hop;
    state *s = allreduce_fast(send, recv, count, type, op, comm, &dt, &hop);
    if (s != NULL)
        return run_allreduce(s, send, recv, (uint64_t)count, dt, hop);
    COUNT(C_NEXT_ALLREDUCE);
    return next.allreduce(send, recv, count, type, op, comm);
}

EXPORT int MPI_Barrier(MPI_Comm comm)
{
    state *s = barrier_state(comm);
    if (s != NULL)
        return run_barrier(s);
    COUNT(C_NEXT_BARRIER);
    return next.barrier(comm);
}

#if MPI_VERSION >= 4
typedef int (*allreduce_c_fn)(const void *, void *, MPI_Count, MPI_Datatype, MPI_Op, MPI_Comm);
EXPORT int MPI_Allreduce_c(const void *send, void *recv, MPI_Count count, MPI_Datatype type,
                           MPI_Op op, MPI_Comm comm)
{
    int dt, hop;
    state *s = allreduce_fast(send, recv, count, type, op, comm, &dt, &hop);
    if (s != NULL)
        return run_allreduce(s, send, recv, (uint64_t)count, dt, hop);
    COUNT(C_NEXT_ALLREDUCE);
    return ((allreduce_c_fn)next.allreduce_c)(send, recv, count, type, op, comm);
}
#endif

#ifdef OPEN_MPI
/* Open MPI's Fortran bindings call PMPI_* directly: its mpif.h and `use mpi` programs reach
 * the core through these.  What does not go to the core goes to the next Fortran entry with
 * the arguments as they came (MPI_BOTTOM and the like stay Fortran's). */
typedef void (*f_allreduce_fn)(void *, void *, MPI_Fint *, MPI_Fint *, MPI_Fint *, MPI_Fint *,
                               MPI_Fint *);
typedef void (*f_barrier_fn)(MPI_Fint *, MPI_Fint *);

EXPORT void mpi_allreduce_(void *send, void *recv, MPI_Fint *count, MPI_Fint *type, MPI_Fint *op,
                           MPI_Fint *comm, MPI_Fint *ierr)
{
    int dt, hop;
    MPI_Datatype t = PMPI_Type_f2c(*type);
    MPI_Op o = PMPI_Op_f2c(*op);
    void *in = send == next.f_in_place ? MPI_IN_PLACE : send;
    state *s = allreduce_fast(in, recv, *count, t, o, PMPI_Comm_f2c(*comm), &dt, &hop);
    if (s != NULL) {
        *ierr = run_allreduce(s, in, recv, (uint64_t)*count, dt, hop);
        return;
    }
    COUNT(C_NEXT_ALLREDUCE);
    ((f_allreduce_fn)next.f_allreduce)(send, recv, count, type, op, comm, ierr);
}

EXPORT void mpi_barrier_(MPI_Fint *comm, MPI_Fint *ierr)
{
    state *s = barrier_state(PMPI_Comm_f2c(*comm));
    if (s != NULL) {
        *ierr = run_barrier(s);
        return;
    }
    COUNT(C_NEXT_BARRIER);
    ((f_barrier_fn)next.f_barrier)(comm, ierr);
}
#endif
