/* hybridmpi's PMPI library: the C core's barrier, allreduce and neighbourhood collectives
 * under unchanged C, C++ and Fortran programs (docs/guide/pmpi.md).
 *
 * This file defines MPI_Allreduce, MPI_Allreduce_c (where the MPI has large-count calls) and
 * MPI_Barrier, and for Open MPI the Fortran mpi_allreduce_ and mpi_barrier_; hm_pmpi_ngh.c the
 * neighbourhood collectives and the completion calls of their requests (hm_pmpi.h: what the two
 * share).  A call goes to
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
#include "hm_pmpi.h"
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

struct pmpi_cfg cfg;

static const char *const counter_names[C_NUM] = {
    "allreduce fast", "barrier fast", "allreduce passed on", "barrier passed on",
    "communicators set up", "set-ups that fell back", "calls that failed", "neighbor fast",
    "neighbor passed on", "allreduce mpi path", "barrier mpi path", "tables taken"};
_Atomic long counters[C_NUM];
static int started;   /* start() ran */

/* HYBRIDMPI_TUNE, as the Python library reads it (auto, table, off, mpi; auto and table alike
 * here: a table where one is found, never a calibration); another value is named on stderr and
 * auto is used. */
static int tune_setting(void)
{
    const char *v = getenv("HYBRIDMPI_TUNE");
    if (v == NULL || *v == '\0' || strcasecmp(v, "auto") == 0 || strcasecmp(v, "table") == 0)
        return TUNE_AUTO;
    if (strcasecmp(v, "off") == 0)
        return TUNE_OFF;
    if (strcasecmp(v, "mpi") == 0)
        return TUNE_MPI;
    fprintf(stderr, "hybridmpi pmpi: HYBRIDMPI_TUNE=%s is not auto, table, off or mpi; using auto\n", v);
    return TUNE_AUTO;
}

/* Settings are parsed strictly: a value that is not what the variable takes is named on
 * stderr, and the safe value is used (the default for a number; for HYBRIDMPI_PMPI_OFF, off:
 * a setting that could make calls go fast never does so by mistake). */
static void bad_setting(const char *name, const char *v, const char *what, const char *kept)
{
    fprintf(stderr, "hybridmpi pmpi: %s=%s is not %s; using %s\n", name, v, what, kept);
}

static long env_long(const char *name, long dflt, long lo, long hi)
{
    const char *v = getenv(name);
    char *end;
    if (v == NULL || *v == '\0')
        return dflt;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (*end != '\0' || errno == ERANGE || x < lo || x > hi) {
        char what[96], kept[32];
        snprintf(what, sizeof what, "an integer from %ld to %ld", lo, hi);
        snprintf(kept, sizeof kept, "%ld", dflt);
        bad_setting(name, v, what, kept);
        return dflt;
    }
    return (long)x;
}

/* 1/0, true/false, yes/no, on/off (any case); else `bad`. */
static int env_bool(const char *name, int dflt, int bad)
{
    static const char *const yes[] = {"1", "true", "yes", "on"}, *const no[] = {"0", "false", "no", "off"};
    const char *v = getenv(name);
    if (v == NULL || *v == '\0')
        return dflt;
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(v, yes[i]) == 0)
            return 1;
        if (strcasecmp(v, no[i]) == 0)
            return 0;
    }
    bad_setting(name, v, "one of 1/0, true/false, yes/no, on/off", bad ? "1" : "0");
    return bad;
}

static double env_seconds(const char *name)
{
    const char *v = getenv(name);
    char *end;
    if (v == NULL || *v == '\0')
        return 0.0;
    errno = 0;
    double x = strtod(v, &end);
    if (*end != '\0' || errno == ERANGE || !(x >= 0.0 && x <= 1e9)) {
        bad_setting(name, v, "a number of seconds from 0 to 1e9", "0 (no timeout)");
        return 0.0;
    }
    return x;
}

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

/* ------------------------------------------------------------------ named types and operations */

typedef struct {
    MPI_Datatype type;
    int code;
} type_entry;
/* The named types the core reduces, with the core's code.  Types whose size is not the code's
 * (or that the MPI does not have) are dropped at start-up. */
