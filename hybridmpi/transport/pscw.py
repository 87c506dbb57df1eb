"""Method "pscw" (paper Algorithm 7): shared buffers, synchronized by MPI's
post/start/complete/wait.

A sender packs its buffers and posts an exposure epoch to its intranode
receivers; a receiver starts an access epoch on its senders, copies from
their buffers and completes it; the sender's wait, at the end of its own
call, returns once every receiver has completed, so the buffer is free for
the next call.  Internode channels are flat Isend/Irecv.
"""

from ._base import FWD, REV
from ._shm import Direction, SharedWindow


class PSCW:
    def __init__(self, halo):
        self.halo = halo
        hc = halo.hc
        self.shm = SharedWindow(halo, lock_all=False)
        self.dirs = [Direction(halo, self.shm, d, counters=False, persistent=False)
                     for d in (FWD, REV)]
        group = hc.node_comm.Get_group()
        near = self.shm.node_rank
        self.groups = []
        for s in self.dirs:
            post = [near[c.peer] for c in s.send_chans]
            start = [near[c.peer] for c in s.recv_chans]
            self.groups.append((group.Incl(post) if post else None,
                                group.Incl(start) if start else None))
        group.Free()

    def begin(self, d, xbuf, e):
        self.dirs[d].start(self.halo, xbuf, e)
        post = self.groups[d][0]
        if post is not None:
            self.shm.win.Post(post)

    def end(self, d, xbuf, e, op):
        post, start = self.groups[d]
        win = self.shm.win
        if start is not None:
            win.Start(start)
        self.dirs[d].finish(self.halo, d, xbuf, e, op)
        if start is not None:
            win.Complete()
        if post is not None:
            win.Wait()

    def run(self, d, xbuf, e, op):
        self.begin(d, xbuf, e)
        self.end(d, xbuf, e, op)

    def free(self):
        for s in self.dirs:
            s.msgs.free()
        for pair in self.groups:
            for g in pair:
                if g is not None:
                    g.Free()
        self.shm.free()
