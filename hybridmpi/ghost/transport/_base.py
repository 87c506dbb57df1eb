"""Pieces shared by the transports: what a transport is given (:class:`Exchange`), how it
fails (:class:`~hybridmpi._native.errmap.Fault`), channels for the C core, MPI messages, deadlines."""

import os
import time
from abc import ABC, abstractmethod
from collections import namedtuple
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import settings
from ..._native.clib import copy_policy, ffi, lib
from ..._native.errmap import Fault, broke_before
from ..._native.errmap import check as check_rc
from ..._native.marks import mark as prof_mark
from ..._native.marks import mark_end as prof_mark_end
from ...comm._waits import NOTICE_GRACE_S, wait_requests

FWD, REV = 0, 1
_WORD = (1 << 64) - 1   # a counter as the unsigned 64-bit word it is


@dataclass(frozen=True)
class Paths:
    """The settings from which a transport chooses its paths, agreed by every rank when the
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
class Exchange:
    """Everything a transport needs of its Halo, fixed when the Halo is made.

    A transport reads this and nothing else of the Halo; it reports failures by
    raising :class:`Fault`, which the Halo turns into the exception users see.
    """

    #: the HybridComm's :class:`~hybridmpi.comm._context.Context`: its communicators, node layout,
    #: shared arena, wait policy and failure notices (a transport sees nothing else of it)
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
    #: the agreed settings from which the transport chooses its paths
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

class PackFloor:
    """The C kernels of a Halo's forward update and nothing else: its send points packed into a
    private buffer and its ghosts unpacked from another, with no synchronization or transfer
    (the floor under every method, for benchmarks).

    Args:
        exchange: the Halo's ``exchange``.
    """

    def __init__(self, exchange: Exchange) -> None:
        sends, recvs = exchange.plans[FWD]
        self._bufs = [private_chans(sends, exchange.esz), private_chans(recvs, exchange.esz)]
        self._pack = Xchg(exchange, self._bufs[0][1])
        self._unpack = Xchg(exchange, self._bufs[1][1])

    def update(self, xbuf: Any) -> None:
        """Pack and unpack ``xbuf`` (a cffi ``char[]`` over the Halo's vector)."""
        lib.hm_xchg_send(self._pack.x, xbuf, 1)
        lib.hm_xchg_recv(self._unpack.x, xbuf, 1, lib.HM_INSERT, 0)


def complete(ex, reqs, peers, what, e, statuses=None):
    """Complete MPI requests, under the Halo's deadline if it has one; a failure notice from
    a peer ends the wait (Fault "notice").  ``statuses`` (a list as long as ``reqs``)
    receive the requests' statuses."""
    stop = wait_requests(ex.ctx, reqs, ex.timeout, statuses=statuses)
    if stop is None:
        return
    if stop.notice is not None:
        raise Fault("notice", peer=stop.notice)
    late = [peers[i] for i in stop.late]
    raise Fault("timeout", detail=f"{what}: the messages with ranks {late} of call {e} did not "
                "complete", peer=late[0] if len(late) == 1 else None, counter="message", epoch=e)


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
    """A Halo method, made from an :class:`Exchange`.

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
    #: cross-memory attach, a :class:`~.atomic.ZeroCopy`), or None
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