static type_entry types[] = {
    {MPI_DOUBLE, HM_F64}, {MPI_INT, HM_I32}, {MPI_FLOAT, HM_F32}, {MPI_LONG, HM_I64},
    {MPI_LONG_LONG, HM_I64}, {MPI_INT64_T, HM_I64}, {MPI_INT32_T, HM_I32},
    {MPI_UNSIGNED, HM_U32}, {MPI_UNSIGNED_LONG, HM_U64}, {MPI_UNSIGNED_LONG_LONG, HM_U64},
    {MPI_UINT64_T, HM_U64}, {MPI_UINT32_T, HM_U32}, {MPI_SHORT, HM_I16},
    {MPI_UNSIGNED_SHORT, HM_U16}, {MPI_INT16_T, HM_I16}, {MPI_UINT16_T, HM_U16},
    {MPI_SIGNED_CHAR, HM_I8}, {MPI_UNSIGNED_CHAR, HM_U8}, {MPI_INT8_T, HM_I8},
    {MPI_UINT8_T, HM_U8}, {MPI_C_DOUBLE_COMPLEX, HM_C128}, {MPI_CXX_DOUBLE_COMPLEX, HM_C128},
    {MPI_DOUBLE_PRECISION, HM_F64}, {MPI_INTEGER, HM_I32}, {MPI_REAL, HM_F32},
    {MPI_DOUBLE_COMPLEX, HM_C128}, {MPI_REAL8, HM_F64}, {MPI_INTEGER8, HM_I64},
    {MPI_INTEGER4, HM_I32}, {MPI_REAL4, HM_F32}};
static int ntypes;

static const struct {
    MPI_Op op;
    int code;
} ops[] = {{MPI_SUM, HM_SUM}, {MPI_MAX, HM_MAX}, {MPI_MIN, HM_MIN}, {MPI_PROD, HM_PROD},
           {MPI_LAND, HM_LAND}, {MPI_LOR, HM_LOR}, {MPI_LXOR, HM_LXOR}, {MPI_BAND, HM_BAND},
           {MPI_BOR, HM_BOR}, {MPI_BXOR, HM_BXOR}};

static int type_code(MPI_Datatype t)
{
    for (int i = 0; i < ntypes; i++)
        if (types[i].type == t)
            return types[i].code;
    return -1;
}

static int op_code(MPI_Op op, int dtype)
{
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (ops[i].op == op)
            return hm_op_valid(dtype, ops[i].code) ? ops[i].code : -1;
    return -1;
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

/* The extensions registered (pmpi_extend), in the order they came. */
enum { MAX_EXTENSIONS = 4 };
static const pmpi_extension *extensions[MAX_EXTENSIONS];
static int nextensions;

void pmpi_extend(const pmpi_extension *x)
{
    if (nextensions < MAX_EXTENSIONS)
        extensions[nextensions++] = x;
}

/* Frees what `s` holds; 0 when it must be kept instead: a call between the nodes failed and
 * left a request that MPI may still complete into the state, the segment and the leaders'
 * communicator (a revoked communicator's, once: it is kept whole, never freed), or an
 * extension keeps it. */
static int release(state *s)
{
    if (s->leaders != MPI_COMM_NULL && hm_net_pending(&s->net))
        return 0;
    for (int i = 0; i < nextensions; i++)
        if (!extensions[i]->release(s))
            return 0;
    if (s->base != NULL)
        munmap(s->base, s->bytes);
    s->base = NULL;
    free(s->seg);
    s->seg = NULL;
    free(s->suspect);
    s->suspect = NULL;
    if (s->leaders != MPI_COMM_NULL) {
        hm_net_free_ops(&s->net);
        PMPI_Comm_free(&s->leaders);
    }
    if (s->node != MPI_COMM_NULL)
        PMPI_Comm_free(&s->node);
    return 1;
}

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
    if (release(s))
        free(s);
    return MPI_SUCCESS;
}

