"""Drop-in ``barrier`` and ``allreduce`` that cache one HybridComm per communicator.

The HybridComm is stored as an MPI attribute of the communicator, so it is
freed when the communicator is freed; the rest are freed when MPI finalizes.
"""

from .comm import HybridComm, _mpi

_KEYVAL = []
_WORLD = []


def _delete_attr(_comm, _keyval, hc):
    hc.free()
    return 0


def hybrid(comm=None):
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


def barrier(comm=None):
    """Drop-in for ``comm.Barrier()`` through the shared-memory tree barrier.

    Args:
        comm: an intracommunicator; default ``MPI.COMM_WORLD``.
    """
    hybrid(comm).barrier()


def allreduce(x, op="sum", comm=None):
    """Drop-in for ``comm.allreduce(x, op)``; see :meth:`HybridComm.allreduce`.

    Args:
        x: int, float, complex, numpy scalar or numpy array.
        op: ``"sum"``, ``"prod"``, ``"min"``, ``"max"`` or the MPI ops.
        comm: an intracommunicator; default ``MPI.COMM_WORLD``.

    Returns:
        The combined value, of the same kind as ``x``.
    """
    return hybrid(comm).allreduce(x, op)
