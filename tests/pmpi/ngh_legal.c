/* Legal programs (and two erroneous ones) that broke the PMPI library's neighbourhood
 * collectives once: run with and without the library (tests/test_pmpi.py), each rank's output
 * compared.  Every receive buffer is checked element by element against what the standard
 * says; rank 0 prints "ngh_legal CASE ok" when every rank agrees (a plain PMPI_Allreduce of
 * the verdicts), else each rank names what it saw wrong on stderr and the exit code is 1.
 *
 *   threadfree  a thread waits on a pending MPI_Ineighbor_alltoall while the main thread
 *               frees its communicator (MPI_THREAD_MULTIPLE)
 *   typefree    a vector type freed right after posting, a contiguous type made at once
 *               (it may get the freed handle), then the wait; then a call with a type of other
 *               layout made under a freed type's handle (the plan of the old one must not serve)
 *   outstanding 40 calls posted (1 KB and 40 KB edges); an even rank then blocks in a receive
 *               from its odd partner, which sends once its own calls completed: no hang, right
 *               values
 *   huge        one edge of 2^28 + 16 doubles (more than 2 GiB) and a small self edge, with
 *               MPI_DOUBLE and with a packed type of one double, MPI_ERRORS_RETURN; and (MPI-4)
 *               one of 2^31 + 16 bytes by MPI_Neighbor_alltoallv_c
 *   straddle    (erroneous) counts that differ on an edge across the staging limit, each way
 *               (12,400 bytes sent, 12,000 expected, and 12,000 sent, 12,400 expected), and
 *               across a slot that is busy: every rank completes every call; each prints
 *               "rank R: call K: error" or "rank R: call K: ok"
 *   statuses    (library only: HYBRIDMPI_PMPI_TIMEOUT=1) Waitsome over two of the library's
 *               calls that failed and two plain requests that did not: every returned status's
 *               MPI_ERROR is set (MPI_SUCCESS for the plain ones)
 */
#include <mpi.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int rank, size, bad;

#define CHECK(cond, ...)                                                                       \
    do {                                                                                       \
        if (!(cond) && bad++ < 5) {                                                            \
            fprintf(stderr, "ngh_legal: rank %d: ", rank);                                     \
            fprintf(stderr, __VA_ARGS__);                                                      \
            fprintf(stderr, "\n");                                                             \
        }                                                                                      \
    } while (0)

static double val(int call, int from, int to, long i) { return call * 1e6 + from * 1e4 + to * 100 + (double)(i % 97); }

/* A ring in both directions (each rank's left and right; at 2 ranks the peer twice). */
static MPI_Comm ring(void)
{
    int nb[2] = {(rank + size - 1) % size, (rank + 1) % size};
    MPI_Comm g;
    MPI_Dist_graph_create_adjacent(MPI_COMM_WORLD, 2, nb, MPI_UNWEIGHTED, 2, nb, MPI_UNWEIGHTED,
                                   MPI_INFO_NULL, 0, &g);
    return g;
}

/* What rank `rank` gets in block j of a ring call `call` of n doubles a block. */
static void check_ring(const double *r, int n, int call, const char *what)
{
    int nb[2] = {(rank + size - 1) % size, (rank + 1) % size};
    for (int j = 0; j < 2; j++) {
        /* block j came from nb[j], which sent it as its block towards this rank: its index of
         * this rank among its destinations, the k-th repeated edge matching the k-th */
        int k = size == 2 ? j : 1 - j;
        for (int i = 0; i < n; i++)
            if (r[j * n + i] != val(call, nb[j], k, i)) {
                CHECK(0, "%s: call %d block %d [%d] is %g, not %g", what, call, j, i, r[j * n + i],
                      val(call, nb[j], k, i));
                return;
            }
    }
}

static void fill_ring(double *s, int n, int call)
{
    for (int j = 0; j < 2; j++)
        for (int i = 0; i < n; i++)
            s[j * n + i] = val(call, rank, j, i);
}

/* ------------------------------------------------------------------ threadfree */

static MPI_Request pending;
static void *waiter(void *arg)
{
    (void)arg;
    MPI_Wait(&pending, MPI_STATUS_IGNORE);
    return NULL;
}

