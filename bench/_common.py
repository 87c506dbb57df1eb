"""Timing and reporting shared by the benchmark programs (seed 003, Section 4).

Each repetition synchronizes the ranks with ten shared-memory barriers, then
times a loop of calls; the time per call of a repetition is the maximum over
ranks.  Tables report min, mean, max and standard deviation over repetitions.
"""

import os
import platform
import socket
import statistics
import time

from mpi4py import MPI

import hybridmpi


def timed(comm, sync, call, iters, reps):
    """Per-repetition time of one call in microseconds, max over ranks."""
    samples = []
    for _ in range(reps):
        for _ in range(10):
            sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            call()
        dt = (time.perf_counter() - t0) / iters * 1e6
        samples.append(comm.allreduce(dt, op=MPI.MAX))
    return samples


def stats(samples):
    return {"min": min(samples), "mean": statistics.fmean(samples), "max": max(samples),
            "sd": statistics.pstdev(samples)}


def describe_mpi():
    return MPI.Get_library_version().splitlines()[0].strip()


def header(name, comm, hc, node_size, iters, reps):
    """The JSON fields every benchmark writes: machine, MPI, layout, counts."""
    return {"benchmark": name, "machine": platform.machine(), "host": socket.gethostname(),
            "cpus": os.cpu_count(), "mpi_library": describe_mpi(),
            "mpi_version": "%d.%d" % MPI.Get_version(), "ranks": comm.size,
            "nodes": hc.num_nodes, "node_size": node_size, "iters": iters, "reps": reps,
            "hybridmpi": hybridmpi.__version__}
