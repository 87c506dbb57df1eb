"""Exceptions raised by hybridmpi, and ending the job when one rank fails."""

from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
from collections.abc import Iterator
from typing import Any


class SyncTimeout(RuntimeError):
    """A wait on a peer passed its deadline.

    Attributes:
        rank: rank (in the HybridComm's communicator) that timed out.
        peer: rank whose counter was watched, or None when several could be.
        counter: name of the watched counter (``"arrive"``, ``"release"``...).
        epoch: value the counter had to reach.
        missing: ranks of this node that had not entered the call.
    """

    def __init__(self, message: str, *, rank: int | None = None, peer: int | None = None,
                 counter: str | None = None, epoch: int | None = None,
                 missing: Any = ()) -> None:
        super().__init__(message)
        self.rank = rank
        self.peer = peer
        self.counter = counter
        self.epoch = epoch
        self.missing = tuple(missing)


class PeerError(RuntimeError):
    """A peer failed inside the same call (its error bits reached this rank), so this rank
    stops too instead of waiting for it.  The object of the call becomes unusable.

    Attributes:
        rank: this rank.
        peer: the rank whose error bits were seen (None when not known).
    """

    def __init__(self, message: str, *, rank: int | None = None, peer: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.peer = peer


class PeerArgumentError(PeerError, ValueError):
    """A peer passed invalid arguments to the same call, or arguments that differ from this
    rank's (its error bits or its signature reached this rank), so this rank raises this
    instead of waiting for it.  Caught as :class:`PeerError` (the peer's own error says what
    was wrong; the peer raises that, a ``TypeError`` for instance) and as ``ValueError``
    (the ranks' arguments disagreed)."""


class FreedError(RuntimeError):
    """An object that owns MPI resources was used after ``free()``."""


class PatternError(ValueError):
    """A ghost pattern is inconsistent; raised on every rank of the communicator.

    The message names the rank where the problem was found, the peer and the
    offending id or count.
    """


#: the environment variables in which launchers tell a process its size and rank
_LAUNCHER_ENV = (("PMI_SIZE", "PMI_RANK"),                           # MPICH (hydra), Intel MPI, PMI-2
                 ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"),   # Open MPI
                 ("MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK"))     # MVAPICH2
#: abort_on_error blocks entered and not yet left
_GUARDS = [0]
#: seconds between printing the error and aborting (time for the launcher to forward it)
_FORWARD_S = 0.5


def launched() -> tuple[int, int]:
    """This process's rank and the number of processes, as the launcher's environment says
    (``mpiexec`` of MPICH, Open MPI, Intel MPI, MVAPICH2), without starting MPI; ``(0, 1)``
    outside a launcher."""
    for size, rank in _LAUNCHER_ENV:
        try:
            return int(os.environ.get(rank, "0")), int(os.environ[size])
        except (KeyError, ValueError):
            continue
    return 0, 1


def _world():
    """(rank, size) of MPI_COMM_WORLD when MPI is initialized, else the launcher's; None once
    MPI was finalized."""
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is not None and MPI.Is_finalized():
        return None
    if MPI is not None and MPI.Is_initialized():
        return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    return launched()


@contextlib.contextmanager
def abort_on_error(code: int = 1) -> Iterator[None]:
    """End the whole MPI job when the body raises on this rank, as ``python -m mpi4py`` does:
    print the rank's traceback to stderr, then ``MPI.COMM_WORLD.Abort(code)``, so that
    ``mpiexec`` returns non-zero within seconds instead of the other ranks waiting for this
    one.  A ``sys.exit(n)`` with ``n != 0`` aborts with ``n``.  Alone (no launcher, or one
    rank) the exception propagates as usual.

    Enter it first, before any import that can fail, so that an error on one rank also ends
    the job before MPI is started (the failing rank then starts MPI to abort: every rank of
    an MPI program starts it).  ``import hybridmpi`` imports nothing else::

        import hybridmpi

        with hybridmpi.abort_on_error():
            import numpy as np
            from mpi4py import MPI
            with hybridmpi.HybridComm(MPI.COMM_WORLD) as hc:
                ...

    A ``with`` block of a HybridComm, Halo, GlobalMemory or Coarray that an exception leaves
    inside it is not freed (freeing is collective, and the job ends anyway).
    """
    _GUARDS[0] += 1
    try:
        yield
    except SystemExit as e:
        if e.code not in (None, 0):
            _abort_job(e.code if isinstance(e.code, int) else code, None,
                       message=None if isinstance(e.code, int) else f"{e.code}\n")
        raise
    except BaseException:
        _abort_job(code, traceback.format_exc())
        raise
    finally:
        _GUARDS[0] -= 1


def _ends_job(exc: BaseException | None) -> bool:
    """Whether ``exc``, leaving a ``with`` block now, ends the job: it is inside
    :func:`abort_on_error`, which aborts on it, and several ranks run."""
    if exc is None or _GUARDS[0] == 0 or (isinstance(exc, SystemExit) and exc.code in (None, 0)):
        return False
    world = _world()
    return world is not None and world[1] > 1


def _abort_job(code, trace, *, message=None, wait=0.0):
    """End the job when this process is one of several: write ``trace`` (under a line naming
    this rank) or ``message`` to stderr, then ``MPI.COMM_WORLD.Abort(code)``, starting MPI
    first if this rank had not (every rank of an MPI program starts it, so the start
    completes).  Ranks other than 0 first sleep ``wait`` seconds, so that an error that every
    rank found is printed once: rank 0 ends the job meanwhile.  Returns, doing nothing, when
    this process runs alone or MPI was finalized."""
    world = _world()
    if world is None or world[1] < 2:
        return
    rank = world[0]
    if wait and rank:
        time.sleep(wait)
    if trace:
        sys.stderr.write(f"hybridmpi: rank {rank} failed; aborting the job:\n{trace}")
    elif message:
        sys.stderr.write(message)
    sys.stdout.flush()
    sys.stderr.flush()
    # the launcher forwards output asynchronously, and an abort can tear it down before it
    # forwarded the lines just written (seen with MPICH's hydra): give it a moment
    time.sleep(_FORWARD_S)
    try:
        from mpi4py import MPI

        if not MPI.Is_initialized():
            MPI.Init()
    except BaseException:  # no MPI here (the import is what failed): exit with the error
        return
    MPI.COMM_WORLD.Abort(code)
    # MPICH's MPI_Abort may return before the launcher kills this process: never go on
    os._exit(code)
