"""The stencil applications as benchmarks: heat3d (DART-MPI Section 5.3, Fig. 8) and Himeno
(XcalableMP Section 4.3, Fig. 9).  Time per step split into halo exchange, computation and
reduction, per exchange, with the flat-MPI exchange of the same run as the baseline; the
exchange split again into imbalance (a neighbour had not arrived) and transfer, and the
ratios to the baseline on both the exchange and its transfer time (medians of the
repetitions)."""

import time

import numpy as np

from ...comm.hybridcomm import HybridComm
from ...profiling.waits import split_waits
from ..apps import heat3d, himeno
from ._common import Progress, add, document


def _common_arguments(p, exchanges, default_steps, what):
    p.add_argument(f"--{what}", type=int, default=default_steps, help=f"{what} per repetition")
    p.add_argument("--reps", type=int, default=3, help="repetitions")
    p.add_argument("--exchange", default=",".join(exchanges), help=f"any of {','.join(exchanges)}")
    p.add_argument("--ranks", default="", help="a sweep: run on the first R ranks for each R "
                   "(default: all ranks)")


def heat3d_arguments(p):
    p.add_argument("--grid", default="40,40,40", help="NX,NY,NZ cells (at the smallest rank count "
                   "with --weak)")
    p.add_argument("--weak", action="store_true", help="weak scaling: NX grows with the ranks")
    p.add_argument("--check-every", type=int, default=10, help="steps between convergence checks")
    _common_arguments(p, heat3d.EXCHANGES, 50, "steps")


def himeno_arguments(p):
    p.add_argument("--size", default="S", help=f"one of {','.join(himeno.SIZES)}")
    _common_arguments(p, himeno.EXCHANGES, 20, "iterations")


def _names(text, allowed, kind):
    names = [n for n in text.split(",") if n]
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise SystemExit(f"hybridmpi bench {kind}: unknown exchanges {bad}; use {','.join(allowed)}")
    return names


def _sweep(comm, text, kind):
    ranks = [int(r) for r in text.split(",") if r] or [comm.size]
    if any(not 1 <= r <= comm.size for r in ranks):
        raise SystemExit(f"hybridmpi bench {kind}: --ranks must lie in 1..{comm.size}")
    return ranks


def _time(hc, app, steps, reps):
    """Per repetition: µs per step of the whole step (max over ranks) and of each part
    (mean over ranks: a part's maximum would charge one rank's wait for a slower neighbour
    to the exchange and its neighbour's computation to the computation), then the exchange
    split into imbalance (waiting for a neighbour that had not entered the same part of the
    same step yet) and transfer (the rest), as hybridmpi.profile splits a call."""
    from mpi4py import MPI

    app.run(2)  # warm-up
    out = []
    st = app.stepper
    for _ in range(reps):
        for _ in range(10):
            hc.barrier()
        st.times = dict.fromkeys(st.times, 0.0)
        st.marks = []
        t0 = time.perf_counter()
        app.run(steps)
        parts = [time.perf_counter() - t0, st.times["halo"], st.times["compute"], st.times["reduce"]]
        marks = (np.array(st.marks) * 1e9).astype(np.int64)
        st.marks = None
        imb, _ = split_waits(hc, marks[:, 0::2].ravel(), marks[:, 1::2].ravel(),
                             app.grid.neighbor_ranks)
        parts.append(float(imb.sum()) * 1e-9)
        parts = [hc.comm.allreduce(parts[0], op=MPI.MAX)] + [
            hc.comm.allreduce(v, op=MPI.SUM) / hc.size for v in parts[1:]]
        out.append([v / steps * 1e6 for v in parts])
    return out


def _run(hc, comm, a, kind, make, names, baseline, result):
    from mpi4py import MPI

    sweep = _sweep(comm, a.ranks, kind)
    steps = a.steps if kind == "heat3d" else a.iterations
    doc = document(kind, f"{kind}: time per {'step' if kind == 'heat3d' else 'iteration'} (us), "
                   "split into halo exchange, computation and reduction", "ranks", hc, a.node_size,
                   reps=a.reps, steps=steps, exchanges=names)
    bar = Progress(comm, len(sweep) * len(names), kind)
    for r in sweep:
        sub = comm.Split(0 if comm.rank < r else MPI.UNDEFINED, comm.rank)
        rows = []
        if sub != MPI.COMM_NULL:
            with HybridComm(sub, node_size=a.node_size) as h:
                for name in names:
                    app = make(h, name, r)
                    try:
                        samples = _time(h, app, steps, a.reps)
                        rows.append((name, samples, result(app)))
                    finally:
                        app.free()
                    bar.step(f"{r} ranks {name}")
            sub.Free()
        rows = comm.bcast(rows, root=0)
        base = {n: s for n, s, _ in rows}.get(baseline)
        for name, samples, extra in rows:
            mean = [float(np.median([s[k] for s in samples])) for k in range(5)]
            row = add(doc, name, r, [s[0] for s in samples], baseline=name == baseline,
                      halo_us=mean[1], compute_us=mean[2], reduce_us=mean[3],
                      imbalance_us=mean[4], transfer_us=mean[1] - mean[4], **extra)
            if base is not None:
                base_halo = float(np.median([s[1] for s in base]))
                base_transfer = base_halo - float(np.median([s[4] for s in base]))
                row["halo_ratio"] = mean[1] / base_halo if base_halo > 0 else None
                row["transfer_ratio"] = ((mean[1] - mean[4]) / base_transfer
                                         if base_transfer > 0 else None)
    return doc


def run_heat3d(hc, comm, a):
    """Every heat3d exchange on the given grid (and rank sweep), sendrecv as the baseline."""
    names = _names(a.exchange, heat3d.EXCHANGES, "heat3d")
    try:
        grid = tuple(int(n) for n in a.grid.split(","))
        assert len(grid) == 3 and min(grid) >= 1
    except (ValueError, AssertionError):
        raise SystemExit(f"hybridmpi bench heat3d: --grid must be NX,NY,NZ, got {a.grid!r}") from None
    smallest = min(_sweep(comm, a.ranks, "heat3d"))

    def make(h, name, r):
        g = (grid[0] * r // smallest, grid[1], grid[2]) if a.weak else grid
        return heat3d.Heat3D(h, g, exchange=name, check_every=a.check_every)

    def result(app):
        return {"checksum": app.checksum(), "cells": int(app.shape[0] * app.shape[1] * app.shape[2])}

    doc = _run(hc, comm, a, "heat3d", make, names, "sendrecv", result)
    doc["grid"], doc["weak"] = list(grid), a.weak
    return doc


def run_himeno(hc, comm, a):
    """Every Himeno exchange on one size (and rank sweep), mpi as the baseline; MFLOPS."""
    names = _names(a.exchange, himeno.EXCHANGES, "himeno")
    if a.size not in himeno.SIZES:
        raise SystemExit(f"hybridmpi bench himeno: --size must be one of {','.join(himeno.SIZES)}")

    def make(h, name, r):
        return himeno.Himeno(h, a.size, exchange=name)

    def result(app):
        # gosa adds up over every iteration this app ran (warm-up and repetitions), as in the
        # reference, which never resets p between its measuring runs
        return {"gosa": app.gosa, "gosa_iterations": app.stepper.step_count,
                "flops_per_iteration": app.flops_per_iteration}

    doc = _run(hc, comm, a, "himeno", make, names, "mpi", result)
    for row in doc["results"]:
        row["mflops"] = row["flops_per_iteration"] / row["mean"]  # flop per µs = Mflop/s
    doc["size"] = a.size
    return doc
