"""The shared window of one Halo, used by the atomic, fence, pscw and lock methods.

For every directed intranode channel s -> r (one per direction of update):
two send buffers and the DONE counter in s's segment, the READY counter in
r's segment.  Every counter owns a 128-byte region, written by one process.
Each segment starts with a region holding the last epoch this rank entered
per direction, read after a timeout to name the ranks that never came, and
(methods synchronized by MPI: fence, pscw, lock) the last call per direction in
which this rank's arguments were invalid, which its readers check before they copy,
and the gates of the baselines fence and pscw (``hybridmpi.tools.baselines._gates``).
"""

from ..._native.clib import ffi, lib
from ...comm._agree import allgather, barrier
from ...comm.arena import KeptWindow, allocate_shared, check_room, commit, hold_ids
from ...comm.arena import round_up as _round
from ._base import FWD, REV, Chan, Messages, Transport, Xchg, check

_R = lib.HM_REGION
_ACQ_REL = lib.HM_ACQ_REL
#: the fields of a channel's layout entry: its counter's region (DONE in the sender's segment,
#: READY in the receiver's), then the sender's two buffers (by epoch parity)
COUNTER, BUF0, BUF1 = 0, 1, 2
#: the 8-byte slots of the first region: 0, 1 the epochs entered (by direction); 2-5 the last
#: invalid call by direction and epoch parity (MARKS + 2 * d + e % 2: a sender may be one call
#: ahead of a reader, never two); from GATES on, the words of the baselines synchronized by
#: MPI (``hybridmpi.tools.baselines._gates``)
MARKS, GATES = 2, 6


_HINT = " (method 'flat' needs no shared memory; method 'auto' falls back to it)"
#: the windows of transports freed after their HybridComm broke (ShmTransport.abandoned)
_KEPT: list = []


class SharedWindow:
    """Allocate and map the segments (collective).

    Args:
        ex: the Halo's Exchange (its plans, esz and HybridComm).
        lock_all: a block of the HybridComm's arena, whose windows are in one
            passive epoch for their lifetime (load and store access
            synchronized by C11 atomics); False for methods that synchronize
            with MPI's RMA calls, which get a window of their own.
    """

    def __init__(self, ex, lock_all, kind=""):
        hc = ex.ctx
        self.arena, self.kind, self.kept = hc.arena, kind, None
        me = hc.rank
        self.me = me
        self.node_rank = hc.node_index
        layout, off = {}, _R  # the first region: epochs entered
        for d in (FWD, REV):
            sends, recvs = ex.plans[d]
            for p, ids in sends:
                if p in self.node_rank:
                    nb = _round(ids.size * ex.esz)
                    layout[(d, me, p)] = (off, off + _R, off + _R + nb)
                    off += _R + 2 * nb
            for p, _ in recvs:
                if p in self.node_rank:
                    layout[(d, p, me)] = (off,)
                    off += _R
        self.layouts = allgather(hc, hc.node_comm, layout, "Halo")
        self.block = self.win = None
        self.base, self.pad = [], []
        if lock_all:
            self.block = hc.arena.alloc(off, "Halo", _HINT)
            for r, rank in enumerate(hc.node_ranks):
                self.base.append(self.block.addr(r, rank))
                self.pad.append(None)
        else:
            node = check_room(hc, off, "Halo", _HINT, ids=1)
            # a window kept from a freed Halo of this method when it is large enough (the
            # same decision on every node rank), else a new one
            kept = self.arena.reuse_window(kind, node)
            if kept is None:
                kept = KeptWindow(*allocate_shared(hc, off), node)
                hold_ids(1)
            self.kept = kept
            self.win, self.base, self.pad = kept.win, kept.bases, kept.pads
            # every page committed now (MemoryError on every rank if /dev/shm cannot hold it),
            # not at the first pack into a buffer (SIGBUS)
            commit(hc, self.base[hc.node_rank], off, "Halo", _HINT, undo=kept.free)
        # Zero the counters only: the buffers are written before they are read (their pages
        # are committed already: arena.commit).
        mine = self.base[hc.node_rank]
        for start in [0] + [v[0] for v in layout.values()]:
            ffi.memmove(ffi.cast("char *", mine + start), bytes(_R), _R)
        barrier(hc, hc.node_comm, "Halo")

    def entered(self, d):
        """Address of this rank's "entered" word of direction ``d``."""
        return self.base[self.node_rank[self.me]] + 8 * d

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

    def slot(self, rank, k):
        """Address of 8-byte slot ``k`` of ``rank``'s first region."""
        return self.base[self.node_rank[rank]] + 8 * k

    def missing(self, d, epoch):
        """Ranks of this node whose last entered call of direction ``d`` is before ``epoch``."""
        ranks = sorted(self.node_rank, key=self.node_rank.get)
        return [r for r in ranks if r != self.me   # this rank is in the call it timed out in
                and lib.hm_load(ffi.cast("void *", self.base[self.node_rank[r]] + 8 * d), 0) < epoch]

    def counter(self, rank, key):
        """Address of the counter of channel ``key`` in ``rank``'s segment."""
        return self._at(rank, key, COUNTER)

    def _at(self, rank, key, field):
        nr = self.node_rank[rank]
        return self.base[nr] + self.layouts[nr][key][field]

    def disp(self, rank, key, field):
        """Displacement (bytes from the window base of ``rank``) of a field, for RMA calls."""
        nr = self.node_rank[rank]
        return self.pad[nr] + self.layouts[nr][key][field]

    def send_chan(self, d, peer, ids, counters=True):
        """This rank's channel to ``peer`` in direction ``d``."""
        key = (d, self.me, peer)
        return Chan(peer, ids, self._at(self.me, key, BUF0), self._at(self.me, key, BUF1),
                    self._at(peer, key, COUNTER) if counters else None,
                    self._at(self.me, key, COUNTER) if counters else None,
                    self._at(peer, key, COUNTER) + 8 if counters else None)

    def recv_chan(self, d, peer, ids, counters=True):
        """The channel from ``peer`` to this rank in direction ``d``."""
        key = (d, peer, self.me)
        return Chan(peer, ids, self._at(peer, key, BUF0), self._at(peer, key, BUF1),
                    self._at(self.me, key, COUNTER) if counters else None,
                    self._at(peer, key, COUNTER) if counters else None,
                    self._at(self.me, key, COUNTER) + 8 if counters else None)

    def free(self):
        """Give the memory back (collective where every rank frees its Halo, agreed); a window
        of its own is kept for the next Halo of its method (:meth:`Arena.keep_window`)."""
        if self.block is not None:
            self.block.free()
        elif not self.arena.keep_window(self.kind, self.kept):
            self.kept.free()


