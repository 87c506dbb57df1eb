"""Method "pscw" (paper Algorithm 7): shared buffers, synchronized by MPI's
post/start/complete/wait.

A sender packs its buffers and posts an exposure epoch to its intranode
receivers; a receiver starts an access epoch on its senders, copies from
their buffers and completes it; the sender's wait, at the end of its own
call, returns once every receiver has completed, so the buffer is free for
the next call.  Internode channels are flat Isend/Irecv.
"""

from ._shm import ShmTransport


class PSCW(ShmTransport):
    def __init__(self, ex):
        super().__init__(ex, lock_all=False, counters=False, persistent=False)
        group = ex.hc.node_comm.Get_group()
        near = self.shm.node_rank
        self.groups = []
        for s in self.dirs:
            post = [near[c.peer] for c in s.send_chans]
            start = [near[c.peer] for c in s.recv_chans]
            self.groups.append((group.Incl(post) if post else None,
                                group.Incl(start) if start else None))
        group.Free()

    def begin(self, d, xbuf, e):
        super().begin(d, xbuf, e)
        post = self.groups[d][0]
        if post is not None:
            self.shm.win.Post(post)

    def end(self, d, xbuf, e, op):
        post, start = self.groups[d]
        win = self.shm.win
        if start is not None:
            win.Start(start)
        super().end(d, xbuf, e, op)
        if start is not None:
            win.Complete()
        if post is not None:
            win.Wait()

    def free(self):
        for pair in self.groups:
            for g in pair:
                if g is not None:
                    g.Free()
        super().free()