static void threadfree(void)
{
    int provided;
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_MULTIPLE) {
        CHECK(0, "threadfree: MPI_THREAD_MULTIPLE not provided");
        return;
    }
    for (int it = 0; it < 50; it++) {
        MPI_Comm g = ring();
        int n = 64 + it;
        double *s = malloc(sizeof(double) * 2 * n), *r = calloc(2 * (size_t)n, sizeof(double));
        fill_ring(s, n, it);
        if (rank % 2 && it % 2)
            usleep(20000);   /* (a peer posts late: the waiting thread is inside its wait) */
        MPI_Ineighbor_alltoall(s, n, MPI_DOUBLE, r, n, MPI_DOUBLE, g, &pending);
        pthread_t t;
        pthread_create(&t, NULL, waiter, NULL);
        if (it % 2)
            usleep(200);
        MPI_Comm_free(&g);   /* (legal: the pending call completes as if it were not freed) */
        pthread_join(t, NULL);
        check_ring(r, n, it, "threadfree");
        free(s);
        free(r);
    }
}

/* ------------------------------------------------------------------ typefree */

static void typefree(void)
{
    MPI_Comm g = ring();
    enum { N = 40 };   /* elements a block; a vector of stride 2: every other double */
    for (int it = 0; it < 20; it++) {
        double s[2 * N], r[4 * N], s2[2 * N];
        for (int i = 0; i < 4 * N; i++)
            r[i] = -1;
        fill_ring(s, N, it);
        MPI_Datatype vec, other;
        MPI_Type_vector(N, 1, 2, MPI_DOUBLE, &vec);   /* block j of r: r[2jN + 2i] */
        MPI_Type_commit(&vec);
        MPI_Request q;
        MPI_Datatype rtype = vec;
        MPI_Aint lb, ext;
        MPI_Type_get_extent(vec, &lb, &ext);
        MPI_Datatype rs;
        MPI_Type_create_resized(vec, 0, 2 * N * sizeof(double), &rs);   /* blocks 2N apart */
        MPI_Type_commit(&rs);
        MPI_Type_free(&vec);
        rtype = rs;
        MPI_Ineighbor_alltoall(s, N, MPI_DOUBLE, r, 1, rtype, g, &q);
        MPI_Type_free(&rs);   /* right after posting: legal */
        MPI_Type_contiguous(3, MPI_DOUBLE, &other);   /* may get the freed handle */
        MPI_Type_commit(&other);
        MPI_Wait(&q, MPI_STATUS_IGNORE);
        int nb[2] = {(rank + size - 1) % size, (rank + 1) % size};
        for (int j = 0; j < 2; j++) {
            int k = size == 2 ? j : 1 - j;
            for (int i = 0; i < N; i++) {
                CHECK(r[2 * j * N + 2 * i] == val(it, nb[j], k, i), "typefree: call %d block %d [%d] is %g", it,
                      j, i, r[2 * j * N + 2 * i]);
                CHECK(r[2 * j * N + 2 * i + 1] == -1, "typefree: call %d: a gap written", it);
            }
        }
        /* a call whose type has another layout (the odd doubles) but the same size and extent,
         * under what may be the freed type's handle: the old plan must not serve it */
        MPI_Type_free(&other);
        int disp[N];
        for (int i = 0; i < N; i++)
            disp[i] = 2 * i + 1;
        MPI_Datatype odd, odd_rs;
        MPI_Type_create_indexed_block(N, 1, disp, MPI_DOUBLE, &odd);
        MPI_Type_create_resized(odd, 0, 2 * N * sizeof(double), &odd_rs);
        MPI_Type_commit(&odd_rs);
        MPI_Type_free(&odd);
        for (int i = 0; i < 4 * N; i++)
            r[i] = -1;
        fill_ring(s2, N, it + 100);
        MPI_Neighbor_alltoall(s2, N, MPI_DOUBLE, r, 1, odd_rs, g);
        for (int j = 0; j < 2; j++) {
            int k = size == 2 ? j : 1 - j;
            for (int i = 0; i < N; i++) {
                CHECK(r[2 * j * N + 2 * i + 1] == val(it + 100, nb[j], k, i),
                      "typefree: call %d, the odd type: block %d [%d] is %g", it, j, i, r[2 * j * N + 2 * i + 1]);
                CHECK(r[2 * j * N + 2 * i] == -1, "typefree: call %d, the odd type: an even double written", it);
            }
        }
        MPI_Type_free(&odd_rs);
    }
    MPI_Comm_free(&g);
}

