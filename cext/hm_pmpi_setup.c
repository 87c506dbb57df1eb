/* hybridmpi's PMPI library: a communicator's set-up (hm_pmpi.c says when it happens) and its
 * release: its node split and shared segment, the C core's state over it, the layout's path
 * from the tuning tables, and the leaders' communicator with the MPI calls that the core's
 * protocol between the nodes makes (hm_net.c); the extensions' part in a release (pmpi_extend);
 * the named types and operations the core reduces. */
#define _GNU_SOURCE
#include "hm_pmpi_common.h"
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static void set_up_returning(state *s, int rank, int *local, int *all);

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
int pmpi_release(state *s)
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

/* At MPI_Finalize, once every state is freed: each extension's messages still on their way. */
void pmpi_drain_extensions(void)
{
    for (int i = 0; i < nextensions; i++)
        extensions[i]->drain();
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

int pmpi_type_code(MPI_Datatype t)
{
    for (int i = 0; i < ntypes; i++)
        if (types[i].type == t)
            return types[i].code;
    return -1;
}

int pmpi_op_code(MPI_Op op, int dtype)
{
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (ops[i].op == op)
            return hm_op_valid(dtype, ops[i].code) ? ops[i].code : -1;
    return -1;
}

/* Keeps the named types this MPI has at the size the core expects (a type it lacks is
     * MPI_DATATYPE_NULL: no call is made that could reach an error handler); once, at start-up. */
void pmpi_types_init(void)
{
    ntypes = 0;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        int size = 0;
        if (types[i].type != MPI_DATATYPE_NULL && PMPI_Type_size(types[i].type, &size) == MPI_SUCCESS &&
            (size_t)size == hm_dtype_size(types[i].code))
            types[ntypes++] = types[i];
    }
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
    hm_policy_init(p, s->mpi_calls);   /* (s->mpi_calls: the physical node's ranks share cores) */
    p->timeout_ns = (int64_t)(cfg.timeout_s * 1e9);
    return 0;
}


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
    pmpi_tuned t;
    int got = pmpi_tune_table(&l, rank, where, sizeof where, &t);
    mine[0] = got == TUNE_PATH_CORE, mine[1] = got == TUNE_PATH_MPI, mine[2] = got == TUNE_PATH_NONE;
    if (PMPI_Allreduce(mine, views, 3, MPI_INT, MPI_SUM, s->comm) != MPI_SUCCESS)
        views[0] = views[1] = 0, views[2] = 1;
    int path = views[2] ? (l.nodes == size && !l.oversubscribed ? TUNE_PATH_MPI : TUNE_PATH_CORE)
             : views[1] == size ? TUNE_PATH_MPI : TUNE_PATH_CORE;
    if (views[2] == 0)
        COUNT(C_TABLES);
    /* the node tree's radix and the direct allreduce's gate: the tables' where every rank
     * took one and they agree on it (the gate by one more: 0 names none) */
    int r[4] = {t.radix, -t.radix, t.direct_total + 1, -(t.direct_total + 1)};
    int most_r[4] = {0, 1, 0, 1};
    if (views[2] == 0 && (views[0] == size || views[1] == size) &&
        PMPI_Allreduce(r, most_r, 4, MPI_INT, MPI_MAX, s->comm) == MPI_SUCCESS) {
        if (most_r[0] == -most_r[1] && most_r[0] > 0)
            hm_coll_set_radix(&s->c, most_r[0]);
        if (most_r[2] == -most_r[3] && most_r[2] > 0)
            hm_coll_set_direct_total(&s->c, most_r[2] - 1);
    }
    if (cfg.stats && rank == 0)
        fprintf(stderr, "hybridmpi pmpi: a communicator of %d ranks, %d node(s) of %d-%d ranks: "
                "barrier and allreduce on %s, node tree of radix %d, direct allreduce to %llu "
                "bytes (%s)\n", size, l.nodes, l.lo, l.hi,
                path == TUNE_PATH_MPI ? "MPI's own calls" : "the core", s->c.radix,
                (unsigned long long)s->c.direct_total,
                views[2] ? "the layout's default: not every rank has a table" :
                views[0] == size || views[1] == size ? where : "the ranks' tables differ");
    return path;
}

/* Set up `s`, collectively over its communicator; every rank ends in S_FAST or in S_NEXT. */
void pmpi_set_up(state *s)
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
    pmpi_release(s);
    s->phase = S_NEXT;
    COUNT(C_FELL_BACK);
    if (cfg.stats && local[1])
        fprintf(stderr, "hybridmpi pmpi: rank %d: a communicator stays on MPI: %s\n", rank, failure);
}
