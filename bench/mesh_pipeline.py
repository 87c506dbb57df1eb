"""Mesh pipeline timings: cube generation and cached read, METIS partition, distribute.

Run under mpiexec, e.g. ``mpiexec -n 2 python bench/mesh_pipeline.py --h 0.05,0.03,0.02``.
Rank 0 generates the mesh with gmsh, reads it back from a cache file,
partitions it for the job's ranks, then every rank takes part in
``distribute``.  Prints a table and writes JSON.
"""

import argparse
import json
import os
import tempfile
import time

import meshio
from mpi4py import MPI

import hybridmpi
from hybridmpi import mesh
from hybridmpi.bench._common import describe_mpi
from hybridmpi.mesh import generate


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--h", default="0.05,0.03,0.02", help="characteristic lengths")
    p.add_argument("--node-size", type=int, default=None, help="ranks per virtual node")
    p.add_argument("--json", default="mesh_pipeline.json", help="output file ('' for none)")
    a = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    hc = hybridmpi.HybridComm(comm, node_size=a.node_size)
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        for h in map(float, a.h.split(",")):
            row = {"h": h}
            m = part = None
            if comm.rank == 0:
                t0 = time.perf_counter()
                m = generate._generate(h)
                row["cube_s"] = time.perf_counter() - t0
                meshio.write(os.path.join(cache, generate.mesh_name(h)), m)
                t0 = time.perf_counter()
                m = mesh.cube(h, cache_dir=cache)
                row["read_s"] = time.perf_counter() - t0
                t0 = time.perf_counter()
                part = mesh.partition(m, comm.size, node_size=a.node_size)
                row["partition_s"] = time.perf_counter() - t0
                row["points"], row["tetrahedra"] = len(m.points), len(m.cells[0].data)
            comm.Barrier()
            t0 = time.perf_counter()
            lm = mesh.distribute(hc, m, part)
            row["distribute_s"] = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
            row["max_local_points"] = comm.allreduce(lm.size, op=MPI.MAX)
            rows.append(row)
    if comm.rank == 0:
        print(f"# mesh pipeline, {comm.size} ranks (partition into {comm.size} parts), seconds")
        print(f"{'# h':<7}{'points':>9}{'tets':>10}{'generate':>10}{'read':>8}{'partition':>11}"
              f"{'distribute':>12}{'max local':>11}")
        for r in rows:
            print(f"{r['h']:<7g}{r['points']:>9}{r['tetrahedra']:>10}{r['cube_s']:>10.2f}"
                  f"{r['read_s']:>8.2f}{r['partition_s']:>11.2f}"
                  f"{r['distribute_s']:>12.2f}{r['max_local_points']:>11}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"benchmark": "mesh_pipeline", "mpi_library": describe_mpi(),
                           "ranks": comm.size, "node_size": a.node_size, "results": rows}, f, indent=1)
            print(f"# wrote {a.json}")
    hc.free()


if __name__ == "__main__":
    main()
