"""Global memory: arrays in the shared arena with locality-aware one-sided access.

A peer on this rank's node is reached with loads and stores (a copy into or
out of its shared segment, no MPI call; the release/acquire of the
synchronizations order it); a peer on another node with MPI-3 RMA on the
window that exposes the same memory (DART-MPI's design).  ``sync_all`` and
``sync_images`` are XcalableMP's synchronization; ``Coarray`` is its
facade.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Iterable
from typing import Any

import numpy as np

from ._clib import ERRBIT, copy_policy, ffi, lib
from ._resource import Freed
from .comm import HybridComm
from .errors import FreedError, PeerError, SyncTimeout
from .profile import mark as prof_mark
from .profile import mark_end as prof_mark_end

try:
    from ._timed import Near as _Near
except ImportError:  # built without the extension: the Python methods
    _Near = None

_R = lib.HM_REGION
_TAG_SYNC = 1
_EMPTY = bytearray(0)
#: communicators whose Iprobe drives MPI progress in waits (one per live _Sync across nodes)
_PROGRESS: list[Any] = []


@ffi.def_extern()
def hm_py_progress():
    """Drive MPI progress from a wait that stopped spinning: RMA aimed at this rank
    needs the target to enter MPI with some implementations."""
    if _PROGRESS:
        _PROGRESS[0].Iprobe()


def _int(value, what, rank):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"hybridmpi: rank {rank}: {what} must be an int, got {type(value).__name__}")
    return int(value)


class _Sync:
    """What sync_images needs on one HybridComm (made with its first global memory).

    Per ordered pair of ranks on a node, a 128-byte region holds how many
    times the first has called sync_images naming the second; only the
    first writes it.  Across nodes, each such call sends one zero-byte
    message on a communicator of its own.
    """

    def __init__(self, hc):
        self.hc = hc
        self.block = hc.arena.alloc(hc.node_size * _R, "sync_images counters")
        ffi.memmove(ffi.cast("char *", self.block.local), bytes(hc.node_size * _R), hc.node_size * _R)
        self.comm = hc.comm.Dup() if hc.num_nodes > 1 else None
        self.calls = ffi.new("uint64_t[]", hc.size)  # sync_images calls naming each rank (node peers)
        self.node_rank = {r: i for i, r in enumerate(hc.node_ranks)}
        self.plans = {}
        self.dirty = {}  # RMA windows with non-blocking operations not yet flushed, by id
        self.broken = None
        if self.comm is not None:
            _PROGRESS.append(self.comm)
            lib.hm_set_progress(lib.hm_py_progress)
        hc.node_comm.Barrier()

    def _ranks(self, ranks, what):
        """The checked, sorted ranks of a sync_images call, this rank left out."""
        hc = self.hc
        if isinstance(ranks, (int, np.integer)) and not isinstance(ranks, (bool, np.bool_)):
            ranks = (int(ranks),)
        try:
            ranks = tuple(_int(r, "a rank of sync_images", hc.rank) for r in ranks)
        except TypeError as e:
            if "must be an int" in str(e):
                raise
            raise TypeError(f"hybridmpi: rank {hc.rank}: {what}: ranks must be an int or a sequence "
                            f"of ints, got {type(ranks).__name__}") from None
        for r in ranks:
            if not 0 <= r < hc.size:
                raise ValueError(f"hybridmpi: rank {hc.rank}: {what}: rank {r} is out of range "
                                 f"(the communicator has {hc.size} ranks)")
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"hybridmpi: rank {hc.rank}: {what}: ranks {list(ranks)} name a rank twice")
        return tuple(sorted(r for r in ranks if r != hc.rank))

    def _plan(self, ranks, what):
        """Counters and peers of a sync_images argument, checked and built once per argument."""
        try:
            key = ranks if type(ranks) is int else tuple(ranks)
            plan = self.plans.get(key)
        except TypeError:
            key = plan = None
        if plan is not None:
            return plan
        ranks = self._ranks(ranks, what)
        hc = self.hc
        near = [r for r in ranks if r in self.node_rank]
        far = [r for r in ranks if r not in self.node_rank]
        p = ffi.new("hm_pairs *")
        n = max(len(near), 1)
        keep = [ffi.new("void *[]", n), ffi.new("void *[]", n), ffi.new("int64_t[]", near or [0])]
        p.n = len(near)
        p.signal, p.wait, p.peer = keep
        p.calls = self.calls
        me = self.node_rank[hc.rank]
        for i, r in enumerate(near):
            nr = self.node_rank[r]
            p.signal[i] = ffi.cast("void *", self.block.addr(nr, r) + me * _R)
            p.wait[i] = ffi.cast("void *", self.block.local + nr * _R)
        copy_policy(p.policy, hc._st.policy)
        plan = (near, far, p, keep)
        if key is not None:
            self.plans[key] = plan
        return plan

    def check(self):
        if self.broken:
            raise RuntimeError(f"hybridmpi: rank {self.hc.rank}: global memory synchronization is "
                               f"unusable after an earlier {self.broken}")

    def flush_dirty(self):
        for win in self.dirty.values():
            win.Flush_all()
        self.dirty.clear()

    def sync_all(self):
        self.check()
        self.flush_dirty()
        self.hc.barrier()
        if self.comm is not None:
            for win in self.hc.arena.rma_windows():
                win.Sync()

    def sync_images(self, ranks, what):
        near, far, p, _ = self._plan(ranks, what)
        if self.broken:
            self.check()
        if self.dirty:
            self.flush_dirty()
        hc = self.hc
        reqs = None
        if far:
            comm = self.comm
            reqs = [comm.Irecv(_EMPTY, r, _TAG_SYNC) for r in far]
            reqs += [comm.Isend(_EMPTY, r, _TAG_SYNC) for r in far]
        if near and lib.hm_signal_wait(p):
            peer = near[p.err.peer]
            if p.err.code == lib.HM_EPEER:
                self.broken = "PeerError"
                raise hc._peer_error(what, peer, int(p.err.seen))
            self.broken = "SyncTimeout"
            raise SyncTimeout(
                f"hybridmpi: rank {hc.rank} timed out after {hc.timeout:g} s in {what}: rank "
                f"{peer} has called sync_images naming rank {hc.rank} {int(p.err.seen)} times, "
                f"this rank {int(p.err.epoch)}", rank=hc.rank, peer=peer, counter="sync_images",
                epoch=int(p.err.epoch))
        if reqs:
            self._complete(reqs, far, what)
            for win in hc.arena.rma_windows():
                win.Sync()

    def _complete(self, reqs, far, what):
        try:
            left = _wait_requests(self.hc, reqs, notices=True)
        except PeerError:
            self.broken = "PeerError"
            raise
        if left is None:
            return
        # the receives come first in reqs, one per rank of far
        late = [far[i] for i in left if i < len(far)] or list(far)
        self.broken = "SyncTimeout"
        who = f"rank {late[0]} on another node" if len(late) == 1 else f"ranks {late} on other nodes"
        raise SyncTimeout(
            f"hybridmpi: rank {self.hc.rank} timed out after {self.hc.timeout:g} s in {what}: "
            f"{who} did not call sync_images naming rank {self.hc.rank}",
            rank=self.hc.rank, peer=late[0] if len(late) == 1 else None,
            counter="sync_images", epoch=None)

    def _describe_word(self, addr):
        """What a wait on ``addr`` waits for, if it is a sync_images counter (hang diagnosis)."""
        if self.block.chunk is None:
            return None
        for nr, r in enumerate(self.hc.node_ranks):
            if addr == self.block.local + nr * _R:
                return (f"sync_images, waiting for rank {r} to name rank {self.hc.rank} once more "
                        f"(call {int(self.calls[r])} naming it)")
        return None

    def poison(self, bits):
        """Error bits in the sync_images counters this rank writes (its HybridComm broke)."""
        if self.block.chunk is None:
            return
        hc, me = self.hc, self.node_rank[self.hc.rank]
        words = [ffi.cast("void *", self.block.addr(nr, r) + me * _R)
                 for nr, r in enumerate(hc.node_ranks) if r != hc.rank]
        if words:
            lib.hm_poison(len(words), words, bits)

    def free(self):
        self.block.free()
        if self.comm is not None:
            _PROGRESS.remove(self.comm)
            if not _PROGRESS:
                lib.hm_set_progress(ffi.NULL)
            if not self.hc._MPI.Is_finalized():
                self.hc._free_comm(self.comm)
        self.comm = None


def _wait_requests(hc, reqs, notices=False):
    """Complete MPI requests, under the HybridComm's deadline if it has one; with
    ``notices`` (requests a peer must match), a failure notice from any rank ends the wait
    with PeerError.

    Returns:
        None, or on timeout the indices of the requests still incomplete
        (the caller names who it waited for).
    """
    MPI = hc._MPI
    prof_mark()
    if MPI.Request.Testall(reqs):
        prof_mark_end()
        return None
    deadline = None if hc.timeout is None else time.monotonic() + hc.timeout
    polls, spin = 0, hc._st.policy.spin
    while not MPI.Request.Testall(reqs):
        polls += 1
        if notices and polls % 64 == 0 and hc._failure_notice() is not None:
            raise hc._peer_error("sync_images", hc._notice_from, ERRBIT)
        if deadline is not None and time.monotonic() > deadline:
            return [i for i, r in enumerate(reqs) if not r.Test()]
        if polls > spin:
            os.sched_yield()
    prof_mark_end()
    return None


def _rma_timeout(hc, what):
    return SyncTimeout(f"hybridmpi: rank {hc.rank} timed out after {hc.timeout:g} s waiting for "
                       f"{what}", rank=hc.rank, counter="rma")


def _sync_state(hc):
    if hc._gm is None:
        hc._gm = _Sync(hc)
    return hc._gm


class Request:
    """A non-blocking put or get (:meth:`GlobalMemory.Rput`, :meth:`GlobalMemory.Rget`).

    ``wait()`` returns once the transfer is complete at both ends (a put's
    data is in the target's memory; a get's data is in ``out``); ``test()``
    says whether it is, without blocking.  A request is waited once.
    """

    __slots__ = ("_mem", "_req", "_target", "_keep", "_done", "_waited", "_what")

    def __init__(self, mem, req, target, keep, what):
        self._mem = mem
        self._req = req          # MPI request, None when already complete
        self._target = target    # rank to flush for a put across nodes, else None
        self._keep = keep        # buffers that must live until completion
        self._done = req is None
        self._waited = False
        self._what = what

    def _finish(self):
        if self._target is not None:
            self._mem._win.Flush(self._target)
        self._done = True
        self._keep = None

    def test(self) -> bool:
        """True once the transfer is complete (never blocks)."""
        if not self._done and self._req.Test():
            self._finish()
        return self._done

    def wait(self) -> None:
        """Block until the transfer is complete at both ends.

        Raises:
            RuntimeError: the request was already waited.
            SyncTimeout: not complete within the HybridComm's timeout.
        """
        hc = self._mem.hc
        if self._waited:
            raise RuntimeError(f"hybridmpi: rank {hc.rank}: {self._what} request waited twice")
        self._waited = True
        if self._done:
            return
        if _wait_requests(hc, [self._req]) is not None:
            raise _rma_timeout(hc, self._what)
        self._finish()


def waitall(requests: Iterable[Request]) -> None:
    """Wait for every request of a list (checked first: none may have been waited).

    Raises:
        TypeError: an element is not a Request.
        RuntimeError: a request was already waited (nothing is waited then).
    """
    requests = list(requests)
    for r in requests:
        if not isinstance(r, Request):
            raise TypeError(f"hybridmpi: waitall: expected Requests, got {type(r).__name__}")
        if r._waited:
            raise RuntimeError(f"hybridmpi: rank {r._mem.hc.rank}: waitall: a {r._what} request was "
                               "already waited")
    pending = [r for r in requests if not r._done]
    for r in requests:
        r._waited = True
    if not pending:
        return
    hc = pending[0]._mem.hc
    if _wait_requests(hc, [r._req for r in pending]) is not None:
        raise _rma_timeout(hc, f"waitall ({len(pending)} requests)")
    # one flush per window and target completes every put at its target
    flushes = {}
    for r in pending:
        if r._target is not None:
            flushes[(id(r._mem._win), r._target)] = r._mem._win
        r._done = True
        r._keep = None
    for (_, target), win in flushes.items():
        win.Flush(target)


class GlobalMemory(Freed):
    """An array with a part on every rank, reachable by one-sided put and get.

    Collective over the HybridComm.  The parts live in the HybridComm's
    shared arena, zeroed; a part on this rank's node is accessed with
    loads and stores, one on another node with MPI-3 RMA over the same
    memory.

    Args:
        hc: the HybridComm.
        count: elements of this rank's part (ranks may differ; 0 allowed).
        dtype: a numeric numpy dtype (the same on every rank).

    Attributes:
        local: this rank's part (a numpy array in shared memory).
        counts: every rank's count.
        dtype, hc, rank, size.

    Memory: a blocking put or get is complete at both ends when it
    returns; other ranks see a put's data for certain after a
    synchronization that orders them (:meth:`sync_all`, :meth:`sync_images`).

    Raises:
        TypeError: not a HybridComm, count not an int, non-numeric dtype.
        ValueError: negative count, ranks with different dtypes.
        MemoryError: the parts do not fit in /dev/shm (every rank).
        FreedError: the HybridComm was freed.
    """

    def __init__(self, hc: HybridComm, count: int, dtype: Any = np.float64) -> None:
        if not isinstance(hc, HybridComm):
            raise TypeError(f"hybridmpi: GlobalMemory needs a HybridComm, got {type(hc).__name__}")
        if hc.closed:
            raise FreedError(f"hybridmpi: rank {hc.rank}: GlobalMemory on a freed HybridComm")
        problem: str | None = None
        exc: type[Exception] = ValueError
        try:
            dt = np.dtype(dtype)
        except TypeError:
            dt = None
        if dt is None or dt.kind not in "biufc":
            problem, exc = f"dtype must be a numeric numpy dtype, got {dtype!r}", TypeError
        elif isinstance(count, (bool, np.bool_)) or not isinstance(count, (int, np.integer)):
            problem, exc = f"count must be an int, got {type(count).__name__}", TypeError
        elif count < 0:
            problem = f"count must be >= 0, got {count}"
        views = hc.comm.allgather((problem, exc, dt.str if dt is not None else None))
        bad = [(r, p, e) for r, (p, e, _) in enumerate(views) if p]
        if bad:
            raise bad[0][2](f"hybridmpi: GlobalMemory(): rank {bad[0][0]}: {bad[0][1]}")
        if len({v[2] for v in views}) != 1:
            raise ValueError("hybridmpi: GlobalMemory(): ranks passed different dtypes: "
                             f"{[np.dtype(v[2]).name for v in views]}")
        count = int(count)
        self.hc = hc
        self.rank, self.size = hc.rank, hc.size
        self.dtype = dt
        self._views: Any = None
        self._near = {}
        self._sync = _sync_state(hc)
        self.counts = tuple(hc.comm.allgather(count))
        self._block = hc.arena.alloc(count * dt.itemsize, "GlobalMemory")
        self._win = self._block.rma
        self._BYTE = hc._MPI.BYTE
        self._disp = self._block.offsets
        node_rank = {r: i for i, r in enumerate(hc.node_ranks)}
        views, addrs = [None] * hc.size, [0] * hc.size
        for r, nr in node_rank.items():
            addrs[r] = self._block.addr(nr, r)
            views[r] = self._array(addrs[r], self.counts[r])
        self.local = views[hc.rank]
        self.local[...] = 0
        self._addrs = addrs
        # Open MPI 4's osc/rdma crashes in MPI_Compare_and_swap aimed at the calling rank over
        # its shared-memory BTL (open-mpi/ompi#7967, #11349); there the CAS on this rank's own
        # part is a CPU atomic, which stays atomic with MPI's (executed on this rank's memory
        # by this rank's own progress, or with CPU atomics)
        vendor, version = hc._MPI.get_vendor()
        self._self_cas = vendor == "Open MPI" and version < (5,)
        self._itemsize = dt.itemsize
        self._views = views
        self._near = {r: views[r] for r in node_rank}  # the parts reached by load/store
        if _Near is not None and dt.itemsize:
            # Put and Get of a 1-D array to a part on this node in C: about 0.2 us instead of
            # 1 us of Python checks and slicing; anything else falls back to the methods below
            bases = [a if v is not None else 0 for a, v in zip(addrs, views)]
            me = weakref.proxy(self)  # no reference cycle through the C object
            for name, get in (("Put", False), ("Get", True)):
                self.__dict__[name] = _Near(np.ndarray, dt, getattr(GlobalMemory, name).__get__(me),
                                            bases, list(self.counts), dt.itemsize, get)
        hc.comm.Barrier()  # every part zeroed before anyone reaches it
        hc._adopt(self)

    def _array(self, addr, count):
        if count == 0:
            return np.zeros(0, dtype=self.dtype)
        return np.frombuffer(ffi.buffer(ffi.cast("char *", addr), count * self.dtype.itemsize),
                             dtype=self.dtype)

    # ------------------------------------------------------------ checks

    def _usable(self, what):
        if self._views is None:
            raise FreedError(f"hybridmpi: rank {self.rank}: GlobalMemory.{what} after free()")

    def _target(self, rank, offset, n, what):
        """Check a target range before anything moves."""
        if type(rank) is not int:
            rank = _int(rank, f"GlobalMemory.{what}: rank", self.rank)
        if not 0 <= rank < self.size:
            raise ValueError(f"hybridmpi: rank {self.rank}: GlobalMemory.{what}: rank {rank} is out of "
                             f"range (the communicator has {self.size} ranks)")
        if type(offset) is not int:
            offset = _int(offset, f"GlobalMemory.{what}: offset", self.rank)
        part = self.counts[rank]
        if offset < 0 or offset + n > part:
            raise IndexError(f"hybridmpi: rank {self.rank}: GlobalMemory.{what}: offset {offset} and "
                             f"length {n} are outside rank {rank}'s part of {part} elements")
        return rank, offset

    def _buffer(self, a, what, write):
        if type(a) is not np.ndarray:
            raise TypeError(f"hybridmpi: rank {self.rank}: GlobalMemory.{what}: expected a numpy array, "
                            f"got {type(a).__name__}")
        if a.dtype != self.dtype:
            raise TypeError(f"hybridmpi: rank {self.rank}: GlobalMemory.{what}: array has dtype "
                            f"{a.dtype}, this memory holds {self.dtype}")
        if not a.flags.c_contiguous:
            raise ValueError(f"hybridmpi: rank {self.rank}: GlobalMemory.{what}: array must be "
                             "C-contiguous")
        if write and not a.flags.writeable:
            raise ValueError(f"hybridmpi: rank {self.rank}: GlobalMemory.{what}: out is read-only")

    # ------------------------------------------------------------ access

    def local_view(self, rank: int) -> np.ndarray | None:
        """A numpy view of ``rank``'s part when it shares this rank's node, else None."""
        self._usable("local_view")
        rank, _ = self._target(rank, 0, 0, "local_view")
        return self._views[rank]

    def Put(self, data: np.ndarray, rank: int, offset: int = 0) -> None:
        """Write ``data`` into ``rank``'s part from element ``offset``; complete at both ends on return.

        Raises:
            TypeError: ``data`` not a numpy array of this memory's dtype.
            ValueError: non-contiguous ``data``, rank out of range.
            IndexError: the range is outside the target's part.
            FreedError: after free().
        """
        # The common cases in as few Python operations as possible: a 1-D array
        # of the right dtype to a peer on this node (_near is empty once freed)
        # or on another node.
        v = self._near.get(rank)
        if type(data) is np.ndarray and data.dtype is self.dtype and data.ndim == 1 and type(offset) is int:
            if v is not None and data.flags.c_contiguous:
                n = data.size
                if 0 <= offset <= v.size - n:
                    if n == 1:  # one element: a scalar store, a third of a slice copy's time
                        v[offset] = data.item()
                    else:
                        v[offset:offset + n] = data
                    return
            elif (type(rank) is int and 0 <= rank < self.size and 0 <= offset
                  and offset + data.size <= self.counts[rank] and data.flags.c_contiguous
                  and self._views is not None):
                nb, win, BYTE = data.nbytes, self._win, self._BYTE
                win.Put((data, nb, BYTE), rank, (self._disp[rank] + offset * self._itemsize, nb, BYTE))
                win.Flush(rank)
                return
        self._usable("Put")
        self._buffer(data, "Put", False)
        rank, offset = self._target(rank, offset, data.size, "Put")
        v = self._views[rank]
        if v is not None:
            v[offset:offset + data.size] = data.reshape(-1)
            return
        nb = data.nbytes
        if nb:
            win, BYTE = self._win, self._BYTE
            win.Put((data, nb, BYTE), rank, (self._disp[rank] + offset * self._itemsize, nb, BYTE))
            win.Flush(rank)

    def Get(self, out: np.ndarray, rank: int, offset: int = 0) -> None:
        """Read ``out.size`` elements of ``rank``'s part from ``offset`` into ``out``; complete on return.

        Raises:
            TypeError: ``out`` not a numpy array of this memory's dtype.
            ValueError: ``out`` read-only or non-contiguous, rank out of range.
            IndexError: the range is outside the target's part.
            FreedError: after free().
        """
        v = self._near.get(rank)
        if type(out) is np.ndarray and out.dtype is self.dtype and out.ndim == 1 and type(offset) is int:
            if v is not None and out.flags.c_contiguous:
                n = out.size
                if 0 <= offset <= v.size - n:
                    try:
                        if n == 1:  # one element: a scalar load and store
                            out[0] = v[offset]
                        else:
                            out[:] = v[offset:offset + n]
                        return
                    except ValueError:
                        pass  # read-only: the checks below say so
            elif (type(rank) is int and 0 <= rank < self.size and 0 <= offset
                  and offset + out.size <= self.counts[rank] and out.flags.c_contiguous
                  and out.flags.writeable and self._views is not None):
                nb, win, BYTE = out.nbytes, self._win, self._BYTE
                win.Get((out, nb, BYTE), rank, (self._disp[rank] + offset * self._itemsize, nb, BYTE))
                win.Flush(rank)
                return
        self._usable("Get")
        self._buffer(out, "Get", True)
        rank, offset = self._target(rank, offset, out.size, "Get")
        v = self._views[rank]
        if v is not None:
            out.reshape(-1)[:] = v[offset:offset + out.size]
            return
        nb = out.nbytes
        if nb:
            win, BYTE = self._win, self._BYTE
            win.Get((out, nb, BYTE), rank, (self._disp[rank] + offset * self._itemsize, nb, BYTE))
            win.Flush(rank)

    def Rput(self, data: np.ndarray, rank: int, offset: int = 0) -> Request:
        """Start a put; returns a :class:`Request` (``data`` must not change until it completes).

        Inside a node the copy is made at once and the request is complete.
        """
        self._usable("Rput")
        self._buffer(data, "Rput", False)
        rank, offset = self._target(rank, offset, data.size, "Rput")
        v = self._views[rank]
        if v is not None or data.size == 0:
            if data.size:
                v[offset:offset + data.size] = data.reshape(-1)
            return Request(self, None, None, None, "Rput")
        MPI = self.hc._MPI
        nb = data.nbytes
        req = self._win.Rput((data, nb, MPI.BYTE), rank,
                             (self._disp[rank] + offset * self._itemsize, nb, MPI.BYTE))
        self._sync.dirty[id(self._win)] = self._win
        return Request(self, req, rank, data, "Rput")

    def Rget(self, out: np.ndarray, rank: int, offset: int = 0) -> Request:
        """Start a get into ``out``; returns a :class:`Request` (read ``out`` after it completes)."""
        self._usable("Rget")
        self._buffer(out, "Rget", True)
        rank, offset = self._target(rank, offset, out.size, "Rget")
        v = self._views[rank]
        if v is not None or out.size == 0:
            if out.size:
                out.reshape(-1)[...] = v[offset:offset + out.size]
            return Request(self, None, None, None, "Rget")
        MPI = self.hc._MPI
        nb = out.nbytes
        req = self._win.Rget((out, nb, MPI.BYTE), rank,
                             (self._disp[rank] + offset * self._itemsize, nb, MPI.BYTE))
        return Request(self, req, None, out, "Rget")

    def flush(self, rank: int | None = None) -> None:
        """Complete every outstanding operation of this rank on this memory (to ``rank``, or to all)."""
        self._usable("flush")
        if rank is not None:
            rank, _ = self._target(rank, 0, 0, "flush")
        if self._win is None:
            return
        if rank is None:
            self._win.Flush_all()
        elif self._views[rank] is None:
            self._win.Flush(rank)

    def _atomic(self, rank, offset, what):
        self._usable(what)
        if self.dtype != np.int64:
            raise TypeError(f"hybridmpi: rank {self.rank}: GlobalMemory.{what}: atomics need an int64 "
                            f"memory, this one holds {self.dtype}")
        return self._target(rank, offset, 1, what)

    def fetch_add(self, rank: int, offset: int, value: int) -> int:
        """Atomically add ``value`` to element ``offset`` of ``rank``'s part; return the old value.

        Atomic with respect to every other fetch_add and compare_swap on this
        memory (inside one node C11 atomics, across nodes MPI's: when the
        memory spans several nodes, every atomic goes through MPI).
        """
        rank, offset = self._atomic(rank, offset, "fetch_add")
        value = _int(value, "GlobalMemory.fetch_add: value", self.rank)
        if self._win is None:
            return int(lib.hm_fetch_add(ffi.cast("void *", self._addrs[rank] + 8 * offset), value))
        MPI = self.hc._MPI
        res = np.zeros(1, dtype=np.int64)
        self._win.Fetch_and_op(np.array([value], dtype=np.int64), res, rank,
                               self._disp[rank] + 8 * offset, MPI.SUM)
        self._win.Flush(rank)
        return int(res[0])

    def compare_swap(self, rank: int, offset: int, expected: int, value: int) -> int:
        """Atomically set element ``offset`` of ``rank``'s part to ``value`` if it equals
        ``expected``; return the old value (atomic as :meth:`fetch_add`)."""
        rank, offset = self._atomic(rank, offset, "compare_swap")
        expected = _int(expected, "GlobalMemory.compare_swap: expected", self.rank)
        value = _int(value, "GlobalMemory.compare_swap: value", self.rank)
        if self._win is None or (rank == self.rank and self._self_cas):
            return int(lib.hm_compare_swap(ffi.cast("void *", self._addrs[rank] + 8 * offset),
                                           expected, value))
        res = np.zeros(1, dtype=np.int64)
        self._win.Compare_and_swap(np.array([value], dtype=np.int64), np.array([expected], dtype=np.int64),
                                   res, rank, self._disp[rank] + 8 * offset)
        self._win.Flush(rank)
        return int(res[0])

    # ------------------------------------------------------------ synchronization

    def sync_all(self) -> None:
        """Barrier over the HybridComm after which every put issued before it, by any rank,
        is visible to every rank (XcalableMP ``sync all``).

        Raises:
            SyncTimeout: a rank did not arrive within the timeout.
        """
        self._usable("sync_all")
        self._sync.sync_all()

    def sync_images(self, ranks: int | Iterable[int]) -> None:
        """Wait until each listed rank has called ``sync_images`` naming this rank as many
        times as this rank has named it (XcalableMP ``sync images``); their puts to this
        rank issued before their call are then visible.  No global barrier.

        The counts are per HybridComm, shared by all its global memory and coarrays.

        Args:
            ranks: an int or a sequence of distinct ranks (this rank is ignored).

        Raises:
            TypeError, ValueError: bad ranks (nothing is signalled).
            SyncTimeout: a listed rank did not call within the timeout; names it.
        """
        self._usable("sync_images")
        self._sync.sync_images(ranks, "sync_images")

    # ------------------------------------------------------------ life

    def free(self) -> None:
        """Give the memory back to the arena (collective).  Idempotent."""
        self.hc._children.pop(id(self), None)
        if self._views is None:
            return
        self._views = None
        self._near = {}
        self.local = None
        for name in ("Put", "Get"):
            fast = self.__dict__.pop(name, None)
            if fast is not None and hasattr(fast, "close"):
                fast.close()  # a reference kept by the caller now raises FreedError too
        if self._win is not None and not self.hc._MPI.Is_finalized():
            self._win.Flush_all()  # every pending operation on the window: none stays dirty
            if self.hc._gm is not None:
                self.hc._gm.dirty.pop(id(self._win), None)
        self._block.free()

    @property
    def closed(self) -> bool:
        """True once :meth:`free` was called."""
        return self._views is None

    def __repr__(self):
        state = "freed" if self._views is None else f"{self.counts[self.rank]} local elements"
        return f"<GlobalMemory rank {self.rank}/{self.size} dtype={self.dtype}, {state}>"


def _key(index, rank):
    """A hashable form of a basic index (slices are not hashable before Python 3.12)."""
    t = type(index)
    if t is int or index is Ellipsis:
        return index
    if t is slice:
        return (slice, index.start, index.stop, index.step)
    if t is tuple:
        return tuple(_key(i, rank) for i in index)
    if isinstance(index, np.integer):
        return int(index)
    raise TypeError(f"hybridmpi: rank {rank}: Coarray: only basic indexing (ints, slices, ...) "
                    f"is supported, got {type(index).__name__}")


class _Section:
    """Where a basic index lands in the array: byte offset, shape and byte strides,
    and the index as numpy takes it (a 0-d view, not a copy, when every index is an int)."""

    __slots__ = ("start", "shape", "strides", "idx", "nbytes", "contiguous")

    def __init__(self, local, index, rank):
        idx = index if type(index) is tuple else (index,)
        if not any(i is Ellipsis for i in idx):
            idx = idx + (Ellipsis,)
        try:
            view = local[idx]
        except IndexError as e:
            raise IndexError(f"hybridmpi: rank {rank}: Coarray: index {index!r} is outside the shape "
                             f"{local.shape}: {e}") from None
        self.start = view.__array_interface__["data"][0] - local.__array_interface__["data"][0]
        self.shape, self.strides, self.idx = view.shape, view.strides, idx
        self.nbytes = view.nbytes
        self.contiguous = view.flags.c_contiguous  # moves as plain bytes across nodes


class Coarray(Freed):
    """XcalableMP coarrays: an array of the same shape on every rank, ``a[r][index]`` put and get.

    ``a.local`` is this rank's array (shared memory).  ``a[r][index] = values``
    writes a section of rank ``r``'s array (blocking: complete at both ends
    on return; ``values`` broadcast to the section), ``a[r][index]`` reads one
    into a new array; ``index`` is numpy basic indexing (ints, slices with
    steps, ``...``) in any dimension.  Strided sections move in one call:
    one numpy (C) strided copy inside a node, one MPI derived datatype
    (nested hvectors) across nodes, never row by row.

    Args:
        hc: the HybridComm (collective).
        shape: the array's shape, the same on every rank.
        dtype: a numeric numpy dtype.

    Raises:
        TypeError: bad shape or dtype.
        ValueError: ranks with different shapes or dtypes, negative extents.
    """

    def __init__(self, hc: HybridComm, shape: int | tuple[int, ...], dtype: Any = np.float64) -> None:
        if not isinstance(hc, HybridComm):
            raise TypeError(f"hybridmpi: Coarray needs a HybridComm, got {type(hc).__name__}")
        if isinstance(shape, (int, np.integer)):
            shape = (shape,)
        problem = None
        try:
            shape = tuple(_int(n, "a Coarray extent", hc.rank) for n in shape)
            if any(n < 0 for n in shape):
                problem = f"extents must be >= 0, got {shape}"
        except TypeError:
            problem = f"shape must be an int or a tuple of ints, got {shape!r}"
        views = hc.comm.allgather((problem, shape))
        bad = [(r, p) for r, (p, _) in enumerate(views) if p]
        if bad:
            exc = TypeError if "must be an int or" in bad[0][1] else ValueError
            raise exc(f"hybridmpi: Coarray(): rank {bad[0][0]}: {bad[0][1]}")
        if len({v[1] for v in views}) != 1:
            raise ValueError(f"hybridmpi: Coarray(): ranks passed different shapes: {[v[1] for v in views]}")
        self.shape = shape
        self.mem = GlobalMemory(hc, int(np.prod(shape, dtype=np.int64)), dtype)
        hc._children.pop(id(self.mem), None)
        if hc._profile is not None:
            hc._profile._forget(self.mem)  # recorded as the Coarray's
        hc._adopt(self)
        self.hc = hc
        self.dtype = self.mem.dtype
        self.local = self.mem.local.reshape(shape)
        self._shaped: list[Any] = [None if v is None else v.reshape(shape) for v in self.mem._views]
        self._images = [_Image(self, r) for r in range(hc.size)]
        self._sections: dict[Any, Any] = {}   # index key -> _Section
        self._targets: dict[Any, Any] = {}    # (rank, index key) -> view of a node peer's section
        self._types: dict[Any, Any] = {}      # (shape, strides) -> committed MPI datatype

    def __getitem__(self, rank):
        if type(rank) is int and 0 <= rank < len(self._images):
            return self._images[rank]
        self.mem._usable("[rank]")
        rank, _ = self.mem._target(rank, 0, 0, "[rank]")
        return self._images[rank]

    def _section(self, key, index):
        sec = self._sections.get(key)
        if sec is None:
            sec = self._sections[key] = _Section(self.local, index, self.mem.rank)
        return sec

    def _target(self, rank, index):
        """(view of the section on a node peer or None, index key)."""
        self.mem._usable("[rank][index]")
        key = _key(index, self.mem.rank)
        view = self._targets.get((rank, key))
        if view is None and self._shaped[rank] is not None:
            view = self._targets[(rank, key)] = self._shaped[rank][self._section(key, index).idx]
        return view, key

    def _datatype(self, sec):
        """An MPI datatype for a strided section (cached), built from nested hvectors."""
        key = (sec.shape, sec.strides)
        t = self._types.get(key)
        if t is None:
            MPI = self.hc._MPI
            t = MPI.BYTE.Create_contiguous(self.dtype.itemsize)
            for n, stride in zip(reversed(sec.shape), reversed(sec.strides)):
                outer = t.Create_hvector(n, 1, stride)
                t.Free()
                t = outer
            t.Commit()
            self._types[key] = t
        return t

    def _where(self, mem, rank, sec):
        """The RMA target of a section: plain bytes when contiguous, else a derived datatype."""
        if sec.contiguous:
            return (mem._disp[rank] + sec.start, sec.nbytes, self.hc._MPI.BYTE)
        return (mem._disp[rank] + sec.start, 1, self._datatype(sec))

    def _put(self, rank, index, values, blocking):
        view, key = self._target(rank, index)
        mem = self.mem
        if view is not None:
            try:
                view[...] = values
            except ValueError:
                raise ValueError(f"hybridmpi: rank {mem.rank}: Coarray: values of shape "
                                 f"{np.shape(values)} do not fit the section of shape {view.shape}") from None
            return None if blocking else Request(mem, None, None, None, "Coarray.Rput")
        sec = self._section(key, index)
        try:
            if (type(values) is np.ndarray and values.dtype is self.dtype and values.shape == sec.shape
                    and values.flags.c_contiguous):
                src = values
            else:
                src = np.ascontiguousarray(np.broadcast_to(np.asarray(values, dtype=self.dtype),
                                                           sec.shape))
        except ValueError:
            raise ValueError(f"hybridmpi: rank {mem.rank}: Coarray: values of shape "
                             f"{np.shape(values)} do not fit the section of shape {sec.shape}") from None
        if src.size == 0:
            return None if blocking else Request(mem, None, None, None, "Coarray.Rput")
        MPI = self.hc._MPI
        target = self._where(mem, rank, sec)
        if blocking:
            mem._win.Put((src, src.nbytes, MPI.BYTE), rank, target)
            mem._win.Flush(rank)
            return None
        req = mem._win.Rput((src, src.nbytes, MPI.BYTE), rank, target)
        mem._sync.dirty[id(mem._win)] = mem._win
        return Request(mem, req, rank, src, "Coarray.Rput")

    def _get(self, rank, index):
        view, key = self._target(rank, index)
        if view is not None:
            return np.array(view)
        sec = self._section(key, index)
        out = np.empty(sec.shape, dtype=self.dtype)
        if out.size:
            mem, MPI = self.mem, self.hc._MPI
            mem._win.Get((out, out.nbytes, MPI.BYTE), rank, self._where(mem, rank, sec))
            mem._win.Flush(rank)
        return out

    def Rget(self, rank: int, index: Any, out: np.ndarray) -> Request:
        """Start ``out[...] = a[rank][index]``; returns a :class:`Request` (read ``out`` after it).

        Args:
            out: a writeable C-contiguous array of this dtype and the section's shape.
        """
        mem = self.mem
        mem._usable("Rget")
        rank, _ = mem._target(rank, 0, 0, "Rget")
        view, key = self._target(rank, index)
        sec = self._section(key, index)
        if (type(out) is not np.ndarray or out.dtype != self.dtype or out.shape != sec.shape
                or not out.flags.c_contiguous or not out.flags.writeable):
            raise ValueError(f"hybridmpi: rank {mem.rank}: Coarray.Rget: out must be a writeable "
                             f"C-contiguous {self.dtype} array of shape {sec.shape}")
        if view is not None or out.size == 0:
            if out.size:
                out[...] = view
            return Request(mem, None, None, None, "Coarray.Rget")
        req = mem._win.Rget((out, out.nbytes, self.hc._MPI.BYTE), rank, self._where(mem, rank, sec))
        return Request(mem, req, None, out, "Coarray.Rget")

    def Rput(self, rank: int, index: Any, values: Any) -> Request:
        """Start ``a[rank][index] = values``; returns a :class:`Request` (``values`` are copied)."""
        self.mem._usable("Rput")
        rank, _ = self.mem._target(rank, 0, 0, "Rput")
        return self._put(rank, index, values, False)

    def sync_all(self) -> None:
        """As :meth:`GlobalMemory.sync_all`."""
        self.mem.sync_all()

    def sync_images(self, ranks: int | Iterable[int]) -> None:
        """As :meth:`GlobalMemory.sync_images`."""
        sync = self.mem._sync
        if self.mem._views is None:
            self.mem._usable("sync_images")
        sync.sync_images(ranks, "Coarray.sync_images")

    def free(self) -> None:
        """Free the coarray (collective).  Idempotent."""
        self.hc._children.pop(id(self), None)
        if self.mem.closed:
            return
        self.mem.free()
        self.local = None
        self._shaped = [None] * len(self._shaped)
        self._targets = {}
        if not self.hc._MPI.Is_finalized():
            for t in self._types.values():
                t.Free()
        self._types = {}

    @property
    def closed(self) -> bool:
        return self.mem.closed

    def __repr__(self):
        return f"<Coarray rank {self.mem.rank} shape={self.shape} dtype={self.dtype}>"


class _Image:
    """``a[r]``: the coarray on rank ``r``, indexed to put or get a section."""

    __slots__ = ("_a", "_rank")

    def __init__(self, a, rank):
        self._a = a
        self._rank = rank

    def __getitem__(self, index):
        return self._a._get(self._rank, index)

    def __setitem__(self, index, values):
        self._a._put(self._rank, index, values, True)
