"""``hybridmpi demo``: the ghost update with every method and the collectives, against MPI.

Run under ``mpiexec -n N``: partitions the shipped cube mesh for N ranks,
times every Halo method and the mpi4py baseline, the barrier and the
scalar allreduce against MPI's, prints one summary table with the ratios
and writes JSON and PNG figures into the output folder.
"""

import os

import numpy as np

from .baselines import METHODS
from .bench._common import Progress, add, document, print_table, set_ratios, timed, write_json
from .bench.ghost import measure
from .mesh import distribute_cube, distribute_file


def run(hc, comm, a):
    h, path = a.h, getattr(a, "mesh", None)
    where = f"mesh {path}" if path else f"the unit cube, h = {h:g}"
    doc = document("demo", f"ghost update on {where} (block 3) and collectives, "
                   "time per call (us)", "operation", hc, a.node_size, reps=a.reps)
    bar = Progress(comm, 5 + len(METHODS), "demo")
    one, res = np.ones(1), np.empty(1)
    for op, mpi_call, call in (("barrier", comm.Barrier, hc.barrier),
                               ("allreduce", lambda: comm.Allreduce(one, res),
                                lambda: hc.allreduce(1.0))):
        add(doc, "MPI", op, timed(comm, hc.barrier, mpi_call, a.iters, a.reps), baseline=True)
        add(doc, "hybridmpi", op, timed(comm, hc.barrier, call, a.iters, a.reps))
        bar.step(op)
        bar.step(op)
    pattern = (distribute_file(hc, path) if path else distribute_cube(hc, h))[1].pattern
    rng = np.random.default_rng(comm.rank)
    measure(doc, hc, pattern, "ghost update", 3, list(METHODS), max(a.iters // 5, 10), a.reps, rng, bar)
    for r in doc["results"]:
        if r["series"] == "flat-numpy":
            r["series"] = "MPI (mpi4py + numpy)"
    set_ratios(doc)
    return doc


def report(doc, outdir):
    """Print the summary table and write the JSON and figures (rank 0)."""
    from .plot import plot

    print_table(doc)
    rows = doc["results"]
    best = min((r for r in rows if r["x"] == "ghost update" and r["ratio"] is not None
                and r["series"] != "floor"), key=lambda r: r["mean"])
    print("# summary (ratio = hybridmpi / MPI, below 1 is faster):")
    for r in rows:
        if r["ratio"] is not None and (r["x"] != "ghost update" or r["series"] == "atomic"):
            print(f"#   {r['x']:<13} {r['series']:<10} {r['mean']:9.2f} us   ratio {r['ratio']:.2f}")
    print(f"#   fastest ghost update method: {best['series']} ({best['mean']:.2f} us)")
    os.makedirs(outdir, exist_ok=True)
    path = os.path.join(outdir, "demo.json")
    write_json(doc, path)
    for p in [path] + plot(doc, outdir):
        print(f"# wrote {p}")
