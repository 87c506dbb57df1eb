"""Method "pscw" (paper Algorithm 7): shared buffers, synchronized by MPI's
post/start/complete/wait.

A sender packs its buffers and posts an exposure epoch to its intranode
receivers; a receiver starts an access epoch on its senders, copies from
their buffers and completes it; the sender's wait, at the end of its own
call, returns once every receiver has completed, so the buffer is free for
the next call.  Internode channels are flat Isend/Irecv.  A rank whose
arguments were invalid opens and closes the same epochs with its call marked
invalid (:meth:`PSCW.bad_call`); its receivers complete theirs, then raise.
No rank enters a blocking MPI call before its peers have committed to theirs:
a receiver starts once each sender has posted the call (the POSTED gate word), a
sender waits once each receiver closes its access epoch (CLOSED); a rank whose
comm broke poisons its gate words instead, so its peers raise PeerError rather
than wait inside MPI for ever.
"""

from ..._native.errmap import Fault
from ._gates import CLOSED, POSTED, GatedTransport


class PSCW(GatedTransport):
    def __init__(self, ex):
        super().__init__(ex)
        group = ex.ctx.node_comm.Get_group()
        near = self.shm.node_rank
        self.groups = []
        for s in self.dirs:
            post = [near[c.peer] for c in s.send_chans]
            start = [near[c.peer] for c in s.recv_chans]
            self.groups.append((group.Incl(post) if post else None,
                                group.Incl(start) if start else None))
        group.Free()
        # The gates order post before start (a receiver starts once each sender stored POSTED
        # after its post), which is what MPI_MODE_NOCHECK asserts: MPI then sends no post
        # notices to match.  Without it MPICH's start was seen to wait for ever on posts that
        # had completed (4 ranks, one node, a long program: the soak), and once to return
        # before one (a read of an unpacked buffer: findings 12, 18).
        # (MPICH and its derivatives only: Open MPI 5's post/start/complete/wait with the
        # assertion was seen to leave every rank in MPI_Win_wait, 4 ranks, the soak)
        self._NOCHECK = 0 if ex.MPI.get_vendor()[0] == "Open MPI" else ex.MPI.MODE_NOCHECK
        #: per direction: the receivers (this rank's exposure epoch) and senders (its access
        #: epoch), whose gate words this rank waits on
        self.peers = [([c.peer for c in s.send_chans], [c.peer for c in s.recv_chans])
                      for s in self.dirs]

    def words(self):
        return self.gate_words(POSTED, POSTED + 1, CLOSED, CLOSED + 1)

    def _post(self, d, e):
        post = self.groups[d][0]
        if post is not None:
            self.shm.win.Post(post, self._NOCHECK)
            self.commit(POSTED + d, e)

    def _start(self, d, e):
        start = self.groups[d][1]
        if start is not None:
            self.await_gates(POSTED + d, e, self.peers[d][1], "POSTED", d, e)
            self.shm.win.Start(start, self._NOCHECK)

    def begin(self, d, xbuf, e):
        super().begin(d, xbuf, e)
        self._post(d, e)

    def end(self, d, xbuf, e, op):
        start = self.groups[d][1]
        self._start(d, e)
        try:
            self.finish_checked(d, xbuf, e, op)
        except Fault as f:
            if f.kind == "invalid":    # every peer is in this call: its epochs end as usual
                self._close(d, e)
            elif f.kind in ("notice", "peer") and start is not None:
                # a peer broke the comm: end this rank's access epoch, so that a target still
                # in its MPI_Win_wait (a peer that saw nothing wrong) returns; waiting on the
                # origins here could last forever (the one that failed may never complete)
                self.commit(CLOSED + d, e)
                self.shm.win.Complete()
            raise
        self._close(d, e)

    def _close(self, d, e):
        post, start = self.groups[d]
        win = self.shm.win
        if start is not None:
            self.commit(CLOSED + d, e)
            win.Complete()
        if post is not None:
            self.await_gates(CLOSED + d, e, self.peers[d][0], "CLOSED", d, e)
            win.Wait()

    def bad_call(self, d, e):
        """Call ``e`` of direction ``d`` for a rank whose arguments were invalid: the call
        marked invalid, its exposure and access epochs opened and closed, nothing packed or
        copied; messages as Messages.bad.  Returns whether every node peer sending to this
        rank was invalid too."""
        self.shm.mark_bad(d, e)
        self._post(d, e)
        self._start(d, e)
        good = len(self.dirs[d].recv_chans) - len(self.bad_senders(d, e))
        self._close(d, e)
        good += self.dirs[d].msgs.bad(d, e)
        return good == 0

    def free(self):
        for pair in self.groups:
            for g in pair:
                if g is not None:
                    g.Free()
        super().free()
