/* Programs that try to break the PMPI library (tests/test_pmpi.py), one per argument:
 *   progress  rank 0 is in MPI_Ssend to rank 1 while rank 1 is in MPI_Allreduce on another
 *             communicator, whose last rank joins only once that Ssend completed: the wait
 *             must drive MPI's progress, or the three wait for each other forever (with a
 *             message unexpected at rank 1 all along, which a probe must not match);
 *   rma       passive-target RMA (lock, put, unlock) aimed at ranks that sit in the library's
 *             barrier and allreduce;
 *   threads   MPI_THREAD_MULTIPLE: every thread reduces and synchronizes on its own
 *             communicator, all at once;
 *   kill      the last rank ends (SIGKILL) inside the run of allreduces; the others must not
 *             hang (the launcher ends the job, or the library reports it through the
 *             communicator's error handler);
 *   mismatch [R [F]]  rank R (default 0) calls MPI_Barrier where the others call MPI_Allreduce
 *             (an erroneous program; F = 1: an allreduce of no element where the others reduce
 *             one; F = 2: of no element where the others are in MPI_Barrier): the library
 *             reports it on every rank instead of hanging or returning garbage (a rank that is
 *             not its node's leader too);
 *   late      (with HYBRIDMPI_PMPI_TIMEOUT) the last rank calls MPI_Allreduce seconds after the
 *             others: each rank's call fails at the timeout (between the nodes too, where a
 *             leader waits on another node's), through the error handler, and nothing hangs;
 *             the late rank's own call may complete, with the right sum, where every other
 *             part had come before the others timed out;
 *   fallback  (with HYBRIDMPI_PMPI_FAIL_RANK) one rank's set-up fails: all ranks go on with
 *             MPI, with correct results.
 *   errhandlers  MPI_ERRORS_RETURN on MPI_COMM_WORLD, the library set up: errors with no
 *             communicator (MPI_Type_size of MPI_DATATYPE_NULL, MPI_Barrier of MPI_COMM_NULL)
 *             return a code as they do without it, and MPI_COMM_SELF's handler is unset;
 *   comms     MPI_ERRORS_RETURN, then MPI_Comm_dup until MPI runs out, each new communicator
 *             used (the library sets it up): prints how many the program got ("comms N");
 *   buffers   erroneous buffers (none, or send == recv without MPI_IN_PLACE): prints the codes
 *             (the test compares them with MPI's own);
 *   churn     dup, 8 allreduces, free, many times: prints the time per cycle;
 *   sessions  (MPI-4) a sessions program, no MPI_Init: a communicator from the WORLD process set,
 *             reduced on many times;
 *   minmax    MPI_MIN and MPI_MAX of doubles and floats, a NaN at each rank position, -0.0 and
 *             +0.0 in every order, beside other values and a NaN, at counts of each of the core's
 *             algorithms, in place and not: bit for bit IEEE 754-2019's minimum and maximum
 *             (computed here); MPI_PROD of MPI_C_DOUBLE_COMPLEX with an infinite part at each
 *             rank position among +-1: C99's product (on MPICH: PMPI_Allreduce's bits).
 * Prints "<case> ok" on rank 0. */
#include <mpi.h>
#include <complex.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int rank, size;
#define CHECK(cond, ...) do { if (!(cond)) { fprintf(stderr, "rank %d: ", rank); \
    fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)

static void warm(MPI_Comm comm)
{
    for (int i = 0; i < 8; i++)
        MPI_Barrier(comm);
}

static double sum_of_ranks(MPI_Comm comm)
{
    int r;
    MPI_Comm_rank(comm, &r);
    double x = r + 1, y = -1;
    MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, comm);
    return y;
}

