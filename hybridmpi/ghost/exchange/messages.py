"""The messages of an exchange: point-to-point messages with the peers on other nodes (or with
every peer: method "flat"), packed and unpacked by the C core.
"""



from ..._native.clib import lib
from ..._native.errmap import Fault
from .channels import Xchg, check, complete, private_chans, release

_EMPTY = bytearray(0)


class Messages:
    """Point-to-point messages with some peers, packed and unpacked by the C core.

    Persistent requests (``Send_init``/``Recv_init``, started together) or a
    fresh ``Irecv``/``Isend`` per call, as flat MPI codes do.
    """

    def __init__(self, ex, sends, recvs, tag, persistent):
        self.ex = ex
        comm = ex.ctx.comm
        self._sbuf, schans, sviews = private_chans(sends, ex.esz)
        self._rbuf, self.recv_chans, rviews = private_chans(recvs, ex.esz)
        self.send = Xchg(ex, schans)
        self.recv = Xchg(ex, self.recv_chans)
        self.peers = [p for p, _ in recvs] + [p for p, _ in sends]
        self._pairs = (list(zip([p for p, _ in recvs], rviews)), list(zip([p for p, _ in sends], sviews)))
        self._comm, self._tag = comm, tag
        self._persistent = persistent
        self._reqs = []
        if persistent:
            self._reqs = ([comm.Recv_init(v, p, tag) for p, v in self._pairs[0]]
                          + [comm.Send_init(v, p, tag) for p, v in self._pairs[1]])
        self.empty = not self.peers
        self._MPI = ex.MPI
        self._statuses = [self._MPI.Status() for _ in self.peers]
        # the receives that carry data (an empty one is an invalid call's mark)
        self._expect = [i for i, (_, v) in enumerate(self._pairs[0]) if v.size]

    def start(self, xbuf, e):
        """Pack the sends and start every message."""
        if self.empty:
            return
        comm, tag = self._comm, self._tag
        if self._persistent:
            check(lib.hm_xchg_send(self.send.x, xbuf, e), self.send)
            self._MPI.Prequest.Startall(self._reqs)
            return
        reqs = [comm.Irecv(v, p, tag) for p, v in self._pairs[0]]
        check(lib.hm_xchg_send(self.send.x, xbuf, e), self.send)
        reqs += [comm.Isend(v, p, tag) for p, v in self._pairs[1]]
        self._reqs = reqs

    def bad(self, d, e):
        """Call ``e`` (direction ``d``) for a rank whose arguments were invalid: an empty
        message where each receiver expects data (it raises unless its arguments were invalid
        too), and each sender's message or empty message taken and dropped, so that nothing
        of this call is left for the next one (a message and its mark share the data's tag:
        MPI keeps them in order).  Returns how many peers sent data (their arguments were
        valid)."""
        if self.empty:
            return 0
        comm, tag = self._comm, self._tag
        reqs = [comm.Irecv(v, p, tag) for p, v in self._pairs[0]]
        reqs += [comm.Isend(_EMPTY, p, tag) for p, _ in self._pairs[1]]
        st = self._statuses
        complete(self.ex, reqs, self.peers, "reverse" if d else "update", e, st)
        return sum(st[i].Get_count(self._MPI.BYTE) > 0 for i in self._expect)

    def wait(self, what, e):
        """Complete the messages started last; an empty message from a peer (its arguments
        were invalid: Messages.bad) raises ValueError once all completed."""
        if self.empty:
            return
        st = self._statuses
        complete(self.ex, self._reqs, self.peers, what, e, st)
        for i in self._expect:
            if st[i].Get_count(self._MPI.BYTE) == 0:
                raise Fault("invalid", peer=self.peers[i])

    def free(self):
        release(self._reqs, self._sbuf, self._rbuf)
        if self._persistent:
            for r in self._reqs:
                r.Free()
        self._reqs = []
