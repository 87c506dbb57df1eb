"""Method "fence" (paper Algorithm 6): shared buffers, synchronized by MPI_Win_fence.

Each call packs into the buffer of its epoch's parity, then fences the node;
receivers copy from their senders' buffers after the fence.  A buffer is
packed again two calls later, after a fence that every rank entered only
once it had finished reading it.  Internode channels are flat Isend/Irecv.
The fence is collective over the node: a rank whose arguments were invalid
still fences (:meth:`Fence.bad_call`), with its call marked invalid.
"""

from .._clib import lib
from ._shm import ShmTransport


class Fence(ShmTransport):
    #: every rank of the node takes part in every call, neighbor or not
    node_collective = True

    def __init__(self, ex):
        super().__init__(ex, lock_all=False, counters=False, persistent=False)
        self.shm.win.Fence()

    def begin(self, d, xbuf, e):
        super().begin(d, xbuf, e)
        self.shm.win.Fence()

    def end(self, d, xbuf, e, op):
        self.finish_checked(d, xbuf, e, op)

    def bad_call(self, d, e):
        """Call ``e`` of direction ``d`` for a rank whose arguments were invalid: the call
        marked invalid, the node's fence, nothing packed or copied; messages as Messages.bad.
        Returns HM_OK when every node peer sending to this rank was invalid too."""
        self.shm.mark_bad(d, e)
        self.shm.win.Fence()
        good = len(self.dirs[d].recv_chans) - len(self.bad_senders(d, e))
        good += self.dirs[d].msgs.bad(d, e)
        return lib.HM_OK if good == 0 else lib.HM_EMISMATCH

    def free(self):
        if not self.abandoned():
            self.shm.win.Fence()
        super().free()