static void progress(void)
{
    CHECK(size >= 3, "progress needs 3 ranks");
    MPI_Comm other;   /* ranks 1 .. size-1 */
    MPI_Comm_split(MPI_COMM_WORLD, rank == 0 ? MPI_UNDEFINED : 0, rank, &other);
    if (other != MPI_COMM_NULL)
        warm(other);
    /* a message rank 1 receives only at the end lies unexpected in its queue meanwhile: a
     * progress probe that matched it drove no progress in Open MPI (ob1) */
    int early = 7;
    if (rank == 2)
        MPI_Send(&early, 1, MPI_INT, 0, 7, other);
    enum { N = 1 << 20 };
    char *buf = calloc(N, 1);
    for (int round = 0; round < 20; round++) {
        if (rank == 0) {
            MPI_Ssend(buf, N, MPI_CHAR, 1, round, MPI_COMM_WORLD);
            MPI_Send(&round, 1, MPI_INT, size - 1, 100 + round, MPI_COMM_WORLD);
        } else if (rank == 1) {
            MPI_Request req;
            MPI_Irecv(buf, N, MPI_CHAR, 0, round, MPI_COMM_WORLD, &req);
            double y = sum_of_ranks(other);
            CHECK(y == (size - 1) * size / 2.0, "sum %g", y);
            MPI_Wait(&req, MPI_STATUS_IGNORE);
        } else {
            if (rank == size - 1) {
                int got;
                MPI_Recv(&got, 1, MPI_INT, 0, 100 + round, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            }
            double y = sum_of_ranks(other);
            CHECK(y == (size - 1) * size / 2.0, "sum %g", y);
        }
    }
    free(buf);
    if (rank == 1) {
        int got = 0;
        MPI_Recv(&got, 1, MPI_INT, 1, 7, other, MPI_STATUS_IGNORE);
        CHECK(got == 7, "the early message %d", got);
    }
    if (other != MPI_COMM_NULL)
        MPI_Comm_free(&other);
}

static void rma(void)
{
    double *base;
    MPI_Win win;
    MPI_Win_allocate(sizeof(double) * size, sizeof(double), MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
    memset(base, 0, sizeof(double) * size);
    warm(MPI_COMM_WORLD);
    for (int round = 1; round <= 50; round++) {
        int target = (rank + round) % size;
        double v = round * 1000 + rank;
        MPI_Win_lock(MPI_LOCK_SHARED, target, 0, win);
        MPI_Put(&v, 1, MPI_DOUBLE, target, rank, 1, MPI_DOUBLE, win);
        MPI_Win_unlock(target, win);
        double y = sum_of_ranks(MPI_COMM_WORLD);
        CHECK(y == size * (size + 1) / 2.0, "sum %g", y);
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Win_lock(MPI_LOCK_SHARED, rank, 0, win);
        int from = ((rank - round) % size + size) % size;
        CHECK(base[from] == round * 1000 + from, "round %d: put from %d reads %g", round, from, base[from]);
        MPI_Win_unlock(rank, win);
        MPI_Barrier(MPI_COMM_WORLD);
    }
    MPI_Win_free(&win);
}

enum { THREADS = 3 };
static MPI_Comm thread_comm[THREADS];

static void *thread_body(void *arg)
{
    MPI_Comm comm = thread_comm[(long)arg];
    for (int i = 0; i < 3000; i++) {
        long x = rank + 1 + i, y = 0;
        MPI_Allreduce(&x, &y, 1, MPI_LONG, MPI_SUM, comm);
        CHECK(y == (long)size * (size + 1) / 2 + (long)size * i, "thread %ld: %ld", (long)arg, y);
        if (i % 7 == 0)
            MPI_Barrier(comm);
    }
    return NULL;
}

static void threads(int provided)
{
    CHECK(provided == MPI_THREAD_MULTIPLE, "MPI_THREAD_MULTIPLE not provided");
    pthread_t t[THREADS];
    for (int k = 0; k < THREADS; k++)
        MPI_Comm_dup(MPI_COMM_WORLD, &thread_comm[k]);
    for (long k = 0; k < THREADS; k++)
        pthread_create(&t[k], NULL, thread_body, (void *)k);
    for (int k = 0; k < THREADS; k++)
        pthread_join(t[k], NULL);
    for (int k = 0; k < THREADS; k++)
        MPI_Comm_free(&thread_comm[k]);
}

static void kill_one(void)
{
    warm(MPI_COMM_WORLD);
    for (int i = 0; i < 200; i++) {
        if (rank == size - 1 && i == 100)
            raise(SIGKILL);
        sum_of_ranks(MPI_COMM_WORLD);
    }
    CHECK(0, "the allreduces went on without the killed rank");
}

static void mismatch(int odd, int form)
{
    /* ten times, each on a communicator of its own (a failed call revokes it): the mismatch
     * is caught whatever the timing */
    for (int rep = 0; rep < 10; rep++) {
        MPI_Comm comm;
        MPI_Comm_dup(MPI_COMM_WORLD, &comm);
        MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
        warm(comm);
        double x = rank + 1, y = 0;
        for (int i = 0; i < 4; i++)   /* a stale value in every slot */
            MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, comm);
        int rc;
        if (form == 0)
            rc = rank == odd ? MPI_Barrier(comm) : MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, comm);
        else if (form == 1)
            rc = MPI_Allreduce(&x, &y, rank == odd ? 0 : 1, MPI_DOUBLE, MPI_SUM, comm);
        else
            rc = rank == odd ? MPI_Allreduce(&x, &y, 0, MPI_DOUBLE, MPI_SUM, comm) : MPI_Barrier(comm);
        CHECK(rc != MPI_SUCCESS, "rep %d: a barrier met an allreduce and both returned MPI_SUCCESS "
              "(y = %g)", rep, y);
        if (rep == 0) {
            int len;
            char text[MPI_MAX_ERROR_STRING];
            MPI_Error_string(rc, text, &len);
            fprintf(stderr, "rank %d: returned %d (%s)\n", rank, rc, text);
        }
        /* the communicator is revoked: later calls fail at once on every rank, none waits */
        CHECK(MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, comm) != MPI_SUCCESS &&
              MPI_Barrier(comm) != MPI_SUCCESS, "a call after the failure succeeded");
        MPI_Comm_free(&comm);
    }
}

