"""``hybridmpi solve``: the manufactured Poisson problem on the cube, end to end."""

import time

import numpy as np

from ..._extras import need
from .. import mesh
from .poisson import Poisson
from .problems import exact, rhs


def write_vtu(hc, m, lm, x, path):
    """Gather the owned values on rank 0 and write the solution with the mesh (meshio)."""
    meshio = need("meshio", "writing VTU files")
    parts = hc.comm.gather((lm.global_ids[:lm.n_owned], x[:lm.n_owned]), root=0)
    if hc.rank == 0:
        u = np.empty(len(m.points))
        for ids, vals in parts:
            u[ids] = vals
        meshio.write(path, meshio.Mesh(m.points, m.cells, point_data={"u": u,
                                                                         "u_exact": exact(m.points)}))


def run(hc, h, *, method="atomic", tol=1e-10, vtu=None, mesh_file=None):
    """Solve on the cube of mesh size ``h``, or on ``mesh_file`` (any format meshio reads,
    tetrahedra; u = g on its surface), and return a dict of figures (the same on every rank)."""
    t0 = time.perf_counter()
    boundary = None
    if mesh_file:
        m, lm = mesh.distribute_file(hc, mesh_file)
        surface = hc.comm.bcast(mesh.boundary_points(m) if hc.rank == 0 else None, root=0)
        boundary = surface[lm.global_ids]
    else:
        m, lm = mesh.distribute_cube(hc, h)
    t1 = time.perf_counter()
    system = Poisson(hc, lm, rhs, exact, method=method, boundary=boundary)
    t2 = time.perf_counter()
    try:
        x, its, split = system.cg(tol=tol)
        t3 = time.perf_counter()
        err = system.l2_error(x, exact)
        if vtu:
            write_vtu(hc, m, lm, x, vtu)
    finally:
        system.free()
    from mpi4py import MPI

    comm = hc.comm
    split = {k: comm.allreduce(v, op=MPI.MAX) / max(its, 1) * 1e6 for k, v in split.items()}
    return {"h": h, "mesh": mesh_file, "points": comm.allreduce(lm.n_owned), "ranks": hc.size,
            "nodes": hc.num_nodes,
            "method": method, "iterations": its, "l2_error": err, "tol": tol,
            "us_per_iteration": split, "mesh_s": t1 - t0, "assemble_s": t2 - t1,
            "solve_s": comm.allreduce(t3 - t2, op=MPI.MAX)}


def report(r):
    s = r["us_per_iteration"]
    total = sum(s.values())
    where = f"mesh {r['mesh']}" if r.get("mesh") else "the unit cube"
    print(f"# -Δu = f on {where}, u = sin(πx)sin(πy)sin(πz) + x; P1 elements, Jacobi CG "
          f"(tol {r['tol']:g}), Halo method {r['method']!r}")
    size = r["mesh"] if r.get("mesh") else f"h = {r['h']:g}"
    print(f"# {size}: {r['points']} points on {r['ranks']} ranks, {r['nodes']} node(s)")
    print(f"iterations        {r['iterations']}")
    print(f"L2 error          {r['l2_error']:.6e}")
    print(f"solve             {r['solve_s']:.3f} s (mesh and partition {r['mesh_s']:.2f} s, "
          f"assembly {r['assemble_s']:.2f} s)")
    print("per iteration     " + ", ".join(f"{k} {v:.1f} us ({v / total:.0%})" for k, v in s.items())
          + " (max over ranks)")
