"""Ghost update: every Halo method vs what users write with mpi4py, on synthetic patterns.

Run under mpiexec, e.g. ``mpiexec -n 2 python bench/ghost.py``.

Each rank exchanges ghosts with its two ring neighbors (one at 2 ranks);
``--sizes`` gives the data per neighbor in KiB.  The local vector is laid
out as distribute() does it: inner points, the points sent to each
neighbor, then the ghosts grouped by owner (``--layout scattered`` sends
randomly placed points instead).  Timed, with the method of
bench/_common.py, in the same run:

- every Halo method's ``update(x)``;
- ``flat-numpy``: the mpi4py code users write (``np.take`` of the send
  points, Irecv/Isend, Waitall, fancy-index assignment of the ghosts);
- ``floor``: the C pack of the send points plus unpack of the ghosts, with
  no communication, the least any method can cost.

Every method's result is checked against flat-numpy's before it is timed.
"""

import argparse
import json

import numpy as np
from _common import describe_mpi, header, stats, timed
from mpi4py import MPI

import hybridmpi
from hybridmpi._clib import ffi, lib
from hybridmpi.transport import METHODS
from hybridmpi.transport._base import Xchg, private_chans


def ring_pattern(hc, npts, layout, rng):
    """Send and receive lists of a ring exchange with ``npts`` points per neighbor."""
    r, p = hc.rank, hc.size
    peers = sorted({(r - 1) % p, (r + 1) % p} - {r})
    n_send = npts * len(peers)
    n_inner = 4 * n_send
    n_owned = n_inner + n_send
    send, recv = {}, {}
    for i, q in enumerate(peers):
        if layout == "contiguous":
            send[q] = np.arange(n_inner + i * npts, n_inner + (i + 1) * npts)
        else:
            send[q] = np.sort(rng.choice(n_owned, npts, replace=False))
        recv[q] = np.arange(n_owned + i * npts, n_owned + (i + 1) * npts)
    return hybridmpi.GhostPattern(hc, send=send, recv=recv, size=n_owned + n_send)


class FlatNumpy:
    """The ghost update as users write it with mpi4py and numpy."""

    def __init__(self, comm, pattern, tag=77):
        self.comm, self.tag = comm, tag
        self.send = [(p, np.asarray(ids)) for p, ids in pattern.send.items()]
        self.recv = [(p, np.asarray(ids)) for p, ids in pattern.recv.items()]

    def update(self, x):
        comm, tag = self.comm, self.tag
        bufs = [np.empty(ids.size, dtype=x.dtype) for _, ids in self.recv]
        reqs = [comm.Irecv(b, p, tag) for (p, _), b in zip(self.recv, bufs)]
        reqs += [comm.Isend(np.take(x, ids), p, tag) for p, ids in self.send]
        MPI.Request.Waitall(reqs)
        for (_, ids), b in zip(self.recv, bufs):
            x[ids] = b


class Floor:
    """Pack the send points and unpack the ghosts with the C kernels, nothing else."""

    def __init__(self, halo):
        sends, recvs = halo.plan(0)
        self._bufs = [private_chans(sends, halo.esz), private_chans(recvs, halo.esz)]
        self.pack = Xchg(halo, self._bufs[0][1])
        self.unpack = Xchg(halo, self._bufs[1][1])

    def update(self, xbuf):
        lib.hm_xchg_send(self.pack.x, xbuf, 1)
        lib.hm_xchg_recv(self.unpack.x, xbuf, 1, lib.HM_INSERT, 0)


