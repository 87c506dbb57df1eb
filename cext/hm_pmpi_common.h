/* hybridmpi's PMPI library, internal: what its files share.  hm_pmpi.c holds the
 * per-communicator state, the barrier and the allreduce; hm_pmpi_cfg.c the settings and the
 * counters; hm_pmpi_setup.c a communicator's set-up and release; hm_pmpi_tune.c the tuning
 * tables; hm_pmpi_ngh*.c the neighbourhood collectives and the completion calls of their
 * requests. */
#ifndef HM_PMPI_COMMON_H
#define HM_PMPI_COMMON_H

#include <mpi.h>
#include "hm_core.h"

#include <stdatomic.h>
#include <sys/types.h>

#define EXPORT __attribute__((visibility("default")))

struct pmpi_cfg {
    int after;           /* calls on a communicator before it is set up */
    uint64_t max_bytes;  /* the largest payload the core reduces */
    int node_size;       /* > 0: virtual nodes of this many ranks (tests) */
    int stats;           /* print the counters at MPI_Finalize */
    int off;             /* 1: every call goes to what comes next */
    double timeout_s;    /* > 0: a wait that lasts this long fails */
    int fail_rank;       /* tests: this rank of each communicator fails its set-up (-1: none) */
    int adaptive;        /* defer set-ups where communicators die young (a vote per decision) */
    uint64_t ngh_bytes;  /* the most a rank stages in shared memory per neighbourhood call */
    uint64_t ngh_stage;  /* the most it stages for one peer (more: the MPI's messages) */
    int tune;            /* HYBRIDMPI_TUNE: TUNE_AUTO (or table: the same here), TUNE_OFF (the
                          * core), TUNE_MPI */
};
enum { TUNE_AUTO, TUNE_OFF, TUNE_MPI };
/* hm_pmpi_cfg.c: the settings read (once, at start), and the counters printed (world_usable:
 * MPI_COMM_WORLD may be asked for its rank) */
void pmpi_read_settings(void);
void pmpi_print_counters(int world_usable);
enum { TUNE_PATH_NONE = -1, TUNE_PATH_CORE, TUNE_PATH_MPI };
extern struct pmpi_cfg cfg;

enum { C_FAST_ALLREDUCE, C_FAST_BARRIER, C_NEXT_ALLREDUCE, C_NEXT_BARRIER, C_SETUP, C_FELL_BACK,
       C_FAILED, C_FAST_NEIGHBOR, C_NEXT_NEIGHBOR, C_MPI_ALLREDUCE, C_MPI_BARRIER, C_TABLES, C_NUM };
extern _Atomic long counters[C_NUM];
#define COUNT(k) atomic_fetch_add_explicit(&counters[k], 1, memory_order_relaxed)

enum { S_COUNTING, S_FAST, S_NEXT, S_BROKEN };

struct ngh;

typedef struct state {
    int phase;
    int calls;
    int set_up_at;          /* the call at which its ranks next consider setting it up */
    long fast;              /* calls that went to the core (its lifetime's worth) */
    MPI_Comm comm;          /* the user's communicator */
    MPI_Comm node;          /* its ranks on this node (MPI_COMM_NULL before set-up) */
    MPI_Comm leaders;       /* the nodes' leaders, on leaders across nodes; else MPI_COMM_NULL */
    int multi;              /* more than one node */
    int mpi_calls;          /* its barrier and allreduce go to MPI (the layout's path: a tuning
                             * table's, else MPI where every node has one rank with a core of
                             * its own; HYBRIDMPI_TUNE) */
    int cores;              /* cores its physical node's ranks may run on (set-up only) */
    char *base;             /* the node's shared segment */
    size_t bytes;
    char **seg;
    pid_t *pids;            /* each node rank's process, in the segment */
    int watch;              /* 1: the node's processes are visible here (dead-peer checks) */
    unsigned char *suspect; /* node ranks whose process was found gone once (checked again) */
    hm_coll c;
    hm_net net;             /* a leader's calls between the nodes (hm_net.c), over `leaders` */
    struct ngh *ngh;        /* the neighbourhood collectives' part (hm_pmpi_ngh.c), or NULL */
    struct state *prev, *next;
} state;

/* hm_pmpi.c */
state *pmpi_state(MPI_Comm comm, int now);
void *pmpi_next(const char *name, const char *pname);   /* what comes next: RTLD_NEXT, else PMPI */
int pmpi_failed(state *s, const char *call, int rc);
int pmpi_revoked(state *s);
void pmpi_poke(MPI_Comm fallback);
int pmpi_gone(state *s, int node_rank);

/* hm_pmpi_setup.c: set `s` up, collectively over its communicator (every rank ends in S_FAST
 * or in S_NEXT); the core's codes of a named type and operation (-1: not the core's); the named
 * types of this MPI, once at start-up; the node split and shared segment (the neighbourhood
 * collectives' set-up too) */
void pmpi_set_up(state *s);
int pmpi_release(state *s);   /* frees what `s` holds; 0: it must be kept (a pending request) */
void pmpi_drain_extensions(void);   /* at MPI_Finalize, once every state is freed */
int pmpi_type_code(MPI_Datatype t);
int pmpi_op_code(MPI_Op op, int dtype);
void pmpi_types_init(void);
int pmpi_split_node(MPI_Comm comm, int rank, MPI_Comm *node, int *shared_cores, int *cores);
char *pmpi_map_segment(MPI_Comm node, size_t bytes, int inject, const char **why, int *fd);

/* hm_pmpi_tune.c: a communicator's layout as a tuning table's key names it, and the path the
 * table for it chose on this host and MPI (HYBRIDMPI_TUNE_FILE, else the cache folder), or
 * TUNE_PATH_NONE; `where`: the file looked at last; `t`: the node tree's arity the table
 * chose (0 where it chose none) and the direct allreduce's gate (-1 where it chose none).
 * `rank`: the communicator's (0 says on stderr why a named table is not taken, once per
 * process). */
typedef struct pmpi_layout {
    int ranks, nodes;
    int lo, hi;          /* ranks per node, the fewest and the most */
    int cores;           /* cores a physical node's ranks may run on, the fewest */
    int oversubscribed;  /* some physical node has more ranks than cores */
} pmpi_layout;
typedef struct pmpi_tuned {
    int radix;
    int direct_total;
} pmpi_tuned;
int pmpi_tune_table(const pmpi_layout *l, int rank, char *where, size_t n, pmpi_tuned *t);

/* An extension of the base (hm_pmpi_ngh.c: the neighbourhood collectives), registered by the
 * extension when the library is loaded (pmpi_extend, from a constructor), so that the base
 * names none of them.  `release`: frees the extension's part of a state whose communicator is
 * freed; 0 when the state must be kept (a request MPI may still complete into it).  `drain`:
 * at MPI_Finalize, once every state is freed (the messages still on their way go). */
typedef struct pmpi_extension {
    int (*release)(state *s);
    void (*drain)(void);
} pmpi_extension;
void pmpi_extend(const pmpi_extension *x);

#endif
