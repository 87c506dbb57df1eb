"""Exceptions raised by hybridmpi, and ending the job when one rank fails."""

from __future__ import annotations

import contextlib
import sys
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


class FreedError(RuntimeError):
    """An object that owns MPI resources was used after ``free()``."""


class PatternError(ValueError):
    """A ghost pattern is inconsistent; raised on every rank of the communicator.

    The message names the rank where the problem was found, the peer and the
    offending id or count.
    """


@contextlib.contextmanager
def abort_on_error(code: int = 1) -> Iterator[None]:
    """End the whole MPI job when the body raises on this rank, as ``python -m mpi4py`` does:
    print the rank's traceback to stderr, then ``MPI.COMM_WORLD.Abort(code)``, so that
    ``mpiexec`` returns non-zero within seconds instead of the other ranks waiting for this
    one.  With one rank (or MPI not initialized) the exception propagates as usual.

    Put it inside the ``with HybridComm(...)`` so that nothing collective runs after the error::

        with hybridmpi.HybridComm(MPI.COMM_WORLD) as hc, hybridmpi.abort_on_error():
            ...
    """
    try:
        yield
    except SystemExit as e:
        if e.code not in (None, 0):
            _abort_job(e.code if isinstance(e.code, int) else code, None)
        raise
    except BaseException:
        _abort_job(code, traceback.format_exc())
        raise


def _abort_job(code, trace):
    """Print ``trace`` (with this rank's number) and abort the job when several ranks run."""
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is None or not MPI.Is_initialized() or MPI.Is_finalized():
        return
    world = MPI.COMM_WORLD
    if world.Get_size() < 2:
        return
    if trace:
        sys.stderr.write(f"hybridmpi: rank {world.Get_rank()} failed; aborting the job:\n{trace}")
    sys.stdout.flush()
    sys.stderr.flush()
    world.Abort(code)
