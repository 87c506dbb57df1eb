"""Resident memory per object: made and freed (growth per cycle), and kept live (cost per object).

    mpiexec -n 2 python -m mpi4py scripts/object_rss.py [--cycles 10000] [--live 3000]
        [--kinds all|KIND,KIND...] [--node-size K] [--json object_rss.json]

Kinds made and freed, ``--cycles`` times each after 500 warm-up ones: ``halo-METHOD`` (a Halo of
a one-ghost ring, used once), ``halo-vector-METHOD`` (the same with a shared ``vector()``), for
every method; ``globalmem`` (64 doubles), ``coarray`` (8 x 8), ``pattern``
(``GhostPattern.from_global``) and ``hybridcomm``.  ``live-halo``: ``--live`` atomic Halos of that
ring kept at once, the resident memory they add per Halo.  Each rank reads its VmRSS
(/proc/self/statm) before and after; rank 0 prints the largest growth over ranks, in bytes per
object, and the noise floor: the same loop run twice gives the spread between two halves of it
(B per cycle), so a growth within it is stated as zero within the noise.
"""

import argparse
import gc
import json
import sys

import numpy as np
from mpi4py import MPI

from hybridmpi import Coarray, GhostPattern, GlobalMemory, Halo, HybridComm
from hybridmpi.tools import baselines  # noqa: F401  (the paper's baseline methods of the Halo)

METHODS = ("atomic", "flat", "neighbor", "fence", "pscw", "lock")


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def ring(hc, k=6):
    owned = np.arange(hc.rank * k, hc.rank * k + k)
    ghosts = np.array([(hc.rank + 1) % hc.size * k], np.int64) if hc.size > 1 else np.array([], np.int64)
    return GhostPattern.from_global(hc, owned, ghosts)


def makers(comm, hc, pat, node_size):
    out = {}
    for m in METHODS:
        def halo(m=m):
            h = Halo(pat, method=m)
            h.update(np.zeros(pat.size))
            h.free()

        def halo_vector(m=m):
            h = Halo(pat, method=m)
            u = h.vector()
            h.update(u)
            h.free()
        out[f"halo-{m}"] = halo
        out[f"halo-vector-{m}"] = halo_vector

    def globalmem():
        GlobalMemory(hc, 64).free()

    def coarray():
        Coarray(hc, (8, 8)).free()

    def pattern():
        ring(hc)

    def hybridcomm():
        HybridComm(comm, node_size=node_size).free()
    out.update(globalmem=globalmem, coarray=coarray, pattern=pattern, hybridcomm=hybridcomm)
    return out


def measure(comm, one, cycles):
    """(growth per cycle over the whole run, the two halves' difference per cycle), max over
    ranks."""
    for _ in range(500):
        one()
    gc.collect()
    comm.Barrier()
    r0 = rss()
    half = cycles // 2
    for _ in range(half):
        one()
    r1 = rss()
    for _ in range(cycles - half):
        one()
    gc.collect()
    r2 = rss()
    per = (r2 - r0) / cycles
    spread = abs((r2 - r1) - (r1 - r0)) / max(half, 1)
    return comm.allreduce(per, op=MPI.MAX), comm.allreduce(spread, op=MPI.MAX)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=10000)
    ap.add_argument("--live", type=int, default=3000)
    ap.add_argument("--kinds", default="all")
    ap.add_argument("--node-size", type=int, default=None)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    hc = HybridComm(comm, node_size=a.node_size)
    pat = ring(hc)
    all_kinds = makers(comm, hc, pat, a.node_size)
    kinds = list(all_kinds) + ["live-halo"] if a.kinds == "all" else a.kinds.split(",")
    rows = []
    if comm.rank == 0:
        print(f"{'kind':<22} {'B per cycle':>12} {'noise B':>9}   ({a.cycles} cycles, {comm.size} ranks)",
              flush=True)
    for kind in kinds:
        if kind == "live-halo":
            gc.collect()
            comm.Barrier()
            r0 = rss()
            halos = [Halo(pat) for _ in range(a.live)]
            for h in halos[:: max(1, a.live // 50)]:
                h.update(np.zeros(pat.size))
            r1 = rss()
            per = comm.allreduce((r1 - r0) / a.live, op=MPI.MAX)
            for h in halos:
                h.free()
            row = {"kind": kind, "bytes_per_live_object": per, "objects": a.live}
            if comm.rank == 0:
                print(f"{kind:<22} {per:>12.0f} B per live Halo ({a.live} live)", flush=True)
        else:
            per, spread = measure(comm, all_kinds[kind], a.cycles)
            row = {"kind": kind, "bytes_per_cycle": per, "noise_bytes_per_cycle": spread,
                   "cycles": a.cycles}
            if comm.rank == 0:
                print(f"{kind:<22} {per:>12.1f} {spread:>9.1f}", flush=True)
        rows.append(row)
    hc.free()
    if comm.rank == 0 and a.json:
        with open(a.json, "w") as f:
            json.dump({"mpi": MPI.Get_library_version().splitlines()[0].strip(), "ranks": comm.size,
                       "node_size": a.node_size, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