/* ------------------------------------------------------------------ outstanding */

static void outstanding(void)
{
    MPI_Comm g = ring();
    enum { CALLS = 40 };
    for (int big = 0; big < 2; big++) {
        int n = big ? 5000 : 128;   /* 40 KB or 1 KB a block */
        double *s = malloc(sizeof(double) * 2 * n * CALLS), *r = malloc(sizeof(double) * 2 * n * CALLS);
        MPI_Request q[CALLS];
        for (int c = 0; c < CALLS; c++) {
            fill_ring(s + 2 * n * c, n, c + 10 * big);
            MPI_Ineighbor_alltoall(s + 2 * n * c, n, MPI_DOUBLE, r + 2 * n * c, n, MPI_DOUBLE, g, &q[c]);
        }
        /* blocking point-to-point before a wait: an even rank receives from its odd partner,
         * which sends only once its own calls completed */
        int partner = rank ^ 1, token = rank, got = -1;
        if (partner < size && rank % 2 == 0) {
            MPI_Recv(&got, 1, MPI_INT, partner, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            CHECK(got == partner, "outstanding: the token is %d", got);
        }
        if (big) {
            MPI_Waitall(CALLS, q, MPI_STATUSES_IGNORE);
        } else {
            for (int c = CALLS - 1; c >= 0; c--)   /* (in reverse) */
                MPI_Wait(&q[c], MPI_STATUS_IGNORE);
        }
        if (partner < size && rank % 2)
            MPI_Send(&token, 1, MPI_INT, partner, 7, MPI_COMM_WORLD);
        for (int c = 0; c < CALLS; c++)
            check_ring(r + 2 * n * c, n, c + 10 * big, big ? "outstanding 40 KB" : "outstanding 1 KB");
        free(s);
        free(r);
    }
    MPI_Comm_free(&g);
}

/* ------------------------------------------------------------------ huge */

static void huge(void)
{
    if (size != 2) {
        CHECK(0, "huge: run it at 2 ranks");
        return;
    }
    /* rank 0 -> rank 1: N doubles; each rank -> itself: 10 */
    const int N = (1 << 28) + 16;
    int src[2], dst[2], nin = 0, nout = 0;
    dst[nout++] = rank;
    src[nin++] = rank;
    if (rank == 0)
        dst[nout++] = 1;
    else
        src[nin++] = 0;
    MPI_Comm g;
    MPI_Dist_graph_create_adjacent(MPI_COMM_WORLD, nin, src, MPI_UNWEIGHTED, nout, dst, MPI_UNWEIGHTED,
                                   MPI_INFO_NULL, 0, &g);
    MPI_Comm_set_errhandler(g, MPI_ERRORS_RETURN);
    double *big = malloc(sizeof(double) * ((size_t)N + 10));
    if (big == NULL) {
        CHECK(0, "huge: no memory");
        return;
    }
    MPI_Datatype one;   /* one double, packed by the library (an hindexed type) */
    int bl = 1;
    MPI_Aint at = 0;
    MPI_Type_create_hindexed(1, &bl, &at, MPI_DOUBLE, &one);
    MPI_Type_commit(&one);
    for (int packed = 0; packed < 2; packed++) {
        MPI_Datatype t = packed ? one : MPI_DOUBLE;
        int sc[2] = {10, N}, sd[2] = {0, 10}, rc[2] = {10, N}, rd[2] = {0, 10};
        double self[10], mine[10];
        for (int i = 0; i < 10; i++)
            self[i] = val(packed, rank, rank, i), mine[i] = -1;
        if (rank == 0) {
            for (long i = 0; i < N; i++)
                big[10 + i] = (double)(i % 1000003);
            memcpy(big, self, sizeof self);
            int rc_ = MPI_Neighbor_alltoallv(big, sc, sd, t, mine, rc, rd, t, g);
            CHECK(rc_ == MPI_SUCCESS, "huge: rank 0's call returned %d", rc_);
        } else {
            memset(big, 0, sizeof(double) * ((size_t)N + 10));
            int rcv[2] = {10, N}, rdv[2] = {0, 10};
            int rc_ = MPI_Neighbor_alltoallv(self, sc, sd, t, big, rcv, rdv, t, g);
            CHECK(rc_ == MPI_SUCCESS, "huge: rank 1's call returned %d", rc_);
            memcpy(mine, big, sizeof mine);
            long wrong = 0;
            for (long i = 0; i < N; i++)
                wrong += big[10 + i] != (double)(i % 1000003);
            CHECK(wrong == 0, "huge (%s): %ld of the 2 GiB edge's doubles wrong", packed ? "packed" : "double",
                  wrong);
        }
        for (int i = 0; i < 10; i++)
            CHECK(mine[i] == self[i], "huge (%s): the self edge's [%d] is %g", packed ? "packed" : "double", i,
                  mine[i]);
    }
#if MPI_VERSION >= 4
    {   /* the _c form: 2^31 + 16 bytes on the edge, a count past 2^31 - 1 */
        const MPI_Count NB = ((MPI_Count)1 << 31) + 16;
        MPI_Count sc[2] = {10, NB}, rc[2] = {10, NB};
        MPI_Aint sd[2] = {0, 16}, rd[2] = {0, 16};
        char self[10], mine[10];
        unsigned char *b = (unsigned char *)big;
        for (int i = 0; i < 10; i++)
            self[i] = (char)(rank * 10 + i), mine[i] = -1;
        int rc_;
        if (rank == 0) {
            for (MPI_Count i = 0; i < NB; i++)
                b[16 + i] = (unsigned char)(i % 251);
            memcpy(b, self, sizeof self);
            rc_ = MPI_Neighbor_alltoallv_c(b, sc, sd, MPI_BYTE, mine, rc, rd, MPI_BYTE, g);
        } else {
            memset(b, 0, (size_t)NB + 16);
            rc_ = MPI_Neighbor_alltoallv_c(self, sc, sd, MPI_BYTE, b, rc, rd, MPI_BYTE, g);
            memcpy(mine, b, sizeof mine);
            long wrong = 0;
            for (MPI_Count i = 0; i < NB; i++)
                wrong += b[16 + i] != (unsigned char)(i % 251);
            CHECK(wrong == 0, "huge (_c, bytes): %ld of the edge's bytes wrong", wrong);
        }
        CHECK(rc_ == MPI_SUCCESS, "huge (_c): rank %d's call returned %d", rank, rc_);
        for (int i = 0; i < 10; i++)
            CHECK(mine[i] == self[i], "huge (_c): the self edge's [%d] is %d", i, mine[i]);
    }
#endif
    MPI_Type_free(&one);
    free(big);
    MPI_Comm_free(&g);
}

/* ------------------------------------------------------------------ straddle (erroneous) */

static void straddle(void)
{
    if (size != 2) {
        CHECK(0, "straddle: run it at 2 ranks");
        return;
    }
    int peer = 1 - rank;
    MPI_Comm g;
    MPI_Dist_graph_create_adjacent(MPI_COMM_WORLD, 1, &peer, MPI_UNWEIGHTED, 1, &peer, MPI_UNWEIGHTED,
                                   MPI_INFO_NULL, 0, &g);
    MPI_Comm_set_errhandler(g, MPI_ERRORS_RETURN);
    /* (Open MPI reports a failed generalized request through MPI_COMM_WORLD's handler) */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    /* bytes sent by rank 0 and received by rank 1, and back; a call of each kind, then the same
     * with 20 matching calls outstanding first (the slots busy: buffered messages) */
    static const int cases[][2] = {{12400, 12000}, {12000, 12400}, {800, 400}, {400, 800}, {40000, 400},
                                   {400, 40000}};
    int ncase = (int)(sizeof cases / sizeof cases[0]), call = 0;
    char *s = malloc(40000), *r = malloc(40000 + 64);
    memset(s, 1, 40000);
    for (int busy = 0; busy < 2; busy++)
        for (int c = 0; c < ncase; c++, call++) {
            MPI_Request q[21];
            int nq = 0;
            char sm[16][64], rm[16][64];
            for (int k = 0; busy && k < 16; k++)   /* (matching, never waited for until after) */
                MPI_Ineighbor_alltoall(sm[k], 64, MPI_BYTE, rm[k], 64, MPI_BYTE, g, &q[nq++]);
            int sent = cases[c][0], expect = cases[c][1];   /* (both ranks: both edges differ) */
            int rc_ = MPI_Ineighbor_alltoallv(s, &sent, (int[]){0}, MPI_BYTE, r, &expect, (int[]){0}, MPI_BYTE, g,
                                              &q[nq++]);
            int err = rc_ != MPI_SUCCESS;
            for (int k = 0; k < nq; k++) {
                int rk = MPI_Wait(&q[k], MPI_STATUS_IGNORE);
                if (k < nq - 1)
                    CHECK(rk == MPI_SUCCESS, "straddle: call %d: a matching call before it failed", call);
                else
                    err |= rk != MPI_SUCCESS;
            }
            fprintf(stderr, "ngh_legal straddle: rank %d: call %d: %s\n", rank, call, err ? "error" : "ok");
        }
    free(s);
    free(r);
    MPI_Comm_free(&g);
}

/* ------------------------------------------------------------------ statuses (library only) */

static void statuses(void)
{
    MPI_Comm g = ring();
    MPI_Comm_set_errhandler(g, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);   /* (Open MPI: greqs' errors) */
    double s[4] = {1, 2, 3, 4}, r[4];
    MPI_Request q[4];
    if (rank == 0) {
        /* two calls its peers post only after 3 s: a third one's wait times out
         * (HYBRIDMPI_PMPI_TIMEOUT=1) and the two fail with it */
        MPI_Request third;
        double s3[4], r3[4];
        MPI_Ineighbor_alltoall(s, 2, MPI_DOUBLE, r, 2, MPI_DOUBLE, g, &q[2]);
        MPI_Ineighbor_alltoall(s, 2, MPI_DOUBLE, r, 2, MPI_DOUBLE, g, &q[3]);
        MPI_Ineighbor_alltoall(s3, 2, MPI_DOUBLE, r3, 2, MPI_DOUBLE, g, &third);
        int rc3 = MPI_Wait(&third, MPI_STATUS_IGNORE);
        CHECK(rc3 != MPI_SUCCESS, "statuses: the third call did not fail");
        int a = 5, b = 0;
        MPI_Irecv(&b, 1, MPI_INT, 0, 3, MPI_COMM_SELF, &q[1]);
        MPI_Isend(&a, 1, MPI_INT, 0, 3, MPI_COMM_SELF, &q[0]);
        usleep(100000);   /* (both plain requests complete) */
        MPI_Status st[4];
        int idx[4], out = 0, done = 0;
        while (done < 4) {
            for (int k = 0; k < 4; k++)
                st[k].MPI_ERROR = 12345;
            int rc = MPI_Waitsome(4, q, &out, idx, st);
            if (out == MPI_UNDEFINED)
                break;
            for (int k = 0; k < out; k++) {
                CHECK(st[k].MPI_ERROR != 12345, "statuses: Waitsome (rc %d) left status %d (request %d) unwritten",
                      rc, k, idx[k]);
                CHECK((idx[k] >= 2) == (st[k].MPI_ERROR != MPI_SUCCESS),
                      "statuses: request %d's status says %d", idx[k], st[k].MPI_ERROR);
            }
            done += out;
        }
        CHECK(b == 5, "statuses: the plain receive got %d", b);
    } else {
        sleep(3);
        for (int k = 0; k < 3; k++) {
            MPI_Request x;
            if (MPI_Ineighbor_alltoall(s, 2, MPI_DOUBLE, r, 2, MPI_DOUBLE, g, &x) == MPI_SUCCESS)
                MPI_Wait(&x, MPI_STATUS_IGNORE);
        }
    }
    MPI_Comm_free(&g);
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int failed = 0;
    for (int a = 1; a < argc; a++) {
        bad = 0;
        const char *c = argv[a];
        if (!strcmp(c, "threadfree"))
            threadfree();
        else if (!strcmp(c, "typefree"))
            typefree();
        else if (!strcmp(c, "outstanding"))
            outstanding();
        else if (!strcmp(c, "huge"))
            huge();
        else if (!strcmp(c, "straddle"))
            straddle();
        else if (!strcmp(c, "statuses"))
            statuses();
        else
            CHECK(0, "no case %s", c);
        int all = 0;
        PMPI_Allreduce(&bad, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        if (rank == 0)
            printf(all ? "ngh_legal %s FAILED\n" : "ngh_legal %s ok\n", c);
        fflush(stdout);
        failed |= all != 0;
    }
    MPI_Finalize();
    return failed;
}
