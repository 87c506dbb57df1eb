/* The PMPI library's matrix (tests/test_pmpi.py runs it under the library at 1-8 ranks, on
 * real and virtual nodes): every named type x operation x count x in place or not, on
 * MPI_COMM_WORLD and on communicators made and freed as it goes (dup, split, a split that
 * leaves ranks out), compared element by element with the reduction computed here.  Values
 * are small integers, so every order of combination gives the same bits.  Also barriers, calls of size 0 and past the core's payload (which go to MPI), a user
 * operation and a derived type (MPI), and an intercommunicator.  Prints "matrix ok: N checks"
 * on rank 0, or the first difference on the rank that saw it (exit 1). */
#include <mpi.h>
#include <complex.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long checks;
static int rank, size;

#define FAIL(...) do { fprintf(stderr, "rank %d: ", rank); fprintf(stderr, __VA_ARGS__); \
                       fprintf(stderr, "\n"); MPI_Abort(MPI_COMM_WORLD, 1); } while (0)

typedef struct { MPI_Datatype t; size_t size; const char *name; int integer, cplx; } tinfo;
static const tinfo types[] = {
    {MPI_DOUBLE, 8, "double", 0, 0}, {MPI_FLOAT, 4, "float", 0, 0}, {MPI_INT, 4, "int", 1, 0},
    {MPI_LONG, sizeof(long), "long", 1, 0}, {MPI_LONG_LONG, 8, "long long", 1, 0},
    {MPI_INT64_T, 8, "int64_t", 1, 0}, {MPI_INT32_T, 4, "int32_t", 1, 0},
    {MPI_UNSIGNED, 4, "unsigned", 1, 0}, {MPI_UNSIGNED_LONG, sizeof(long), "unsigned long", 1, 0},
    {MPI_UINT64_T, 8, "uint64_t", 1, 0}, {MPI_SHORT, 2, "short", 1, 0},
    {MPI_UNSIGNED_SHORT, 2, "unsigned short", 1, 0}, {MPI_SIGNED_CHAR, 1, "signed char", 1, 0},
    {MPI_UNSIGNED_CHAR, 1, "unsigned char", 1, 0}, {MPI_INT8_T, 1, "int8_t", 1, 0},
    {MPI_UINT16_T, 2, "uint16_t", 1, 0},
    {MPI_C_DOUBLE_COMPLEX, 16, "double complex", 0, 1}};
static const struct { MPI_Op op; const char *name; int ints_only, real_only; } ops[] = {
    {MPI_SUM, "sum", 0, 0}, {MPI_PROD, "prod", 0, 0}, {MPI_MIN, "min", 0, 1}, {MPI_MAX, "max", 0, 1},
    {MPI_LAND, "land", 1, 0}, {MPI_LOR, "lor", 1, 0}, {MPI_LXOR, "lxor", 1, 0},
    {MPI_BAND, "band", 1, 0}, {MPI_BOR, "bor", 1, 0}, {MPI_BXOR, "bxor", 1, 0}};

/* element i of rank r: small numbers, so that sums and products of up to 8 ranks are exact
 * in any order of combination (integer types wrap as the MPI's do) */
static double complex value(const tinfo *t, int i, int r, int salt)
{
    int v = (i * 7 + r * 3 + salt) % 5 + (r == (i % 3) ? 0 : 1);
    if (t->t == MPI_DOUBLE) return v - 1.5 * (i % 2);
    if (t->t == MPI_FLOAT) return v - (i % 2);
    if (t->cplx) return v + (double)(i % 3) * I;
    return v;
}