static void late(void)
{
    warm(MPI_COMM_WORLD);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    double x = 1, y;
    if (rank == size - 1)
        sleep(3);
    double t0 = MPI_Wtime();
    int rc = MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    /* the late rank may find every other part there (the others' leaders posted theirs before
     * they timed out): then its call completes, with the right sum; every other rank fails */
    int complete = rc == MPI_SUCCESS && rank == size - 1 && y == size;
    CHECK(rc != MPI_SUCCESS || complete, "an allreduce whose last rank came 3 s late (timeout 1 s) "
          "succeeded on a rank that was on time, or with a wrong sum (%g)", y);
    fprintf(stderr, "rank %d: returned %d after %.1f s\n", rank, rc, MPI_Wtime() - t0);
}

static void fallback(void)
{
    warm(MPI_COMM_WORLD);
    for (int i = 0; i < 100; i++) {
        double y = sum_of_ranks(MPI_COMM_WORLD);
        CHECK(y == size * (size + 1) / 2.0, "sum %g", y);
    }
}

static void errhandlers(void)
{
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    warm(MPI_COMM_WORLD);
    for (int i = 0; i < 20; i++)
        CHECK(sum_of_ranks(MPI_COMM_WORLD) == size * (size + 1) / 2.0, "sum");
    int n = 0;
    CHECK(MPI_Type_size(MPI_DATATYPE_NULL, &n) != MPI_SUCCESS, "MPI_Type_size(MPI_DATATYPE_NULL)");
    CHECK(MPI_Barrier(MPI_COMM_NULL) != MPI_SUCCESS, "MPI_Barrier(MPI_COMM_NULL)");
    double x = 1, y = 0;
    CHECK(MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_NULL) != MPI_SUCCESS,
          "MPI_Allreduce on MPI_COMM_NULL");
    MPI_Errhandler h;
    MPI_Comm_get_errhandler(MPI_COMM_SELF, &h);
    CHECK(h == MPI_ERRORS_ARE_FATAL, "MPI_COMM_SELF's handler changed");
    MPI_Errhandler_free(&h);
}

