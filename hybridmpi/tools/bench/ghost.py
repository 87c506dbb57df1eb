"""Ghost update (paper 4.6, 6.4): every Halo method vs what users write with mpi4py.

Two kinds of pattern:

- ``--h 0.05,0.03``: the unit cube meshed with gmsh, partitioned by METIS
  for the job's ranks (two levels with ``--node-size``), distributed;
  ``--block`` values per point (3 as in the paper);
- ``--mesh FILE``: a user's mesh (any format meshio reads, tetrahedra),
  partitioned and distributed the same way;
- ``--sizes 4,20,78,312``: a synthetic ring, KiB per neighbor, laid out
  as distribute() does (``--layout runs``) or with the sent points at
  sorted random places (``--layout scattered``, the numbering users bring).

``--peers`` adds PETSc ``VecGhost.ghostUpdate`` and DOLFINx
``la.Vector.scatter_forward`` on the same pattern when they import
(bench/peers.py), with columns /PETSc and /DOLFINx.

Timed in the same run: every method's ``update(x)``; ``flat-numpy``, the
baseline (``np.take`` of the send points, Irecv/Isend, Waitall, fancy-index
assignment of the ghosts); ``floor``, the C pack of the send points plus
unpack of the ghosts with no communication.  Every method's result is
checked against flat-numpy's before it is timed.
"""

import numpy as np

from ..._native.clib import ffi, lib
from ...ghost.exchange import FWD, Xchg, private_chans
from ...ghost.halo import Halo
from ...ghost.pattern import GhostPattern
from ..baselines import METHODS
from ..mesh import distribute_cube
from . import peers as peer_mod
from ._common import Progress, add, document, timed


class PackFloor:
    """The C kernels of a Halo's forward update and nothing else: its send points packed into a
    private buffer and its ghosts unpacked from another, with no synchronization or transfer
    (the floor under every method).

    Args:
        spec: the Halo's ``spec``.
    """

    def __init__(self, spec):
        sends, recvs = spec.plans[FWD]
        self._bufs = [private_chans(sends, spec.esz), private_chans(recvs, spec.esz)]
        self._pack = Xchg(spec, self._bufs[0][1])
        self._unpack = Xchg(spec, self._bufs[1][1])

    def update(self, xbuf):
        """Pack and unpack ``xbuf`` (a cffi ``char[]`` over the Halo's vector)."""
        lib.hm_xchg_send(self._pack.x, xbuf, 1)
        lib.hm_xchg_recv(self._unpack.x, xbuf, 1, lib.HM_INSERT, 0)


def arguments(p):
    src = p.add_mutually_exclusive_group()
    src.add_argument("--h", default=None, help="cube meshes, comma-separated lengths (default 0.05)")
    src.add_argument("--sizes", default=None, help="synthetic ring: KiB per neighbor, comma-separated")
    p.add_argument("--kb", action="store_true", help="--sizes in decimal kB (1000 bytes): 4 kB "
                   "stays under Open MPI's 4096-byte eager limit, 4 KiB does not")
    src.add_argument("--mesh", default=None, help="a mesh file (any format meshio reads, tetrahedra)")
    p.add_argument("--methods", default=",".join(METHODS), help="Halo methods to time")
    p.add_argument("--block", type=int, default=None, help="values per point (mesh: 3, ring: 1)")
    p.add_argument("--layout", choices=["runs", "scattered", "contiguous"], default="runs",
                   help="ring only: sent points in runs as distribute() numbers them, or at sorted "
                   "random places ('contiguous' is an old name of 'runs')")
    p.add_argument("--peers", action="store_true",
                   help="also time PETSc VecGhost and DOLFINx la.Vector when they import")
    p.add_argument("--iters", type=int, default=0, help="calls per repetition (0: by size)")
    p.add_argument("--reps", type=int, default=15, help="repetitions")


def ring_pattern(hc, npts, layout, rng):
    """Send and receive lists of a ring exchange with ``npts`` points per neighbor."""
    r, p = hc.rank, hc.size
    peers = sorted({(r - 1) % p, (r + 1) % p} - {r})
    n_send = npts * len(peers)
    n_inner = 4 * n_send
    n_owned = n_inner + n_send
    send, recv = {}, {}
    for i, q in enumerate(peers):
        if layout in ("runs", "contiguous"):
            send[q] = np.arange(n_inner + i * npts, n_inner + (i + 1) * npts)
        else:
            send[q] = np.sort(rng.choice(n_owned, npts, replace=False))
        recv[q] = np.arange(n_owned + i * npts, n_owned + (i + 1) * npts)
    return GhostPattern(hc, send=send, recv=recv, size=n_owned + n_send)


class FlatNumpy:
    """The ghost update as users write it with mpi4py and numpy."""

    def __init__(self, comm, pattern, tag=77):
        self.comm, self.tag = comm, tag
        self.send = [(p, np.asarray(ids)) for p, ids in pattern.send.items()]
        self.recv = [(p, np.asarray(ids)) for p, ids in pattern.recv.items()]

    def update(self, x):
        from mpi4py import MPI

        comm, tag = self.comm, self.tag
        bufs = [np.empty((ids.size,) + x.shape[1:], dtype=x.dtype) for _, ids in self.recv]
        reqs = [comm.Irecv(b, p, tag) for (p, _), b in zip(self.recv, bufs)]
        reqs += [comm.Isend(np.take(x, ids, axis=0), p, tag) for p, ids in self.send]
        MPI.Request.Waitall(reqs)
        for (_, ids), b in zip(self.recv, bufs):
            x[ids] = b


