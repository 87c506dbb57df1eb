"""Method "atomic": shared buffers synchronized by C11 epoch counters (DESIGN.md).

Per directed intranode channel s -> r: s packs into the buffer of the
epoch's parity and release-stores READY = e; r acquire-waits READY >= e,
copies into its ghosts and release-stores DONE = e; s waits DONE >= e - 2
before it packs that buffer again.  No node-wide barrier, and the whole
intranode part of a call is one C call.  Internode channels are persistent
MPI requests, started before the intranode work and completed after it.
"""

from .._clib import lib
from ._base import FWD, REV
from ._shm import Direction, SharedWindow


class Atomic:
    def __init__(self, halo):
        self.halo = halo
        self.shm = SharedWindow(halo, lock_all=True)
        self.dirs = [Direction(halo, self.shm, d, counters=True, persistent=True)
                     for d in (FWD, REV)]

    def begin(self, d, xbuf, e):
        self.dirs[d].start(self.halo, xbuf, e)

    def end(self, d, xbuf, e, op):
        self.dirs[d].finish(self.halo, d, xbuf, e, op)

    def run(self, d, xbuf, e, op):
        s = self.dirs[d]
        if not s.msgs.empty:
            self.begin(d, xbuf, e)
            self.end(d, xbuf, e, op)
            return
        rc = lib.hm_xchg_both(s.send.x, s.recv.x, xbuf, e, op, d)
        if rc:
            self.halo.check(rc, s.send if s.send.x.err.code else s.recv)

    def free(self):
        for s in self.dirs:
            s.msgs.free()
        self.shm.free()