def run_size(hc, kib, methods, a, rng):
    """Time flat-numpy, every method and the floor at ``kib`` KiB per neighbor."""
    comm = hc.comm
    npts = max(1, int(kib * 1024) // 8)
    iters = a.iters or int(min(5000, max(50, 40000 / kib)))
    pattern = ring_pattern(hc, npts, a.layout, rng)
    x = rng.standard_normal(pattern.size)
    ref = FlatNumpy(comm, pattern)
    want = x.copy()
    ref.update(want)
    results = {}

    def row(method, call):
        samples = timed(comm, hc.barrier, call, iters, a.reps)
        results[method] = {"kib": kib, "points": npts, "method": method, "iters": iters,
                           "samples_us": samples, **stats(samples)}

    row("flat-numpy", lambda: ref.update(x))
    for method in methods:
        with hybridmpi.Halo(pattern, method=method) as h:
            y = x.copy()
            h.update(y)
            if not comm.allreduce(int(y.tobytes() == want.tobytes()), op=MPI.MIN):
                raise SystemExit(f"ghost.py: method {method} gave a different result")
            row(method, lambda h=h: h.update(x))
            if method == "flat":
                floor = Floor(h)
                xbuf = ffi.from_buffer("char[]", x)
                row("floor", lambda f=floor, b=xbuf: f.update(b))
    base = results["flat-numpy"]["mean"]
    flat = results.get("flat", {}).get("mean")
    low = results.get("floor", {}).get("mean")
    for r in results.values():
        r["vs_flat_numpy"] = r["mean"] / base
        r["vs_flat"] = r["mean"] / flat if flat else None
        r["vs_floor"] = r["mean"] / low if low else None
    return list(results.values())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="4,20,78,312", help="KiB per neighbor")
    p.add_argument("--methods", default=",".join(METHODS), help="Halo methods to time")
    p.add_argument("--layout", choices=["contiguous", "scattered"], default="contiguous")
    p.add_argument("--iters", type=int, default=0, help="calls per repetition (0: by size)")
    p.add_argument("--reps", type=int, default=15, help="repetitions")
    p.add_argument("--node-size", type=int, default=None, help="ranks per virtual node")
    p.add_argument("--json", default="ghost.json", help="output file ('' for none)")
    a = p.parse_args(argv)

    comm = MPI.COMM_WORLD
    hc = hybridmpi.HybridComm(comm, node_size=a.node_size)
    rng = np.random.default_rng(comm.rank)
    methods = [m for m in a.methods.split(",") if m]
    rows = []
    for kib in map(float, a.sizes.split(",")):
        rows += run_size(hc, kib, methods, a, rng)

    if comm.rank == 0:
        print("# hybridmpi ghost update benchmark (forward update, float64, block 1)")
        print(f"# {describe_mpi()}; {comm.size} ranks, {hc.num_nodes} node(s), "
              f"node_size={a.node_size}; ring pattern, layout {a.layout}")
        print(f"# per repetition: 10 shared-memory barriers, then the timed calls; {a.reps} "
              "repetitions; time per call, max over ranks, in microseconds")
        print("# MPI baseline, same run: flat-numpy (np.take, Irecv/Isend, Waitall, x[ghosts] = ...);"
              " floor: C pack + unpack only")
        print(f"{'# KiB/nbr':<10}{'method':>11}{'iters':>6}{'min':>9}{'avg':>9}{'max':>9}{'sd':>8}"
              f"{'/flat-np':>9}{'/flat':>7}{'/floor':>7}")
        for r in rows:
            vf = f"{r['vs_flat']:7.2f}" if r["vs_flat"] else f"{'-':>7}"
            vl = f"{r['vs_floor']:7.2f}" if r["vs_floor"] else f"{'-':>7}"
            print(f"{r['kib']:<10g}{r['method']:>11}{r['iters']:>6}{r['min']:9.2f}{r['mean']:9.2f}"
                  f"{r['max']:9.2f}{r['sd']:8.2f}{r['vs_flat_numpy']:9.2f}{vf}{vl}")
        if a.json:
            doc = {**header("ghost", comm, hc, a.node_size, a.iters, a.reps),
                   "layout": a.layout, "dtype": "float64", "block": 1, "results": rows}
            with open(a.json, "w") as f:
                json.dump(doc, f, indent=1)
            print(f"# wrote {a.json}")
    hc.free()


if __name__ == "__main__":
    main()
