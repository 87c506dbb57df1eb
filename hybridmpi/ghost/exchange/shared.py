"""Method "atomic" (and "flat", its messages alone): the node's shared window of buffers and
counters (:class:`SharedWindow`), one :class:`Direction` each way, and the :class:`Exchange`
that ties them to the messages across nodes.
"""


import numpy as np

from ..._native.clib import ffi, lib
from ..._native.errmap import TAG_INVALID, ok
from ..._native.tables import mpi
from ...comm._agree import allgather, alltoall, barrier
from ...comm.room import round_up as _round
from .channels import Chan, Xchg, check
from .messages import Messages
from .method import CMA_MIN_RUN, FWD, REV, Transport
from .zerocopy import ZeroCopy, cma_pids, pair_runs

NO_ROOM_HINT = " (method 'flat' needs no shared memory; method 'auto' falls back to it)"
#: the fields of a channel's layout entry: its counter's region (DONE in the sender's segment,
#: READY in the receiver's), then the sender's two buffers (by epoch parity)
COUNTER, BUF0, BUF1 = 0, 1, 2


class SharedWindow:
    """The segments of one Halo on its node, a block of the HybridComm's arena (collective).

    For every directed channel s -> r inside the node (one per direction of update): two
    send buffers and the DONE counter in s's segment, the READY counter in r's segment.
    Every counter owns a 128-byte region, written by one process.  Each segment starts with
    a region whose first two words hold the last epoch this rank entered per direction (read
    after a timeout to name the ranks that never came); the baselines keep words of their own
    in the rest of it.

    Args:
        ex: the Halo's Spec (its plans, esz and HybridComm).
        kind: the method's name (baselines that keep their window for the next Halo).
    """

    def __init__(self, ex, kind=""):
        hc = ex.ctx
        self.arena, self.kind = hc.arena, kind
        me = hc.rank
        self.me = me
        self.node_rank = hc.node_index
        layout, off = {}, lib.HM_REGION  # the first region: epochs entered
        for d in (FWD, REV):
            sends, recvs = ex.plans[d]
            for p, ids in sends:
                if p in self.node_rank:
                    nb = _round(ids.size * ex.esz)
                    layout[(d, me, p)] = (off, off + lib.HM_REGION, off + lib.HM_REGION + nb)
                    off += lib.HM_REGION + 2 * nb
            for p, _ in recvs:
                if p in self.node_rank:
                    layout[(d, p, me)] = (off,)
                    off += lib.HM_REGION
        self.layouts = allgather(hc, hc.node_comm, layout, "Halo")
        self.win = None
        self.base, self.pad = self._allocate(hc, off)
        # Zero the counters only: the buffers are written before they are read (their pages
        # are committed already: room.commit).
        mine = self.base[hc.node_rank]
        for start in [0] + [v[0] for v in layout.values()]:
            ffi.memmove(ffi.cast("char *", mine + start), bytes(lib.HM_REGION), lib.HM_REGION)
        barrier(hc, hc.node_comm, "Halo")

    def _allocate(self, hc, nbytes):
        """The segments' addresses by node rank, and their displacements in an RMA window (None
        here: a block of the arena, whose windows stay in one passive epoch for their lifetime,
        load and store access synchronized by C11 atomics)."""
        self.block = hc.arena.alloc(nbytes, "Halo", NO_ROOM_HINT)
        return ([self.block.addr(r, rank) for r, rank in enumerate(hc.node_ranks)],
                [None] * len(hc.node_ranks))

    def entered(self, d):
        """Address of this rank's "entered" word of direction ``d``."""
        return self.slot(self.me, d)

    def slot(self, rank, k):
        """Address of 8-byte slot ``k`` of ``rank``'s first region."""
        return self.base[self.node_rank[rank]] + 8 * k

    def missing(self, d, epoch):
        """Ranks of this node whose last entered call of direction ``d`` is before ``epoch``."""
        ranks = sorted(self.node_rank, key=self.node_rank.get)
        return [r for r in ranks if r != self.me   # this rank is in the call it timed out in
                and lib.hm_load(ffi.cast("void *", self.slot(r, d)), 0) < epoch]

    def counter(self, rank, key):
        """Address of the counter of channel ``key`` in ``rank``'s segment."""
        return self._at(rank, key, COUNTER)

    def _at(self, rank, key, field):
        nr = self.node_rank[rank]
        return self.base[nr] + self.layouts[nr][key][field]

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
        """Give the block back to the arena (its chunks are freed as the arena agrees)."""
        self.block.free()


