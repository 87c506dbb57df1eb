"""Halo: the ghost update of a GhostPattern, with a choice of transport."""

from __future__ import annotations

import functools
from typing import Any, ClassVar, NamedTuple

import numpy as np

from .._native import errmap as _errmap
from .._native.clib import Calls, Hot, State, ffi, lib, operations
from .._native.tables import DTYPES, mpi
from ..comm._agree import barrier, unusable
from ..comm._resource import Freed
from ..comm.room import TAG_SLOTS
from ..errors import FreedError, PeerArgumentError, PeerError, agreed
from ._args import REVERSE_OPS, agree_args, make_transport, reverse_op, setting
from .exchange import CMA_BYTES, CMA_MIN_RUN, FWD, REV, ZERO_COPY_BYTES, Fault, Paths, Spec
from .pattern import GhostPattern

__all__ = ["CMA_BYTES", "CMA_MIN_RUN", "ZERO_COPY_BYTES", "Halo"]

_WHAT = {FWD: "update", REV: "reverse"}
_NO_OP = object()   # Halo._arg: the call takes no op (None is an invalid op)

_FN = {name: int(ffi.cast("uintptr_t", ffi.addressof(lib, name)))
       for name in ("hm_xchg_update", "hm_zc_update", "hm_xchg_both")}
# Two MPI tags per Halo (one per direction), from an identifier no other live Halo on the
# HybridComm holds, so Halos never match each other's messages.
_TAG_BASE = 100


class HaloParts(NamedTuple):
    """``Halo._internal``: what the profile, above the Halo, uses of one."""

    #: the Halo's call counts per direction (its epochs), live
    epochs: Any
    #: its operations' table (``Calls``), through which a profile records them
    calls: Any


