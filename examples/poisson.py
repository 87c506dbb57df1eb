"""Solve -Δu = f on the unit cube with P1 elements and conjugate gradients, on any number of ranks.

    mpiexec -n 4 python examples/poisson.py [h] [out.vtu]

The steps a FEM code takes with hybridmpi: one rank meshes and partitions,
every rank gets its part with a ghost pattern, assembles its rows, and CG
runs with overlapped ghost updates and hybrid allreduces.
"""

import hybridmpi  # imports nothing else: the guard below is in place before any import can fail

with hybridmpi.abort_on_error():  # an error on any rank (an import, an argument): end the job
    import sys

    from mpi4py import MPI

    from hybridmpi.tools import fem, mesh
    from hybridmpi.tools.fem.solve import write_vtu

    h = float(sys.argv[1]) if len(sys.argv) > 1 else 0.05
    out = sys.argv[2] if len(sys.argv) > 2 else None

    with hybridmpi.HybridComm(MPI.COMM_WORLD) as hc:
        m = part = None
        if hc.rank == 0:
            m = mesh.cube(h)                     # tetrahedra, cached on disk
            part = mesh.partition(m, hc.size)    # METIS, one part per rank
        lm = mesh.distribute(hc, m, part)        # points, cells, GhostPattern of this rank

        system = fem.Poisson(hc, lm, fem.rhs, fem.exact)  # u = sin(πx)sin(πy)sin(πz) + x
        u, iterations, seconds = system.cg(tol=1e-10)
        error = system.l2_error(u, fem.exact)
        if out:
            write_vtu(hc, m, lm, u, out)
        system.free()

        if hc.rank == 0:
            split = ", ".join(f"{k} {v / iterations * 1e6:.1f} us" for k, v in seconds.items())
            print(f"h = {h:g}: {iterations} iterations, L2 error {error:.3e}; per iteration on rank 0: "
                  f"{split}")
