"""``hybridmpi.share`` against a copy per rank: the time to give every rank an array the root
holds, and the memory the node then holds (PSS from ``/proc/self/smaps_rollup``, summed over
the node's ranks, less what they held before), for mpi4py's ``Bcast`` into each rank's own
array (the baseline), ``comm.bcast`` (pickled; up to ``--pickle-mb``) and ``share``."""

import gc
import time

import numpy as np

from ...globalmem.shared import Shared
from ._common import add, document


def arguments(p):
    p.add_argument("--mb", default="1,16,128", help="array sizes in MB (10**6 bytes), comma-separated")
    p.add_argument("--reps", type=int, default=5, help="repetitions (the series alternate)")
    p.add_argument("--pickle-mb", type=float, default=256.0,
                   help="largest size comm.bcast (pickled) is timed at")


def pss_kib():
    """This process's proportional set size: shared pages count 1/N in each of N mappers."""
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Pss:"))


def _peak_reset():
    """Start this process's peak RSS (VmHWM) afresh (Linux: ``clear_refs`` 5); its RSS in KiB."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return _status_kib("VmRSS")


def _status_kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _node_mb(hc, before):
    """MB the node's ranks hold more than ``before`` (their PSS summed, on every rank)."""
    return hc.node_comm.allreduce(pss_kib() - before) * 1024 / 1e6


def _one(hc, series, x, n):
    """Time one series once (max over ranks) and the node's memory while its arrays live."""
    from mpi4py import MPI

    comm, root = hc.comm, 0
    gc.collect()
    before = pss_kib()
    rss = _peak_reset()
    comm.Barrier()
    t0 = time.perf_counter()
    keep = None
    if series == "MPI Bcast":
        keep = x if hc.rank == root else np.empty(n, dtype=np.uint8)
        comm.Bcast([keep, MPI.BYTE], root=root)
    elif series == "comm.bcast":
        keep = comm.bcast(x if hc.rank == root else None, root=root)
    elif series == "share fill":   # written in place on the root: it never holds a private copy
        keep = Shared(shape=(n,), dtype=np.uint8, fill=lambda out: out.fill(7), root=root, comm=hc)
    else:
        keep = Shared(x if hc.rank == root else None, root=root, comm=hc)
    dt = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX) * 1e6
    peak = (_status_kib("VmHWM") - rss) * 1024 / 1e6   # this rank's peak RSS growth, MB
    shared = series.startswith("share")
    got = keep.value if shared else keep
    ok = comm.allreduce(int(got[n // 2] == 7 and got[-1] == 7), op=MPI.MIN)
    mb = _node_mb(hc, before)
    if shared:
        del got
        keep.free()
    del keep
    gc.collect()
    if not ok:
        raise AssertionError(f"{series}: a rank did not get the root's values")
    return dt, mb, comm.bcast(peak, root=root)


def run(hc, comm, a):
    """Every size: the series alternating, ``--reps`` times; the node's memory of the last."""
    doc = document("share", "giving every rank the root's array: time (us, max over ranks) and "
                   "the memory of the node (MB of PSS more than before, summed over its ranks)",
                   "MB", hc, a.node_size, reps=a.reps)
    for mb in [float(m) for m in a.mb.split(",") if m]:
        n = int(mb * 1e6)
        x = np.full(n, 7, dtype=np.uint8) if hc.rank == 0 else None
        series = ["MPI Bcast", "share", "share fill"] + (["comm.bcast"] if mb <= a.pickle_mb else [])
        times = {s: [] for s in series}
        memory = {s: (0.0, 0.0) for s in series}
        for rep in range(a.reps):
            for s in series[rep % len(series):] + series[:rep % len(series)]:
                dt, node_mb, peak = _one(hc, s, x, n)
                times[s].append(dt)
                memory[s] = node_mb, peak
        for s in series:
            add(doc, s, mb, times[s], baseline=s == "MPI Bcast", node_mb=memory[s][0],
                per_rank_mb=memory[s][0] / hc.node_size, root_peak_mb=memory[s][1])
        del x
    doc["notes"] = [f"node {hc.node_id}: {hc.node_size} ranks; node MB: PSS grown while the "
                    "arrays live, summed over the node's ranks (a copy per rank: ranks x size); "
                    "root peak: the root's peak RSS grown during the call (shared pages it "
                    "touched count in full); share fill: written in place on the root"]
    return doc