static void print_counters(void)
{
    int rank = -1, size = 0, world = 0;
    if (!other_abi_seen)
        PMPI_Initialized(&world);
    if (world) {   /* a sessions program has no MPI_COMM_WORLD */
        PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
        PMPI_Comm_size(MPI_COMM_WORLD, &size);
    }
    char line[512];
    int n = snprintf(line, sizeof line, "hybridmpi pmpi: rank %d of %d:", rank, size);
    for (int k = 0; k < C_NUM && n < (int)sizeof line; k++)
        n += snprintf(line + n, sizeof line - (size_t)n, "%s %ld %s", k ? "," : "",
                      atomic_load(&counters[k]), counter_names[k]);
    fprintf(stderr, "%s\n", line);
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
    for (int i = 0; i < nextensions; i++)
        extensions[i]->drain();
    quiet_close();
    if (cfg.stats)
        print_counters();
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
    cfg.off = env_bool("HYBRIDMPI_PMPI_OFF", 0, 1);
    cfg.stats = env_bool("HYBRIDMPI_PMPI_STATS", 0, 0);
    cfg.after = (int)env_long("HYBRIDMPI_PMPI_AFTER", 5, 0, INT_MAX - 1);
    cfg.max_bytes = (uint64_t)env_long("HYBRIDMPI_PMPI_MAX_BYTES", 2048, 0, 1 << 20);
    cfg.node_size = (int)env_long("HYBRIDMPI_PMPI_NODE_SIZE", 0, 0, INT_MAX);
    cfg.timeout_s = env_seconds("HYBRIDMPI_PMPI_TIMEOUT");
    cfg.fail_rank = (int)env_long("HYBRIDMPI_PMPI_FAIL_RANK", -1, -1, INT_MAX);
    cfg.adaptive = env_bool("HYBRIDMPI_PMPI_ADAPTIVE", 1, 1);
    cfg.ngh_bytes = (uint64_t)env_long("HYBRIDMPI_PMPI_NEIGHBOR_BYTES", 1 << 20, 0, 1L << 30);
    cfg.ngh_stage = (uint64_t)env_long("HYBRIDMPI_PMPI_NEIGHBOR_STAGE", 12288, 0, 1L << 30);
    cfg.tune = tune_setting();
    next.allreduce = (allreduce_fn)pmpi_next("MPI_Allreduce", "PMPI_Allreduce");
    next.barrier = (barrier_fn)pmpi_next("MPI_Barrier", "PMPI_Barrier");
    next.allreduce_c = pmpi_next("MPI_Allreduce_c", "PMPI_Allreduce_c");
    next.f_allreduce = pmpi_next("mpi_allreduce_", "pmpi_allreduce_");
    next.f_barrier = pmpi_next("mpi_barrier_", "pmpi_barrier_");
    next.f_in_place = dlsym(RTLD_DEFAULT, "mpi_fortran_in_place_");
    /* keep the named types this MPI has at the size the core expects (a type it lacks is
     * MPI_DATATYPE_NULL: no call is made that could reach an error handler) */
    ntypes = 0;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        int size = 0;
        if (types[i].type != MPI_DATATYPE_NULL && PMPI_Type_size(types[i].type, &size) == MPI_SUCCESS &&
            (size_t)size == hm_dtype_size(types[i].code))
            types[ntypes++] = types[i];
    }
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
            print_counters();
    }
    if (!started)
        finalizing = 1;   /* a first call from inside MPI_Finalize goes to MPI */
    return ((finalize_fn)pmpi_next("MPI_Finalize", "PMPI_Finalize"))();
}

/* ------------------------------------------------------------------ between the nodes */

/* The core's protocol between the nodes (hm_net.c) reaches MPI through these: PMPI_* with
 * the handles converted back from intptr_t. */
static int net_iallreduce(const void *send, void *recv, int count, intptr_t type, intptr_t op,
                          intptr_t comm, void *req)
{
    return PMPI_Iallreduce(send, recv, count, (MPI_Datatype)type, (MPI_Op)op, (MPI_Comm)comm,
                           (MPI_Request *)req);
}

static int net_ireduce(const void *send, void *recv, int count, intptr_t type, intptr_t op, int root,
                       intptr_t comm, void *req)
{
    return PMPI_Ireduce(send, recv, count, (MPI_Datatype)type, (MPI_Op)op, root, (MPI_Comm)comm,
                        (MPI_Request *)req);
}