static void store(void *buf, const tinfo *t, int i, double complex v)
{
    if (t->t == MPI_DOUBLE) ((double *)buf)[i] = creal(v);
    else if (t->t == MPI_FLOAT) ((float *)buf)[i] = (float)creal(v);
    else if (t->cplx) ((double complex *)buf)[i] = v;
    else if (t->size == 8) ((int64_t *)buf)[i] = (int64_t)creal(v);
    else if (t->size == 4) ((int32_t *)buf)[i] = (int32_t)(int64_t)creal(v);
    else if (t->size == 2) ((int16_t *)buf)[i] = (int16_t)(int64_t)creal(v);
    else ((int8_t *)buf)[i] = (int8_t)(int64_t)creal(v);
}

static void fill(void *buf, const tinfo *t, int n, int r, int salt)
{
    for (int i = 0; i < n; i++)
        store(buf, t, i, value(t, i, r, salt));
}

/* The reduction over `nranks` ranks, computed here (not by MPI): in double complex for the
 * floating types, in int64 for the integer ones (stored truncated: the wrap of the type). */
static void expect(void *buf, const tinfo *t, int oi, int n, int nranks, int salt)
{
    for (int i = 0; i < n; i++) {
        double complex acc = value(t, i, 0, salt);
        int64_t a = (int64_t)creal(acc);
        for (int r = 1; r < nranks; r++) {
            double complex x = value(t, i, r, salt);
            int64_t b = (int64_t)creal(x);
            switch (oi) {
            case 0: acc += x; a += b; break;
            case 1: acc *= x; a *= b; break;
            case 2: acc = creal(x) < creal(acc) ? x : acc; a = b < a ? b : a; break;
            case 3: acc = creal(x) > creal(acc) ? x : acc; a = b > a ? b : a; break;
            case 4: a = a && b; break;
            case 5: a = a || b; break;
            case 6: a = !a != !b; break;
            case 7: a &= b; break;
            case 8: a |= b; break;
            default: a ^= b; break;
            }
        }
        store(buf, t, i, t->integer ? (double complex)a : acc);
    }
}

static void check_allreduce(MPI_Comm comm, const char *where, int n, int ti, int oi, int in_place)
{
    const tinfo *t = &types[ti];
    int r, nranks;
    MPI_Comm_rank(comm, &r);
    MPI_Comm_size(comm, &nranks);
    size_t bytes = (size_t)n * t->size + 1;
    char *a = malloc(bytes), *b = malloc(bytes), *ref = malloc(bytes);
    fill(a, t, n, r, oi + ti);
    expect(ref, t, oi, n, nranks, oi + ti);
    memset(b, 0x5a, bytes);
    int rc;
    if (in_place) {
        memcpy(b, a, bytes - 1);
        rc = MPI_Allreduce(MPI_IN_PLACE, b, n, t->t, ops[oi].op, comm);
    } else {
        rc = MPI_Allreduce(a, b, n, t->t, ops[oi].op, comm);
    }
    if (rc != MPI_SUCCESS)
        FAIL("%s: MPI_Allreduce returned %d", where, rc);
    if (memcmp(b, ref, (size_t)n * t->size) != 0)
        FAIL("%s: %s %s count %d%s: result differs from the expected one", where, t->name,
             ops[oi].name, n, in_place ? " in place" : "");
    if ((unsigned char)b[(size_t)n * t->size] != 0x5a)
        FAIL("%s: %s %s count %d: wrote past the buffer", where, t->name, ops[oi].name, n);
    free(a), free(b), free(ref);
    checks++;
}

static void sweep(MPI_Comm comm, const char *where, int full)
{
    static const int counts[] = {1, 2, 3, 12, 13, 100, 256, 257, 1000, 5000};
    int ncounts = full ? 10 : 4;
    for (int ti = 0; ti < (int)(sizeof types / sizeof types[0]); ti++)
        for (int oi = 0; oi < (int)(sizeof ops / sizeof ops[0]); oi++) {
            if ((ops[oi].ints_only && !types[ti].integer) || (ops[oi].real_only && types[ti].cplx))
                continue;
            for (int ci = 0; ci < ncounts; ci++)
                check_allreduce(comm, where, counts[ci], ti, oi, (ci + oi) % 2);
        }
    if (MPI_Barrier(comm) != MPI_SUCCESS)
        FAIL("%s: MPI_Barrier failed", where);
}