class Direction:
    """What one direction of update moves: the channels inside the node through the shared
    window, the others as MPI messages.

    Attributes:
        send, recv: Xchg of the channels inside the node (peers in rank order).
        msgs: Messages with the other peers.
        recv_all: Xchg of every receiving channel in peer rank order (the fixed combination
            order of reverse updates).
        send_chans, recv_chans: the Chan lists inside the node.
    """

    def __init__(self, ex, shm, d, counters, persistent):
        sends, recvs = ex.plans[d]
        #: whether the node's part runs (flat has none: no C call for it)
        self.near = shm is not None
        near = shm.node_rank if shm is not None else {}
        self.send_chans = [shm.send_chan(d, p, ids, counters) for p, ids in sends if p in near]
        self.recv_chans = [shm.recv_chan(d, p, ids, counters) for p, ids in recvs if p in near]
        self.msgs = Messages(ex, [(p, ids) for p, ids in sends if p not in near],
                             [(p, ids) for p, ids in recvs if p not in near],
                             ex.tag + d, persistent)
        self.send = Xchg(ex, self.send_chans, shm.entered(d) if shm is not None else None)
        self.recv = Xchg(ex, self.recv_chans)
        self.recv_all = Xchg(ex, sorted(self.recv_chans + self.msgs.recv_chans,
                                          key=lambda c: c.peer))

    def start(self, xbuf, e):
        """Steps 1-3: the messages (receives posted, sends packed and started), then the
        channels inside the node packed (READY published where counted)."""
        self.msgs.start(xbuf, e)
        if self.near:
            check(lib.hm_xchg_send(self.send.x, xbuf, e), self.send)

    def finish(self, d, xbuf, e, op):
        """Step 4: receive everything.  Forward: inside the node first, whichever is ready,
        then the messages.  Reverse: the messages, then every channel in peer rank order, so
        the combination order is fixed."""
        if d == FWD:
            if self.near:
                check(lib.hm_xchg_recv(self.recv.x, xbuf, e, op, 0), self.recv)
            if not self.msgs.empty:
                self.msgs.wait("update", e)
                check(lib.hm_xchg_recv(self.msgs.recv.x, xbuf, e, op, 0), self.msgs.recv)
        else:
            self.msgs.wait("reverse", e)
            check(lib.hm_xchg_recv(self.recv_all.x, xbuf, e, op, 1), self.recv_all)


