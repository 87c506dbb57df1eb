"""Explicit heat equation in DOLFINx, its ghost updates by hybridmpi (or by DOLFINx itself).

    mpiexec -n 2 python3 examples/dolfinx_heat.py [--n 24] [--steps 50] [--scatter dolfinx]

Every step assembles the action of the stiffness form on the current solution (as
matrix-free and explicit codes do), accumulates the ghost contributions into their owners
(reverse, add), updates the owned values (u -= dt K u / lumped mass) and refreshes the
ghosts of u (forward).  With ``--scatter hybridmpi`` (the default) the two ghost updates
are a hybridmpi Halo on DOLFINx's own IndexMap; with ``--scatter dolfinx`` they are
DOLFINx's scatters.  Both give the same bits; the last line prints a checksum of u.
"""

import hybridmpi  # imports nothing else: the guard below is in place before any import can fail

with hybridmpi.abort_on_error():  # an error on any rank (an import, an argument): end the job
    import argparse

    import numpy as np
    import ufl
    from dolfinx import fem, la, mesh
    from mpi4py import MPI

    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=24, help="cells per side of the unit cube")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--scatter", choices=["hybridmpi", "dolfinx"], default="hybridmpi")
    args = ap.parse_args()

    comm = MPI.COMM_WORLD
    msh = mesh.create_unit_cube(comm, args.n, args.n, args.n)
    V = fem.FunctionSpace(msh, ("Lagrange", 1))
    u = fem.Function(V)
    u.interpolate(lambda x: np.sin(np.pi * x[0]) * np.sin(np.pi * x[1]) * np.sin(np.pi * x[2]))
    v = ufl.TestFunction(V)
    action = fem.form(ufl.inner(ufl.grad(u), ufl.grad(v)) * ufl.dx)  # K u, assembled every step
    lumped = fem.assemble_vector(fem.form(v * ufl.dx))
    lumped.scatter_reverse(la.ScatterMode.add)
    b = la.vector(V.dofmap.index_map, V.dofmap.index_map_bs)
    n_owned = V.dofmap.index_map.size_local * V.dofmap.index_map_bs
    dt = 0.1 / args.n ** 2

    with hybridmpi.HybridComm(comm) as hc:
        # the three lines a DOLFINx code adds: a pattern from its IndexMap, a Halo on it ...
        pattern = hybridmpi.GhostPattern.from_index_map(hc, V.dofmap.index_map)
        halo = hybridmpi.Halo(pattern, block=V.dofmap.index_map_bs)
        for _ in range(args.steps):
            b.array[:] = 0
            fem.assemble_vector(b.array, action)
            if args.scatter == "hybridmpi":
                halo.reverse(b.array, "add")     # ... and the two ghost updates on its arrays
            else:
                b.scatter_reverse(la.ScatterMode.add)
            u.x.array[:n_owned] -= dt * b.array[:n_owned] / lumped.array[:n_owned]
            if args.scatter == "hybridmpi":
                halo.update(u.x.array)
            else:
                u.x.scatter_forward()
        owned = u.x.array[:n_owned]
        total = comm.allreduce(float(np.sum(owned * np.arange(1, owned.size + 1))), op=MPI.SUM)
        norm = np.sqrt(comm.allreduce(float(owned @ owned), op=MPI.SUM))
        if comm.rank == 0:
            print(f"{args.scatter}: {args.steps} steps on {comm.size} ranks, |u| = {norm:.12e}, "
                  f"checksum {total.hex()}")
        halo.free()
