"""Ending the whole MPI job when one rank fails (a leaf: what :func:`hybridmpi.abort_on_error`,
the ``with`` blocks of every object and the command share)."""

from __future__ import annotations

import os
import sys
import time

from .settings import launched

#: abort_on_error blocks entered and not yet left
GUARDS = [0]
#: seconds between printing the error and aborting (time for the launcher to forward it)
FORWARD_S = 0.5


def world():
    """(rank, size) of MPI_COMM_WORLD when MPI is initialized, else the launcher's; None once
    MPI was finalized."""
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is not None and MPI.Is_finalized():
        return None
    if MPI is not None and MPI.Is_initialized():
        return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    return launched()


def ends_job(exc: BaseException | None) -> bool:
    """Whether ``exc``, leaving a ``with`` block now, ends the job: it is inside
    :func:`abort_on_error`, which aborts on it, and several ranks run."""
    if exc is None or GUARDS[0] == 0 or (isinstance(exc, SystemExit) and exc.code in (None, 0)):
        return False
    found = world()
    return found is not None and found[1] > 1


def abort_job(code, trace, *, message=None, wait=0.0):
    """End the job when this process is one of several: write ``trace`` (under a line naming
    this rank) or ``message`` to stderr, then ``MPI.COMM_WORLD.Abort(code)``, starting MPI
    first if this rank had not (every rank of an MPI program starts it, so the start
    completes).  Ranks other than 0 first sleep ``wait`` seconds, so that an error that every
    rank found is printed once: rank 0 ends the job meanwhile.  Returns, doing nothing, when
    this process runs alone or MPI was finalized."""
    found = world()
    if found is None or found[1] < 2:
        return
    rank = found[0]
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
    time.sleep(FORWARD_S)
    try:
        from mpi4py import MPI

        if not MPI.Is_initialized():
            MPI.Init()
    except BaseException:  # no MPI here (the import is what failed): exit with the error
        return
    MPI.COMM_WORLD.Abort(code)
    # MPICH's MPI_Abort may return before the launcher kills this process: never go on
    os._exit(code)
