"""Method "fence" (paper Algorithm 6): shared buffers, synchronized by MPI_Win_fence.

Each call packs into the buffer of its epoch's parity, then fences the node;
receivers copy from their senders' buffers after the fence.  A buffer is
packed again two calls later, after a fence that every rank entered only
once it had finished reading it.  Internode channels are flat Isend/Irecv.
"""

from ._base import FWD, REV
from ._shm import Direction, SharedWindow


class Fence:
    def __init__(self, halo):
        self.halo = halo
        self.shm = SharedWindow(halo, lock_all=False)
        self.dirs = [Direction(halo, self.shm, d, counters=False, persistent=False)
                     for d in (FWD, REV)]
        self.shm.win.Fence()

    def begin(self, d, xbuf, e):
        self.dirs[d].start(self.halo, xbuf, e)
        self.shm.win.Fence()

    def end(self, d, xbuf, e, op):
        self.dirs[d].finish(self.halo, d, xbuf, e, op)

    def run(self, d, xbuf, e, op):
        self.begin(d, xbuf, e)
        self.end(d, xbuf, e, op)

    def free(self):
        for s in self.dirs:
            s.msgs.free()
        self.shm.win.Fence()
        self.shm.free()
