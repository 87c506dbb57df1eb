"""The Halo's exchange: one object moves a Halo's data, by method "atomic" (shared buffers
synchronized by C11 epoch counters inside a node, persistent MPI messages across nodes) or
"flat" (MPI messages with every neighbor, fresh per call: the MPI baseline).

A call of direction ``d`` (FWD: owners to ghosts; REV: ghosts into owners) with epoch ``e``
(1, 2, ... per direction) runs in four steps, as PETSc's ``sfbasic.c`` does:

1. ``begin``: post the receives from the other nodes;
2. ``begin``: pack the values for the other nodes and start their sends;
3. ``begin``: pack the values for the node peers into the shared buffer of the epoch's parity
   and release-store READY = e in each receiver's segment;
4. ``end``: unpack.  Forward: the node peers' buffers whichever is ready first (acquire-wait
   READY >= e, copy, release-store DONE = e in the sender's segment), then the messages.
   Reverse: the messages, then every channel in the order of the sending ranks, so the
   combined values have the same bits whatever the timing.

A sender waits DONE >= e - 2 before it packs a buffer again; there is no node-wide barrier.
When every peer is on the node, a whole call is one C call (``hm_xchg_both``, the Halo's hot
path).  Two more ways to move the part inside a node run over the same counters
(:class:`ZeroCopy`): shared vectors read in place by their readers, and private arrays read
by cross-memory attach.

A failure raises :class:`~hybridmpi._native.errmap.Fault`, which the Halo turns into the
exception users see.  The paper's baselines (:mod:`hybridmpi.tools.baselines`) implement the
same :class:`Transport` interface and join :data:`METHODS` through :func:`register`.

(A package of one module: ``hybridmpi.ghost.transport``, its old name, was a package, and the
old names of the baselines under it, ``hybridmpi.ghost.transport.neighbor`` and the others, still
resolve through it to :mod:`hybridmpi.tools.baselines`, with a DeprecationWarning.)
"""

import functools
import os
from abc import ABC, abstractmethod
from collections import namedtuple
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import settings
from ..._native.clib import copy_policy, ffi, lib
from ..._native.errmap import TAG_INVALID, Fault, ok
from ..._native.errmap import check as check_rc
from ..._native.tables import mpi
from ...comm._agree import allgather, alltoall, barrier
from ...comm._waits import wait_requests
from ...comm.room import round_up as _round

FWD, REV = 0, 1
#: channel size (bytes) from which shared vectors are updated without staging buffers
ZERO_COPY_BYTES = 6 * 1024
#: channel size (bytes) from which blocking updates of private arrays read the owner's array
#: with process_vm_readv (cross-memory attach), when the runs average CMA_MIN_RUN points
CMA_BYTES = 8 * 1024
CMA_MIN_RUN = 64


@dataclass(frozen=True)
class Paths:
    """The settings from which an exchange chooses its paths, agreed by every rank when the
    Halo is made (so every rank takes the same path)."""

    #: the largest channel inside a node, over all ranks (bytes)
    biggest: int
    #: channel size from which shared vectors are updated without staging (atomic)
    zero_copy_bytes: int
    #: channel size from which private arrays are read by cross-memory attach (atomic)
    cma_bytes: int
    #: whether cross-memory attach is allowed (env HYBRIDMPI_CMA)
    cma: bool


@dataclass(frozen=True)
class Spec:
    """Everything a method needs of its Halo, fixed when the Halo is made (``Halo.spec``).

    A method reads this and nothing else of the Halo; it reports failures by raising
    :class:`Fault`, which the Halo turns into the exception users see.
    """

    #: the HybridComm's :class:`~hybridmpi.comm._context.Context`: its communicators, node layout,
    #: shared arena, wait policy and failure notices (a method sees nothing else of it)
    ctx: Any
    #: mpi4py's MPI module
    MPI: Any
    #: per direction (FWD, REV): (sends, recvs), each a list of (peer, local ids), peers in
    #: rank order
    plans: tuple
    #: bytes per point (the dtype's itemsize times the block)
    esz: int
    #: the C core's type code of the dtype
    dtype: int
    #: the Halo's MPI tag; direction d's messages use tag + d
    tag: int
    #: seconds a wait may last (None: no limit)
    timeout: float | None
    #: the wait policy (a cffi ``hm_wait_policy``) that the C core's waits copy
    policy: Any
    #: the pattern's neighbors, in rank order
    neighbors: tuple
    #: the pattern itself, as a key only: the Halos of one pattern may share its MPI objects
    pattern: Any
    #: the agreed settings from which the method chooses its paths
    paths: Paths


