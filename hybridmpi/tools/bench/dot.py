"""Dot product (paper 4.5): flop rate per core vs vector length, with and without the reduction."""

import numpy as np

from ... import settings
from ._common import Progress, add, document, timed


def arguments(p):
    p.add_argument("--lengths", default="100,1000,10000,100000,1000000",
                   help="local vector lengths")
    p.add_argument("--reps", type=int, default=10, help="repetitions")
    p.add_argument("--iters", type=int, default=0, help="calls per repetition (0: by length)")


def run(hc, comm, a):
    """Local np.dot alone, np.dot + hybrid allreduce, np.dot + MPI allreduce (the baseline)."""
    lengths = [int(s) for s in a.lengths.split(",")]
    doc = document("dot", "dot product x.y of float64 vectors, time per call (us); gflops = "
                   "flop rate per core", "length", hc, a.node_size, reps=a.reps,
                   blas_threads=settings.blas_threads() or "1 (set by the hybridmpi command)")
    rng = np.random.default_rng(comm.rank)
    bar = Progress(comm, 3 * len(lengths), "dot")
    for n in lengths:
        x, y = rng.standard_normal(n), rng.standard_normal(n)
        iters = a.iters or int(min(5000, max(20, 2e7 / n / 10)))
        flop = 2 * n
        one, res = np.empty(1), np.empty(1)

        def mpi_dot(x=x, y=y, one=one, res=res):
            one[0] = np.dot(x, y)
            comm.Allreduce(one, res)
            return res[0]

        calls = [("MPI Allreduce", mpi_dot, True),
                 ("local only", lambda x=x, y=y: float(np.dot(x, y)), False),
                 ("hybrid allreduce", lambda x=x, y=y: hc.allreduce(float(np.dot(x, y))), False)]
        for name, call, base in calls:
            row = add(doc, name, n, timed(comm, hc.barrier, call, iters, a.reps), baseline=base,
                      iters=iters)
            row["gflops"] = flop / row["mean"] / 1e3
            bar.step(f"{name} {n}")
    return doc