@operations("update", "reverse", "update_begin", "update_end", "reverse_begin", "reverse_end")
class Halo(Freed):
    """Ghost updates of one pattern for vectors of one dtype and block size.

    Collective over the pattern's HybridComm, and so is every update: all
    ranks call the same operations in the same order.

    Args:
        pattern: a :class:`~hybridmpi.GhostPattern`.
        dtype: float64, float32, int64, int32 or complex128.
        block: values per point (3 for a displacement field).
        method: ``"atomic"`` (shared buffers and C11 epoch counters, the
            default), ``"flat"`` (Isend/Irecv only); ``"auto"``: atomic, or
            flat with a RuntimeWarning when the shared buffers do not fit;
            after ``import hybridmpi.tools.baselines``, the paper's baselines
            ``"neighbor"`` (Neighbor_alltoallv), ``"fence"``, ``"pscw"``,
            ``"lock"`` (shared buffers synchronized by MPI RMA calls).
            Default: env ``HYBRIDMPI_METHOD``, else ``"atomic"``.  Every
            method gives the same bits.

    Arrays passed to the operations are C-contiguous, writeable numpy
    arrays of shape ``(size,)`` or ``(size, block)`` and of the Halo's dtype.
    Between a ``*_begin`` and its ``*_end`` the ghost entries (forward) or
    the owned entries that receive (reverse) must not be used; the values
    sent were copied by ``*_begin``.

    Raises:
        TypeError: not a GhostPattern, or an unsupported dtype.
        ValueError: bad block or method, or ranks that passed different ones.
        MemoryError: the shared buffers do not fit in /dev/shm (every rank).
        FreedError: the pattern's HybridComm was freed.
    """

    __slots__ = ("_calls",)
    OPERATIONS: ClassVar[tuple[str, ...]]   # set by @operations
    RECORDED_AS = "Halo"

    def __init__(self, pattern: GhostPattern, *, dtype: Any = np.float64, block: int = 1,
                 method: str | None = None) -> None:
        self._calls = Calls(self.OPERATIONS)   # what serves update and reverse; the profile's
        if not isinstance(pattern, GhostPattern):
            raise TypeError(f"hybridmpi: Halo needs a GhostPattern, got {type(pattern).__name__}")
        hc = pattern.hc
        if hc.closed:
            raise FreedError(f"hybridmpi: rank {hc.rank}: Halo on a freed HybridComm")
        self._transport: Any = None
        dt, block, method, biggest = agree_args(pattern, hc, dtype, block, method)
        self.pattern = pattern
        self.hc = hc
        self.dtype = dt
        self.block = block
        self.method = method
        self.size = pattern.size
        self.dtype_code = DTYPES[dt]
        self.esz = dt.itemsize * block
        self.timeout = hc.timeout
        ident = hc.context.take_id()
        if ident is None:
            raise RuntimeError(f"hybridmpi: rank {hc.rank}: Halo(): {TAG_SLOTS} Halos are live on "
                               "this HybridComm; free some first")
        self._ident = ident
        self.tag = _TAG_BASE + 2 * ident
        # block > 1: rows of `block` values, or the same values flat (as DOLFINx and PETSc
        # store blocked vectors: u.x.array, vec.array)
        self._shapes = (((pattern.size, block), (pattern.size * block,)) if block > 1
                        else ((pattern.size,), (pattern.size, 1)))
        #: the one owner of the per-call state: epochs, current direction, pending begin, broken
        self._state = State()
        self._vectors: list[Any] = []   # (array, arena block, ZeroCopy or None) of vector()
        self.zero_copy = False  # whether vector()s are updated without staging buffers
        plans = []
        for d in (FWD, REV):
            sends, recvs = (pattern.send, pattern.recv) if d == FWD else (pattern.recv, pattern.send)
            plans.append((list(sends.items()), list(recvs.items())))
        #: what the method is given (frozen): plans, sizes, tag, wait policy, communicators
        paths = Paths(biggest=biggest, zero_copy_bytes=setting(hc, "zero_copy_bytes", ZERO_COPY_BYTES),
                      cma_bytes=setting(hc, "cma_bytes", CMA_BYTES), cma=hc.env["cma"])
        ctx = hc.context
        self.spec = Spec(ctx=ctx, MPI=mpi(), plans=tuple(plans), esz=self.esz,
                         dtype=self.dtype_code, tag=self.tag, timeout=self.timeout,
                         policy=ctx.policy, neighbors=tuple(pattern.neighbors),
                         pattern=pattern, paths=paths)
        try:
            self._transport, self.method = make_transport(method, self.spec)
        except BaseException:
            hc.context.release_id(ident)   # agreed failure (every rank raises): the id is free again
            raise
        # blocking forward updates of private arrays by the method's own path, if it has one
        self._transport.prepare()
        self._cma = self._transport.cross_memory
        # The hot path: a blocking update or reverse of the array of the last such call, where
        # the method packs a whole call into one C call (atomic, every peer on this node): one
        # identity test and three cheap checks, then that C call (_fast: per direction, or None).
        self._fast: list[Any] = [self._transport.packed(FWD), self._transport.packed(REV)]
        self._hot_plan: dict[str, tuple] = {}   # what the C hot path of update/reverse calls
        self._rops = {k: v for k, v in REVERSE_OPS.items()
                      if not (dt.kind == "c" and k in ("min", "max"))}
        hc.context.adopt(self, poison=self._poison, describe_word=self._describe_word)

    def vector(self) -> np.ndarray:
        """A zeroed vector of this Halo's shape and dtype in shared memory (collective: every
        rank calls it in the same order; freed with the Halo).

        With method ``"atomic"``, when the largest channel inside a node carries at
        least ``ZERO_COPY_BYTES`` (6 KiB, env ``HYBRIDMPI_ZERO_COPY_BYTES``; below that
        the extra hop costs more than the copy it saves, and the vector is updated as any
        array), updates of such a vector inside a node copy nothing twice: the receiver
        copies straight from the owner's vector into its ghosts, and the reverse combines
        straight from the neighbours' ghost entries (in the order of the sending ranks,
        on one node; across nodes the reverse packs as for any array).

        Between ``update_begin`` and ``update_end`` the owned entries must not change
        (they are read in place); between ``reverse_begin`` and ``reverse_end`` the ghost
        entries must not.  Every rank must pass its corresponding vector: a rank that
        passes another vector, or a private array, makes the call raise ``ValueError`` on
        it and on the peers it exchanges with inside the node.

        Raises:
            MemoryError: the vector does not fit in /dev/shm (every rank).
            FreedError: after free().
        """
        self._usable()
        hc = self.hc
        nbytes = self.size * self.esz
        block = hc.arena.alloc(nbytes, "Halo.vector")
        shape = (self.size,) if self.block == 1 else (self.size, self.block)
        arr = block.array(self.dtype, self.size * self.block).reshape(shape)  # owns its memory
        arr[...] = 0
        # the method's own path for shared vectors (atomic: zero copy, from ZERO_COPY_BYTES;
        # the same choice on every rank), or None
        zc = self._transport.shared_vector(
            len(self._vectors), [block.addr(nr, r) for nr, r in enumerate(hc.node_ranks)])
        self.zero_copy = self.zero_copy or zc is not None
        barrier(hc.context, hc.node_comm, "Halo.vector")  # every vector zeroed before a peer reads it
        self._vectors.append((arr, block, zc))
        return arr

    def _zero_copy(self, x, d):
        """The ZeroCopy of a shared vector of this Halo (None for other arrays, and for the
        reverse across nodes, which packs)."""
        for arr, _, zc in self._vectors:
            if arr is x:
                if d == REV and self.hc.num_nodes > 1:
                    return None
                return zc
        return None

    def _mismatch_error(self, peer, invalid=False):
        """The error of ranks that passed non-corresponding vectors (the Halo becomes unusable)."""
        self._state.broken = "ValueError"
        if invalid:   # the peer raises its own error (TypeError, ValueError)
            return _errmap.peer_invalid(self.hc.rank, "Halo", peer)
        return _errmap.other_vector(self.hc.rank, peer)

    def _order_error(self, peer, tag=None, call=None, d=None, detail=""):
        """The error of a rank whose neighbor-collective message from ``peer`` belongs to
        another call (``tag``, ``call``, direction ``d``) than the one it completes, or (tag
        None) did not fit: MPI's ``detail``."""
        self._state.broken = "ValueError"
        d = self._state.current
        mine = f"call {self._state.epoch(d)} of {_WHAT[d]} on Halo #{self.tag}"
        if tag is None:
            theirs = f"a neighbor's message of another size ({detail})"
        else:
            theirs = f"rank {peer}'s call {call} of {_WHAT.get(d, d)} on Halo #{tag}"
        return ValueError(
            f"hybridmpi: rank {self.hc.rank}: Halo (method 'neighbor'): this rank's {mine} received "
            f"{theirs}; Halos of one pattern with method 'neighbor' share one graph "
            "communicator, whose nonblocking collectives match in the order they are started: "
            "begin them in the same order on every rank (or use method 'atomic' or 'flat')")

    # ------------------------------------------------------------ errors

    def _exception(self, fault):
        """The exception users see for a transport's Fault (the Halo becomes unusable)."""
        k = fault.kind
        if k == "timeout":
            return self._timeout_error(fault.detail, fault.peer, fault.counter, fault.epoch)
        if k == "notice":
            return self._peer_failed(fault.peer)
        if k == "peer":
            d = self._state.pending[0] if self._state.pending else self._state.current
            exc = _errmap.halo_peer_error(self.hc.rank, f"Halo.{_WHAT[d]}", fault.peer, fault.seen)
            self._state.broken = _errmap.breaks(exc)
            return exc
        if k in ("mismatch", "invalid"):
            return self._mismatch_error(fault.peer, invalid=k == "invalid")
        if k == "cma":
            self._state.broken = "RuntimeError"
            return RuntimeError(f"hybridmpi: rank {self.hc.rank}: Halo.update: a cross-memory read "
                                f"between this rank and rank {fault.peer} failed"
                                f"{fault.cma_detail()}; set HYBRIDMPI_CMA=0 to update private "
                                "arrays through shared buffers")
        if k == "core":
            return RuntimeError(f"hybridmpi: rank {self.hc.rank}: Halo: C core returned {fault.rc}")
        return self._order_error(fault.peer, fault.tag, fault.call, fault.direction, fault.detail)

    def _peer_failed(self, peer):
        """The error of a rank that got a failure notice from a message peer."""
        self._state.broken = "PeerError"
        return _errmap.halo_peer_error(self.hc.rank, f"Halo.{_WHAT[self._state.current]}", peer, None)

    def _failed(self, exc):
        """After ``exc`` ended a call in its middle: break the HybridComm, which leaves error
        bits in every word this rank's node peers wait on (this Halo's included) and sends a
        failure notice to the ranks that wait on MPI messages, so that they raise instead of
        waiting (the Halo becomes unusable).  Returns the exception to raise (a transport's
        Fault becomes the Halo's exception)."""
        if isinstance(exc, Fault):
            exc = self._exception(exc)
        if self._state.broken is None:
            self._state.broken = type(exc).__name__
        hc = self.hc
        if self._transport is not None and not hc.closed and not mpi().Is_finalized():
            why = ("ValueError" if isinstance(exc, ValueError)
                   else f"a failed Halo call ({type(exc).__name__})")
            # a peer that failed has broken its own comm and told every rank; a peer whose
            # arguments were invalid (PeerArgumentError) may not have: it learns it from here
            hc.context.break_comm(why, notify=not isinstance(exc, PeerError)
                                  or isinstance(exc, PeerArgumentError), raised=type(exc).__name__)
        return exc

    def _describe_word(self, addr):
        """What a wait on the word at ``addr`` waits for, if it is one of this Halo's
        (hang diagnosis, HYBRIDMPI_WARN_AFTER), else None."""
        found = self._transport.describe_word(addr) if self._transport is not None else None
        if found is None:
            return None
        counter, peer = found
        d = self._state.pending[0] if self._state.pending else self._state.current
        e = self._state.epoch(d)
        return (f"Halo #{self.tag} (method {self.method!r}) {_WHAT[d]} call {e}, waiting "
                f"for the {counter} word of rank {peer}; ranks of this node that have not "
                f"entered the call: {self._transport.missing(d, e)}")

    def _poison(self, bits):
        """Its HybridComm broke: error bits in the words this rank writes that its node peers
        wait on, and every later call raises (it never stores a plain epoch over the bits)."""
        if self._state.broken is None:
            self._state.broken = "error on its HybridComm"
        words = self._transport.words() if self._transport is not None else []
        if words:
            lib.hm_poison(len(words), [ffi.cast("void *", w) for w in words], bits)

    def _bad_call(self, exc, d):
        """Raise ``exc``, this rank's invalid arguments, after making the call with an
        'invalid' mark instead of data: node peers see the mark in the tag word (atomic) or
        in the call's invalid mark after the method's synchronization (fence, pscw, lock),
        peers reached by MPI messages get an empty message (with neighbor, a marked header)
        where the data would be.  A peer whose arguments were
        valid and that reads from this rank raises ValueError (the Halo becomes unusable
        there); when every peer's
        arguments were invalid too, the Halo stays usable.  No message of the call is left
        behind for the next one."""
        t = self._transport
        if self.hc.size == 1:
            raise agreed(exc)
        if not len(self.pattern.neighbors) and not t.node_collective:
            raise exc
        bad = t.bad_call
        e = self._state.start(d)
        try:
            alone = bad(d, e)
        except Exception as err:   # a peer's notice or a timeout: this rank's own error stays
            self._failed(err)      # the one it raises (the comm breaks as for any failure)
            raise exc from None
        if not alone:
            self._failed(exc)
        elif self._state.broken is None:   # every peer's arguments were invalid: still usable
            agreed(exc)
        raise exc

    def _timeout_error(self, detail, peer, counter, epoch):
        """A SyncTimeout for this Halo, which becomes unusable."""
        self._state.broken = "SyncTimeout"
        d = self._state.pending[0] if self._state.pending else self._state.current
        missing = self._transport.missing(d, epoch) if self._transport is not None else []
        return _errmap.timed_out(self.hc.rank, self.timeout, f"in Halo.{_WHAT[d]} (method {self.method!r})",
                                 detail, peer=peer, counter=counter, epoch=epoch, missing=missing)

    def _usable(self):
        if self._transport is None:
            raise FreedError(f"hybridmpi: rank {self.hc.rank}: Halo used after free()")
        if self._state.broken:
            self.hc.context.notices.progress()   # this rank's notice, if it is still queued
            raise unusable(self.hc.rank, "this Halo is unusable after an earlier "
                           f"{self._state.broken}; free it", self._state.broken)

    def _arg(self, x, what, d=None, op=_NO_OP):
        """A cffi view of ``x`` after checking it (nothing is touched on failure), and the code
        of ``op``.  With ``d``, the call starts direction ``d``: invalid arguments are made
        known to the peers (:meth:`_bad_call`)."""
        self._usable()
        if d is not None and self._state.pending:   # before the checks: a bad call never takes the
            raise self._state_error(what)      # pending call's epoch
        try:
            return self._check_arg(x, what), (None if op is _NO_OP else reverse_op(op, self.dtype))
        except (TypeError, ValueError) as exc:
            if d is None:
                raise
            self._bad_call(exc, d)

    def _check_arg(self, x, what):
        if type(x) is not np.ndarray:
            raise TypeError(f"hybridmpi: Halo.{what}: x must be a numpy array, got {type(x).__name__}")
        if x.dtype != self.dtype:
            raise TypeError(f"hybridmpi: Halo.{what}: x has dtype {x.dtype}, this Halo moves {self.dtype}")
        if x.shape not in self._shapes:
            raise ValueError(f"hybridmpi: Halo.{what}: x has shape {x.shape}, expected "
                             f"{' or '.join(map(str, self._shapes))}")
        flags = x.flags
        if not flags.c_contiguous:
            raise ValueError(f"hybridmpi: Halo.{what}: x must be C-contiguous")
        if not flags.writeable:
            raise ValueError(f"hybridmpi: Halo.{what}: x is read-only")
        # a fresh view each call: an array resized in place keeps its identity, not its memory
        return ffi.from_buffer("char[]", x)

    # ------------------------------------------------------------ operations

    def update(self, x: np.ndarray) -> None:
        """Copy every owned value to the ghosts of it on the other ranks (forward scatter).

        Memory: when it returns, this rank's ghost entries hold the owners'
        values as they were when the owners called it.  With method ``"atomic"``, a
        Halo whose channels inside the node are large runs (``CMA_BYTES``) lets the node
        peers read the owned entries of ``x`` in place, by cross-memory attach, before
        this call returns (docs/guide/ghost-updates.md: "Private arrays: cross-memory attach").

        Raises:
            TypeError, ValueError: bad ``x`` (nothing was sent; with method ``"atomic"``
                the node peers raise ValueError unless their ``x`` was bad too).
            RuntimeError: a begin is pending.
            PeerError: a peer failed in this call.
            SyncTimeout: a peer did not take part within the timeout.
        """
        self._update(x)   # (the Hot that _install made serves the hot arrays before this)

    def _update(self, x):
        """The checked, general path of :meth:`update`."""
        buf, _ = self._arg(x, "update", FWD)
        e = self._state.start(FWD)
        try:
            zc = (self._zero_copy(x, FWD) if self._vectors else None) or self._cma
            if zc:
                zc.update(buf, e)
            else:
                self._transport.run(FWD, buf, e, lib.HM_INSERT)
        except BaseException as exc:
            raise self._failed(exc) from None
        self._heat(x, buf, zc)

    def update_begin(self, x: np.ndarray) -> None:
        """Start :meth:`update`: the owned values are sent (copied) now."""
        buf, _ = self._arg(x, "update_begin", FWD)
        self._begin(FWD, x, buf, lib.HM_INSERT, "update_begin")

    def update_end(self, x: np.ndarray) -> None:
        """Finish :meth:`update_begin`; the ghosts of ``x`` then hold the owners' values.

        Raises:
            RuntimeError: no update_begin pending (on this rank only, before anything is
                sent: the rank may go on with the right call; peers in another call wait for
                it, until their timeout).
        """
        self._finish(FWD, x, "update_end")

    def reverse(self, x: np.ndarray, op: str = "add") -> None:
        """Combine every ghost value into its owner (the assembly step).

        ``x[owned] = x[owned] op ghost values``, taken in the order of the
        sending ranks, so the result has the same bits whatever the timing
        and the method.  Ghost entries are left unchanged.

        Args:
            x: the vector.
            op: ``"add"``, ``"insert"`` (the highest sending rank's value
                wins), ``"min"`` or ``"max"`` (of floats, IEEE 754-2019's minimum and
                maximum, as the collectives': a NaN, owned or ghost, gives a NaN; -0.0 is
                below 0.0).

        Raises:
            TypeError, ValueError: bad ``x`` or ``op`` (nothing was sent; with method
                ``"atomic"`` the node peers raise ValueError unless theirs were bad too).
            RuntimeError: a begin is pending.
            PeerError: a peer failed in this call.
            SyncTimeout: a peer did not take part within the timeout.
        """
        self._reverse(x, op)   # (the Hot that _install made serves the hot arrays before this)

    def _reverse(self, x, op):
        """The checked, general path of :meth:`reverse`."""
        buf, code = self._arg(x, "reverse", REV, op)
        e = self._state.start(REV)
        try:
            zc = self._zero_copy(x, REV) if self._vectors else None
            if zc:
                zc.begin(REV, buf, e)
                zc.end(REV, buf, e, code)
            else:
                self._transport.run(REV, buf, e, code)
        except BaseException as exc:
            raise self._failed(exc) from None
        if not zc and self._fast[REV] is not None:
            self._install("reverse", 2, REV, x, buf, "hm_xchg_both", self._fast[REV],
                          functools.partial(self._fast_error, REV), op, code)

    def _heat(self, x, buf, zc):
        """After a blocking update of ``x`` (through ``zc``, or packed): make ``x`` the hot
        array if that path is one C call of (buf, epoch)."""
        if zc:
            if zc.whole_call() is not None:
                self._install("update", 1, FWD, x, buf, "hm_zc_update", zc.whole_args(),
                              functools.partial(self._hot_error, zc.check), tag=zc.tag)
        elif self._fast[FWD] is not None:
            self._install("update", 0, FWD, x, buf, "hm_xchg_update", self._fast[FWD],
                          functools.partial(self._fast_error, FWD))

    def _install(self, name, kind, d, x, buf, fn, structs, error, op="add", opcode=0, tag=0):
        """Serve ``update`` (or ``reverse``) of ``x`` by one C call object (``Hot``): the checks
        of the hot path and the C call without Python in between.  It declines any other call
        (the method serves it); a profile that records the Halo records its calls too."""
        plan = (kind, d, opcode, op, _FN[fn], tuple(int(ffi.cast("uintptr_t", p)) for p in structs),
                tag)
        hot = self._calls.fast(name)
        try:
            if hot is not None and self._hot_plan.get(name) == plan:
                hot.add(x)   # the same call for another array: both stay hot (alternating vectors)
                return
            self._cool(name)
            self._calls.serve(name, Hot(self._state, x, int(ffi.cast("uintptr_t", buf)), error, plan))
            self._hot_plan[name] = plan
        except (ValueError, BufferError):
            self._cool(name)

    def _cool(self, *names):
        """Drop the C hot paths ``names`` (a kept reference to one then declines every call)."""
        for name in names or ("update", "reverse"):
            hot = self._calls.fast(name)
            if hot is not None:
                hot.close()
                self._calls.serve(name, None)

    def _fast_error(self, d, rc):
        """The hot path's packed exchange returned ``rc``: raise as the transport would."""
        self._hot_error(functools.partial(self._transport.fault, d), rc)

    def _hot_error(self, check, rc):
        try:
            check(rc)
        except BaseException as exc:
            raise self._failed(exc) from None

    def reverse_begin(self, x: np.ndarray, op: str = "add") -> None:
        """Start :meth:`reverse`: the ghost values are sent (copied) now."""
        buf, code = self._arg(x, "reverse_begin", REV, op)
        self._begin(REV, x, buf, code, "reverse_begin")

    def reverse_end(self, x: np.ndarray) -> None:
        """Finish :meth:`reverse_begin`, combining into the owned entries of ``x``.

        Raises:
            RuntimeError: no reverse_begin pending (on this rank only, as for
                :meth:`update_end`).
        """
        self._finish(REV, x, "reverse_end")

    def _begin(self, d, x, buf, code, what):
        """Start direction ``d`` on ``x`` (checked: ``buf``, ``code``): the values sent are copied
        (or, for a shared vector, published) now; ``_finish`` completes it."""
        e = self._state.start(d)
        try:
            zc = self._zero_copy(x, d) if self._vectors else None
            self._state.pending = (d, x, code, zc)
            (zc or self._transport).begin(d, buf, e)
        except BaseException as exc:
            raise self._failed(exc) from None

    def _finish(self, d, x, what):
        buf, _ = self._arg(x, what)
        pending = self._state.pending
        if pending is None or pending[0] != d:
            start = "update_begin" if d == FWD else "reverse_begin"
            raise RuntimeError(f"hybridmpi: rank {self.hc.rank}: Halo.{what}() without {start}()")
        if pending[1] is not x:
            raise ValueError(f"hybridmpi: rank {self.hc.rank}: Halo.{what}() got another array "
                             f"than {'update' if d == FWD else 'reverse'}_begin()")
        try:
            (pending[3] or self._transport).end(d, buf, self._state.epoch(d), pending[2])
        except BaseException as exc:
            raise self._failed(exc) from None
        finally:
            self._state.pending = None

    def _state_error(self, what):
        started = "update_begin" if self._state.pending[0] == FWD else "reverse_begin"
        ended = started.replace("begin", "end")
        return RuntimeError(f"hybridmpi: rank {self.hc.rank}: Halo.{what}() while {started}() "
                            f"is pending; call {ended}() first")

    # ------------------------------------------------------------ life

    def free(self) -> None:
        """Release the shared window and MPI objects (collective).  Idempotent."""
        ctx = self.hc.context
        if self._transport is None:
            return
        # A Halo with a window of its own (fence, pscw, lock) frees it collectively: every rank
        # frees this Halo now (else RuntimeError everywhere), or its comm broke (then nothing
        # below waits on a peer).  The others free nothing collective here (their arena blocks
        # agree in the arena, when a chunk goes), in any order.
        own = self._transport.own_window
        together = not mpi().Is_finalized() and (ctx.agree_free(f"Halo {self._ident}") if own
                                                 else ctx.broken() is None)
        pending = self._state.pending
        if own and together and pending is not None and self._state.broken is None:
            # a begin still pending: its end first (every rank is in this free), so that no MPI
            # epoch stays open (pscw's exposure epoch made MPI_Win_free fail) and the window
            # can be kept for the next Halo; an error breaks the comm and the window is kept out
            try:
                self._finish(pending[0], pending[1], "free")
            except Exception:  # noqa: BLE001 - the comm broke: the frees below are local
                pass
        ctx.disown(self)
        self._cool()
        t, self._transport = self._transport, None
        vectors, self._vectors = self._vectors, []
        if mpi().Is_finalized():
            return
        if together and self._state.broken is None:   # else messages of the failed call may
            ctx.release_id(self._ident)                # still come: the id is kept
        t.free()
        for _, block, _ in vectors:
            block.free()

    @property
    def closed(self) -> bool:
        """True once :meth:`free` was called."""
        return self._transport is None

    @property
    def _internal(self) -> HaloParts:
        """What the profile uses of a Halo it records (the Halo's one seam: every other private
        name stays in this module)."""
        return HaloParts(self._state.epochs, self._calls)

    def __repr__(self):
        state = "freed" if self._transport is None else f"{len(self.pattern.neighbors)} neighbors"
        return (f"<Halo rank {self.hc.rank} method={self.method!r} dtype={self.dtype} "
                f"block={self.block}, {state}>")