def check(rc, x):
    """Raise the Fault of a C exchange call on ``x`` (an ``Xchg``, or a structure with an
    ``err`` field) that returned ``rc``."""
    if rc:
        check_rc(rc, (x.x if isinstance(x, Xchg) else x).err)

#: One direction of traffic with one peer: local ids, the two buffers (by
#: epoch parity; the same address twice for a private buffer), and the
#: addresses of the READY and DONE counters (None when something else
#: synchronizes) and of the tag word next to READY (which vector was published).
Chan = namedtuple("Chan", "peer ids buf0 buf1 ready done tag", defaults=(None,))


#: channels whose runs of consecutive ids are shorter than this on average are
#: moved point by point through an index list (no branch per point), the others
#: run by run (one memcpy per run)
RUN_KERNEL_MIN = settings.run_kernel_min()


def point_kernel(count, nruns, *arrays):
    """Whether a channel of ``count`` points in ``nruns`` runs goes point by point: its runs
    are short and its ``arrays`` of ids fit int32."""
    return (count > 0 and count < RUN_KERNEL_MIN * nruns
            and all(int(a.max()) < 2**31 and int(a.min()) >= 0 for a in arrays))


def runs(ids):
    """Split sorted-or-not local ids into runs of consecutive ids: (starts, lengths)."""
    if ids.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    first = np.concatenate(([0], np.flatnonzero(np.diff(ids) != 1) + 1))
    lengths = np.diff(np.append(first, ids.size))
    return np.ascontiguousarray(ids[first], dtype=np.int64), lengths.astype(np.int64)


class Xchg:
    """A C ``hm_xchg`` over channels, keeping alive what it points to."""

    def __init__(self, ex, chans, entered=None):
        self.peers = [c.peer for c in chans]
        self._keep = []
        self._arr = ffi.new("hm_chan[]", max(len(chans), 1))
        for i, c in enumerate(chans):
            start, length = runs(c.ids)
            self._keep += [start, length]
            h = self._arr[i]
            h.peer = c.peer
            h.count = c.ids.size
            h.nruns = start.size
            h.run_start = ffi.cast("int64_t *", start.ctypes.data)
            h.run_len = ffi.cast("int64_t *", length.ctypes.data)
            if point_kernel(c.ids.size, start.size, c.ids):
                idx = np.ascontiguousarray(c.ids, dtype=np.int32)
                self._keep.append(idx)
                h.idx = ffi.cast("int32_t *", idx.ctypes.data)
            h.buf[0] = ffi.cast("char *", c.buf0)
            h.buf[1] = ffi.cast("char *", c.buf1)
            h.ready = ffi.cast("void *", c.ready or 0)
            h.done = ffi.cast("void *", c.done or 0)
            h.tag = ffi.cast("void *", c.tag or 0)
        x = self.x = ffi.new("hm_xchg *")
        x.n = len(chans)
        x.chan = self._arr
        x.esz = ex.esz
        x.dtype = ex.dtype
        x.entered = ffi.cast("void *", entered or 0)
        copy_policy(x.policy, ex.policy)


def private_chans(specs, esz):
    """Channels over one private byte buffer, in the order of ``specs`` [(peer, ids)].

    Returns the buffer, the channels and a byte view of each peer's part.
    """
    total = sum(ids.size for _, ids in specs) * esz
    buf = np.empty(max(total, 1), dtype=np.uint8)
    chans, views, off = [], [], 0
    for peer, ids in specs:
        nb = ids.size * esz
        addr = buf.ctypes.data + off
        chans.append(Chan(peer, ids, addr, addr, None, None))
        views.append(buf[off:off + nb])
        off += nb
    return buf, chans, views

