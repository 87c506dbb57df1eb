/* A C loop of MPI_Allreduce (one double) and MPI_Barrier, for bench/pmpi.py: run as it is and
 * under the PMPI library.  Usage: loop LEVEL ITERS REPS (LEVEL: single, funneled, serialized,
 * multiple).  Each repetition times ITERS calls of each after a barrier; the time per call is
 * the slowest rank's.  Rank 0 prints one JSON line: the per-call medians, minima and all
 * repetitions, in microseconds, and the level MPI provided. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv)
{
    const char *names[] = {"single", "funneled", "serialized", "multiple"};
    int level = MPI_THREAD_FUNNELED, provided, rank, size;
    for (int k = 0; k < 4; k++)
        if (argc > 1 && strcmp(argv[1], names[k]) == 0)
            level = (int[]){MPI_THREAD_SINGLE, MPI_THREAD_FUNNELED, MPI_THREAD_SERIALIZED,
                            MPI_THREAD_MULTIPLE}[k];
    int iters = argc > 2 ? atoi(argv[2]) : 20000, reps = argc > 3 ? atoi(argv[3]) : 7;
    MPI_Init_thread(&argc, &argv, level, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    double *t[2] = {malloc(sizeof(double) * reps), malloc(sizeof(double) * reps)};
    double x = rank, y = 0;
    for (int i = 0; i < iters / 10 + 10; i++) {   /* warm-up (the library sets up after 5) */
        MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
    }
    for (int r = 0; r < reps; r++) {
        for (int k = 0; k < 2; k++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            if (k == 0)
                for (int i = 0; i < iters; i++) {
                    x = y * 0.5 + 1.0;   /* a dependency, as in a Krylov loop */
                    MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
                }
            else
                for (int i = 0; i < iters; i++)
                    MPI_Barrier(MPI_COMM_WORLD);
            double dt = (MPI_Wtime() - t0) / iters * 1e6, slowest;
            PMPI_Allreduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            t[k][r] = slowest;
        }
    }
    if (rank == 0) {
        printf("{\"ranks\": %d, \"level\": \"%s\", \"provided\": \"%s\", \"iters\": %d", size,
               argc > 1 ? argv[1] : "funneled", names[provided], iters);
        for (int k = 0; k < 2; k++) {
            printf(", \"%s\": [", k ? "barrier" : "allreduce");
            for (int r = 0; r < reps; r++)
                printf("%s%.4f", r ? ", " : "", t[k][r]);
            double med = median(t[k], reps);
            printf("], \"%s_median\": %.4f, \"%s_min\": %.4f", k ? "barrier" : "allreduce", med,
                   k ? "barrier" : "allreduce", t[k][0]);
        }
        printf("}\n");
    }
    MPI_Finalize();
    return 0;
}
