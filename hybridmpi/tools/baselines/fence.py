"""Method "fence" (paper Algorithm 6): shared buffers, synchronized by MPI_Win_fence.

Each call packs into the buffer of its epoch's parity, then fences the node;
receivers copy from their senders' buffers after the fence.  A buffer is
packed again two calls later, after a fence that every rank entered only
once it had finished reading it.  Internode channels are flat Isend/Irecv.
The fence is collective over the node: a rank whose arguments were invalid
still fences (:meth:`Fence.bad_call`), with its call marked invalid.  No rank
enters MPI_Win_fence before every node rank has committed to the same fence
(the FENCES gate word): a node peer whose comm broke poisons its gate instead,
so the others raise PeerError rather than wait inside MPI for ever.
"""

from ._gates import FENCES, GatedTransport


class Fence(GatedTransport):
    #: every rank of the node takes part in every call, neighbor or not
    node_collective = True

    def __init__(self, ex):
        super().__init__(ex)
        self._fences = 0   # the fences of calls made (the gate's count)
        self._node = [r for r in self.shm.node_rank if r != self.shm.me]
        self.shm.win.Fence()

    def words(self):
        return self.gate_words(FENCES)

    def _fence(self, d, e):
        """The node's fence of call ``e``, once every node rank has committed to it."""
        self._fences += 1
        self.commit(FENCES, self._fences)
        self.await_gates(FENCES, self._fences, self._node, "FENCES", d, e)
        self.shm.win.Fence()

    def begin(self, d, xbuf, e):
        super().begin(d, xbuf, e)
        self._fence(d, e)

    def end(self, d, xbuf, e, op):
        self.finish_checked(d, xbuf, e, op)

    def bad_call(self, d, e):
        """Call ``e`` of direction ``d`` for a rank whose arguments were invalid: the call
        marked invalid, the node's fence, nothing packed or copied; messages as Messages.bad.
        Returns whether every node peer sending to this rank was invalid too."""
        self.shm.mark_bad(d, e)
        self._fence(d, e)
        good = len(self.dirs[d].recv_chans) - len(self.bad_senders(d, e))
        good += self.dirs[d].msgs.bad(d, e)
        return good == 0

    def free(self):
        if not self.abandoned():
            self.shm.win.Fence()
        super().free()