static int net_ibcast(void *buf, int count, intptr_t type, int root, intptr_t comm, void *req)
{
    return PMPI_Ibcast(buf, count, (MPI_Datatype)type, root, (MPI_Comm)comm, (MPI_Request *)req);
}

static int net_allreduce(const void *send, void *recv, int count, intptr_t type, intptr_t op,
                         intptr_t comm)
{
    return PMPI_Allreduce(send, recv, count, (MPI_Datatype)type, (MPI_Op)op, (MPI_Comm)comm);
}

static int net_reduce(const void *send, void *recv, int count, intptr_t type, intptr_t op, int root,
                      intptr_t comm)
{
    return PMPI_Reduce(send, recv, count, (MPI_Datatype)type, (MPI_Op)op, root, (MPI_Comm)comm);
}

static int net_bcast(void *buf, int count, intptr_t type, int root, intptr_t comm)
{
    return PMPI_Bcast(buf, count, (MPI_Datatype)type, root, (MPI_Comm)comm);
}

static int net_test(void *req, int *flag, void *status)
{
    (void)status;
    return PMPI_Test((MPI_Request *)req, flag, MPI_STATUS_IGNORE);
}

static int net_op_create(hm_mpi_user_fn fn, int commute, void *op)
{
    return PMPI_Op_create((MPI_User_function *)(void (*)(void))fn, commute, (MPI_Op *)op);
}

static int net_op_free(void *op)
{
    return PMPI_Op_free((MPI_Op *)op);
}

static int net_type_contiguous(int count, intptr_t old, void *type)
{
    return PMPI_Type_contiguous(count, (MPI_Datatype)old, (MPI_Datatype *)type);
}

static int net_type_commit(void *type)
{
    return PMPI_Type_commit((MPI_Datatype *)type);
}

static int net_type_free(void *type)
{
    return PMPI_Type_free((MPI_Datatype *)type);
}

/* A leader's hm_net over its leaders' communicator: each core type and op as the first named
 * one of this MPI that the tables above give it, and the core's own ops (float and double min
 * and max, complex prod: hm_net_make_ops, freed with the leaders' communicator by release);
 * 0 on success. */
static int net_init(state *s)
{
    hm_net *n = &s->net;
    *n = (hm_net){.iallreduce = net_iallreduce, .ireduce = net_ireduce, .ibcast = net_ibcast,
                  .test = net_test, .allreduce = net_allreduce, .reduce = net_reduce,
                  .bcast = net_bcast, .op_create = net_op_create, .op_free = net_op_free,
                  .type_contiguous = net_type_contiguous, .type_commit = net_type_commit,
                  .type_free = net_type_free,
                  .comm = (intptr_t)s->leaders, .int64 = (intptr_t)MPI_INT64_T,
                  .max = (intptr_t)MPI_MAX, .in_place = (intptr_t)MPI_IN_PLACE};
    PMPI_Comm_rank(s->leaders, &n->rank);
    PMPI_Comm_size(s->leaders, &n->size);
    for (int i = ntypes - 1; i >= 0; i--)
        n->types[types[i].code] = (intptr_t)types[i].type;
    for (int i = (int)(sizeof ops / sizeof ops[0]) - 1; i >= 0; i--)
        n->ops[ops[i].code] = (intptr_t)ops[i].op;
    return hm_net_make_ops(n) != HM_OK;
}

/* ------------------------------------------------------------------ set-up */

static __thread const char *failure;   /* why this thread's last set-up failed (stats) */

/* The node of `comm` (virtual nodes of cfg.node_size ranks when set), reporting to the library
 * only; 0 on success.  `shared_cores` and `cores` (or NULL): 1 where the physical node has more
 * ranks than its ranks may run on cores (their affinity masks' union), and how many those are. */
