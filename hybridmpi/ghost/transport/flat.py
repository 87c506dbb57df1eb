"""Method "flat": Isend/Irecv with every neighbor, packed by the C core (the MPI baseline)."""

from ..._native.clib import lib
from ._base import FWD, REV, Messages, Transport, check


class Flat(Transport):
    def __init__(self, ex):
        self.msgs = []
        for d in (FWD, REV):
            sends, recvs = ex.plans[d]
            self.msgs.append(Messages(ex, sends, recvs, ex.tag + d, persistent=False))

    def begin(self, d, xbuf, e):
        self.msgs[d].start(xbuf, e)

    def end(self, d, xbuf, e, op):
        m = self.msgs[d]
        m.wait("reverse" if d == REV else "update", e)
        check(lib.hm_xchg_recv(m.recv.x, xbuf, e, op, d), m.recv)

    def bad_call(self, d, e):
        """Call ``e`` of direction ``d`` with invalid arguments on this rank (Messages.bad):
        Whether no peer sent data (theirs were invalid too)."""
        return self.msgs[d].bad(d, e) == 0

    def free(self):
        for m in self.msgs:
            m.free()