static int comm_calls = 7;   /* calls on each new communicator ("comms 0": none, dups only) */

static void comms(void)
{
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    enum { MOST = 70000 };
    MPI_Comm *made = malloc(MOST * sizeof *made);
    int n = 0, ok = 1;
    while (n < MOST && ok) {
        int rc = MPI_Comm_dup(MPI_COMM_WORLD, &made[n]);
        ok = rc == MPI_SUCCESS;   /* every rank fails the same dup: the context id is agreed */
        if (!ok)
            break;
        for (int i = 0; i < comm_calls; i++)
            CHECK(sum_of_ranks(made[n]) == size * (size + 1) / 2.0, "sum on communicator %d", n);
        n++;
    }
    /* what is left still works */
    for (int i = 0; i < 20; i++)
        CHECK(sum_of_ranks(MPI_COMM_WORLD) == size * (size + 1) / 2.0, "sum after");
    for (int i = 0; i < n; i++)
        MPI_Comm_free(&made[i]);
    free(made);
    if (rank == 0)
        printf("comms %d\n", n);
}

static void buffers(void)
{
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    warm(MPI_COMM_WORLD);
    double x[4] = {1, 2, 3, 4};
    int a = MPI_Allreduce(x, NULL, 4, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    int b = MPI_Allreduce(x, x, 4, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    int ca = 0, cb = 0;
    MPI_Error_class(a, &ca);
    MPI_Error_class(b, &cb);
    if (rank == 0)
        printf("buffers: NULL recv class %d, aliased class %d\n", ca, cb);
    for (int i = 0; i < 20; i++)
        CHECK(sum_of_ranks(MPI_COMM_WORLD) == size * (size + 1) / 2.0, "sum after");
}

static void churn(void)
{
    warm(MPI_COMM_WORLD);
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int k = 0; k < 200; k++) {
            MPI_Comm c;
            MPI_Comm_dup(MPI_COMM_WORLD, &c);
            for (int i = 0; i < 8; i++)
                CHECK(sum_of_ranks(c) == size * (size + 1) / 2.0, "sum");
            MPI_Comm_free(&c);
        }
        double t = (MPI_Wtime() - t0) / 200, worst;
        PMPI_Allreduce(&t, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (worst < best)
            best = worst;
    }
    if (rank == 0)
        printf("churn %.2f us per cycle\n", best * 1e6);
}

/* IEEE 754-2019's minimum (maximum with `max`) of a and b, as the library gives it: a NaN met
 * gives the or of the NaNs' bits, quieted; of two zeros -0.0 is the least. */
#define IEEE_MINMAX(T, U, QUIET)                                                        \
    static T ieee_##T(T a, T b, int max)                                                \
    {                                                                                   \
        U ua, ub, r = 0;                                                                \
        memcpy(&ua, &a, sizeof a);                                                      \
        memcpy(&ub, &b, sizeof b);                                                      \
        if (isnan(a) || isnan(b)) {                                                     \
            r = (isnan(a) ? ua : 0) | (isnan(b) ? ub : 0) | (QUIET);                    \
            memcpy(&a, &r, sizeof a);                                                   \
            return a;                                                                   \
        }                                                                               \
        if (a == b && ua != ub)   /* -0.0 and +0.0 */                                    \
            return max ? (T)0.0 : (T)-0.0;                                              \
        return (a < b) != max ? a : b;                                                  \
    }
IEEE_MINMAX(double, uint64_t, UINT64_C(1) << 51)
IEEE_MINMAX(float, uint32_t, UINT32_C(1) << 22)

/* Case e of rank r (the others' values known to every rank): a NaN at one rank position
 * (5, 4, NaN, 1 ...), two NaNs of other bits, zeros of every sign pattern, zeros beside 5
 * and -5, a NaN beside zeros. */
static double minmax_value(int e, int r)
{
    int zeros = 1 << size, n = e % (3 * size + 3 * zeros);
    if (n < size)
        return r == n ? NAN : 5.0 - r;
    if (n < 2 * size) {
        uint64_t bits = UINT64_C(0x7FF8000000000000) | (uint64_t)(r + 1) << 40 |   /* (a float's too) */
                        (uint64_t)(r % 2) << 63;
        double x;
        memcpy(&x, &bits, sizeof x);
        return r == n - size || r == (n - size + 1) % size ? x : 1.0;
    }
    n -= 2 * size;
    if (n < 3 * zeros) {
        int mask = n % zeros, beside = n / zeros;   /* beside 0: zeros only; 1: 5; 2: -5 */
        if (beside && r == mask % size)
            return beside == 1 ? 5.0 : -5.0;
        return mask >> r & 1 ? -0.0 : 0.0;
    }
    n -= 3 * zeros;
    return r == n ? NAN : (r + n) % 2 ? -0.0 : 0.0;
}

#define MINMAX_CHECK(T, MPITYPE)                                                        \
    static void minmax_##T(int count, int max, int in_place, int offset)                \
    {                                                                                   \
        T *x = malloc(count * sizeof *x), *y = malloc(count * sizeof *y);               \
        for (int e = 0; e < count; e++)                                                 \
            x[e] = (T)minmax_value(e + offset, rank);                                   \
        memcpy(y, x, count * sizeof *y);                                                \
        MPI_Allreduce(in_place ? MPI_IN_PLACE : x, y, count, MPITYPE, max ? MPI_MAX : MPI_MIN, \
                      MPI_COMM_WORLD);                                                  \
        for (int e = 0; e < count; e++) {                                               \
            T want = (T)minmax_value(e + offset, 0);                                    \
            for (int r = 1; r < size; r++)                                              \
                want = ieee_##T(want, (T)minmax_value(e + offset, r), max);             \
            CHECK(memcmp(&want, &y[e], sizeof want) == 0, "%s %s of %d, element %d (case %d): " \
                  "%g, not %g", #T, max ? "max" : "min", count, e, e + offset, (double)y[e], \
                  (double)want);                                                        \
        }                                                                               \
        free(x);                                                                        \
        free(y);                                                                        \
    }
MINMAX_CHECK(double, MPI_DOUBLE)
MINMAX_CHECK(float, MPI_FLOAT)

static void minmax(void)
{
    warm(MPI_COMM_WORLD);   /* the library sets up at the 6th call: the rest go to the core */
    int cases = 3 * size + 3 * (1 << size);
    static const int counts[] = {1, 12, 13, 24, 25, 200, 256};
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++)
        for (int offset = 0; offset < cases; offset += counts[k])
            for (int max = 0; max < 2; max++)
                for (int in_place = 0; in_place < 2; in_place++) {
                    minmax_double(counts[k], max, in_place, offset);
                    minmax_float(counts[k], max, in_place, offset);
                }
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len;
    MPI_Get_library_version(version, &len);
    double complex specials[] = {CMPLX(INFINITY, NAN), CMPLX(INFINITY, INFINITY), CMPLX(NAN, INFINITY)};
    for (int k = 0; k < 3; k++)
        for (int p = 0; p < size; p++) {
            double complex x = rank == p ? specials[k] : CMPLX((rank + p) % 2 ? -1.0 : 1.0, 0.0), y, mpi;
            double sign = 1;
            for (int r = 0; r < size; r++)
                sign *= r == p ? 1 : (r + p) % 2 ? -1 : 1;
            MPI_Allreduce(&x, &y, 1, MPI_C_DOUBLE_COMPLEX, MPI_PROD, MPI_COMM_WORLD);
            PMPI_Allreduce(&x, &mpi, 1, MPI_C_DOUBLE_COMPLEX, MPI_PROD, MPI_COMM_WORLD);
            int re_inf = !isnan(creal(specials[k])), im_inf = !isnan(cimag(specials[k]));
            CHECK((re_inf ? creal(y) == sign * INFINITY : isnan(creal(y))) &&
                  (im_inf ? cimag(y) == sign * INFINITY : isnan(cimag(y))),
                  "product %d, special at rank %d: %g%+gi", k, p, creal(y), cimag(y));
            CHECK(strncmp(version, "MPICH", 5) != 0 || memcmp(&y, &mpi, sizeof y) == 0,
                  "product %d, special at rank %d: %g%+gi, MPICH's %g%+gi", k, p, creal(y), cimag(y),
                  creal(mpi), cimag(mpi));
        }
}

