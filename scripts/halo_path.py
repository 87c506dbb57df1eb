"""Which library files a Halo update reads, and how often each is entered from another file.

Run under MPI, e.g. ``mpiexec -n 2 python scripts/halo_path.py`` (one node) and
``mpiexec -n 2 python scripts/halo_path.py --node-size 1`` (every neighbor on another node).
After warm-up calls, one blocking ``update`` of a private array and one ``update_begin`` /
``update_end`` pair are traced with ``sys.setprofile``: a file is *entered* when a function of
it is called from another file (returns are not entries).  Rank 0 prints, per call, the files
in the order they are first entered with their entry counts, and writes JSON with ``--json``.
"""

import argparse
import json
import os
import sys

import numpy as np
from mpi4py import MPI

import hybridmpi as hm

ROOT = os.path.dirname(os.path.abspath(hm.__file__))


def trace(fn):
    """The library files entered while ``fn()`` runs: {relative path: entries}, in first order."""
    entries = {}

    def prof(frame, event, arg):
        if event != "call":
            return
        f = frame.f_code.co_filename
        if not f.startswith(ROOT):
            return
        back = frame.f_back
        caller = back.f_code.co_filename if back is not None else ""
        if caller != f:
            key = os.path.relpath(f, ROOT)
            entries[key] = entries.get(key, 0) + 1

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return entries


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--node-size", type=int, default=None)
    ap.add_argument("--method", default="atomic")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    with hm.HybridComm(comm, node_size=a.node_size) as hc:
        # a ring: each rank owns n points and ghosts its neighbours' nearest ones
        n, r, size = 64, hc.rank, hc.size
        ghosts = sorted({(n * r - 1) % (n * size), (n * r + n) % (n * size)} - set(range(n * r, n * r + n)))
        pat = hm.GhostPattern.from_global(hc, np.arange(n * r, n * r + n), np.array(ghosts, dtype=np.int64))
        h = hm.Halo(pat, method=a.method)
        x = np.zeros(pat.size)
        for _ in range(3):
            h.update(x)
            h.update_begin(x)
            h.update_end(x)
        hc.barrier()
        got = {"update": trace(lambda: h.update(x)),
               "update_begin": trace(lambda: h.update_begin(x)),
               "update_end": trace(lambda: h.update_end(x))}
        hc.barrier()
        h.free()
        nodes = hc.num_nodes
    if comm.rank == 0:
        print(f"Halo method {a.method!r}, {comm.size} ranks, {nodes} node(s)")
        for call, files in got.items():
            listed = ", ".join(f"{k} x{v}" for k, v in files.items()) or "(none: the C hot path)"
            print(f"  {call}: {len(files)} files: {listed}")
        if a.json:
            with open(a.json, "w") as fh:
                json.dump({"ranks": comm.size, "nodes": nodes, "method": a.method, "calls": got},
                          fh, indent=1)


if __name__ == "__main__":
    main()
