/* A PETSc DMDA ghost exchange for scripts/pmpi_thirdparty.py (petsc-neighbor): run with and
 * without the PMPI library, under -sf_type neighbor (PETSc's neighbourhood SF: one
 * MPI_Ineighbor_alltoallv per scatter), the output must be the same bit for bit.
 *
 * A 3-D DMDA (box stencil of width 1, dof 3, periodic in x) on an n x n x n grid; each of
 * -steps steps fills the global vector from the natural index of each entry and the step,
 * DMGlobalToLocal (INSERT_VALUES: the SF's broadcast), scales the local vector, and
 * DMLocalToGlobal (ADD_VALUES: the SF's reduce, the reverse scatter).  Each rank hashes (FNV-1a)
 * the bytes of its local and global arrays after every step; rank 0 prints every rank's hash and
 * the sum of every rank's sum taken in rank order.  No floating-point reduction in MPI: the
 * output does not depend on the order in which an allreduce combines.
 *
 *     mpiexec -n N ./petsc_dmda [-n 16] [-steps 20] [-sf_type neighbor]
 */
#include <petscdmda.h>
#include <stdint.h>

static uint64_t fnv1a(uint64_t h, const void *data, size_t bytes)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < bytes; i++) {
        h ^= p[i];
        h *= 1099511628211ULL;
    }
    return h;
}

int main(int argc, char **argv)
{
    DM da;
    Vec g, l, back;
    PetscInt n = 16, steps = 20, dof = 3;
    PetscMPIInt rank, size;

    PetscFunctionBeginUser;
    PetscCall(PetscInitialize(&argc, &argv, NULL, NULL));
    PetscCall(PetscOptionsGetInt(NULL, NULL, "-n", &n, NULL));
    PetscCall(PetscOptionsGetInt(NULL, NULL, "-steps", &steps, NULL));
    PetscCallMPI(MPI_Comm_rank(PETSC_COMM_WORLD, &rank));
    PetscCallMPI(MPI_Comm_size(PETSC_COMM_WORLD, &size));
    PetscCall(DMDACreate3d(PETSC_COMM_WORLD, DM_BOUNDARY_PERIODIC, DM_BOUNDARY_NONE, DM_BOUNDARY_NONE,
                           DMDA_STENCIL_BOX, n, n, n, PETSC_DECIDE, PETSC_DECIDE, PETSC_DECIDE, dof, 1,
                           NULL, NULL, NULL, &da));
    PetscCall(DMSetFromOptions(da));
    PetscCall(DMSetUp(da));
    PetscCall(DMCreateGlobalVector(da, &g));
    PetscCall(DMCreateLocalVector(da, &l));
    PetscCall(VecDuplicate(g, &back));

    PetscInt xs, ys, zs, xm, ym, zm, nl, ng;
    PetscCall(DMDAGetCorners(da, &xs, &ys, &zs, &xm, &ym, &zm));
    PetscCall(VecGetLocalSize(l, &nl));
    PetscCall(VecGetLocalSize(g, &ng));
    uint64_t hash = 14695981039346656037ULL;
    for (PetscInt step = 0; step < steps; step++) {
        PetscScalar ****x;
        PetscCall(DMDAVecGetArrayDOF(da, g, &x));
        for (PetscInt k = zs; k < zs + zm; k++)
            for (PetscInt j = ys; j < ys + ym; j++)
                for (PetscInt i = xs; i < xs + xm; i++)
                    for (PetscInt c = 0; c < dof; c++) {
                        PetscInt natural = ((k * n + j) * n + i) * dof + c;
                        x[k][j][i][c] = PetscSinReal(0.001 * (PetscReal)natural + 0.1 * (PetscReal)step)
                                        + (PetscReal)natural / 7.0;
                    }
        PetscCall(DMDAVecRestoreArrayDOF(da, g, &x));
        PetscCall(DMGlobalToLocalBegin(da, g, INSERT_VALUES, l));
        PetscCall(DMGlobalToLocalEnd(da, g, INSERT_VALUES, l));
        PetscCall(VecScale(l, 1.0 + 1.0 / (PetscReal)(step + 3)));
        PetscCall(VecSet(back, 0.0));
        PetscCall(DMLocalToGlobalBegin(da, l, ADD_VALUES, back));
        PetscCall(DMLocalToGlobalEnd(da, l, ADD_VALUES, back));

        const PetscScalar *a;
        PetscCall(VecGetArrayRead(l, &a));
        hash = fnv1a(hash, a, sizeof(PetscScalar) * (size_t)nl);
        PetscCall(VecRestoreArrayRead(l, &a));
        PetscCall(VecGetArrayRead(back, &a));
        hash = fnv1a(hash, a, sizeof(PetscScalar) * (size_t)ng);
        PetscCall(VecRestoreArrayRead(back, &a));
    }

    /* every rank's hash and sum to rank 0, summed there in rank order */
    PetscScalar local_sum = 0.0;
    {
        const PetscScalar *a;
        PetscCall(VecGetArrayRead(back, &a));
        for (PetscInt i = 0; i < ng; i++) local_sum += a[i];
        PetscCall(VecRestoreArrayRead(back, &a));
    }
    uint64_t *hashes = NULL;
    PetscScalar *sums = NULL;
    if (rank == 0) {
        PetscCall(PetscMalloc2(size, &hashes, size, &sums));
    }
    PetscCallMPI(MPI_Gather(&hash, 1, MPI_UINT64_T, hashes, 1, MPI_UINT64_T, 0, PETSC_COMM_WORLD));
    PetscCallMPI(MPI_Gather(&local_sum, 1, MPIU_SCALAR, sums, 1, MPIU_SCALAR, 0, PETSC_COMM_WORLD));
    if (rank == 0) {
        PetscScalar total = 0.0;
        for (PetscMPIInt r = 0; r < size; r++) {
            PetscCall(PetscPrintf(PETSC_COMM_SELF, "rank %d hash %016llx\n", r, (unsigned long long)hashes[r]));
            total += sums[r];
        }
        PetscCall(PetscPrintf(PETSC_COMM_SELF, "grid %" PetscInt_FMT "^3 dof %" PetscInt_FMT " steps %"
                              PetscInt_FMT " sum %.17e\n", n, dof, steps, (double)PetscRealPart(total)));
        PetscCall(PetscFree2(hashes, sums));
    }
    PetscCall(VecDestroy(&back));
    PetscCall(VecDestroy(&l));
    PetscCall(VecDestroy(&g));
    PetscCall(DMDestroy(&da));
    PetscCall(PetscFinalize());
    return 0;
}
