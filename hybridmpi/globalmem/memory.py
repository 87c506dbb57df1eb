"""GlobalMemory: an array with a part on every rank, one put/get path deciding locality."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any, ClassVar, NamedTuple

import numpy as np

from .._native import errmap as _errmap
from .._native.clib import Calls, Near, ffi, lib, operations
from .._native.tables import mpi
from ..comm._agree import agree, allgather, barrier, safe_repr
from ..comm._resource import Freed
from ..comm.arena import MAX_BYTES
from ..comm.hybridcomm import HybridComm
from ..errors import FreedError
from .requests import Owner, Request, get_flush, put_flush
from .sync import int64_arg, int_arg, sync_state


class Parts(NamedTuple):
    """What a :class:`~hybridmpi.globalmem.Coarray` uses of the GlobalMemory it is built on
    (``GlobalMemory._internal``: the global-memory layer's seam)."""

    #: the RMA window over the parts (None on one node)
    win: Any
    #: every rank's part's displacement in the window, in bytes
    disp: Any
    #: numpy views of the parts on this node (None elsewhere), by rank
    views: list
    #: the HybridComm's sync_images state
    sync: Any
    #: ``usable(mem, what)`` raises FreedError after free()
    usable: Any
    #: ``target(mem, rank, offset, n, what)`` checks a target range, returns (rank, offset)
    target: Any
    #: what the memory's requests share (:class:`~hybridmpi.globalmem.requests.Owner`)
    owner: Any
    #: its operations' table (``Calls``), through which a profile records them
    calls: Any
    #: ``release(mem, drop)``: free the memory, calling ``drop()`` (the coarray lets go of its
    #: views) once every rank frees it, before the ranks say whether arrays over it live on
    release: Any


@operations("Put", "Get", "Rput", "Rget", "fetch_add", "compare_swap", "flush", "sync_all",
            "sync_images")
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
        counts: every rank's count.
        closed: True once :meth:`free` was called.
        dtype, hc, rank, size.

    Memory: a blocking put or get is complete at both ends when it
    returns; other ranks see a put's data for certain after a
    synchronization that orders them (:meth:`sync_all`, :meth:`sync_images`).

    Raises:
        TypeError: not a HybridComm, count not an int, non-numeric dtype.
        ValueError: negative count, one of more than ``arena.MAX_BYTES`` bytes, ranks with
            different dtypes.
        MemoryError: the parts do not fit in /dev/shm (every rank).
        FreedError: the HybridComm was freed.
    """

    __slots__ = ("_calls",)
    OPERATIONS: ClassVar[tuple[str, ...]]   # set by @operations
    RECORDED_AS = "GlobalMemory"

    def __init__(self, hc: HybridComm, count: int, dtype: Any = np.float64) -> None:
        self._calls = Calls(self.OPERATIONS)   # what serves Put and Get; the profile's
        if not isinstance(hc, HybridComm):
            raise TypeError(f"hybridmpi: GlobalMemory needs a HybridComm, got {type(hc).__name__}")
        if hc.closed:
            raise FreedError(f"hybridmpi: rank {hc.rank}: GlobalMemory on a freed HybridComm")
        problem: tuple[type[Exception], str] | None = None
        try:
            dt = np.dtype(dtype)
        except Exception:   # anything numpy refuses is a problem to agree on, not a raise here
            dt = None
        if dt is None or dt.kind not in "biufc":
            problem = TypeError, f"dtype must be a numeric numpy dtype, got {safe_repr(dtype)}"
        elif isinstance(count, (bool, np.bool_)) or not isinstance(count, (int, np.integer)):
            problem = TypeError, f"count must be an int, got {type(count).__name__}"
        elif count < 0:
            problem = ValueError, f"count must be >= 0, got {count}"
        elif int(count) * dt.itemsize > MAX_BYTES:
            problem = ValueError, (f"count {count} of {dt.name} is {int(count) * dt.itemsize} bytes, "
                                   f"more than the {MAX_BYTES} an arena block may hold")
        if problem is not None:
            problem = problem[0], f"rank {hc.rank}: {problem[1]}"
        dtypes = agree(hc.comm, problem, "GlobalMemory()", data=dt.str if dt is not None else None)
        if len(set(dtypes)) != 1:
            raise _errmap.ranks_differ("GlobalMemory()", "dtypes", [np.dtype(d).name for d in dtypes])
        assert dt is not None
        count = int(count)
        self.hc = hc
        self.rank, self.size = hc.rank, hc.size
        self.dtype = dt
        self._views: Any = None
        # True before the parts are made and once freed (an attribute: one lookup, hot paths)
        self.closed = True
        self._near = {}
        self._sync = sync_state(hc)
        self.counts = tuple(allgather(hc.context, hc.comm, count, "GlobalMemory()"))
        self._block = hc.arena.alloc(count * dt.itemsize, "GlobalMemory")
        self._win = self._block.rma
        self._BYTE = mpi().BYTE
        self._disp = self._block.offsets
        node_rank = hc.node_index
        views: list[Any] = [None] * hc.size
        addrs = [0] * hc.size
        for r, nr in node_rank.items():
            addrs[r] = self._block.addr(nr, r)
            views[r] = self._block.array(dt, self.counts[r], r)   # each owns its memory
        self._local = views[hc.rank]
        self._local[...] = 0
        self._addrs = addrs
        # Open MPI 4's osc/rdma crashes in MPI_Compare_and_swap aimed at the calling rank over
        # its shared-memory BTL (open-mpi/ompi#7967, #11349); there the CAS on this rank's own
        # part is a CPU atomic, which stays atomic with MPI's (executed on this rank's memory
        # by this rank's own progress, or with CPU atomics)
        vendor, version = mpi().get_vendor()
        self._self_cas = vendor == "Open MPI" and version < (5,)
        self._itemsize = dt.itemsize
        self._views = views
        self.closed = False
        self._owner = Owner(hc, self._win)   # what its requests share
        self._near = {r: views[r] for r in node_rank}  # the parts reached by load/store
        if dt.itemsize:
            # Put and Get of a 1-D array to a part on this node in C: about 0.2 us instead of
            # 1 us of Python checks and slicing; Near declines anything else (the methods below)
            bases = [a if v is not None else 0 for a, v in zip(addrs, views)]
            for name, get in (("Put", False), ("Get", True)):
                self._calls.serve(name, Near(np.ndarray, dt, bases, list(self.counts), dt.itemsize, get))
        barrier(hc.context, hc.comm, "GlobalMemory()")  # every part zeroed before anyone reaches it
        # its number among the HybridComm's global memory, the same on every rank (made
        # collectively, in one order): free() checks that every rank frees the same one
        self._serial = next(hc.context.service("globalmem_serials", lambda _ctx: itertools.count()))
        hc.context.adopt(self)

    @property
    def local(self) -> np.ndarray:
        """This rank's part: a numpy array in shared memory, which owns it (kept past
        :meth:`free`, it keeps the values it had, and no other object's).

        Raises:
            FreedError: after free().
        """
        self._usable("local")
        return self._local

    @property
    def _internal(self) -> Parts:
        """What a Coarray built on this memory uses of it (the layer's one seam: every other
        private name stays in this module)."""
        return Parts(self._win, self._disp, self._views, self._sync, GlobalMemory._usable,
                     GlobalMemory._target, self._owner, self._calls, GlobalMemory._release)

    # ------------------------------------------------------------ checks

    def _usable(self, what):
        if self._views is None:
            raise FreedError(f"hybridmpi: rank {self.rank}: GlobalMemory.{what} after free()")

    def _target(self, rank, offset, n, what):
        """Check a target range before anything moves."""
        if type(rank) is not int:
            rank = int_arg(rank, f"GlobalMemory.{what}: rank", self.rank)
        if not 0 <= rank < self.size:
            raise ValueError(f"hybridmpi: rank {self.rank}: GlobalMemory.{what}: rank {rank} is out of "
                             f"range (the communicator has {self.size} ranks)")
        if type(offset) is not int:
            offset = int_arg(offset, f"GlobalMemory.{what}: the offset into rank {rank}'s part", self.rank)
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

    def _access(self, a, rank, offset, what, get, rma):
        """The one path of Put, Get, Rput and Rget: check, then decide locality once.

        A part on this node is copied to or from with numpy; another node's is reached
        by ``rma``, an ``MPI.Win`` method called as ``rma(win, origin, rank, target)``
        (as mpi4py's ``util.pkl5`` passes ``Send`` or ``Isend``).

        Returns:
            (the checked rank, what ``rma`` returned, or None after a copy).
        """
        n = a.size if type(a) is np.ndarray else 0
        # one test for the common call, which needs none of the checks' conversions
        if not (type(a) is np.ndarray and a.dtype is self.dtype and type(rank) is int
                and type(offset) is int and 0 <= rank < self.size and 0 <= offset
                and offset + n <= self.counts[rank] and a.flags.c_contiguous
                and (a.flags.writeable or not get) and self._views is not None):
            self._usable(what)
            self._buffer(a, what, get)
            rank, offset = self._target(rank, offset, n, what)
        v = self._views[rank]
        if v is not None:
            if get:
                a.reshape(-1)[:] = v[offset:offset + n]
            elif n:
                v[offset:offset + n] = a.reshape(-1)
            return rank, None
        if n == 0:
            return rank, None
        self._peers_alive(what)
        nb, BYTE = a.nbytes, self._BYTE
        return rank, rma(self._win, (a, nb, BYTE), rank,
                         (self._disp[rank] + offset * self._itemsize, nb, BYTE))

    def Put(self, data: np.ndarray, rank: int, offset: int = 0) -> None:
        """Write ``data`` into ``rank``'s part from element ``offset``; complete at both ends on return.

        Raises:
            TypeError: ``data`` not a numpy array of this memory's dtype.
            ValueError: non-contiguous ``data``, rank out of range.
            IndexError: the range is outside the target's part.
            FreedError: after free().
        """
        self._access(data, rank, offset, "Put", False, put_flush)

    def Get(self, out: np.ndarray, rank: int, offset: int = 0) -> None:
        """Read ``out.size`` elements of ``rank``'s part from ``offset`` into ``out``; complete on return.

        Raises:
            TypeError: ``out`` not a numpy array of this memory's dtype.
            ValueError: ``out`` read-only or non-contiguous, rank out of range.
            IndexError: the range is outside the target's part.
            FreedError: after free().
        """
        self._access(out, rank, offset, "Get", True, get_flush)

    def Rput(self, data: np.ndarray, rank: int, offset: int = 0) -> Request:
        """Start a put; returns a :class:`Request` (``data`` must not change until it completes).

        Inside a node the copy is made at once and the request is complete.
        """
        rank, req = self._access(data, rank, offset, "Rput", False, mpi().Win.Rput)
        if req is None:
            return Request(self._owner, None, None, None, "Rput")
        self._sync.dirty[id(self._win)] = self._win
        return Request(self._owner, req, rank, data, "Rput")

    def Rget(self, out: np.ndarray, rank: int, offset: int = 0) -> Request:
        """Start a get into ``out``; returns a :class:`Request` (read ``out`` after it completes)."""
        rank, req = self._access(out, rank, offset, "Rget", True, mpi().Win.Rget)
        if req is None:
            return Request(self._owner, None, None, None, "Rget")
        return Request(self._owner, req, None, out, "Rget")

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

    def _peers_alive(self, what):
        """Before a one-sided call to another node, which waits inside MPI (no deadline there):
        raise PeerError if a rank's failure notice came (a failed target may never let the
        call complete; its comm broke, so this one breaks too)."""
        ctx = self.hc.context
        peer = ctx.notices.poll(tries=2)
        if peer is not None:
            raise ctx.peer_error(f"GlobalMemory.{what}", peer)

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

        Raises:
            TypeError: not an int64 memory; rank, offset or value not an int.
            ValueError: rank out of range, value outside an int64.
            IndexError: offset outside the target's part.
        """
        rank, offset = self._atomic(rank, offset, "fetch_add")
        value = int64_arg(value, "GlobalMemory.fetch_add: value", self.rank)
        if self._win is None:
            return int(lib.hm_fetch_add(ffi.cast("void *", self._addrs[rank] + 8 * offset), value))
        MPI = mpi()
        self._peers_alive("fetch_add")
        res = np.zeros(1, dtype=np.int64)
        self._win.Fetch_and_op(np.array([value], dtype=np.int64), res, rank,
                               self._disp[rank] + 8 * offset, MPI.SUM)
        self._win.Flush(rank)
        return int(res[0])

    def compare_swap(self, rank: int, offset: int, expected: int, value: int) -> int:
        """Atomically set element ``offset`` of ``rank``'s part to ``value`` if it equals
        ``expected``; return the old value (atomic as :meth:`fetch_add`; raises as it does)."""
        rank, offset = self._atomic(rank, offset, "compare_swap")
        expected = int64_arg(expected, "GlobalMemory.compare_swap: expected", self.rank)
        value = int64_arg(value, "GlobalMemory.compare_swap: value", self.rank)
        if self._win is None or (rank == self.rank and self._self_cas):
            return int(lib.hm_compare_swap(ffi.cast("void *", self._addrs[rank] + 8 * offset),
                                           expected, value))
        self._peers_alive("compare_swap")
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
        """Give the memory back to the arena (collective, every rank freeing its global memory
        in the same order).  Idempotent.

        A rank that does not call free() within the HybridComm's timeout, or whose comm broke,
        makes the comm unusable: the memory is then released without the collective
        ``MPI_Win_free`` (kept until the end), and free() returns.

        Raises:
            RuntimeError: on every rank, when ranks free different GlobalMemory objects (the
                memory stays usable: free them in one order); nothing is freed.
        """
        self._release(None)

    def _release(self, drop):
        """:meth:`free`; ``drop()`` (when given) lets go of a coarray's arrays over the memory
        once every rank frees it."""
        if self._views is None:
            self.hc.context.disown(self)
            return
        ctx = self.hc.context
        # every rank frees this memory now (RuntimeError everywhere when ranks free different
        # ones, nothing freed), or its comm broke: then nothing below waits on a peer
        if not mpi().Is_finalized():
            ctx.agree_free(f"GlobalMemory {self._serial}")
        ctx.disown(self)
        views, self._views = self._views, None
        views[:] = [None] * len(views)   # also the list a coarray's parts hold
        self.closed = True
        self._near = {}
        self._local = None
        self._calls.close()  # the methods serve every call now: they raise FreedError
        if drop is not None:
            drop()
        if self._win is not None and not mpi().Is_finalized():
            self._win.Flush_all()  # every pending operation on the window: none stays dirty
            self._sync.dirty.pop(id(self._win), None)
        self._owner.freed = True  # its requests not yet complete raise FreedError when waited
        # what the user keeps: node peers may view this rank's part (local_view), so its
        # bytes wait until no rank views it (the ranks say so here, and at each allocation)
        shared = False
        hc = self.hc
        if hc.size > hc.num_nodes and not mpi().Is_finalized():   # (alike on every rank)
            viewed = ctx.agree_views(f"GlobalMemory {self._serial} views", self._block.pins > 0)
            shared = viewed is None or any(viewed)
        self._block.free(shared=shared)

    def __repr__(self):
        state = "freed" if self._views is None else f"{self.counts[self.rank]} local elements"
        return f"<GlobalMemory rank {self.rank}/{self.size} dtype={self.dtype}, {state}>"