def complete(ex, reqs, peers, what, e, statuses=None):
    """Complete MPI requests, under the Halo's deadline if it has one; a failure notice from
    a peer ends the wait (Fault "notice").  ``peers``: each request's peer rank, or None for
    a collective over the pattern's neighbors.  ``statuses`` (a list as long as ``reqs``)
    receive the requests' statuses."""
    stop = wait_requests(ex.ctx, reqs, ex.timeout, statuses=statuses)
    if stop is None:
        return
    if stop.notice is not None:
        raise Fault("notice", peer=stop.notice)
    late = [peers[i] for i in stop.late]
    who = (f"the neighborhood collective with ranks {list(ex.neighbors)}" if None in late
           else f"the messages with ranks {late}")
    raise Fault("timeout", detail=f"{what}: {who} of call {e} did not complete",
                peer=late[0] if len(late) == 1 else None, counter="message", epoch=e)



#: requests that were still active when their transport was freed (a call failed in its
#: middle), with the buffers MPI may still write: never released
_PENDING: list[Any] = []


def release(reqs, *buffers):
    """Forget ``reqs`` at free; if one is still active, keep it and ``buffers`` alive for
    good, since MPI may still move data into them."""
    try:
        done = not reqs or reqs[0].__class__.Testall(reqs)
    except Exception:  # an MPI error completes the request
        done = True
    if not done:
        _PENDING.append((list(reqs), buffers))


_EMPTY = bytearray(0)


class Transport(ABC):
    """A Halo method, made from a :class:`Spec`: :class:`Exchange` ("atomic", "flat") and the
    paper's baselines.

    ``d`` is FWD (owners to ghosts) or REV (ghosts into owners), ``xbuf`` a cffi view of
    the vector, ``e`` the call's epoch (1, 2, ... per direction), ``op`` the C core's code
    of the combining operation.  Failures raise :class:`Fault`.
    """

    @abstractmethod
    def begin(self, d, xbuf, e):
        """Start call ``e`` of direction ``d``: what is sent is copied (or published) now."""

    @abstractmethod
    def end(self, d, xbuf, e, op):
        """Finish call ``e``: what was received is in ``xbuf``."""

    #: every rank of the node takes part in every call, neighbor or not (fence)
    node_collective = False
    #: the method holds an MPI window of its own, freed collectively with the Halo (fence,
    #: pscw, lock); the library's methods take blocks of the HybridComm's arena
    own_window = False

    @abstractmethod
    def free(self):
        """Release what the method holds (collective with the Halo's free)."""

    @abstractmethod
    def bad_call(self, d, e):
        """Call ``e`` of direction ``d`` for a rank whose arguments were invalid: take part in
        its synchronization with the call marked invalid, moving nothing, so that the peers
        raise instead of waiting or reading.  Returns whether every peer sending to this rank
        was invalid too (then the Halo stays usable)."""

    def run(self, d, xbuf, e, op):
        """A whole call: its begin, then its end."""
        self.begin(d, xbuf, e)
        self.end(d, xbuf, e, op)

    def prepare(self):
        """Collective set-up once the transports of every rank are made, outside the Halo's
        method fallback ("auto"); it chooses the method's own paths (atomic: cross-memory
        attach).  Nothing by default."""
        return None

    #: whole forward updates of private arrays by a path of the method's own (atomic:
    #: cross-memory attach, a :class:`ZeroCopy`), or None
    cross_memory: Any = None

    def packed(self, d):
        """The C structures (send, recv) of a whole call of direction ``d`` as one C call (the
        Halo's hot path), or None where the method has none."""
        return None

    def fault(self, d, rc):
        """Raise the Fault of a whole :meth:`packed` call of direction ``d`` that returned
        ``rc`` (only methods whose ``packed`` is not None are asked)."""
        raise RuntimeError(f"hybridmpi: C core returned {rc}")

    def shared_vector(self, tag, bases):
        """Updates of one shared vector (Halo.vector(); ``bases``: its address on each node
        rank) by a path of the method's own, or None: the vector is updated as any array.
        Collective on the node."""
        return None

    def words(self):
        """The words this rank writes that its node peers wait on (where its error bits go)."""
        return []

    def missing(self, d, epoch):
        """Ranks of this node that have not entered call ``epoch`` of direction ``d``, where
        the method can tell (after a timeout)."""
        return []

    def describe_word(self, addr):
        """(counter name, peer) when a wait on the word at ``addr`` is one of this method's."""
        return None


