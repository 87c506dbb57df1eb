"""Method "fence" (paper Algorithm 6): shared buffers, synchronized by MPI_Win_fence.

Each call packs into the buffer of its epoch's parity, then fences the node;
receivers copy from their senders' buffers after the fence.  A buffer is
packed again two calls later, after a fence that every rank entered only
once it had finished reading it.  Internode channels are flat Isend/Irecv.
"""

from ._shm import ShmTransport


class Fence(ShmTransport):
    def __init__(self, ex):
        super().__init__(ex, lock_all=False, counters=False, persistent=False)
        self.shm.win.Fence()

    def begin(self, d, xbuf, e):
        super().begin(d, xbuf, e)
        self.shm.win.Fence()

    def free(self):
        self.shm.win.Fence()
        super().free()
