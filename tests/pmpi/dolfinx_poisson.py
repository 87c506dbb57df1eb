"""DOLFINx 0.5's Poisson problem (the shape of its Poisson demo: -div grad u = f on the unit
square, u = 0 on x = 0 and x = 1, g = sin(5x) on the rest) solved with PETSc's CG + Jacobi, for
scripts/pmpi_thirdparty.py: run with and without the PMPI library, the solution must agree to
rounding.  Prints "norm N iterations K" on rank 0."""

import numpy as np
import ufl
from dolfinx import fem, mesh
from dolfinx.fem.petsc import LinearProblem
from mpi4py import MPI
from petsc4py.PETSc import ScalarType

msh = mesh.create_rectangle(MPI.COMM_WORLD, ((0.0, 0.0), (2.0, 1.0)), (64, 32), mesh.CellType.triangle)
V = fem.FunctionSpace(msh, ("Lagrange", 1))
facets = mesh.locate_entities_boundary(msh, 1, lambda x: np.isclose(x[0], 0.0) | np.isclose(x[0], 2.0))
bc = fem.dirichletbc(ScalarType(0), fem.locate_dofs_topological(V, 1, facets), V)
u, v = ufl.TrialFunction(V), ufl.TestFunction(V)
x = ufl.SpatialCoordinate(msh)
f = 10 * ufl.exp(-((x[0] - 0.5) ** 2 + (x[1] - 0.5) ** 2) / 0.02)
g = ufl.sin(5 * x[0])
problem = LinearProblem(ufl.inner(ufl.grad(u), ufl.grad(v)) * ufl.dx,
                        ufl.inner(f, v) * ufl.dx + ufl.inner(g, v) * ufl.ds, bcs=[bc],
                        petsc_options={"ksp_type": "cg", "pc_type": "jacobi", "ksp_rtol": 1e-12})
uh = problem.solve()
norm = np.sqrt(msh.comm.allreduce(fem.assemble_scalar(fem.form(uh * uh * ufl.dx)), op=MPI.SUM))
its = problem.solver.getIterationNumber()
if msh.comm.rank == 0:
    print(f"norm {norm:.17e} iterations {its}")
