"""A leader's part of the protocol between the nodes: the C core's (``cext/hm_net.c``, which
the PMPI library runs too) over the leaders' communicator.

The core is built without ``mpi.h``; :class:`Net` gives it mpi4py's MPI: the addresses of that
MPI's nonblocking collectives, ``MPI_Test``, ``MPI_Op_create`` and ``MPI_Op_free``,
``MPI_Type_contiguous``, ``MPI_Type_commit`` and ``MPI_Type_free`` (looked up
from mpi4py's extension module, whose dependencies hold them), the handles of the
communicator, types and ops (``MPI._handleof``), the core's own ops for float min and max and
the complex product (made by the core with ``MPI_Op_create``, freed by :meth:`Net.free`), and
the comm's failure notices, which the C wait polls through :func:`hm_py_notice`.
"""

from __future__ import annotations

import ctypes
from typing import Any

from .._native import errmap
from .._native.clib import ffi, lib
from .._native.tables import MPI_OPS, MPI_TYPES
from ._waits import notice_hook

#: the entry points hm_net calls, by its field
_ENTRY_POINTS = {"iallreduce": "MPI_Iallreduce", "ireduce": "MPI_Ireduce", "ibcast": "MPI_Ibcast",
                 "test": "MPI_Test", "op_create": "MPI_Op_create", "op_free": "MPI_Op_free",
                 "type_contiguous": "MPI_Type_contiguous", "type_commit": "MPI_Type_commit",
                 "type_free": "MPI_Type_free"}
#: the entry points of MPI's own calls (``mpi=True``): the barrier's, and the blocking ones
_MPI_CALLS = {"ibarrier": "MPI_Ibarrier", "barrier": "MPI_Barrier", "allreduce": "MPI_Allreduce"}
_ADDRESSES: dict[str, int] = {}


def _addresses(MPI: Any) -> dict[str, int]:
    """The addresses of the entry points in the MPI that mpi4py's MPI module calls."""
    if not _ADDRESSES:
        module = ctypes.CDLL(MPI.__file__, mode=ctypes.RTLD_LOCAL)  # (already loaded: found)
        for field, name in (_ENTRY_POINTS | _MPI_CALLS).items():
            _ADDRESSES[field] = ctypes.cast(getattr(module, name), ctypes.c_void_p).value or 0
    return _ADDRESSES


def _handle(MPI: Any, obj: Any) -> int:
    """The MPI handle of an mpi4py object, as the C core passes it (an int or a pointer; mpi4py
    gives MPICH's negative int handles as unsigned 64-bit numbers): ``obj.handle`` (mpi4py 4),
    else ``MPI._handleof(obj)`` (mpi4py 3's way, Debian's)."""
    h = getattr(obj, "handle", None)
    if h is None:
        h = getattr(MPI, "_handleof")(obj)  # noqa: B009 - mpi4py 3 has no public name for it
    return ctypes.c_int64(h).value


class Net:
    """The ``hm_net`` of a leader across nodes (kept with what it points to).

    Raises:
        RuntimeError: MPI_Op_create failed (the core's own ops).
    """

    __slots__ = ("net", "_handle")

    def __init__(self, leader_comm: Any, notices: Any, MPI: Any, *, mpi: bool = False,
                 blocking: bool = False) -> None:
        net = self.net = ffi.new("hm_net *")
        addresses = _addresses(MPI)
        for field in _ENTRY_POINTS:
            setattr(net, field, ffi.cast(f"hm_mpi_{field}", addresses[field]))
        if mpi:   # MPI's own calls over the whole communicator (hm_net_mpi_*); blocking ones
            # where no wait could end early (no deadline: the notices are not polled)
            for field in ("ibarrier", "barrier", "allreduce") if blocking else ("ibarrier",):
                setattr(net, field, ffi.cast(f"hm_mpi_{field}", addresses[field]))
        net.comm = _handle(MPI, leader_comm)
        net.rank, net.size = leader_comm.Get_rank(), leader_comm.Get_size()
        net.int64, net.max = _handle(MPI, MPI.INT64_T), _handle(MPI, MPI.MAX)
        net.in_place = int(MPI.IN_PLACE)
        for code, name in MPI_TYPES.items():
            net.types[code] = _handle(MPI, getattr(MPI, name))
        for code, name in MPI_OPS.items():
            net.ops[code] = _handle(MPI, getattr(MPI, name))
        self._handle = None
        if not (mpi and blocking):
            net.notice, self._handle = notice_hook(notices)
            net.notice_arg = self._handle
        if not errmap.ok(lib.hm_net_make_ops(net)):
            raise RuntimeError(f"hybridmpi: node leader {net.rank}: MPI_Op_create or "
                               "MPI_Type_contiguous failed (the ops of float min and max, of the "
                               "complex product and of the leaders' first call between the nodes)")

    def free(self) -> None:
        """Free the core's own ops (MPI_Op_free); call it while MPI runs and no request of the
        net is pending (``lib.hm_net_pending``)."""
        lib.hm_net_free_ops(self.net)