class Messages:
    """Point-to-point messages with some peers, packed and unpacked by the C core.

    Persistent requests (``Send_init``/``Recv_init``, started together) or a
    fresh ``Irecv``/``Isend`` per call, as flat MPI codes do.
    """

    def __init__(self, ex, sends, recvs, tag, persistent):
        self.ex = ex
        comm = ex.ctx.comm
        self._sbuf, schans, sviews = private_chans(sends, ex.esz)
        self._rbuf, self.recv_chans, rviews = private_chans(recvs, ex.esz)
        self.send = Xchg(ex, schans)
        self.recv = Xchg(ex, self.recv_chans)
        self.peers = [p for p, _ in recvs] + [p for p, _ in sends]
        self._pairs = (list(zip([p for p, _ in recvs], rviews)), list(zip([p for p, _ in sends], sviews)))
        self._comm, self._tag = comm, tag
        self._persistent = persistent
        self._reqs = []
        if persistent:
            self._reqs = ([comm.Recv_init(v, p, tag) for p, v in self._pairs[0]]
                          + [comm.Send_init(v, p, tag) for p, v in self._pairs[1]])
        self.empty = not self.peers
        self._MPI = ex.MPI
        self._statuses = [self._MPI.Status() for _ in self.peers]
        # the receives that carry data (an empty one is an invalid call's mark)
        self._expect = [i for i, (_, v) in enumerate(self._pairs[0]) if v.size]

    def start(self, xbuf, e):
        """Pack the sends and start every message."""
        if self.empty:
            return
        comm, tag = self._comm, self._tag
        if self._persistent:
            check(lib.hm_xchg_send(self.send.x, xbuf, e), self.send)
            self._MPI.Prequest.Startall(self._reqs)
            return
        reqs = [comm.Irecv(v, p, tag) for p, v in self._pairs[0]]
        check(lib.hm_xchg_send(self.send.x, xbuf, e), self.send)
        reqs += [comm.Isend(v, p, tag) for p, v in self._pairs[1]]
        self._reqs = reqs

    def bad(self, d, e):
        """Call ``e`` (direction ``d``) for a rank whose arguments were invalid: an empty
        message where each receiver expects data (it raises unless its arguments were invalid
        too), and each sender's message or empty message taken and dropped, so that nothing
        of this call is left for the next one (a message and its mark share the data's tag:
        MPI keeps them in order).  Returns how many peers sent data (their arguments were
        valid)."""
        if self.empty:
            return 0
        comm, tag = self._comm, self._tag
        reqs = [comm.Irecv(v, p, tag) for p, v in self._pairs[0]]
        reqs += [comm.Isend(_EMPTY, p, tag) for p, _ in self._pairs[1]]
        st = self._statuses
        complete(self.ex, reqs, self.peers, "reverse" if d else "update", e, st)
        return sum(st[i].Get_count(self._MPI.BYTE) > 0 for i in self._expect)

    def wait(self, what, e):
        """Complete the messages started last; an empty message from a peer (its arguments
        were invalid: Messages.bad) raises ValueError once all completed."""
        if self.empty:
            return
        st = self._statuses
        complete(self.ex, self._reqs, self.peers, what, e, st)
        for i in self._expect:
            if st[i].Get_count(self._MPI.BYTE) == 0:
                raise Fault("invalid", peer=self.peers[i])

    def free(self):
        release(self._reqs, self._sbuf, self._rbuf)
        if self._persistent:
            for r in self._reqs:
                r.Free()
        self._reqs = []


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
            mine, _, _ = _pair_runs(np.asarray(c.ids), np.asarray(theirs[FWD][c.peer]))
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


def _pair_runs(mine, theirs):
    """Runs of (my point, peer's point) pairs that both advance by one: (mine, theirs, lengths)."""
    if mine.size == 0:
        z = np.zeros(0, dtype=np.int64)
        return z, z, z
    breaks = np.flatnonzero((np.diff(mine) != 1) | (np.diff(theirs) != 1)) + 1
    first = np.concatenate(([0], breaks))
    lengths = np.diff(np.append(first, mine.size))
    return (np.ascontiguousarray(mine[first], dtype=np.int64),
            np.ascontiguousarray(theirs[first], dtype=np.int64), lengths.astype(np.int64))


