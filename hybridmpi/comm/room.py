"""What a HybridComm may still take, checked before anything is made: MPI's context ids (the
library's budget of communicators and windows in this process) and the room of /dev/shm (a
tmpfs that runs out mid-run kills the process with SIGBUS instead of failing the allocation),
and the committing of shared pages, agreed on every rank.  The arena (:mod:`.arena`), the
HybridComm and the Halo's own windows call these before they allocate.  And the identifiers
a comm's Halos take their MPI tags from (:class:`TagIds`)."""

import ctypes
import errno
import mmap
import os

import numpy as np

from .. import settings
from .._native.clib import lib
from .._native.tables import mpi
from ._agree import agree, allgather, complete, context_of

_R = lib.HM_REGION
PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
#: bytes of /dev/shm an MPI touches itself per shared window, besides the segments: MPICH 5.0.2
#: writes 4 KiB (an empty window) or 8 KiB (measured with statvfs at 2, 3 and 4 ranks); counted
#: twice over, since a touch past the room is a SIGBUS inside MPI, not an error
MPI_WINDOW_BYTES = 4 * PAGE
#: Linux's madvise(MADV_POPULATE_WRITE) (5.14): commits pages, and returns an error where a
#: store would have raised SIGBUS (a full tmpfs)
_POPULATE_WRITE = 23

#: where MPI libraries map their shared segments on Linux
SHM_DIR = settings.shm_dir()

#: context ids (communicators and windows: every ``MPI_Comm_dup``, ``Split``,
#: ``Win_allocate_shared`` and ``Win_create`` takes one) an MPI gives a process, by vendor:
#: MPICH and its derivatives (Intel MPI, MVAPICH) 2,048 unless built otherwise (2,048 in MPICH's
#: "Too many communicators (0/2048 free ...)"); Open MPI 2**16 - 4 (a 16-bit index, less
#: MPI_COMM_WORLD, MPI_COMM_SELF and its own)
CONTEXT_IDS = {"MPICH": 2048, "Intel MPI": 2048, "MVAPICH": 2048, "Open MPI": 2**16 - 4}
#: of these, left to the application and the MPI's own communicators
CONTEXT_IDS_LEFT = 64
#: what a HybridComm holds: its communicator, node and leader communicators, core window
HYBRIDCOMM_IDS = 4
#: context ids the library's live objects hold in this process (HybridComms, arena chunks,
#: Halo windows); ``[count]``
_held = [0]


def id_budget():
    """(context ids the library may hold in this process, why): env
    ``HYBRIDMPI_CONTEXT_IDS`` (the MPI's limit, for an MPI built with another), else the MPI's
    limit by vendor (:data:`CONTEXT_IDS`, 2,048 when unknown), less :data:`CONTEXT_IDS_LEFT`."""
    env = settings.context_ids()
    if env:
        limit, source = env, "env HYBRIDMPI_CONTEXT_IDS"
    else:
        vendor = mpi().get_vendor()[0]
        limit = CONTEXT_IDS.get(vendor, 2048)
        source = f"{vendor}'s limit"
    return limit - CONTEXT_IDS_LEFT, f"{limit} ({source}) less {CONTEXT_IDS_LEFT} left to the application"


def ids_problem(hc, ids, what):
    """This rank's problem (RuntimeError, message) when ``ids`` more context ids would take the
    library past :func:`id_budget`, else None (agreed by the caller: MPICH crashes or fails with
    'Other MPI error' once its ids run out, on some ranks only)."""
    budget, why = id_budget()
    if _held[0] + ids <= budget:
        return None
    return RuntimeError, (f"rank {hc.rank}: {what} needs {ids} more MPI communicator/window "
                          f"context id(s); hybridmpi holds {_held[0]} in this process and may hold "
                          f"{budget}: {why}; free some Halos (methods fence, pscw, lock keep a "
                          "window each), global memory or HybridComms first")


def hold_ids(k):
    """Count ``k`` context ids made (negative: freed)."""
    _held[0] += k


def held_ids():
    """Context ids the library's live objects hold in this process."""
    return _held[0]


