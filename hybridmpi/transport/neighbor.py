"""Method "neighbor": MPI_Ineighbor_alltoallv on a distributed-graph communicator.

The graph communicator belongs to the pattern and is shared by its Halos
(every communicator costs an id, of which MPICH has 2,048); the last Halo
using it frees it.
"""

import numpy as np

from .._clib import lib
from ._base import FWD, REV, Transport, Xchg, complete, private_chans


class Neighbor(Transport):
    def __init__(self, halo):
        self.halo = halo
        hc = halo.hc
        MPI = hc._MPI
        nbrs = list(halo.pattern.neighbors)
        self.graph = halo.pattern._graph_comm()
        self.nbrs = nbrs
        self.dirs = []
        for d in (FWD, REV):
            sends, recvs = halo.plan(d)
            sbuf, schans, _ = private_chans(sends, halo.esz)
            rbuf, rchans, _ = private_chans(recvs, halo.esz)
            scounts = self._counts(sends, halo.esz)
            rcounts = self._counts(recvs, halo.esz)
            args = ([sbuf, (scounts, self._displs(scounts)), MPI.BYTE],
                    [rbuf, (rcounts, self._displs(rcounts)), MPI.BYTE])
            self.dirs.append((Xchg(halo, schans), Xchg(halo, rchans), args))
        self._req = None

    def _counts(self, specs, esz):
        got = {p: ids.size * esz for p, ids in specs}
        return np.array([got.get(p, 0) for p in self.nbrs], dtype=np.int64)

    @staticmethod
    def _displs(counts):
        return (np.cumsum(counts) - counts).astype(np.int64)

    def begin(self, d, xbuf, e):
        send, _, args = self.dirs[d]
        self.halo.check(lib.hm_xchg_send(send.x, xbuf, e), send)
        self._req = self.graph.Ineighbor_alltoallv(*args)

    def end(self, d, xbuf, e, op):
        _, recv, _ = self.dirs[d]
        complete(self.halo, [self._req], [None], "reverse" if d == REV else "update", e)
        self.halo.check(lib.hm_xchg_recv(recv.x, xbuf, e, op, d), recv)

    def free(self):
        self.halo.pattern._graph_release()
