/* Another PMPI tool, for tests/test_pmpi.py: put after the library in LD_PRELOAD, it sits
 * below it and counts the MPI_Allreduce and MPI_Barrier calls that reach it (what the library
 * passed on: it must call what comes next, not PMPI_* directly), printed at MPI_Finalize. */
#include <mpi.h>
#include <stdio.h>

static long allreduces, barriers;

int MPI_Allreduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm comm)
{
    allreduces++;
    return PMPI_Allreduce(s, r, n, t, op, comm);
}

int MPI_Barrier(MPI_Comm comm)
{
    barriers++;
    return PMPI_Barrier(comm);
}

int MPI_Finalize(void)
{
    int rank;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    fprintf(stderr, "below: rank %d: %ld allreduce, %ld barrier\n", rank, allreduces, barriers);
    return PMPI_Finalize();
}
