"""Coarray: XcalableMP coarrays over a GlobalMemory."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, ClassVar, NamedTuple

import numpy as np

from .._native import errmap as _errmap
from .._native.clib import Calls, operations
from .._native.tables import mpi
from ..comm._agree import agree, safe_repr
from ..comm._resource import Freed
from ..comm.hybridcomm import HybridComm
from ..errors import FreedError
from .memory import GlobalMemory
from .requests import Request, get_flush, put_flush
from .sync import int_arg


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
        except (IndexError, OverflowError) as e:  # OverflowError: an int beyond an int64
            raise IndexError(f"hybridmpi: rank {rank}: Coarray: index {safe_repr(index)} is outside "
                             "the shape "
                             f"{local.shape}: {e}") from None
        except (TypeError, ValueError) as e:  # slice(0.5, 2), a step of 0
            raise type(e)(f"hybridmpi: rank {rank}: Coarray: bad index {safe_repr(index)}: {e}") from None
        self.start = view.__array_interface__["data"][0] - local.__array_interface__["data"][0]
        self.shape, self.strides, self.idx = view.shape, view.strides, idx
        self.nbytes = view.nbytes
        self.contiguous = view.flags.c_contiguous  # moves as plain bytes across nodes


class CoarrayParts(NamedTuple):
    """``Coarray._internal``: what the profile, above the Coarray, uses of one."""

    #: ``section_nbytes(index)``: the bytes of ``a[r][index]``
    section_nbytes: Any
    #: its operations' table (``Calls``), through which a profile records them
    calls: Any
    #: the sync_images state of its memory (``named``: the ranks of its last call, as checked)
    sync: Any


@operations("_put", "_get", "Rput", "Rget", "sync_all", "sync_images")
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
        FreedError: the HybridComm was freed.
    """

    __slots__ = ("_calls",)
    OPERATIONS: ClassVar[tuple[str, ...]]   # set by @operations
    RECORDED_AS = "Coarray"

    def __init__(self, hc: HybridComm, shape: int | tuple[int, ...], dtype: Any = np.float64) -> None:
        self._calls = Calls(self.OPERATIONS)   # the profile records through it
        if not isinstance(hc, HybridComm):
            raise TypeError(f"hybridmpi: Coarray needs a HybridComm, got {type(hc).__name__}")
        if hc.closed:
            raise FreedError(f"hybridmpi: rank {hc.rank}: Coarray on a freed HybridComm")
        if isinstance(shape, (int, np.integer)):
            shape = (shape,)
        problem: tuple[type[Exception], str] | None = None
        try:
            shape = tuple(int_arg(n, "a Coarray extent", hc.rank) for n in shape)
            if any(n < 0 for n in shape):
                problem = ValueError, f"rank {hc.rank}: extents must be >= 0, got {shape}"
        except Exception:   # a shape that cannot even be iterated: agreed, never raised alone
            problem = TypeError, (f"rank {hc.rank}: shape must be an int or a tuple of ints, "
                                  f"got {safe_repr(shape)}")
        shapes = agree(hc.comm, problem, "Coarray()", data=shape)
        if len(set(shapes)) != 1:
            raise _errmap.ranks_differ("Coarray()", "shapes", shapes)
        self.shape = shape
        self.mem = GlobalMemory(hc, math.prod(shape), dtype)  # a Python int: no wrap
        ctx = hc.context
        ctx.disown(self.mem)
        if ctx.profile is not None:
            ctx.profile.forget(self.mem)  # recorded as the Coarray's
        ctx.adopt(self)
        self.hc = hc
        self.dtype = self.mem.dtype
        self._local = self.mem.local.reshape(shape)
        parts = self.mem._internal
        # what the memory decides (checks, window, displacements), used through its seam
        self._parts = parts   # its checks (usable, target) are the memory's functions
        self._owner = parts.owner
        self._win, self._disp, self._sync = parts.win, parts.disp, parts.sync
        self._shaped: list[Any] = [None if v is None else v.reshape(shape) for v in parts.views]
        self._images = [_Image(self, r) for r in range(hc.size)]
        self._sections: dict[Any, Any] = {}   # index key -> _Section
        self._targets: dict[Any, Any] = {}    # (rank, index key) -> view of a node peer's section
        self._types: dict[Any, Any] = {}      # (shape, strides) -> committed MPI datatype

    @property
    def local(self) -> np.ndarray:
        """This rank's array (shared memory, which it owns: kept past :meth:`free`, it keeps
        the values it had, and no other object's).

        Raises:
            FreedError: after free().
        """
        if self.mem.closed:
            self._parts.usable(self.mem, "local")
        return self._local

    def __getitem__(self, rank):
        if type(rank) is int and 0 <= rank < len(self._images):
            return self._images[rank]
        self._parts.usable(self.mem, "[rank]")
        rank, _ = self._parts.target(self.mem, rank, 0, 0, "[rank]")
        return self._images[rank]

    def _section(self, key, index):
        sec = self._sections.get(key)
        if sec is None:
            sec = self._sections[key] = _Section(self._local, index, self.mem.rank)
        return sec

    def _target(self, rank, index):
        """(view of the section on a node peer or None, index key)."""
        if self.mem.closed:
            self._parts.usable(self.mem, "[rank][index]")
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
            MPI = mpi()
            t = MPI.BYTE.Create_contiguous(self.dtype.itemsize)
            for n, stride in zip(reversed(sec.shape), reversed(sec.strides)):
                outer = t.Create_hvector(n, 1, stride)
                t.Free()
                t = outer
            t.Commit()
            self._types[key] = t
        return t

    def _where(self, rank, sec):
        """The RMA target of a section: plain bytes when contiguous, else a derived datatype."""
        if sec.contiguous:
            return (self._disp[rank] + sec.start, sec.nbytes, mpi().BYTE)
        return (self._disp[rank] + sec.start, 1, self._datatype(sec))

    def _put(self, rank, index, values, blocking):
        view, key = self._target(rank, index)
        if view is not None:
            view[...] = values if (type(values) is np.ndarray and values.dtype is self.dtype
                                   and values.shape == view.shape) else self._conform(values, view.shape)
            return None if blocking else Request(self._owner, None, None, None, "Coarray.Rput")
        sec = self._section(key, index)
        if (type(values) is np.ndarray and values.dtype is self.dtype and values.shape == sec.shape
                and values.flags.c_contiguous):
            src = values
        else:
            src = np.ascontiguousarray(self._conform(values, sec.shape))
        if src.size == 0:
            return None if blocking else Request(self._owner, None, None, None, "Coarray.Rput")
        MPI = mpi()
        rma = put_flush if blocking else MPI.Win.Rput
        req = rma(self._win, (src, src.nbytes, MPI.BYTE), rank, self._where(rank, sec))
        if blocking:
            return None
        self._sync.dirty[id(self._win)] = self._win
        return Request(self._owner, req, rank, src, "Coarray.Rput")

    def _conform(self, values, shape):
        """``values`` as this coarray's dtype, broadcast to a section's ``shape``; an error that
        says which of the two failed, and why, before anything is written."""
        rank = self.mem.rank
        try:
            arr = np.asarray(values, dtype=self.dtype)
        except (ValueError, TypeError, OverflowError) as e:
            raise type(e)(f"hybridmpi: rank {rank}: Coarray: {safe_repr(values)} cannot be stored "
                          f"as {self.dtype}: {e}") from None
        try:
            return np.broadcast_to(arr, shape)
        except ValueError:
            raise ValueError(f"hybridmpi: rank {rank}: Coarray: values of shape {arr.shape} do not "
                             f"fit the section of shape {shape}") from None

    def _get(self, rank, index):
        view, key = self._target(rank, index)
        if view is not None:
            return np.array(view)
        sec = self._section(key, index)
        out = np.empty(sec.shape, dtype=self.dtype)
        if out.size:
            MPI = mpi()
            get_flush(self._win, (out, out.nbytes, MPI.BYTE), rank, self._where(rank, sec))
        return out

    def Rget(self, rank: int, index: Any, out: np.ndarray) -> Request:
        """Start ``out[...] = a[rank][index]``; returns a :class:`Request` (read ``out`` after it).

        Args:
            out: a writeable C-contiguous array of this dtype and the section's shape.
        """
        mem = self.mem
        if mem.closed:
            self._parts.usable(mem, "Rget")
        rank, _ = self._parts.target(mem, rank, 0, 0, "Rget")
        view, key = self._target(rank, index)
        sec = self._section(key, index)
        if (type(out) is not np.ndarray or out.dtype != self.dtype or out.shape != sec.shape
                or not out.flags.c_contiguous or not out.flags.writeable):
            raise ValueError(f"hybridmpi: rank {mem.rank}: Coarray.Rget: out must be a writeable "
                             f"C-contiguous {self.dtype} array of shape {sec.shape}")
        if view is not None or out.size == 0:
            if out.size:
                out[...] = view
            return Request(self._owner, None, None, None, "Coarray.Rget")
        req = self._win.Rget((out, out.nbytes, mpi().BYTE), rank, self._where(rank, sec))
        return Request(self._owner, req, None, out, "Coarray.Rget")

    def Rput(self, rank: int, index: Any, values: Any) -> Request:
        """Start ``a[rank][index] = values``; returns a :class:`Request` (``values`` are copied)."""
        mem = self.mem
        if mem.closed:
            self._parts.usable(mem, "Rput")
        rank, _ = self._parts.target(mem, rank, 0, 0, "Rput")
        return self._put(rank, index, values, False)

    def sync_all(self) -> None:
        """As :meth:`GlobalMemory.sync_all`."""
        self.mem.sync_all()

    def _drop_views(self):
        """Let go of every array over the memory (at free: the memory goes when the user's do)."""
        self._local = None
        self._shaped = [None] * len(self._shaped)
        self._targets = {}
        self._sections = {}

    def sync_images(self, ranks: int | Iterable[int]) -> None:
        """As :meth:`GlobalMemory.sync_images`."""
        if self.mem.closed:
            self._parts.usable(self.mem, "sync_images")
        self._sync.sync_images(ranks, "Coarray.sync_images")

    def free(self) -> None:
        """Free the coarray (collective).  Idempotent."""
        self.hc.context.disown(self)
        if self.mem.closed:
            return
        self._parts.release(self.mem, self._drop_views)
        if not mpi().Is_finalized():
            for t in self._types.values():
                t.Free()
        self._types = {}

    @property
    def closed(self) -> bool:
        return self.mem.closed

    @property
    def _internal(self) -> CoarrayParts:
        """What the profile uses of a Coarray it records (its one seam)."""
        return CoarrayParts(self._section_nbytes, self._calls, self.mem._internal.sync)

    def _section_nbytes(self, index):
        return self._section(_key(index, self.mem.rank), index).nbytes

    def __repr__(self):
        return f"<Coarray rank {self.mem.rank} shape={self.shape} dtype={self.dtype}>"


class _Image:
    """``a[r]``: the coarray on rank ``r``, indexed to put or get a section."""

    __slots__ = ("_a", "_rank")

    def __init__(self, a, rank):
        self._a = a
        self._rank = rank

    def __getitem__(self, index):
        return self._a._get(self._rank, index)  # noqa: SLF001 - the Coarray's image, this module

    def __setitem__(self, index, values):
        self._a._put(self._rank, index, values, True)  # noqa: SLF001 - as above
