"""Method "atomic": shared buffers synchronized by C11 epoch counters (DESIGN.md).

Per directed intranode channel s -> r: s packs into the buffer of the
epoch's parity and release-stores READY = e; r acquire-waits READY >= e,
copies into its ghosts and release-stores DONE = e; s waits DONE >= e - 2
before it packs that buffer again.  No node-wide barrier, and the whole
intranode part of a call is one C call.  Internode channels are persistent
MPI requests, started before the intranode work and completed after it.
"""

from .._clib import lib
from ._shm import ShmTransport


class Atomic(ShmTransport):
    def __init__(self, halo):
        super().__init__(halo, lock_all=True, counters=True, persistent=True)

    def run(self, d, xbuf, e, op):
        s = self.dirs[d]
        if not s.msgs.empty:
            super().run(d, xbuf, e, op)
            return
        rc = lib.hm_xchg_both(s.send.x, s.recv.x, xbuf, e, op, d)
        if rc:
            self.halo.check(rc, s.send if s.send.x.err.code else s.recv)
