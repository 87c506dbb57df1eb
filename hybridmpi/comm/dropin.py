"""Drop-in ``barrier`` and ``allreduce`` that cache one HybridComm per communicator.

The HybridComm is stored as an MPI attribute of the communicator, so it is
freed when the communicator is freed; the rest are freed when MPI finalizes.
"""

from __future__ import annotations

from typing import Any

from .._native.tables import mpi as _mpi
from .hybridcomm import HybridComm

_KEYVAL: list[int] = []
_WORLD: list[Any] = []
_FAST: dict[Any, Any] = {}  # id(communicator) -> (communicator, HybridComm)
# The communicator of the last call and its HybridComm: one identity test on the hot path
# (a placeholder communicator until the first call).
#: the last communicator a drop-in was called with (as passed: None too), its HybridComm's bound
#: barrier and allreduce: one identity test on the hot path (no attribute read)
_LAST: list[Any] = [object(), None, None]


def _forget() -> None:
    _LAST[:] = [object(), None, None]


class _Forget:
    """The drop-ins' service of a HybridComm they cache: freeing the comm forgets it."""

    @staticmethod
    def free() -> None:
        _forget()


def _delete_attr(_comm, _keyval, hc):
    hc.free()
    return 0


def hybrid(comm: Any = None) -> HybridComm:
    """Return the cached HybridComm of ``comm`` (collective the first time).

    Args:
        comm: an intracommunicator; default ``MPI.COMM_WORLD``.
    """
    if comm is None and _WORLD and not _WORLD[0].closed:
        return _WORLD[0]
    MPI = _mpi()
    if not _KEYVAL:
        _KEYVAL.append(MPI.Comm.Create_keyval(delete_fn=_delete_attr))
    key = _KEYVAL[0]
    target = MPI.COMM_WORLD if comm is None else comm
    if not isinstance(target, MPI.Intracomm) or target == MPI.COMM_NULL:
        raise TypeError(f"hybridmpi: need an MPI intracommunicator, got {target!r}")
    hc = target.Get_attr(key)
    if hc is None or hc.closed:
        hc = HybridComm(target)
        target.Set_attr(key, hc)
    if comm is None:
        _WORLD[:] = [hc]
    return hc


def _cached(comm):
    """The HybridComm of ``comm`` through a dictionary keyed by the communicator object
    (which it keeps alive, so its id is not reused): one lookup on the hot path."""
    hit = _FAST.get(id(comm))
    if hit is not None and hit[0] is comm and not hit[1].closed:
        hc = hit[1]
    else:
        hc = hybrid(comm)
        for key in [k for k, (_, h) in _FAST.items() if h.closed]:
            del _FAST[key]
        _FAST[id(comm)] = (comm, hc)
    hc.context.service("dropin", lambda _ctx: _Forget())   # its free() forgets it here
    _LAST[:] = [comm, hc.barrier, hc.allreduce]
    return hc


def barrier(comm: Any = None) -> None:
    """Drop-in for ``comm.Barrier()`` through the shared-memory barrier.

    Args:
        comm: an intracommunicator; default ``MPI.COMM_WORLD``.
    """
    last = _LAST
    if comm is last[0]:   # the comm's bound barrier: one C call on one node
        return last[1]()
    _cached(comm).barrier()


def allreduce(x: Any, op: Any = "sum", comm: Any = None) -> Any:
    """Drop-in for ``comm.allreduce(x, op)``; see :meth:`HybridComm.allreduce`.

    Args:
        x: int, float, complex, numpy scalar or numpy array.
        op: ``"sum"``, ``"prod"``, ``"min"``, ``"max"`` or the MPI ops.
        comm: an intracommunicator; default ``MPI.COMM_WORLD``.

    Returns:
        The combined value, of the same kind as ``x``; Python ints exact, of any size, as
        mpi4py's ``comm.allreduce`` gives them.
    """
    last = _LAST
    if comm is last[0]:   # the comm's bound allreduce: a float on one node is one C call
        return last[2](x, op)
    return _cached(comm).allreduce(x, op)
