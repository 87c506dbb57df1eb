"""What the baselines over shared buffers (fence, pscw, lock) share: the Halo's shared window
as an MPI window of their own (:class:`OwnWindow`, kept for the next Halo of the method), the
marks of invalid calls and the entered words they store themselves, and a wait under the
Halo's deadline on a word that MPI's RMA calls make visible (:func:`wait_until`).
"""

import os
import time

from ..._native.clib import ffi, lib
from ..._native.errmap import Fault, broke_before
from ..._native.marks import mark as prof_mark
from ..._native.marks import mark_end as prof_mark_end
from ...comm._waits import NOTICE_GRACE_S
from ...comm.arena import KeptWindow, allocate_shared
from ...comm.room import check_room, commit, hold_ids
from ...ghost.exchange import NO_ROOM_HINT, Exchange, SharedWindow, Transport

_WORD = (1 << 64) - 1   # a counter as the unsigned 64-bit word it is
#: the 8-byte slots of a segment's first region after the two entered words: MARKS.. the last
#: invalid call by direction and epoch parity (MARKS + 2 * d + e % 2: a sender may be one call
#: ahead of a reader, never two); from GATES on, the gate words of fence and pscw (_gates.py)
MARKS, GATES = 2, 6
#: the windows of transports freed after their HybridComm broke (WindowTransport.abandoned)
_KEPT: list = []


class OwnWindow(SharedWindow):
    """The Halo's segments in an MPI window of their own, for methods that synchronize with
    MPI's RMA calls; a window of a freed Halo of the same method is reused when it is large
    enough (the same decision on every node rank)."""

    def _allocate(self, hc, nbytes):
        node = check_room(hc, nbytes, "Halo", NO_ROOM_HINT, ids=1)
        kept = self.arena.reuse_window(self.kind, node)
        if kept is None:
            kept = KeptWindow(*allocate_shared(hc, nbytes), node)
            hold_ids(1)
        self.kept, self.win, self.ctx = kept, kept.win, hc
        # every page committed now (MemoryError on every rank if /dev/shm cannot hold it), not
        # at the first pack into a buffer (SIGBUS)
        commit(hc, kept.bases[hc.node_rank], nbytes, "Halo", NO_ROOM_HINT, undo=kept.free)
        return kept.bases, kept.pads

    def enter(self, d, e):
        """Record that this rank entered call ``e`` of direction ``d`` (methods whose C calls do
        not: lock)."""
        lib.hm_store(ffi.cast("void *", self.entered(d)), e, lib.HM_ACQ_REL)

    def mark_bad(self, d, e):
        """Mark call ``e`` of direction ``d`` as made with invalid arguments on this rank (read by
        :meth:`bad_among` once the method's synchronization has made it visible)."""
        lib.hm_store(self._bad_word(self.me, d, e), e, lib.HM_ACQ_REL)

    def bad_among(self, d, e, peers):
        """The ranks of ``peers`` (on this node) that marked call ``e`` of direction ``d``."""
        return [p for p in peers if lib.hm_load(self._bad_word(p, d, e), lib.HM_ACQ_REL) == e]

    def _bad_word(self, rank, d, e):
        """The word of ``rank``'s first region holding its last invalid call of direction ``d``
        and the parity of ``e`` (a sender that already went on to call e + 1, invalid too, must
        not hide call e's mark from a slow reader)."""
        return ffi.cast("void *", self.slot(rank, MARKS + 2 * d + e % 2))

    def disp(self, rank, key, field):
        """Displacement (bytes from the window base of ``rank``) of a field, for RMA calls."""
        nr = self.node_rank[rank]
        return self.pad[nr] + self.layouts[nr][key][field]

    def free(self):
        """Keep the window for the next Halo of its method (:meth:`Arena.keep_window`), or free
        it (collective where every rank frees its Halo, agreed); after the HybridComm broke,
        keep it for good (:meth:`WindowTransport.abandoned`)."""
        if self.ctx.broken() is not None:
            _KEPT.append(self.win)
        elif not self.arena.keep_window(self.kind, self.kept):
            self.kept.free()


class WindowTransport(Exchange):
    """A baseline over the Halo's shared buffers in a window of its own, synchronized by MPI
    (no counters of the C core), with a fresh Isend/Irecv per call across nodes."""

    own_window = True

    def __init__(self, ex):
        super().__init__(ex, OwnWindow, counters=False, persistent=False)

    #: a whole call: the method's begin, then its end (not the Exchange's one C call)
    run = Transport.run

    def abandoned(self):
        """Whether this transport's window must be kept rather than freed: its HybridComm
        broke, so an RMA epoch of the failed call may still be open (a pscw post without its
        wait), and MPI_Win_free, collective, could wait for it forever."""
        return self.ex.ctx.broken() is not None


def wait_until(ex, poll, value, peer, counter, what, e):
    """Call ``poll()`` until it returns at least ``value``, yielding the CPU, under the deadline;
    a word with error bits (its writer's comm broke) raises Fault "peer", a failure notice
    Fault "notice".  Every few polls it probes for notices, which also drives MPI's progress:
    RMA aimed at this rank from another node (a peer's blocking Get) may need this rank to
    enter MPI before it completes, and that peer may be what this wait waits for."""
    deadline = None if ex.timeout is None else time.monotonic() + ex.timeout
    notices = ex.ctx.notices
    prof_mark()
    polls = 0
    failed, grace = None, 0.0
    while True:
        seen = poll() & _WORD
        if seen >= value:
            prof_mark_end()
            # error bits from before the word reached ``value`` (a writer that reached it first
            # did its part of this call: the next call meets the bits)
            if broke_before(seen, value):
                raise Fault("peer", peer=peer, seen=seen)
            return
        if deadline is not None and time.monotonic() > deadline:
            failed = failed if failed is not None else notices.poll()
            if failed is not None:   # the notice says why the wait ended (as wait_requests)
                raise Fault("notice", peer=failed)
            raise Fault("timeout", detail=f"{what}: rank {peer} did not set {counter} to {value} "
                        f"(it reads {seen})", peer=peer, counter=counter, epoch=e)
        polls += 1
        if polls % 8 == 0:
            if failed is None:
                failed = notices.poll()
                grace = time.monotonic() + NOTICE_GRACE_S
            elif time.monotonic() > grace:   # (as wait_requests: a peer that failed in a later
                raise Fault("notice", peer=failed)   # call may have done its part of this one)
        os.sched_yield()


