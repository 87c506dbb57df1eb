"""Method "neighbor": MPI_Ineighbor_alltoallv on a distributed-graph communicator.

The graph communicators are a per-comm service of this transport (:class:`Graphs`): the Halos
of one pattern share one (every communicator costs an id, of which MPICH has 2,048); the last
Halo using it frees it.  Nonblocking collectives on one
communicator match in the order they are started, so Halos sharing it begun in different
orders on different ranks would exchange each other's data: every message starts with a
16-byte header (the Halo's tag, the call and direction; negative from a rank whose arguments
were invalid), which the receiver checks before it unpacks anything.
"""

import weakref

import numpy as np

from ..._native.clib import lib
from ..._native.errmap import Fault
from ...comm._agree import create_agreed
from ...ghost.exchange import FWD, REV, Chan, Transport, Xchg, check, complete, release

_HDR = 16  # bytes of header before each neighbor's data: int64 (Halo tag, 2 * call + direction)


class Graphs:
    """The distributed-graph communicators of a HybridComm's neighbor Halos (the per-comm
    service ``"neighbor_graphs"``): one per pattern, shared by its Halos, made by the first
    (collective, as Halos are) and freed by the last."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.live = {}   # id(pattern) -> [weak reference to the pattern, graph, users, id]

    def take(self, pattern, nbrs):
        """The graph communicator of ``pattern`` (its neighbors ``nbrs`` as sources and
        destinations), made on first use (collective)."""
        entry = self.live.get(id(pattern))
        if entry is None or entry[0]() is not pattern:   # none, or a dead pattern's id
            ctx = self.ctx
            graph = create_agreed(
                ctx, lambda: ctx.comm.Create_dist_graph_adjacent(list(nbrs), list(nbrs), reorder=False),
                failed="MPI_Dist_graph_create_adjacent", exc=RuntimeError,
                where="Halo(method='neighbor')",
                hint=" (MPI ran out of communicators: free Halos or HybridComms no longer used)")
            entry = self.live[id(pattern)] = [weakref.ref(pattern), graph, 0, id(pattern)]
        entry[2] += 1
        return entry

    def release(self, entry):
        """One user of a graph (what :meth:`take` returned) less; the last one frees it."""
        entry[2] -= 1
        if entry[2] == 0:
            if self.live.get(entry[3]) is entry:   # not replaced after its pattern died
                del self.live[entry[3]]
            if not self.ctx.MPI.Is_finalized():
                self.ctx.free_comm(entry[1])

    def free(self):
        """At the comm's free (its Halos are freed first): any graph left."""
        live, self.live = self.live, {}
        if not self.ctx.MPI.Is_finalized():
            for entry in live.values():
                self.ctx.free_comm(entry[1])


class Neighbor(Transport):
    def __init__(self, ex):
        self.ex = ex
        MPI = ex.MPI
        self.nbrs = list(ex.neighbors)
        self.graphs = ex.ctx.service("neighbor_graphs", Graphs)
        self.entry = self.graphs.take(ex.pattern, self.nbrs)
        self.graph = self.entry[1]
        self.dirs = []
        for d in (FWD, REV):
            sends, recvs = ex.plans[d]
            sbuf, schans, shdr, scounts = self._layout(sends, ex.esz)
            rbuf, rchans, rhdr, rcounts = self._layout(recvs, ex.esz)
            args = ([sbuf, (scounts, self._displs(scounts)), MPI.BYTE],
                    [rbuf, (rcounts, self._displs(rcounts)), MPI.BYTE])
            self.dirs.append((Xchg(ex, schans), Xchg(ex, rchans), args, shdr, rhdr))
        self._req = None

    def _layout(self, specs, esz):
        """One byte buffer holding, for each neighbor in rank order, a header then the data of
        ``specs`` [(peer, ids)] for it; returns the buffer, the channels, the headers (one row
        of two int64 per neighbor, views into the buffer) and the byte counts."""
        ids = dict(specs)
        counts = np.array([_HDR + ids[p].size * esz if p in ids else _HDR for p in self.nbrs],
                          dtype=np.int64)
        buf = np.zeros(max(int(counts.sum()), 1), dtype=np.uint8)
        chans, hdr, off = [], [], 0
        for p, n in zip(self.nbrs, counts):
            hdr.append(buf[off:off + _HDR].view(np.int64))
            if p in ids:
                addr = buf.ctypes.data + off + _HDR
                chans.append(Chan(p, ids[p], addr, addr, None, None))
            off += int(n)
        return buf, chans, hdr, counts

    @staticmethod
    def _displs(counts):
        return (np.cumsum(counts) - counts).astype(np.int64)

    def begin(self, d, xbuf, e):
        send, _, args, shdr, _ = self.dirs[d]
        check(lib.hm_xchg_send(send.x, xbuf, e), send)
        stamp = 2 * e + d
        for h in shdr:
            h[0], h[1] = self.ex.tag, stamp
        self._req = self.graph.Ineighbor_alltoallv(*args)

    def end(self, d, xbuf, e, op):
        _, recv, _, _, rhdr = self.dirs[d]
        what = "reverse" if d == REV else "update"
        try:
            complete(self.ex, [self._req], [None], what, e)
        except self.ex.MPI.Exception as err:  # a longer message than this call's
            raise Fault("order", peer=None, tag=None, call=None, direction=None,
                        detail=err.Get_error_string()) from None
        stamp = 2 * e + d
        tag = self.ex.tag
        for p, h in zip(self.nbrs, rhdr):
            if h[0] != tag or h[1] != stamp:
                if h[0] == tag and h[1] == -1 - stamp:
                    raise Fault("invalid", peer=p)
                raise Fault("order", peer=p, tag=int(h[0]), call=int(h[1]) >> 1,
                            direction=int(h[1]) & 1, detail="")
        check(lib.hm_xchg_recv(recv.x, xbuf, e, op, d), recv)

    def bad_call(self, d, e):
        """Call ``e`` of direction ``d`` for a rank whose arguments were invalid: take part in
        the collective with headers marked invalid (-1 - stamp) and nothing packed; the
        peers' messages are dropped.  Whether every neighbor's header was marked too."""
        _, _, args, shdr, rhdr = self.dirs[d]
        mark = -1 - (2 * e + d)
        for h in shdr:
            h[0], h[1] = self.ex.tag, mark
        self._req = self.graph.Ineighbor_alltoallv(*args)
        complete(self.ex, [self._req], [None], "reverse" if d == REV else "update", e)
        valid = [p for p, h in zip(self.nbrs, rhdr) if not (h[0] == self.ex.tag and h[1] == mark)]
        return not valid

    def free(self):
        if self._req is not None:
            release([self._req], self.dirs)
        self.graphs.release(self.entry)