int pmpi_split_node(MPI_Comm comm, int rank, MPI_Comm *node, int *shared_cores, int *cores)
{
    MPI_Comm shared;
    if (PMPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shared))
        return 1;
    if (shared_cores != NULL) {
        int ranks = 1;
        cpu_set_t mask;
        PMPI_Comm_size(shared, &ranks);
        /* the job's processes on this node, as the launcher says, may be more than the
         * communicator's (MPICH's and Intel MPI's hydra, Open MPI, MVAPICH2) */
        static const char *const local[] = {"MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE",
                                            "MV2_COMM_WORLD_LOCAL_SIZE"};
        for (size_t i = 0; i < sizeof local / sizeof local[0]; i++) {
            const char *v = getenv(local[i]);
            if (v != NULL && atoi(v) > ranks)
                ranks = atoi(v);
        }
        /* the cores its ranks may run on: the union of their masks (a launcher that pins each
         * rank to one core, as Intel MPI's does, gives each a mask of one) */
        CPU_ZERO(&mask);
        if (sched_getaffinity(0, sizeof mask, &mask) != 0 ||
            PMPI_Allreduce(MPI_IN_PLACE, &mask, (int)sizeof mask, MPI_BYTE, MPI_BOR, shared) != MPI_SUCCESS)
            CPU_ZERO(&mask);
        *shared_cores = ranks > CPU_COUNT(&mask);
        if (cores != NULL)
            *cores = CPU_COUNT(&mask);
    }
    if (cfg.node_size > 0) {
        int r;
        PMPI_Comm_rank(shared, &r);
        PMPI_Comm_split(shared, r / cfg.node_size, rank, node);
        PMPI_Comm_free(&shared);
    } else {
        *node = shared;
    }
    /* the library's own communicators report to it, never to the program's handler */
    PMPI_Comm_set_errhandler(*node, MPI_ERRORS_RETURN);
    return 0;
}

/* A shared segment of `bytes` mapped by every rank of `node`, collectively: NULL and *why set
 * when one rank could not.  POSIX shared memory, its name unlinked once every rank tried to map
 * it (a job killed later leaves nothing in /dev/shm).  Its room is reserved before use, so that
 * a full /dev/shm fails here, not in the program: the whole segment when `fd` is NULL; else the
 * file is only sized, and each rank gets a descriptor (*fd) with which it reserves the parts it
 * writes (posix_fallocate) before it writes them.  `inject`: as if this rank had no room
 * (tests). */
char *pmpi_map_segment(MPI_Comm node, size_t bytes, int inject, const char **why, int *fd)
{
    int nr;
    PMPI_Comm_rank(node, &nr);
    char name[64] = "", *base = NULL;
    int f = -1;
    if (nr == 0 && !inject) {
        static _Atomic unsigned serial;
        snprintf(name, sizeof name, "/hybridmpi-pmpi-%d-%u-%lx", (int)getpid(),
                 atomic_fetch_add(&serial, 1), (unsigned long)time(NULL));
        f = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
        int err = f < 0 ? errno : fd ? (ftruncate(f, (off_t)bytes) ? errno : 0)
                                     : posix_fallocate(f, 0, (off_t)bytes);
        if (f >= 0 && err == 0)
            base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
        if (base == MAP_FAILED)
            base = NULL;
        if (base == NULL) {
            if (f >= 0)
                shm_unlink(name);
            name[0] = '\0';
        }
    }
    if (PMPI_Bcast(name, sizeof name, MPI_CHAR, 0, node) != MPI_SUCCESS)
        name[0] = '\0';
    if (name[0] == '\0') {   /* every node rank sees it: none goes on to the barrier below */
        if (f >= 0)
            close(f);
        return *why = "no room for the node's shared segment", NULL;
    }
    if (nr != 0 && !inject) {
        f = shm_open(name, O_RDWR, 0);
        if (f >= 0)
            base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
        if (f < 0 || base == MAP_FAILED)
            base = NULL;
    }
    PMPI_Barrier(node);
    if (nr == 0)
        shm_unlink(name);
    if (base == NULL)
        *why = "could not map the node's shared segment";
    if (fd && base)
        *fd = f;
    else if (f >= 0)
        close(f);
    return base;
}