class Exchange(Transport):
    """Method "atomic" (``window`` a :class:`SharedWindow`: counted shared buffers inside the
    node, persistent messages across nodes), or with ``window=None`` method "flat" (a fresh
    Isend/Irecv per call with every neighbor).  Which path a call takes (the packed exchange,
    zero copy for a shared vector, cross-memory attach for a private array) follows from the
    Spec's agreed :class:`Paths`, the same on every rank.  The baselines over a window of their
    own (fence, pscw, lock) build on it with ``counters=False`` (MPI synchronizes them)."""

    def __init__(self, ex, window=SharedWindow, *, counters=True, persistent=True):
        self.ex = ex
        self.shm = window(ex, kind=type(self).__name__) if window is not None else None
        self.dirs = [Direction(ex, self.shm, d, counters, persistent) for d in (FWD, REV)]
        #: the node's part synchronized by the C core's counters (atomic; the baselines over a
        #: window of their own are synchronized by MPI, flat has no node part)
        self.counted = counters and self.shm is not None
        self._whole = [self.packed(FWD), self.packed(REV)]
        self._bad = None
        self._theirs = None

    def begin(self, d, xbuf, e):
        self.dirs[d].start(xbuf, e)

    def end(self, d, xbuf, e, op):
        self.dirs[d].finish(d, xbuf, e, op)

    def run(self, d, xbuf, e, op):
        whole = self._whole[d]
        if whole is None:   # steps 1-4 with no frame between (flat's blocking call)
            s = self.dirs[d]
            s.start(xbuf, e)
            s.finish(d, xbuf, e, op)
            return
        rc = lib.hm_xchg_both(*whole, xbuf, e, op, d)
        if rc:
            self.fault(d, rc)

    def packed(self, d):
        """(send, recv) ``hm_xchg`` structures of a whole call of direction ``d`` when every
        peer is on this node (one C call: the Halo's hot path), else None."""
        s = self.dirs[d]
        return (s.send.x, s.recv.x) if self.counted and s.msgs.empty else None

    def fault(self, d, rc):
        """Raise the Fault of a whole packed call of direction ``d`` that returned ``rc``."""
        s = self.dirs[d]
        check(rc, s.send if s.send.x.err.code else s.recv)

    def bad_call(self, d, e):
        """Call ``e`` of direction ``d`` for a rank whose arguments were invalid: publish the
        invalid tag instead of data and read the node peers' tags (nothing is copied), and the
        same over messages (Messages.bad).  Returns whether every peer sending to this rank
        was invalid too."""
        rc = 0
        if self.counted:
            if self._bad is None:
                self._bad = [ZeroCopy(self, TAG_INVALID, None, None, None, empty=True, only=d2)
                             for d2 in (FWD, REV)]
            rc, _ = self._bad[d].bad(e)
        good_far = self.dirs[d].msgs.bad(d, e)
        return ok(rc) and good_far == 0

    def prepare(self):
        """Blocking forward updates of private arrays by cross-memory attach: large channels
        of long runs, on a node where process_vm_readv works (the same choice everywhere;
        every rank enters the probe, also one alone on its node)."""
        ex = self.ex
        paths = ex.paths
        if self.counted and paths.biggest >= paths.cma_bytes:
            pids = cma_pids(ex.ctx)
            if pids:
                runs = paths.cma and self.long_runs(self.node_ids(), CMA_MIN_RUN)
                if ex.ctx.comm.allreduce(int(runs), op=mpi().MIN):
                    self.cross_memory = ZeroCopy(self, lib.HM_TAG_CMA, None, self.node_ids(), pids)

    def shared_vector(self, tag, bases):
        """Updates of one shared vector (``bases``: its address on each node rank) without
        staging, when the largest channel inside a node carries ``zero_copy_bytes`` (zero copy
        needs one more hop, the owner waiting until its readers copied: it pays off from
        there); else None (collective on the node the first time)."""
        if not self.counted or self.ex.paths.biggest < self.ex.paths.zero_copy_bytes:
            return None
        return ZeroCopy(self, tag, bases, self.node_ids())

    def node_ids(self):
        """Per direction: each node peer's ids of its channel to this rank (collective on the
        node the first time)."""
        if self._theirs is None:
            ctx = self.ex.ctx
            self._theirs = []
            for d in (FWD, REV):
                sends = dict(self.ex.plans[d][0])
                got = alltoall(ctx, ctx.node_comm, [sends.get(r) for r in ctx.node_ranks], "Halo")
                self._theirs.append({ctx.node_ranks[i]: ids for i, ids in enumerate(got)
                                     if ids is not None})
        return self._theirs

    def long_runs(self, theirs, min_run):
        """Whether every forward channel inside the node moves runs of at least ``min_run``
        points on average (counted in (my point, peer's point) pairs)."""
        for c in self.dirs[FWD].recv_chans:
            mine, _, _ = pair_runs(np.asarray(c.ids), np.asarray(theirs[FWD][c.peer]))
            if c.ids.size < min_run * mine.size:
                return False
        return True

    def words(self):
        """The words this rank writes that its node peers wait on (READY of every sending
        channel, DONE of every receiving channel, both directions): where its error bits go."""
        return [c.ready for s in self.dirs for c in s.send_chans if c.ready] + \
               [c.done for s in self.dirs for c in s.recv_chans if c.done]

    def missing(self, d, epoch):
        return self.shm.missing(d, epoch) if self.shm is not None else []

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
        if self.shm is not None:
            self.shm.free()


def flat(ex):
    """Method "flat": Isend/Irecv with every neighbor, packed by the C core (the MPI
    baseline; no shared memory)."""
    return Exchange(ex, window=None, persistent=False)