def _probe_cma(ctx):
    """The process ids of this node's ranks (by node rank) if every rank can read every
    other node rank's memory with process_vm_readv (cross-memory attach), else False.
    Collective over the whole communicator."""
    hc = ctx
    word = np.array([os.getpid(), hc.rank], dtype=np.int64)
    peers = allgather(hc, hc.node_comm, (os.getpid(), word.ctypes.data, hc.rank), "Halo")
    ok = hc.node_size > 1
    got = np.zeros(2, dtype=np.int64)
    for pid, addr, rank in peers:
        if ok and rank != hc.rank:
            ok = bool(lib.hm_cma_probe(pid, ffi.cast("void *", addr),
                                       ffi.cast("void *", got.ctypes.data), 16))
            ok = ok and got.tolist() == [pid, rank]
    ok = hc.comm.allreduce(int(ok), op=mpi().MIN)  # word stays alive until here
    return [pid for pid, _, _ in peers] if ok else False


def cma_pids(ctx):
    """The process ids of this node's ranks when cross-memory attach works between them,
    else None: probed once per HybridComm (``ctx``: its Context; collective the first time)."""
    return ctx.service("cma", _probe_cma) or None


#: one direction of a ZeroCopy: the hm_pulls of this rank's reads and of its readers, the
#: READY and tag words it publishes to, and what those C structures point into
_Pulls = namedtuple("_Pulls", "pulls readers ready tags keep")