/* This rank's part of a set-up: the node, its segment, the core; 0 on success. */
static int map_node(state *s, int rank)
{
    if (pmpi_split_node(s->comm, rank, &s->node, &s->mpi_calls, &s->cores))   /* (shared cores, for now) */
        return failure = "MPI_Comm_split_type failed", 1;
    int nr, nn;
    PMPI_Comm_rank(s->node, &nr);
    PMPI_Comm_size(s->node, &nn);
    size_t per = (hm_coll_segment_bytes(cfg.max_bytes) + 4095) & ~(size_t)4095;
    s->bytes = per * (size_t)nn + (((size_t)nn * sizeof(pid_t) + 4095) & ~(size_t)4095);
    s->base = pmpi_map_segment(s->node, s->bytes, rank == cfg.fail_rank, &failure, NULL);
    if (s->base == NULL)
        return 1;
    s->seg = malloc((size_t)nn * sizeof(char *));
    if (s->seg == NULL)
        return failure = "out of memory", 1;
    for (int r = 0; r < nn; r++)
        s->seg[r] = s->base + per * (size_t)r;
    s->pids = (pid_t *)(s->base + per * (size_t)nn);
    s->pids[nr] = getpid();
    s->suspect = calloc((size_t)nn, 1);
    if (s->suspect == NULL)
        return failure = "out of memory", 1;
    if (hm_coll_init(&s->c, nr, nn, 4, s->seg, cfg.max_bytes) != HM_OK || !hm_lock_free())
        return failure = "the core cannot run here", 1;
    hm_wait_policy *p = &s->c.policy;
    p->spin = 1000;
    p->yield_ns = 2000000000;
    p->sleep_ns = 50000;
    p->timeout_ns = (int64_t)(cfg.timeout_s * 1e9);
    p->order = HM_ACQ_REL;
    return 0;
}

static void set_up_returning(state *s, int rank, int *local, int *all);

/* The path of the barrier and the allreduce for the layout of `s` (collective, every rank
 * alike: `all` is the set-up's agreement: nodes, ranks that failed, sharing cores): a tuning
 * table's where every rank took one and they agree, the core where they differ, else the
 * layout's default (MPI's own calls where every node has one rank with a core of its own, as
 * tuning.Layout.default_path). */
static int layout_path(state *s, int rank, int leader, const int *all)
{
    int size = 1, mine[3], most[3] = {0, 0, 0}, views[3] = {0, 0, 1};
    PMPI_Comm_size(s->comm, &size);
    /* the fewest and the most ranks per node, the fewest cores, by one MPI_MAX */
    mine[0] = leader ? s->c.size : 0;
    mine[1] = leader ? -s->c.size : -size;
    mine[2] = -s->cores;
    if (PMPI_Allreduce(mine, most, 3, MPI_INT, MPI_MAX, s->comm) != MPI_SUCCESS)
        return TUNE_PATH_NONE;
    pmpi_layout l = {.ranks = size, .nodes = all[0], .lo = -most[1], .hi = most[0],
                     .cores = -most[2], .oversubscribed = all[2] != 0};
    char where[4096] = "";
    int radix = 0;
    int got = pmpi_tune_table(&l, rank, where, sizeof where, &radix);
    mine[0] = got == TUNE_PATH_CORE, mine[1] = got == TUNE_PATH_MPI, mine[2] = got == TUNE_PATH_NONE;
    if (PMPI_Allreduce(mine, views, 3, MPI_INT, MPI_SUM, s->comm) != MPI_SUCCESS)
        views[0] = views[1] = 0, views[2] = 1;
    int path = views[2] ? (l.nodes == size && !l.oversubscribed ? TUNE_PATH_MPI : TUNE_PATH_CORE)
             : views[1] == size ? TUNE_PATH_MPI : TUNE_PATH_CORE;
    if (views[2] == 0)
        COUNT(C_TABLES);
    /* the node tree's radix: the tables' where every rank took one and they agree on it */
    int r[2] = {radix, -radix}, most_r[2] = {0, 1};
    if (views[2] == 0 && (views[0] == size || views[1] == size) &&
        PMPI_Allreduce(r, most_r, 2, MPI_INT, MPI_MAX, s->comm) == MPI_SUCCESS &&
        most_r[0] == -most_r[1] && most_r[0] > 0)
        hm_coll_set_radix(&s->c, most_r[0]);
    if (cfg.stats && rank == 0)
        fprintf(stderr, "hybridmpi pmpi: a communicator of %d ranks, %d node(s) of %d-%d ranks: "
                "barrier and allreduce on %s, node tree of radix %d (%s)\n", size, l.nodes, l.lo,
                l.hi, path == TUNE_PATH_MPI ? "MPI's own calls" : "the core", s->c.radix,
                views[2] ? "the layout's default: not every rank has a table" :
                views[0] == size || views[1] == size ? where : "the ranks' tables differ");
    return path;
}

