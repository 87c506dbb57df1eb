"""The library's barrier and allreduce against MPI's, in alternating blocks, in one layout.

    mpiexec -n N python bench/paths.py [--node-size K] [--thread-level funneled]
        [--sizes 1,8,64,256,2048,16384] [--reps 9] [--json FILE]

Per call (``barrier()``, ``allreduce`` of a float, ``Allreduce`` of arrays of doubles): mpi4py's
own call on ``MPI.COMM_WORLD`` (the baseline), ``hc`` on the layout's default path
(``collectives="auto"``: what a program gets), the drop-ins (``hybridmpi.barrier`` and
``hybridmpi.allreduce``, which return a new value), and the C core's path
(``collectives="core"``), and mpi4py's call on a duplicate of the communicator (the library's
calls run on communicators of their own: MPICH's allreduce of 128 KiB took 6 % longer on a
duplicate than on ``MPI.COMM_WORLD`` here), each in blocks of about 10 ms, alternating, the
median of ``--reps`` blocks (each block's time the slowest rank's).  Prints a table and writes
JSON (the ratios are the medians' over the baseline's).  Run it under ``taskset -c 0`` for
ranks on one core.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--node-size", type=int)
ap.add_argument("--thread-level", default="funneled")
ap.add_argument("--sizes", default="1,8,64,256,2048,16384")
ap.add_argument("--reps", type=int, default=9)
ap.add_argument("--block", type=float, default=0.01, help="seconds per block, about")
ap.add_argument("--json")
args = ap.parse_args()

import mpi4py  # noqa: E402

mpi4py.rc.thread_level = args.thread_level
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import hybridmpi  # noqa: E402
from hybridmpi.comm import tuning  # noqa: E402

comm = MPI.COMM_WORLD
dup = comm.Dup()   # MPI on a communicator of its own, as the library's calls are
auto = hybridmpi.HybridComm(comm, node_size=args.node_size)
core = hybridmpi.HybridComm(comm, node_size=args.node_size, collectives="core")
# the drop-ins' comm is the default one of COMM_WORLD (no virtual nodes): with --node-size they
# are timed on a HybridComm of that layout through the same code (dropin.allreduce(comm=...))
drop = auto if args.node_size is None else None


def block(call, iters):
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    return comm.allreduce((time.perf_counter() - t0) / iters * 1e6, op=MPI.MAX)


def calls():
    out = [("barrier", 0, {"MPI": comm.Barrier, "MPI (a Dup)": dup.Barrier,
                           "hc (default path)": auto.barrier,
                           "drop-in": (lambda: hybridmpi.barrier(comm)) if drop else None,
                           "hc (core path)": core.barrier})]
    for n in (int(s) for s in args.sizes.split(",")):
        x, y = np.full(n, 1.0), np.empty(n)
        if n == 1:
            out.append(("allreduce(float)", 8, {
                "MPI": lambda x=x, y=y: comm.Allreduce(x, y),
                "MPI (a Dup)": lambda x=x, y=y: dup.Allreduce(x, y),
                "hc (default path)": lambda: auto.allreduce(1.0),
                "drop-in": (lambda: hybridmpi.allreduce(1.0, comm=comm)) if drop else None,
                "hc (core path)": lambda: core.allreduce(1.0)}))
        else:
            out.append(("Allreduce", 8 * n, {
                "MPI": lambda x=x, y=y: comm.Allreduce(x, y),
                "MPI (a Dup)": lambda x=x, y=y: dup.Allreduce(x, y),
                "hc (default path)": lambda x=x, y=y: auto.Allreduce(x, y),
                "drop-in": (lambda x=x: hybridmpi.allreduce(x, comm=comm)) if drop else None,
                "hc (core path)": lambda x=x, y=y: core.Allreduce(x, y)}))
    return out


rows = []
t_start = time.perf_counter()
for name, nbytes, cands in calls():
    cands = {k: f for k, f in cands.items() if f is not None}
    for f in cands.values():
        for _ in range(50):
            f()
    est = max(block(f, 5) for f in cands.values())
    iters = max(3, min(50000, int(args.block * 1e6 / max(est, 0.05))))
    times = {k: [] for k in cands}
    for _ in range(args.reps):
        for k, f in cands.items():
            times[k].append(block(f, iters))
    base = statistics.median(times["MPI"])
    for k, v in times.items():
        med = statistics.median(v)
        rows.append({"call": name, "bytes": nbytes, "series": k, "median_us": med,
                     "samples": v, "ratio": med / base, "iters": iters})

if comm.rank == 0:
    doc = {"benchmark": "paths", "mpi_library": tuning.mpi_name(MPI),
           "thread_level": args.thread_level, "ranks": comm.size, "node_size": args.node_size,
           "layout": auto.layout.words(), "default_path": auto.collective_path,
           "why": auto.tuning, "host": platform.node(), "cpus": os.cpu_count(),
           "affinity": sorted(os.sched_getaffinity(0)), "reps": args.reps,
           "seconds": round(time.perf_counter() - t_start, 1), "rows": rows}
    print(f"# {doc['mpi_library']}, thread level {args.thread_level}; {doc['layout']}; "
          f"default path {auto.collective_path} ({auto.tuning})")
    print(f"# medians of {args.reps} alternating blocks, us; ratio to mpi4py's call")
    print(f"{'# call':<18}{'bytes':>8}{'series':>20}{'median':>11}{'ratio':>8}")
    for r in rows:
        print(f"{r['call']:<18}{r['bytes']:>8}{r['series']:>20}{r['median_us']:>11.3f}{r['ratio']:>8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"# wrote {args.json}")
core.free()
auto.free()
dup.Free()
sys.exit(0)
