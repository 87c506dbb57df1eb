"""Method "lock" (paper Algorithm 8): shared buffers, synchronized by
passive-target RMA (MPI_Win_lock/unlock with MPI_Accumulate and
MPI_Fetch_and_op on epoch counters instead of C11 atomics).

Every lock is shared and taken with MPI_MODE_NOCHECK (see __init__).
A sender packs inside a lock of its own segment, then sets READY = e in
each receiver's segment with Accumulate(REPLACE); a receiver polls its
READY with Fetch_and_op(NO_OP), copies under a lock of the sender's
segment, and sets the sender's DONE = e.  Buffers alternate by epoch parity
and a sender waits DONE >= e - 2 before packing one again, as in "atomic".
Internode channels are flat Isend/Irecv.  A rank whose arguments were invalid
marks its call invalid and sets the counters as for a call that moves nothing
(:meth:`Lock.bad_call`); its receivers complete the call's counters, then raise.
"""

import numpy as np

from ..._native.clib import lib
from ..._native.errmap import Fault
from ...ghost.exchange import COUNTER, FWD, REV, Xchg, check
from ._window import WindowTransport, wait_until


class Lock(WindowTransport):
    def __init__(self, ex):
        super().__init__(ex)
        # One single-channel Xchg per channel: every copy sits in its own lock epoch.
        self.single = [([Xchg(ex, [c]) for c in s.send_chans], {c.peer: Xchg(ex, [c]) for c in s.recv_chans})
                       for s in self.dirs]
        self.internode = [{c.peer: Xchg(ex, [c]) for c in s.msgs.recv_chans} for s in self.dirs]
        self._val = np.zeros(1, dtype=np.int64)
        self._got = np.zeros(1, dtype=np.int64)
        MPI = ex.MPI
        self._SHARED, self._NO_OP, self._REPLACE = MPI.LOCK_SHARED, MPI.NO_OP, MPI.REPLACE
        # Every lock is shared, so MODE_NOCHECK is legal; without it a lock
        # request waits for the target to make MPI progress, and a target
        # spinning in a shared-memory collective never does (deadlock).
        self._NOCHECK = MPI.MODE_NOCHECK
        self._INT64 = MPI.INT64_T

    def words(self):
        """The counters this rank writes that its node peers poll: READY of each channel it
        sends on (in the receiver's segment), DONE of each it receives on (in the sender's)."""
        at, me = self.shm.counter, self.shm.me
        return ([at(c.peer, (d, me, c.peer)) for d, s in enumerate(self.dirs) for c in s.send_chans]
                + [at(c.peer, (d, c.peer, me)) for d, s in enumerate(self.dirs)
                   for c in s.recv_chans])

    def _read(self, key):
        """Fetch_and_op(NO_OP) of one of this rank's counters."""
        me, win = self.shm.me, self.shm.win
        win.Lock(self.shm.node_rank[me], self._SHARED, self._NOCHECK)
        win.Fetch_and_op(self._val, self._got, self.shm.node_rank[me], self.shm.disp(me, key, COUNTER),
                         self._NO_OP)
        win.Unlock(self.shm.node_rank[me])
        return int(self._got[0])

    def _write(self, rank, key, value):
        """Accumulate(REPLACE) a counter in ``rank``'s segment."""
        win, nr = self.shm.win, self.shm.node_rank[rank]
        self._val[0] = value
        win.Lock(nr, self._SHARED, self._NOCHECK)
        target = (self.shm.disp(rank, key, COUNTER), 1, self._INT64)
        win.Accumulate([self._val, 1, self._INT64], nr, target, self._REPLACE)
        win.Unlock(nr)

    def begin(self, d, xbuf, e):
        s = self.dirs[d]
        self.shm.enter(d, e)
        s.msgs.start(xbuf, e)
        me, win = self.shm.me, self.shm.win
        mine = self.shm.node_rank[me]
        for c, one in zip(s.send_chans, self.single[d][0]):
            key = (d, me, c.peer)
            if e > 2:
                wait_until(self.ex, lambda k=key: self._read(k), e - 2, c.peer, "DONE",
                           "reverse" if d == REV else "update", e)
            win.Lock(mine, self._SHARED, self._NOCHECK)
            check(lib.hm_xchg_send(one.x, xbuf, e), one)
            win.Unlock(mine)
            self._write(c.peer, key, e)

    def _take(self, d, peer, xbuf, e, op, copy=True):
        """Wait for ``peer``'s READY of call ``e``, copy its channel (unless ``copy`` is False
        or the peer marked the call invalid) and set its DONE; returns whether it was valid."""
        me, win = self.shm.me, self.shm.win
        key = (d, peer, me)
        wait_until(self.ex, lambda: self._read(key), e, peer, "READY",
                   "reverse" if d == REV else "update", e)
        valid = not self.shm.bad_among(d, e, [peer])
        if copy and valid:
            one = self.single[d][1][peer]
            nr = self.shm.node_rank[peer]
            win.Lock(nr, self._SHARED, self._NOCHECK)
            check(lib.hm_xchg_recv(one.x, xbuf, e, op, 1), one)
            win.Unlock(nr)
        self._write(peer, key, e)
        return valid

    def end(self, d, xbuf, e, op):
        s = self.dirs[d]
        bad = []   # senders that marked the call invalid: the rest still completes, then Fault
        if d == FWD:
            for c in s.recv_chans:
                if not self._take(d, c.peer, xbuf, e, op, copy=not bad):
                    bad.append(c.peer)
            if not s.msgs.empty:
                s.msgs.wait("update", e)
                if not bad:
                    check(lib.hm_xchg_recv(s.msgs.recv.x, xbuf, e, op, 0), s.msgs.recv)
        else:
            try:
                s.msgs.wait("reverse", e)
            except Fault as f:   # an invalid call across nodes: the node's channels complete
                if f.kind != "invalid":
                    raise
                bad.append(f.peer)
            # every node sender's READY and mark before anything combines: an owned entry gets
            # every sender's values or none (not a partial sum when a later sender was invalid)
            me = self.shm.me
            for c in s.recv_chans:
                wait_until(self.ex, lambda k=(d, c.peer, me): self._read(k), e, c.peer, "READY",
                           "reverse", e)
            bad += self.shm.bad_among(d, e, [c.peer for c in s.recv_chans])
            internode = self.internode[d]
            for peer in s.recv_all.peers:
                if peer in internode:
                    if not bad:
                        check(lib.hm_xchg_recv(internode[peer].x, xbuf, e, op, 1), internode[peer])
                else:
                    self._take(d, peer, xbuf, e, op, copy=not bad)
        if bad:
            raise Fault("invalid", peer=bad[0])

    def bad_call(self, d, e):
        """Call ``e`` of direction ``d`` for a rank whose arguments were invalid: the call
        marked invalid, READY set for each receiver and DONE for each sender as in a call that
        moves nothing; messages as Messages.bad.  Returns whether every node peer sending
        to this rank was invalid too."""
        s = self.dirs[d]
        me = self.shm.me
        self.shm.enter(d, e)
        what = "reverse" if d == REV else "update"
        # the mark of call e shares its slot with call e - 2's: stored once every receiver has
        # read call e - 2 (its DONE), as the data of a valid call (a sender two calls ahead
        # made a slow reader take call e - 2 for valid)
        for c in s.send_chans:
            if e > 2:
                wait_until(self.ex, lambda k=(d, me, c.peer): self._read(k), e - 2, c.peer,
                           "DONE", what, e)
        self.shm.mark_bad(d, e)
        for c in s.send_chans:
            self._write(c.peer, (d, me, c.peer), e)
        good = [c.peer for c in s.recv_chans if self._take(d, c.peer, None, e, 0, copy=False)]
        far = s.msgs.bad(d, e)
        return not good and not far
