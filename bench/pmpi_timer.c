/* A stackable timer of neighbourhood calls (bench/pmpi_neighbor.py): preloaded in front of the
 * PMPI library (LD_PRELOAD="timer.so library.so") or alone, it times each
 * MPI_Ineighbor_alltoallv from its entry to the exit of the MPI_Wait or MPI_Waitall that completes
 * its request, and each MPI_Neighbor_alltoallv, and passes every call on (dlsym(RTLD_NEXT): the
 * library, or the MPI).  At MPI_Finalize each rank prints one line per call size (the bytes it
 * sends): `pmpi_timer: rank R: bytes B: calls N median_us M`.
 *
 * Built with the MPI's wrapper: mpicc -O2 -shared -fPIC pmpi_timer.c -o timer.so -ldl */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { SIZES = 16, SAMPLES = 1 << 18, OPEN = 64 };

static struct {
    long long bytes;
    int n;
    float *us;
} sizes[SIZES];
static struct {
    MPI_Request req;
    int size;
    double t0;
} open_[OPEN];

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static void *next(const char *name)
{
    void *f = dlsym(RTLD_NEXT, name);
    if (f == NULL) {
        fprintf(stderr, "pmpi_timer: no %s after this library\n", name);
        abort();
    }
    return f;
}

/* The bucket of a call that sends `bytes` (-1: too many sizes, not kept); counts are int, or
 * MPI_Count with `big` (the _c forms, which mpi4py 4 calls). */
static int bucket_of(const void *counts, int big, int n, MPI_Datatype t)
{
    int size = 0;
    long long bytes = 0;
    PMPI_Type_size(t, &size);
    for (int i = 0; i < n; i++)
        bytes += (big ? (long long)((const MPI_Count *)counts)[i] : ((const int *)counts)[i]) * size;
    for (int k = 0; k < SIZES; k++) {
        if (sizes[k].us == NULL) {
            sizes[k].bytes = bytes;
            sizes[k].us = malloc(sizeof(float) * SAMPLES);
        }
        if (sizes[k].bytes == bytes)
            return sizes[k].us ? k : -1;
    }
    return -1;
}

static int bucket(const int *counts, int n, MPI_Datatype t)
{
    return bucket_of(counts, 0, n, t);
}

static void sample(int k, double t0)
{
    if (k >= 0 && sizes[k].n < SAMPLES)
        sizes[k].us[sizes[k].n++] = (float)((now() - t0) * 1e6);
}

static int outdegree(MPI_Comm comm)
{
    int in = 0, out = 0, weighted = 0, topo = MPI_UNDEFINED;
    PMPI_Topo_test(comm, &topo);
    if (topo == MPI_DIST_GRAPH)
        PMPI_Dist_graph_neighbors_count(comm, &in, &out, &weighted);
    return out;
}

/* A call in flight: its request, its bucket and its start. */
static void opened(MPI_Request req, int size, double t0)
{
    for (int i = 0; i < OPEN; i++)
        if (open_[i].req == MPI_REQUEST_NULL || open_[i].req == 0) {
            open_[i].req = req;
            open_[i].size = size;
            open_[i].t0 = t0;
            break;
        }
}

int MPI_Ineighbor_alltoallv(const void *sb, const int sc[], const int sd[], MPI_Datatype st, void *rb,
                            const int rc[], const int rd[], MPI_Datatype rt, MPI_Comm comm,
                            MPI_Request *req)
{
    typedef int (*fn)(const void *, const int[], const int[], MPI_Datatype, void *, const int[],
                      const int[], MPI_Datatype, MPI_Comm, MPI_Request *);
    static fn f;
    if (f == NULL)
        f = (fn)next("MPI_Ineighbor_alltoallv");
    double t0 = now();
    int rc_ = f(sb, sc, sd, st, rb, rc, rd, rt, comm, req);
    opened(*req, bucket(sc, outdegree(comm), st), t0);
    return rc_;
}

#if MPI_VERSION >= 4
int MPI_Ineighbor_alltoallv_c(const void *sb, const MPI_Count sc[], const MPI_Aint sd[], MPI_Datatype st,
                              void *rb, const MPI_Count rc[], const MPI_Aint rd[], MPI_Datatype rt,
                              MPI_Comm comm, MPI_Request *req)
{
    typedef int (*fn)(const void *, const MPI_Count[], const MPI_Aint[], MPI_Datatype, void *,
                      const MPI_Count[], const MPI_Aint[], MPI_Datatype, MPI_Comm, MPI_Request *);
    static fn f;
    if (f == NULL)
        f = (fn)next("MPI_Ineighbor_alltoallv_c");
    double t0 = now();
    int rc_ = f(sb, sc, sd, st, rb, rc, rd, rt, comm, req);
    opened(*req, bucket_of(sc, 1, outdegree(comm), st), t0);
    return rc_;
}
#endif

int MPI_Neighbor_alltoallv(const void *sb, const int sc[], const int sd[], MPI_Datatype st, void *rb,
                           const int rc[], const int rd[], MPI_Datatype rt, MPI_Comm comm)
{
    typedef int (*fn)(const void *, const int[], const int[], MPI_Datatype, void *, const int[],
                      const int[], MPI_Datatype, MPI_Comm);
    static fn f;
    if (f == NULL)
        f = (fn)next("MPI_Neighbor_alltoallv");
    double t0 = now();
    int rc_ = f(sb, sc, sd, st, rb, rc, rd, rt, comm);
    sample(bucket(sc, outdegree(comm), st), t0);
    return rc_;
}

/* The open calls among `reqs` (before the wait: it sets them to MPI_REQUEST_NULL). */
static int mark(int n, const MPI_Request *reqs, int *which)
{
    int m = 0;
    for (int i = 0; i < OPEN; i++) {
        if (open_[i].req == MPI_REQUEST_NULL || open_[i].req == 0)
            continue;
        for (int j = 0; j < n; j++)
            if (reqs[j] == open_[i].req && m < OPEN)
                which[m++] = i;
    }
    return m;
}

static void close_(int m, const int *which)
{
    for (int k = 0; k < m; k++) {
        sample(open_[which[k]].size, open_[which[k]].t0);
        open_[which[k]].req = MPI_REQUEST_NULL;
    }
}

int MPI_Wait(MPI_Request *r, MPI_Status *st)
{
    typedef int (*fn)(MPI_Request *, MPI_Status *);
    static fn f;
    if (f == NULL)
        f = (fn)next("MPI_Wait");
    int which[OPEN], m = mark(1, r, which);
    int rc_ = f(r, st);
    close_(m, which);
    return rc_;
}

int MPI_Waitall(int n, MPI_Request reqs[], MPI_Status st[])
{
    typedef int (*fn)(int, MPI_Request[], MPI_Status[]);
    static fn f;
    if (f == NULL)
        f = (fn)next("MPI_Waitall");
    int which[OPEN], m = mark(n, reqs, which);
    int rc_ = f(n, reqs, st);
    close_(m, which);
    return rc_;
}

static int by_value(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

int MPI_Finalize(void)
{
    int rank = -1;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    for (int k = 0; k < SIZES && sizes[k].us; k++) {
        if (sizes[k].n == 0)
            continue;
        qsort(sizes[k].us, (size_t)sizes[k].n, sizeof(float), by_value);
        fprintf(stderr, "pmpi_timer: rank %d: bytes %lld: calls %d median_us %.3f\n", rank,
                sizes[k].bytes, sizes[k].n, sizes[k].us[sizes[k].n / 2]);
    }
    return ((int (*)(void))next("MPI_Finalize"))();
}
