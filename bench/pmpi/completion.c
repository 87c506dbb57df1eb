/* The completion calls' cost on a program's own requests, with and without the PMPI library
 * (bench/pmpi_completion.py runs it both ways, alternating, and takes medians).  2 ranks.
 *
 * Prints one line per measurement, "NAME VALUE" (ns per call, or us per call over the array):
 *   wait_null        MPI_Wait(MPI_REQUEST_NULL), no call of the library pending
 *   pingpong_8, pingpong_65536   half a round trip of Irecv + Isend + MPI_Wait each, in us
 *   testall, testany, testsome   one call over 10,000 of the program's pending receives (never
 *                    matched) while one neighbourhood call is pending (the library's, or MPI's
 *                    own without the library), in us
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { NREQ = 10000, BLOCKS = 15 };

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp);
    return v[n / 2];
}

int main(int argc, char **argv)
{
    int provided, rank;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int peer = 1 - rank;
    double t[BLOCKS];

    /* MPI_Wait on MPI_REQUEST_NULL */
    for (int b = 0; b < BLOCKS; b++) {
        MPI_Request r = MPI_REQUEST_NULL;
        double t0 = MPI_Wtime();
        for (int i = 0; i < 1000000; i++)
            MPI_Wait(&r, MPI_STATUS_IGNORE);
        t[b] = (MPI_Wtime() - t0) * 1e3;   /* ns per call */
    }
    if (rank == 0)
        printf("wait_null %.3f\n", median(t, BLOCKS));

    /* ping-pong through MPI_Wait */
    static char buf[65536], got[65536];
    for (int size = 8; size <= 65536; size *= 8192) {
        for (int b = 0; b < BLOCKS; b++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (int i = 0; i < 2000; i++) {
                MPI_Request rs, rr;
                if (rank == 0) {
                    MPI_Isend(buf, size, MPI_BYTE, peer, 1, MPI_COMM_WORLD, &rs);
                    MPI_Wait(&rs, MPI_STATUS_IGNORE);
                    MPI_Irecv(got, size, MPI_BYTE, peer, 1, MPI_COMM_WORLD, &rr);
                    MPI_Wait(&rr, MPI_STATUS_IGNORE);
                } else {
                    MPI_Irecv(got, size, MPI_BYTE, peer, 1, MPI_COMM_WORLD, &rr);
                    MPI_Wait(&rr, MPI_STATUS_IGNORE);
                    MPI_Isend(buf, size, MPI_BYTE, peer, 1, MPI_COMM_WORLD, &rs);
                    MPI_Wait(&rs, MPI_STATUS_IGNORE);
                }
            }
            t[b] = (MPI_Wtime() - t0) / 4000 * 1e6;
        }
        if (rank == 0)
            printf("pingpong_%d %.3f\n", size, median(t, BLOCKS));
    }

    /* the array calls over 10,000 pending receives, one neighbourhood call pending */
    MPI_Comm g;
    MPI_Dist_graph_create_adjacent(MPI_COMM_WORLD, 1, &peer, MPI_UNWEIGHTED, 1, &peer, MPI_UNWEIGHTED,
                                   MPI_INFO_NULL, 0, &g);
    double s = rank, r = -1;
    MPI_Request ngh = MPI_REQUEST_NULL;
    if (rank == 0)   /* (rank 1 posts its part at the end: this one stays pending) */
        MPI_Ineighbor_alltoall(&s, 1, MPI_DOUBLE, &r, 1, MPI_DOUBLE, g, &ngh);
    MPI_Request *reqs = malloc(sizeof(MPI_Request) * NREQ);
    int *idx = malloc(sizeof(int) * NREQ), *dummy = malloc(sizeof(int) * NREQ);
    for (int i = 0; i < NREQ; i++)
        MPI_Irecv(&dummy[i], 1, MPI_INT, 0, 100 + i, MPI_COMM_SELF, &reqs[i]);
    const char *names[3] = {"testall", "testany", "testsome"};
    for (int which = 0; which < 3; which++) {
        for (int b = 0; b < BLOCKS; b++) {
            double t0 = MPI_Wtime();
            for (int i = 0; i < 200; i++) {
                int flag, index, out;
                if (which == 0)
                    MPI_Testall(NREQ, reqs, &flag, MPI_STATUSES_IGNORE);
                else if (which == 1)
                    MPI_Testany(NREQ, reqs, &index, &flag, MPI_STATUS_IGNORE);
                else
                    MPI_Testsome(NREQ, reqs, &out, idx, MPI_STATUSES_IGNORE);
            }
            t[b] = (MPI_Wtime() - t0) / 200 * 1e6;
        }
        if (rank == 0)
            printf("%s %.3f\n", names[which], median(t, BLOCKS));
    }
    for (int i = 0; i < NREQ; i++) {
        MPI_Cancel(&reqs[i]);
        MPI_Wait(&reqs[i], MPI_STATUS_IGNORE);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 1)
        MPI_Ineighbor_alltoall(&s, 1, MPI_DOUBLE, &r, 1, MPI_DOUBLE, g, &ngh);
    MPI_Wait(&ngh, MPI_STATUS_IGNORE);
    if (r != peer)
        fprintf(stderr, "completion: rank %d got %g from its peer\n", rank, r);
    MPI_Comm_free(&g);
    free(reqs);
    free(idx);
    free(dummy);
    MPI_Finalize();
    return r != peer;
}