static void user_sum(void *in, void *inout, int *len, MPI_Datatype *t)
{
    int k = *t == MPI_DOUBLE ? 1 : 2;   /* a double, or a pair of them */
    for (int i = 0; i < k * *len; i++)
        ((double *)inout)[i] += ((double *)in)[i];
}

int main(int argc, char **argv)
{
    int provided, level = MPI_THREAD_FUNNELED, quick = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "multiple") == 0)   /* at MPI_THREAD_MULTIPLE */
            level = MPI_THREAD_MULTIPLE;
        if (strcmp(argv[i], "quick") == 0)      /* fewer counts and communicators (8 ranks) */
            quick = 1;
    }
    MPI_Init_thread(&argc, &argv, level, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int i = 0; i < 6; i++)   /* past the library's set-up (HYBRIDMPI_PMPI_AFTER) */
        MPI_Barrier(MPI_COMM_WORLD);
    sweep(MPI_COMM_WORLD, "world", !quick);
    /* churn: communicators made, used and freed, interleaved with world */
    for (int k = 0; k < (quick ? 4 : 12); k++) {
        MPI_Comm dup, half;
        MPI_Comm_dup(MPI_COMM_WORLD, &dup);
        MPI_Comm_split(MPI_COMM_WORLD, (rank + k) % 2, size - rank, &half);
        for (int i = 0; i < 7; i++) {
            MPI_Barrier(dup);
            MPI_Barrier(half);
        }
        sweep(k % 3 ? dup : half, k % 3 ? "dup" : "split", 0);
        check_allreduce(MPI_COMM_WORLD, "world between", 5, 0, 0, 1);
        if (k % 2)
            MPI_Comm_free(&dup);
        else
            MPI_Comm_free(&half);
        if (k % 2)
            MPI_Comm_free(&half);
        else
            MPI_Comm_free(&dup);
    }
    /* a split that leaves the odd ranks out */
    MPI_Comm evens;
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2 ? MPI_UNDEFINED : 0, rank, &evens);
    if (evens != MPI_COMM_NULL) {
        for (int i = 0; i < 6; i++)
            MPI_Barrier(evens);
        sweep(evens, "evens", 0);
        MPI_Comm_free(&evens);
    }
    /* what goes to MPI: count 0, a user operation, a derived type, an intercommunicator */
    double x = rank + 1, y = 0;
    MPI_Allreduce(&x, &y, 0, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Op op;
    MPI_Op_create(user_sum, 1, &op);
    MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, op, MPI_COMM_WORLD);
    if (y != size * (size + 1) / 2.0)
        FAIL("user op: %g", y);
    MPI_Datatype pair;
    MPI_Type_contiguous(2, MPI_DOUBLE, &pair);
    MPI_Type_commit(&pair);
    double p[2] = {x, 2 * x}, q[2];
    MPI_Allreduce(p, q, 1, pair, op, MPI_COMM_WORLD);
    MPI_Op_free(&op);
    if (q[0] != size * (size + 1) / 2.0 || q[1] != size * (size + 1.0))
        FAIL("derived type: %g %g", q[0], q[1]);
    MPI_Type_free(&pair);
    checks += 3;
    if (size >= 2) {
        MPI_Comm local, inter;
        MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &local);
        MPI_Intercomm_create(local, 0, MPI_COMM_WORLD, rank % 2 ? 0 : 1, 7, &inter);
        for (int i = 0; i < 8; i++) {
            MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, inter);
            MPI_Barrier(inter);
        }
        MPI_Comm_free(&inter);
        MPI_Comm_free(&local);
        checks++;
    }
    long all;
    PMPI_Allreduce(&checks, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        printf("matrix ok: %ld checks\n", all);
    MPI_Finalize();
    return 0;
}