def measure(doc, hc, pattern, x_value, block, methods, iters, reps, rng, bar, peers=()):
    """Time flat-numpy, every method, the floor and the ``peers`` on one pattern; rows at
    x = x_value."""
    from mpi4py import MPI

    comm = hc.comm
    shape = (pattern.size,) if block == 1 else (pattern.size, block)
    x = rng.standard_normal(shape)
    ref = FlatNumpy(comm, pattern)
    want = x.copy()
    ref.update(want)
    kb = comm.allreduce(pattern.n_ghosts * block * 8 / 1000) / comm.size
    extra = {"iters": iters, "data_kb": kb, "block": block}
    add(doc, "flat-numpy", x_value, timed(comm, hc.barrier, lambda: ref.update(x), iters, reps),
        baseline=True, **extra)
    bar.step(f"flat-numpy {x_value}")
    numbering = peer_mod.ghost_globals(comm, pattern) if peers else None
    for name in peers:
        vec = peer_mod.make(name, comm, pattern, block, numbering)
        try:
            vec.array[...] = x
            vec.update()
            if not comm.allreduce(int(vec.array.tobytes() == want.tobytes()), op=MPI.MIN):
                raise RuntimeError(f"hybridmpi bench ghost: peer {name} gave another result")
            add(doc, name, x_value, timed(comm, hc.barrier, vec.update, iters, reps), **extra)
        finally:
            vec.free()
        bar.step(f"{name} {x_value}")
    for method in methods:
        with Halo(pattern, block=block, method=method) as h:
            y = x.copy()
            h.update(y)
            if not comm.allreduce(int(y.tobytes() == want.tobytes()), op=MPI.MIN):
                raise RuntimeError(f"hybridmpi bench ghost: method {method} gave another result")
            add(doc, method, x_value, timed(comm, hc.barrier, lambda h=h: h.update(x), iters, reps),
                **extra)
            if method == "atomic":
                # the same update on a shared vector: zero-copy inside the node
                v = h.vector()
                v[...] = x
                h.update(v)
                if not comm.allreduce(int(v.tobytes() == want.tobytes()), op=MPI.MIN):
                    raise RuntimeError("hybridmpi bench ghost: the shared vector gave another result")
                add(doc, "atomic shared", x_value,
                    timed(comm, hc.barrier, lambda h=h, v=v: h.update(v), iters, reps), **extra)
            if method == methods[0]:
                floor = PackFloor(h.spec)
                xbuf = ffi.from_buffer("char[]", x)
                add(doc, "floor", x_value, timed(comm, hc.barrier, lambda f=floor, b=xbuf: f.update(b),
                                                 iters, reps), **extra)
        bar.step(f"{method} {x_value}")


def _peers(comm, wanted):
    """The peers to time (importable on every rank) and a note on the others."""
    if not wanted:
        return [], []
    why = peer_mod.available()
    everywhere = comm.allreduce([n for n in peer_mod.PEERS if why[n] is None])
    names = [n for n in peer_mod.PEERS if everywhere.count(n) == comm.size]
    notes = [f"peer {n} skipped: {why[n] or 'not importable on every rank'}"
             for n in peer_mod.PEERS if n not in names]
    return names, notes


def _peer_ratios(doc):
    """Columns /PETSc and /DOLFINx: every row's mean over the peer's at the same x."""
    for name in peer_mod.PEERS:
        ref = {r["x"]: r["mean"] for r in doc["results"] if r["series"] == name}
        for r in doc["results"]:
            if r["x"] in ref and r["series"] != name:
                r[f"vs_{name}"] = r["mean"] / ref[r["x"]]


def run(hc, comm, a):
    from ..mesh import distribute_file

    methods = [m for m in a.methods.split(",") if m]
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise ValueError(f"unknown method(s) {bad}; use some of {list(METHODS)}")
    rng = np.random.default_rng(comm.rank)
    peers, notes = _peers(comm, a.peers)
    layout = "runs" if a.layout == "contiguous" else a.layout
    if a.sizes:
        values = [float(s) for s in a.sizes.split(",")]
        block = a.block or 1
        doc = document("ghost", f"ghost update, ring pattern ({layout}), float64 block {block}, "
                       "time per update (us)", "KiB/neighbor", hc, a.node_size, reps=a.reps,
                       pattern="ring", layout=layout)
    elif a.mesh:
        values = [a.mesh]
        block = a.block or 3
        doc = document("ghost", f"ghost update, mesh {a.mesh}, float64 block {block}, time per "
                       "update (us)", "mesh", hc, a.node_size, reps=a.reps, pattern="mesh")
    else:
        values = [float(s) for s in (a.h or "0.05").split(",")]
        block = a.block or 3
        doc = document("ghost", f"ghost update, cube mesh, float64 block {block}, time per update "
                       "(us)", "mesh h", hc, a.node_size, reps=a.reps, pattern="cube")
    doc["peers"] = peers
    if notes:
        doc["notes"] = notes
    bar = Progress(comm, len(values) * (len(methods) + 1 + len(peers)), "ghost")
    for v in values:
        if a.sizes:
            unit = 1000 if a.kb else 1024
            pattern = ring_pattern(hc, max(1, int(v * unit) // (8 * block)), layout, rng)
            size_kb = v
        else:
            pattern = (distribute_file(hc, v) if a.mesh else distribute_cube(hc, v))[1].pattern
            size_kb = comm.allreduce(pattern.n_ghosts * block * 8 / 1024) / comm.size
        iters = a.iters or int(min(5000, max(50, 40000 / max(size_kb, 1))))
        measure(doc, hc, pattern, v, block, methods, iters, a.reps, rng, bar, peers)
    _peer_ratios(doc)
    return doc