/* Set up `s`, collectively over its communicator; every rank ends in S_FAST or in S_NEXT. */
static void set_up(state *s)
{
    int rank, local[3], all[3] = {0, 1, 0};   /* all: nodes, ranks that failed, sharing cores */
    PMPI_Comm_rank(s->comm, &rank);
    /* what fails here (no context id left, say) falls back, and never reaches the program's
     * error handler: the communicator's is set back as it was, whatever happens */
    MPI_Errhandler was;
    PMPI_Comm_get_errhandler(s->comm, &was);
    PMPI_Comm_set_errhandler(s->comm, MPI_ERRORS_RETURN);
    set_up_returning(s, rank, local, all);
    PMPI_Comm_set_errhandler(s->comm, was);
    PMPI_Errhandler_free(&was);
}

static void set_up_returning(state *s, int rank, int *local, int *all)
{
    s->node = s->leaders = MPI_COMM_NULL;
    s->mpi_calls = 0;
    local[1] = map_node(s, rank);
    int leader = s->node != MPI_COMM_NULL && s->c.rank == 0;
    local[0] = leader && !local[1];
    local[2] = s->mpi_calls;   /* this rank's physical node has more ranks than cores */
    /* the agreement; it also orders every rank's hm_coll_init before any rank's first call */
    if (PMPI_Allreduce(local, all, 3, MPI_INT, MPI_SUM, s->comm) != MPI_SUCCESS)
        all[1] = 1;
    /* the layout's path of the barrier and the allreduce, alike on every rank: MPI's own calls
     * where every rank is its node's only one, with a core of its own (the core's node steps
     * are empty there, and its agreement between the nodes costs more than MPI's call), or as
     * HYBRIDMPI_TUNE says; docs/guide/tuning.md */
    s->mpi_calls = cfg.tune == TUNE_MPI || (cfg.tune == TUNE_AUTO && all[1] == 0 &&
                                            layout_path(s, rank, leader, all) == TUNE_PATH_MPI);
    if (all[1] == 0 && all[0] > 1) {
        /* several nodes: their leaders' communicator (every rank knows it is needed), and
         * whether every rank got its part */
        int bad = PMPI_Comm_split(s->comm, leader ? 0 : MPI_UNDEFINED, rank, &s->leaders) != MPI_SUCCESS;
        if (bad)
            s->leaders = MPI_COMM_NULL, failure = "MPI_Comm_split failed";
        if (s->leaders != MPI_COMM_NULL) {
            PMPI_Comm_set_errhandler(s->leaders, MPI_ERRORS_RETURN);
            if (net_init(s))
                bad = 1, failure = "MPI_Op_create failed";
        }
        int any = 1;
        if (PMPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, s->comm) != MPI_SUCCESS || any)
            all[1] = 1, local[1] |= bad;
    }
    if (all[1] == 0) {
        s->multi = all[0] > 1;
        /* the node's communicator served the set-up only: the program keeps its context ids
         * (one node: none is held per communicator; several: the leaders') */
        PMPI_Comm_free(&s->node);
        /* dead peers are looked for only where every node peer's process is visible (not
         * across PID namespaces that share /dev/shm) */
        s->watch = 1;
        for (int r = 0; r < s->c.size; r++)
            if (kill(s->pids[r], 0) != 0 && errno == ESRCH)
                s->watch = 0;
        s->phase = S_FAST;
        COUNT(C_SETUP);
        return;
    }
    release(s);
    s->phase = S_NEXT;
    COUNT(C_FELL_BACK);
    if (cfg.stats && local[1])
        fprintf(stderr, "hybridmpi pmpi: rank %d: a communicator stays on MPI: %s\n", rank, failure);
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
            set_up(s);
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
    if (s == NULL || count < 0 || (*dt = type_code(type)) < 0 || (*hop = op_code(op, *dt)) < 0 ||
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
