"""What the baselines synchronized by MPI (fence, pscw) add to the Halo's shared window: the
gates, words of the window's first region that say which blocking MPI synchronization a rank
has committed to (:meth:`GatedTransport.commit`), so that no rank enters a blocking MPI call
that a peer whose comm broke would never join (such a peer poisons its gate words instead);
and the check, after the call's synchronization, of the senders whose arguments were invalid.
"""

from ..._native.clib import ffi, lib
from ..._native.errmap import Fault, broke_before
from ...ghost.exchange import REV
from ._window import GATES, WindowTransport, wait_until

_ACQ_REL = lib.HM_ACQ_REL
#: the gate words: fence's count of fences; pscw's last call posted and last call closed, by
#: direction
FENCES, POSTED, CLOSED = GATES, GATES + 1, GATES + 3


class GatedTransport(WindowTransport):
    """A shared-window method whose calls synchronize by MPI's RMA calls, behind gates."""

    def __init__(self, ex):
        super().__init__(ex)
        self._gates = {}   # (rank, slot): its gate word's pointer (_gate)

    def _gate(self, p, k):
        """Rank ``p``'s gate word ``k`` as a cffi pointer (made once)."""
        key = (p, k)
        w = self._gates.get(key)
        if w is None:
            w = self._gates[key] = ffi.cast("void *", self.shm.slot(p, k))
        return w

    def commit(self, k, n):
        """Store ``n`` in this rank's gate word ``k``: it is about to make the blocking MPI
        call that ``n`` stands for (nothing between can fail)."""
        lib.hm_store(self._gate(self.shm.me, k), n, _ACQ_REL)

    def await_gates(self, k, n, peers, counter, d, e):
        """Wait (under the deadline; error bits raise Fault "peer") until each of ``peers`` has
        stored at least ``n`` in its gate word ``k``.  A rank whose comm broke poisons its gate
        words instead (:meth:`words`), so the blocking MPI call that follows never waits for a
        rank that will not come.  A word already there (the common case) costs one load."""
        what = "reverse" if d == REV else "update"
        for p in peers:
            w = self._gate(p, k)
            seen = lib.hm_load(w, _ACQ_REL)
            if seen >= n and not broke_before(seen, n):
                continue
            wait_until(self.ex, lambda w=w: lib.hm_load(w, _ACQ_REL), n, p, counter, what, e)

    def gate_words(self, *slots):
        """The addresses of this rank's gate words ``slots`` (its :meth:`words`)."""
        return [self.shm.slot(self.shm.me, k) for k in slots]

    def bad_senders(self, d, e):
        """The node peers sending to this rank in call ``e`` of direction ``d`` whose arguments
        were invalid (methods fence, pscw and lock: after the call's synchronization)."""
        return self.shm.bad_among(d, e, [c.peer for c in self.dirs[d].recv_chans])

    def finish_checked(self, d, xbuf, e, op):
        """Finish call ``e`` (the intranode data already synchronized), unless a node peer
        marked it invalid: then only the messages complete, and Fault "invalid"."""
        bad = self.bad_senders(d, e)
        if not bad:
            self.dirs[d].finish(d, xbuf, e, op)
            return
        msgs = self.dirs[d].msgs
        try:
            msgs.wait("reverse" if d == REV else "update", e)
        except Fault as f:
            if f.kind != "invalid":
                raise
        raise Fault("invalid", peer=bad[0])