def round_up(nbytes):
    """``nbytes`` rounded up to the 128-byte region size."""
    return -(-nbytes // _R) * _R


def shm_room():
    """(bytes free for shared memory on this node or None, how it was found)."""
    try:
        st = os.statvfs(SHM_DIR)
        room, where = st.f_bavail * st.f_frsize, f"{SHM_DIR} has"
    except OSError:
        room, where = None, ""
    limit = settings.shm_limit()
    if limit is not None and (room is None or limit < room):
        room, where = limit, "HYBRIDMPI_SHM_LIMIT allows"
    return room, where


def page_up(nbytes):
    """``nbytes`` rounded up to whole pages."""
    return -(-nbytes // PAGE) * PAGE


def window_bytes(node):
    """Bytes of /dev/shm a window of :func:`allocate_shared` may take when every node rank
    ``r`` asks for ``node[r]`` bytes: each segment (one region more) in whole pages, since
    segments are not contiguous, and the MPI's own pages."""
    return sum(page_up(n + _R) for n in node) + MPI_WINDOW_BYTES


def check_room(hc, nbytes, what, hint="", *, window=True, ids=0):
    """Refuse, on every rank, shared memory that would not fit in /dev/shm (collective).

    A tmpfs that runs out of room mid-run kills the process with SIGBUS
    instead of failing the allocation, so the room is checked first, for
    what will really be mapped (:func:`window_bytes`; ``window=False``:
    only the pages of ``nbytes`` in a window that exists).  Env
    ``HYBRIDMPI_SHM_LIMIT`` (bytes per node) lowers the room further.

    Args:
        nbytes: this rank's bytes (the node's are summed).
        ids: the MPI context ids (windows, communicators) it will make (checked first).

    Returns:
        The bytes every rank of this node asked for, in node rank order.

    Raises:
        RuntimeError: on every rank, when ``ids`` more would take the library past
            its budget of context ids (:func:`id_budget`).
        MemoryError: on every rank, naming ``what``; ``hint`` is appended.
    """
    node = allgather(context_of(hc.comm), hc.node_comm, nbytes, what)
    need = window_bytes(node) if window else sum(page_up(n) + PAGE for n in node)
    problem = ids_problem(hc, ids, what) if ids else None
    try:
        room, where = shm_room()
    except ValueError as e:   # a malformed HYBRIDMPI_SHM_LIMIT, maybe on this rank alone
        room, where, problem = None, "", (ValueError, f"rank {hc.rank}: {str(e).removeprefix('hybridmpi: ')}")
    if problem is None and room is not None and need > room:
        problem = MemoryError, (f"rank {hc.rank}: {what} needs {need / 2**20:.2f} MiB of shared "
                                f"memory on its node (its segments in pages and the MPI's own), "
                                f"{where} {room / 2**20:.2f} MiB free, {need - room} bytes short"
                                f"{hint}")
    agree(hc.comm, problem, what)  # every node agrees
    return node


def _populate(addr, nbytes):
    """Commit the pages of [addr, addr + nbytes) of a shared mapping; returns an error
    message where a store would have raised SIGBUS, else None.  A kernel without
    MADV_POPULATE_WRITE (before 5.14) leaves them to the first store: the room check
    alone guards them then."""
    if nbytes <= 0:
        return None
    lo = addr // PAGE * PAGE
    n = page_up(addr + nbytes) - lo
    if _libc.madvise(lo, n, _POPULATE_WRITE) == 0:
        return None
    err = ctypes.get_errno()
    if err == errno.EINVAL:  # an older kernel
        return None
    return os.strerror(err)


def commit(hc, addr, nbytes, what, hint="", undo=None):
    """Commit this rank's ``nbytes`` of shared memory at ``addr`` before anything is stored
    there, and agree (collective over ``hc.comm``): memory that /dev/shm cannot hold raises
    MemoryError on every rank (after ``undo()``), not SIGBUS on one.

    Raises:
        MemoryError: on every rank, naming ``what``; ``hint`` is appended.
    """
    error = _populate(addr, nbytes)
    problem = error and (MemoryError, f"rank {hc.rank}: {what}: {nbytes} bytes of shared memory "
                                      f"cannot be committed ({error}): {SHM_DIR} is full{hint}")
    try:
        agree(hc.comm, problem, what)
    except MemoryError:
        if undo is not None:
            undo()
        raise


#: identifiers of live Halos on one HybridComm (each takes MPI tags 100 + 2 * id, + 1)
TAG_SLOTS = 16000


class TagIds:
    """The identifiers of one comm's live Halos: bit i of :attr:`bits` is identifier i taken."""

    def __init__(self):
        self.bits = np.zeros(TAG_SLOTS // 64 + 1, dtype=np.uint64)

    def take(self, ctx, comm, MPI):
        """An identifier (0 <= id < TAG_SLOTS) that no live Halo holds on any rank, the same
        on every rank (collective over ``comm``, the comm's own, ``ctx`` its Context: one
        Allreduce of the ranks' taken sets, so identifiers freed in different orders on
        different ranks are never handed out twice); None when all are taken.  Freed
        identifiers are reused: nothing wraps around onto a live one.  The Allreduce is
        non-blocking and waited on as every agreement is (under the timeout, ended by a peer's
        failure notice): a peer interrupted between the constructor's agreement and this call
        (Ctrl-C) made the others wait in a blocking MPI_Allreduce for ever (found by
        test_signals' Halo constructor loop, 2 runs in 14)."""
        taken = self.bits.copy()
        complete(ctx, comm, comm.Iallreduce(MPI.IN_PLACE, taken, op=MPI.BOR), "Halo()")
        free = np.flatnonzero(np.unpackbits(~taken.view(np.uint8), bitorder="little")[:TAG_SLOTS])
        if free.size == 0:
            return None
        i = int(free[0])
        self.bits[i >> 6] |= np.uint64(1 << (i & 63))
        return i

    def release(self, i):
        """Give back an identifier of :meth:`take` (a Halo was freed)."""
        self.bits[i >> 6] &= ~np.uint64(1 << (i & 63))