#if MPI_VERSION >= 4
static int sessions(void)
{
    MPI_Session session;
    MPI_Group group;
    MPI_Comm comm;
    if (MPI_Session_init(MPI_INFO_NULL, MPI_ERRORS_RETURN, &session) != MPI_SUCCESS)
        return 1;
    CHECK(MPI_Group_from_session_pset(session, "mpi://WORLD", &group) == MPI_SUCCESS, "pset");
    CHECK(MPI_Comm_create_from_group(group, "hybridmpi.cases", MPI_INFO_NULL, MPI_ERRORS_RETURN,
                                     &comm) == MPI_SUCCESS, "comm from group");
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    for (int i = 0; i < 50; i++) {
        double y = sum_of_ranks(comm);
        CHECK(y == size * (size + 1) / 2.0, "sum %g", y);
        CHECK(MPI_Barrier(comm) == MPI_SUCCESS, "barrier");
    }
    MPI_Group_free(&group);
    MPI_Comm_free(&comm);
    if (rank == 0)
        printf("sessions ok\n");
    fflush(stdout);
    MPI_Session_finalize(&session);
    return 0;
}
#endif

int main(int argc, char **argv)
{
    const char *which = argc > 1 ? argv[1] : "";
    if (!strcmp(which, "sessions")) {
#if MPI_VERSION >= 4
        return sessions();
#else
        printf("sessions: this MPI has none\n");
        return 0;
#endif
    }
    int provided;
    MPI_Init_thread(&argc, &argv, strcmp(which, "threads") ? MPI_THREAD_FUNNELED : MPI_THREAD_MULTIPLE,
                    &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (!strcmp(which, "progress"))
        progress();
    else if (!strcmp(which, "rma"))
        rma();
    else if (!strcmp(which, "threads"))
        threads(provided);
    else if (!strcmp(which, "kill"))
        kill_one();
    else if (!strcmp(which, "mismatch"))
        mismatch(argc > 2 ? atoi(argv[2]) : 0, argc > 3 ? atoi(argv[3]) : 0);
    else if (!strcmp(which, "late"))
        late();
    else if (!strcmp(which, "fallback"))
        fallback();
    else if (!strcmp(which, "errhandlers"))
        errhandlers();
    else if (!strcmp(which, "comms")) {
        if (argc > 2)
            comm_calls = atoi(argv[2]);
        comms();
    }
    else if (!strcmp(which, "buffers"))
        buffers();
    else if (!strcmp(which, "churn"))
        churn();
    else if (!strcmp(which, "minmax"))
        minmax();
    else
        CHECK(0, "unknown case '%s'", which);
    if (rank == 0)
        printf("%s ok\n", which);
    MPI_Finalize();
    return 0;
}
