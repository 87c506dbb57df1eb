"""Barrier (paper 4.3), allreduce (4.4) and synchronization accuracy (4.1, Fig. 10)."""

import time

import numpy as np

from ...comm.hybridcomm import HybridComm
from ._common import Progress, add, document, timed


def barrier_arguments(p):
    p.add_argument("--iters", type=int, default=2000, help="calls per repetition")
    p.add_argument("--reps", type=int, default=20, help="repetitions")


def run_barrier(hc, comm, a):
    """Dissemination, tree and linear shared-memory barriers, acq_rel and seq_cst, and the
    drop-in, vs MPI_Barrier."""
    from ...comm import dropin

    doc = document("barrier", "shared-memory barrier vs MPI_Barrier, time per call (us)", "ranks",
                   hc, a.node_size, iters=a.iters, reps=a.reps)
    sc = HybridComm(comm, node_size=a.node_size, memory_order="seq_cst")
    bar = Progress(comm, 8, "barrier")
    try:
        add(doc, "MPI_Barrier", comm.size, timed(comm, hc.barrier, comm.Barrier, a.iters, a.reps),
            baseline=True)
        bar.step("MPI_Barrier")
        add(doc, "default (hc.barrier())", comm.size, timed(comm, hc.barrier, hc.barrier, a.iters, a.reps),
            method="default", memory_order="acq_rel")
        dropin.barrier(comm)  # the first call makes the drop-in's HybridComm
        add(doc, "drop-in barrier(comm)", comm.size,
            timed(comm, hc.barrier, lambda: dropin.barrier(comm), a.iters, a.reps),
            method="drop-in", memory_order="acq_rel")
        bar.step("default and drop-in")
        for h, order in ((hc, "acq_rel"), (sc, "seq_cst")):
            for method in ("dissemination", "tree", "linear"):
                samples = timed(comm, hc.barrier, lambda h=h, m=method: h.barrier(method=m),
                                a.iters, a.reps)
                add(doc, f"{method} {order}", comm.size, samples, method=method, memory_order=order)
                bar.step(f"{method} {order}")
    finally:
        sc.free()
    return doc


def allreduce_arguments(p):
    barrier_arguments(p)
    p.add_argument("--sizes", default="1", help="lengths in doubles (1: the scalar call)")


def run_allreduce(hc, comm, a):
    """hc.allreduce of a scalar and hc.Allreduce of arrays (acq_rel, seq_cst, the tree), and
    hc.allreduce(x) and the drop-in of arrays, vs MPI_Allreduce."""
    sizes = [int(s) for s in a.sizes.split(",")]
    doc = document("allreduce", "shared-memory allreduce (sum of doubles) vs MPI_Allreduce, time "
                   "per call (us)", "doubles", hc, a.node_size, iters=a.iters, reps=a.reps)
    from ...comm import dropin

    sc = HybridComm(comm, node_size=a.node_size, memory_order="seq_cst")
    tr = HybridComm(comm, node_size=a.node_size, allreduce="tree")
    bar = Progress(comm, 5 * len(sizes), "allreduce")
    dropin.allreduce(1.0, comm=comm)  # the first call makes the drop-in's HybridComm
    try:
        for n in sizes:
            x, y = np.full(n, 1.0), np.empty(n)
            add(doc, "MPI_Allreduce", n, timed(comm, hc.barrier, lambda x=x, y=y: comm.Allreduce(x, y),
                                               a.iters, a.reps), baseline=True)
            bar.step(f"MPI {n}")
            for h, name in ((hc, "acq_rel"), (sc, "seq_cst"), (tr, "tree acq_rel")):
                if n == 1:
                    call = lambda h=h: h.allreduce(1.0)  # noqa: E731
                else:
                    call = lambda h=h, x=x, y=y: h.Allreduce(x, y)  # noqa: E731
                add(doc, name, n, timed(comm, hc.barrier, call, a.iters, a.reps),
                    memory_order="seq_cst" if h is sc else "acq_rel", method=h.allreduce_method)
                bar.step(f"{name} {n}")
            # the calls that return a new value: hc.allreduce(x) and the drop-in (n > 1: of
            # the array, as a solver reducing several dot products at once calls them)
            v = 1.0 if n == 1 else x
            if n > 1:
                add(doc, "hc.allreduce(x)", n, timed(comm, hc.barrier, lambda v=v: hc.allreduce(v),
                                                     a.iters, a.reps), method="allreduce(x)")
            add(doc, "drop-in allreduce", n, timed(comm, hc.barrier,
                                                   lambda v=v: dropin.allreduce(v, comm=comm),
                                                   a.iters, a.reps), method="drop-in")
            bar.step(f"drop-in {n}")
    finally:
        sc.free()
        tr.free()
    return doc


def sync_arguments(p):
    p.add_argument("--reps", type=int, default=200, help="repetitions (first calls timed)")
    p.add_argument("--warmup", type=int, default=100, help="barriers before each timed call")


def _first_call(comm, hc, before, reps, warmup):
    from mpi4py import MPI

    samples = []
    for _ in range(reps):
        for _ in range(warmup):
            before()
        t0 = time.perf_counter()
        hc.barrier()
        samples.append(comm.allreduce((time.perf_counter() - t0) * 1e6, op=MPI.MAX))
    return samples


def run_sync(hc, comm, a):
    """Latency of the first shared-memory barrier after 100 MPI_Barrier vs after 100 of its own.

    MPI_Barrier lets ranks leave at different times (arrival skew); the
    first shared-memory barrier after it absorbs that skew.
    """
    doc = document("sync", f"first shm barrier after {a.warmup} barriers of each kind, "
                   "latency (us)", "ranks", hc, a.node_size, reps=a.reps, warmup=a.warmup)
    add(doc, "after MPI_Barrier", comm.size, _first_call(comm, hc, comm.Barrier, a.reps, a.warmup),
        baseline=True)
    add(doc, "after shm barrier", comm.size, _first_call(comm, hc, hc.barrier, a.reps, a.warmup))
    return doc