class Direction:
    """What one direction of update moves: intranode channels through the
    shared window, internode ones as MPI messages.

    Attributes:
        send, recv: Xchg of the intranode channels (peers in rank order).
        msgs: Messages with the peers on other nodes.
        recv_all: Xchg of every receiving channel in peer rank order (the
            fixed combination order of reverse updates).
        send_chans, recv_chans: the intranode Chan lists.
    """

    def __init__(self, ex, shm, d, counters, persistent):
        sends, recvs = ex.plans[d]
        near = shm.node_rank
        self.send_chans = [shm.send_chan(d, p, ids, counters) for p, ids in sends if p in near]
        self.recv_chans = [shm.recv_chan(d, p, ids, counters) for p, ids in recvs if p in near]
        self.msgs = Messages(ex, [(p, ids) for p, ids in sends if p not in near],
                             [(p, ids) for p, ids in recvs if p not in near],
                             ex.tag + d, persistent)
        self.send = Xchg(ex, self.send_chans, shm.entered(d))
        self.recv = Xchg(ex, self.recv_chans)
        self.recv_all = Xchg(ex, sorted(self.recv_chans + self.msgs.recv_chans,
                                          key=lambda c: c.peer))

    def start(self, xbuf, e):
        """Start the messages, then pack the intranode channels (publishing READY if counted)."""
        self.msgs.start(xbuf, e)
        check(lib.hm_xchg_send(self.send.x, xbuf, e), self.send)

    def finish(self, d, xbuf, e, op):
        """Receive everything.  Forward: intranode first, whichever is ready,
        then the messages.  Reverse: the messages, then every channel in
        peer rank order, so the combination order is fixed."""
        if d == FWD:
            check(lib.hm_xchg_recv(self.recv.x, xbuf, e, op, 0), self.recv)
            if not self.msgs.empty:
                self.msgs.wait("update", e)
                check(lib.hm_xchg_recv(self.msgs.recv.x, xbuf, e, op, 0), self.msgs.recv)
        else:
            self.msgs.wait("reverse", e)
            check(lib.hm_xchg_recv(self.recv_all.x, xbuf, e, op, 1), self.recv_all)


class ShmTransport(Transport):
    """A method over the Halo's shared window: its two directions, and freeing both."""

    def __init__(self, ex, *, lock_all, counters, persistent):
        self.ex = ex
        self.shm = SharedWindow(ex, lock_all=lock_all, kind=type(self).__name__)
        self.dirs = [Direction(ex, self.shm, d, counters=counters, persistent=persistent)
                     for d in (FWD, REV)]

    def begin(self, d, xbuf, e):
        self.dirs[d].start(xbuf, e)

    def end(self, d, xbuf, e, op):
        self.dirs[d].finish(d, xbuf, e, op)

    def missing(self, d, epoch):
        return self.shm.missing(d, epoch)

    def describe_word(self, addr):
        for s in self.dirs:
            found = ([("READY", c.peer) for c in s.recv_chans if c.ready == addr]
                     + [("DONE", c.peer) for c in s.send_chans if c.done == addr])
            if found:
                return found[0]
        return None

    def free(self):
        for s in self.dirs:
            s.msgs.free()
        if self.abandoned():
            _KEPT.append(self.shm.win)
            return
        self.shm.free()

    def abandoned(self):
        """Whether this transport's own window must be kept rather than freed: its HybridComm
        broke, so an RMA epoch of the failed call may still be open (a pscw post without its
        wait), and MPI_Win_free, collective, could wait for it forever."""
        return self.shm.win is not None and self.ex.ctx.broken() is not None
