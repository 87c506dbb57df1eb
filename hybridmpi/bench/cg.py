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
    doc["notes"] = ["atomic: Halo atomic + hybrid allreduce; flat: Halo flat + MPI_Allreduce; "
                    "flat-numpy: mpi4py + numpy update + comm.allreduce (the baseline)"]
    bar = Progress(comm, 3 * len(values), "cg")
    for h in values:
        _, lm = distribute_cube(hc, h)
        cases = [("flat-numpy", "flat", _Blocking(hc.comm, lm.pattern),
                  lambda v: comm.allreduce(v), True),
                 ("flat", "flat", None, _mpi_sum(comm), False),
                 ("atomic", "atomic", None, hc.allreduce, False)]
        for series, method, exchange, red, base in cases:
            system = Poisson(hc, lm, rhs, exact, method=method)
            try:
                samples = []
                for _ in range(a.reps):
                    for _ in range(10):
                        hc.barrier()
                    t0 = time.perf_counter()
                    system.cg(fixed=a.iterations, exchange=exchange, allreduce=red)
                    dt = (time.perf_counter() - t0) / a.iterations * 1e6
                    samples.append(comm.allreduce(dt, op=MPI.MAX))
            finally:
                system.free()
            add(doc, series, h, samples, baseline=base, points=comm.allreduce(lm.n_owned))
            bar.step(f"{series} {h}")
    return doc
