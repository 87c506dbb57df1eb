"""What the profile costs and whether it tells the truth: a ghost update of a ring pattern
(``--kb`` per neighbour) timed with the profile off, then on, alternating; then one rank
sleeps ``--sleep-ms`` before each of ``--calls`` updates and every rank's profile row is
reported (imbalance per call, the late peer, transfer)."""

import time

import numpy as np

from ...ghost.halo import Halo
from ...ghost.pattern import GhostPattern
from ...profiling.profile import profile
from ._common import add, document


def arguments(p):
    p.add_argument("--kb", default="4,20", help="kB per neighbour (decimal), comma-separated")
    p.add_argument("--iters", type=int, default=2000, help="updates per repetition")
    p.add_argument("--reps", type=int, default=7, help="repetitions (off and on alternate)")
    p.add_argument("--sleep-ms", type=float, default=1.0, help="the sleeping rank's delay")
    p.add_argument("--calls", type=int, default=200, help="updates of the sleep test")


def _ring(hc, n):
    nxt, prv = (hc.rank + 1) % hc.size, (hc.rank - 1) % hc.size
    ghosts = sorted({nxt, prv} - {hc.rank})
    return GhostPattern.from_global(
        hc, owned=np.arange(hc.rank * n, (hc.rank + 1) * n),
        ghosts=np.concatenate([np.arange(g * n, (g + 1) * n) for g in ghosts]) if ghosts
        else np.zeros(0, dtype=np.int64))


def _loop(hc, h, x, iters):
    from mpi4py import MPI

    for _ in range(10):
        hc.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        h.update(x)
    return hc.comm.allreduce((time.perf_counter() - t0) / iters * 1e6, op=MPI.MAX)


def run(hc, comm, a):
    """Off vs on per size; then the sleep test (rows of every rank in the JSON)."""
    doc = document("profile", "Halo.update with hybridmpi.profile off and on (us per call); "
                   "a sleeping rank's imbalance", "kB/neighbour", hc, a.node_size,
                   iters=a.iters, reps=a.reps)
    for kb in [float(k) for k in a.kb.split(",") if k]:
        n = max(1, int(kb * 1000 / 8))
        h = Halo(_ring(hc, n))
        x = np.zeros(h.size)
        h.update(x)
        off, on = [], []
        for _ in range(a.reps):
            off.append(_loop(hc, h, x, a.iters))
            with profile(hc):
                on.append(_loop(hc, h, x, a.iters))
        add(doc, "off", kb, off, baseline=True)
        add(doc, "on", kb, on, overhead_us=float(np.median(on) - np.median(off)))
        h.free()
    # the sleep test: the last rank sleeps before each update; 4 kB
    h = Halo(_ring(hc, 500))
    x = np.zeros(h.size)
    h.update(x)
    late = hc.size - 1
    with profile(hc) as prof:
        for _ in range(a.calls):
            if hc.rank == late:
                time.sleep(a.sleep_ms / 1000)
            h.update(x)
    row = [r for r in prof.rows() if r["op"] == "update"][0]
    rows = comm.gather(row, root=0)
    h.free()
    if comm.rank == 0:
        doc["sleep_test"] = {"sleeping_rank": late, "sleep_ms": a.sleep_ms, "calls": a.calls,
                             "rows": rows}
        doc["notes"] = [f"sleep test: rank {late} sleeps {a.sleep_ms:g} ms before each of "
                        f"{a.calls} updates of 4 kB; per call (us):"]
        for r, got in enumerate(rows):
            c = got["calls"]
            doc["notes"].append(
                f"  rank {r}: imbalance {got['imbalance_s'] / c * 1e6:8.1f}  transfer "
                f"{got['transfer_s'] / c * 1e6:7.1f}  python {got['python_s'] / c * 1e6:6.1f}  "
                f"late_peer {got['late_peer']}")
    return doc
