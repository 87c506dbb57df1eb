"""The mesh pipeline (paper Sections 4.6, 6.4): gmsh generation of the unit cube, the cached
read, the METIS partition (rank 0) and ``distribute`` (every rank), per characteristic length.

Each repetition generates the mesh afresh in a temporary cache; ``generate`` is the row the
others are compared with (the cached read's ratio is what the cache saves)."""

import os
import tempfile
import time

from ..._extras import need
from .. import mesh
from ..mesh import generate
from ._common import Progress, add, document

STAGES = ("generate", "read", "partition", "distribute")


def arguments(p):
    p.add_argument("--h", default="0.05,0.03,0.02", help="characteristic lengths, comma-separated")
    p.add_argument("--reps", type=int, default=3, help="repetitions")


def run(hc, comm, a):
    """Seconds per stage (max over ranks for distribute), as µs in the common schema."""
    from mpi4py import MPI

    hs = [float(h) for h in a.h.split(",") if h]
    doc = document("mesh", "mesh pipeline: generate (gmsh), cached read, METIS partition, "
                   "distribute (us)", "mesh h", hc, a.node_size, reps=a.reps)
    bar = Progress(comm, len(hs) * a.reps, "mesh")
    for h in hs:
        times = {s: [] for s in STAGES}
        sizes = None
        for _ in range(a.reps):
            m = part = None
            got = {}
            with tempfile.TemporaryDirectory() as cache:
                if comm.rank == 0:
                    t0 = time.perf_counter()
                    m = generate.generate_cube(h)
                    got["generate"] = time.perf_counter() - t0
                    need("meshio", "the mesh benchmark").write(os.path.join(cache, generate.mesh_name(h)), m)
                    t0 = time.perf_counter()
                    m = mesh.cube(h, cache_dir=cache)
                    got["read"] = time.perf_counter() - t0
                    t0 = time.perf_counter()
                    part = mesh.partition(m, comm.size, node_size=a.node_size)
                    got["partition"] = time.perf_counter() - t0
                    sizes = (len(m.points), len(m.cells[0].data))
                comm.Barrier()
                t0 = time.perf_counter()
                local = mesh.distribute(hc, m, part)
                got["distribute"] = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
                most = comm.allreduce(local.size, op=MPI.MAX)
            got = comm.bcast(got, root=0)   # distribute: the same maximum on every rank
            for s in STAGES:
                times[s].append(got[s] * 1e6)
            bar.step(f"h={h}")
        sizes = comm.bcast(sizes, root=0)
        for s in STAGES:
            add(doc, s, h, times[s], baseline=s == "generate", points=sizes[0],
                tetrahedra=sizes[1], max_local_points=most)
    return doc
