"""Conjugate gradients (the FEM use): time per CG iteration, atomic vs flat vs flat-numpy."""

import time

import numpy as np

from ..fem.poisson import Poisson
from ..fem.problems import exact, rhs
from ..mesh import distribute_cube
from ._common import Progress, add, document
from .ghost import FlatNumpy


def arguments(p):
    p.add_argument("--h", default="0.05", help="cube meshes, comma-separated lengths")
    p.add_argument("--iterations", type=int, default=50, help="CG iterations per repetition")
    p.add_argument("--reps", type=int, default=5, help="repetitions")


def _mpi_sum(comm):
    """Sum of a float over ranks with MPI_Allreduce on preallocated buffers."""
    one, res = np.empty(1), np.empty(1)

    def red(v):
        one[0] = v
        comm.Allreduce(one, res)
        return float(res[0])

    return red


class _Blocking(FlatNumpy):
    """flat-numpy as an exchange: the whole update in update_begin."""

    def update_begin(self, x):
        self.update(x)

    def update_end(self, x):
        pass


def run(hc, comm, a):
    from mpi4py import MPI

    values = [float(s) for s in a.h.split(",")]
    doc = document("cg", f"Jacobi CG on P1 Poisson, time per iteration (us) over {a.iterations} "
                   "iterations", "mesh h", hc, a.node_size, reps=a.reps, iterations=a.iterations)
    doc["notes"] = ["atomic: Halo atomic + hybrid allreduce, search direction in a private array; "
                    "atomic shared: the same with the search direction in Halo.vector() (zero copy "
                    "inside a node when the channels are large enough: column zc); "
                    "flat: Halo flat + MPI_Allreduce; "
                    "flat-numpy: mpi4py + numpy update + comm.allreduce (the baseline)"]
    bar = Progress(comm, 4 * len(values), "cg")
    for h in values:
        _, lm = distribute_cube(hc, h)
        cases = [("flat-numpy", "flat", _Blocking(hc.comm, lm.pattern),
                  lambda v: comm.allreduce(v), True, False),
                 ("flat", "flat", None, _mpi_sum(comm), False, False),
                 ("atomic", "atomic", None, hc.allreduce, False, False),
                 ("atomic shared", "atomic", None, hc.allreduce, False, True)]
        for series, method, exchange, red, base, shared in cases:
            system = Poisson(hc, lm, rhs, exact, method=method)
            try:
                samples = []
                for _ in range(a.reps):
                    for _ in range(10):
                        hc.barrier()
                    t0 = time.perf_counter()
                    system.cg(fixed=a.iterations, exchange=exchange, allreduce=red, shared=shared)
                    dt = (time.perf_counter() - t0) / a.iterations * 1e6
                    samples.append(comm.allreduce(dt, op=MPI.MAX))
                zc = int(system.halo.zero_copy and shared)
            finally:
                system.free()
            add(doc, series, h, samples, baseline=base, points=comm.allreduce(lm.n_owned), zc=zc)
            bar.step(f"{series} {h}")
    _gain(doc)
    return doc


def _gain(doc):
    """Column 'vs private': atomic shared over atomic at the same h (below 1: the gain)."""
    private = {r["x"]: r["mean"] for r in doc["results"] if r["series"] == "atomic"}
    for r in doc["results"]:
        if r["series"] == "atomic shared" and private.get(r["x"]):
            r["vs_private"] = r["mean"] / private[r["x"]]