class ZeroCopy:
    """Updates of one shared vector (Halo.vector()) inside a node without staging buffers;
    with ``pids``, forward updates of private arrays copied by cross-memory attach
    (process_vm_readv from the owner's array, published at each call).

    Direction d, channel s -> r: s release-stores the vector's tag and READY = e
    in r's segment once its values are in place; r copies (forward) or
    combines (reverse) straight from s's vector and release-stores DONE = e in
    s's segment; s's ``*_end`` waits until every reader's DONE >= e.  The
    counters are the ones of the packed path, so both kinds of call can follow
    each other on one Halo.
    """

    def __init__(self, transport, tag, bases, theirs, pids=None, *, empty=False, only=None):
        ex = transport.ex
        self.tag, self.t = tag, transport
        self.cma = pids is not None
        pol = ex.policy
        node_rank = transport.shm.node_rank
        self.dirs = []
        for d in (FWD, REV):
            s = transport.dirs[d]
            keep = []
            pulls = ffi.new("hm_pulls *")
            arr = ffi.new("hm_pull[]", max(len(s.recv_chans), 1))
            for i, c in enumerate(s.recv_chans):
                if empty:  # signals only (bad_call): no points move
                    ids = their_ids = np.zeros(0, dtype=np.int64)
                else:
                    ids, their_ids = np.asarray(c.ids), np.asarray(theirs[d][c.peer])
                mine, other, lengths = _pair_runs(ids, their_ids)
                keep += [mine, other, lengths]
                h = arr[i]
                h.peer = c.peer
                h.count = ids.size
                if pids is None and point_kernel(ids.size, mine.size, ids, their_ids):
                    im = np.ascontiguousarray(ids, dtype=np.int32)
                    it = np.ascontiguousarray(their_ids, dtype=np.int32)
                    keep += [im, it]
                    h.imine = ffi.cast("int32_t *", im.ctypes.data)
                    h.itheirs = ffi.cast("int32_t *", it.ctypes.data)
                h.nruns = mine.size
                h.mine = ffi.cast("int64_t *", mine.ctypes.data)
                h.theirs = ffi.cast("int64_t *", other.ctypes.data)
                h.len = ffi.cast("int64_t *", lengths.ctypes.data)
                if pids is not None:
                    h.pid = pids[node_rank[c.peer]]
                elif bases is not None:
                    h.src = ffi.cast("char *", bases[node_rank[c.peer]])
                h.ready = ffi.cast("void *", c.ready)
                h.tag = ffi.cast("void *", c.tag)
                h.done = ffi.cast("void *", c.done)
            pulls.n, pulls.chan, pulls.esz, pulls.dtype = len(s.recv_chans), arr, ex.esz, ex.dtype
            pulls.cma = int(self.cma)
            readers = ffi.new("hm_pulls *")
            rarr = ffi.new("hm_pull[]", max(len(s.send_chans), 1))
            for i, c in enumerate(s.send_chans):
                rarr[i].peer = c.peer
                rarr[i].done = ffi.cast("void *", c.done)
            readers.n, readers.chan = len(s.send_chans), rarr
            readers.entered = ffi.cast("void *", transport.shm.entered(d))
            copy_policy(pulls.policy, pol)
            copy_policy(readers.policy, pol)
            n = max(len(s.send_chans), 1)
            ready = ffi.new("void *[]", [ffi.cast("void *", c.ready) for c in s.send_chans] or [ffi.NULL] * n)
            tags = ffi.new("void *[]", [ffi.cast("void *", c.tag) for c in s.send_chans] or [ffi.NULL] * n)
            self.dirs.append(_Pulls(pulls, readers, ready, tags, (keep, arr, rarr)))
        # the arguments of hm_zc_update, or None when messages go to other nodes
        self._whole = self.dirs[FWD][:4] if transport.dirs[FWD].msgs.empty else None
        self._only = only

    def bad(self, e):
        """A whole call of direction ``only`` with this object's tag and no points (bad_call)."""
        pulls, readers, ready, tags, _ = self.dirs[self._only]
        return lib.hm_zc_update(pulls, readers, ready, tags, self.tag, ffi.NULL, e), pulls.err

    def update(self, xbuf, e):
        """A whole forward update: one C call when every peer is on this node."""
        if self._whole is None:
            self.begin(FWD, xbuf, e)
            self.end(FWD, xbuf, e, lib.HM_INSERT)
            return
        pulls, readers, ready, tags = self._whole
        rc = lib.hm_zc_update(pulls, readers, ready, tags, self.tag, xbuf, e)
        if rc:
            check(rc, pulls)

    def whole_call(self):
        """The C call of a whole forward update as f(xbuf, e), or None when messages go to
        other nodes (Halo.update's hot path)."""
        if self._whole is None:
            return None
        return functools.partial(lib.hm_zc_update, *self._whole, self.tag)

    def whole_args(self):
        """The structures of hm_zc_update's first four arguments (pulls, readers, ready, tags),
        or None as for whole_call."""
        return self._whole

    def check(self, rc):
        """Raise the Fault of a whole forward update that returned ``rc``."""
        check(rc, self._whole[0])

    def begin(self, d, xbuf, e):
        """Start the messages (packed, across nodes), then publish this vector inside the node."""
        s = self.t.dirs[d]
        s.msgs.start(xbuf, e)
        _, readers, ready, tags, _ = self.dirs[d]
        check(lib.hm_zc_publish(readers, ready, tags, self.tag, xbuf, e), readers)

    def end(self, d, xbuf, e, op):
        """Copy from the node's owners (forward, whichever is ready first) or combine from
        every peer in rank order (reverse), then wait until this rank's readers are done."""
        s = self.t.dirs[d]
        pulls, readers, *_ = self.dirs[d]
        if d == FWD:
            check(lib.hm_pull_recv(pulls, xbuf, self.tag, e, op, 0), pulls)
            if not s.msgs.empty:
                s.msgs.wait("update", e)
                check(lib.hm_xchg_recv(s.msgs.recv.x, xbuf, e, op, 0), s.msgs.recv)
        else:
            check(lib.hm_pull_recv(pulls, xbuf, self.tag, e, op, 1), pulls)
        check(lib.hm_wait_done(readers, e), readers)


#: the Halo's methods: "atomic" (shared memory on the node, messages across nodes) and "flat"
#: (messages only); the paper's baselines ("neighbor", "fence", "pscw", "lock") are added by
#: importing :mod:`hybridmpi.tools.baselines`, which the benchmarks, the demo and the tests do
METHODS: dict[str, Callable[[Spec], Transport]] = {"atomic": Exchange, "flat": flat}


def register(name: str, transport: Callable[[Spec], Transport]) -> None:
    """Make ``Halo(pattern, method=name)`` build ``transport(spec)`` (its :class:`Spec`), a
    :class:`Transport`: how :mod:`hybridmpi.tools.baselines` adds the paper's baselines.
    A name already taken by another transport, or ``"auto"`` (the Halo's choice), is an error."""
    if name == "auto" or METHODS.get(name, transport) is not transport:
        raise ValueError(f"hybridmpi: Halo method {name!r} is taken")
    METHODS[name] = transport
