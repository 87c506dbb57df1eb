"""Exceptions raised by hybridmpi, and ending the job when one rank fails."""

from __future__ import annotations

import sys
import traceback
from typing import Any

from ._jobs import GUARDS, abort_job
from .settings import launched

__all__ = ["FreedError", "PatternError", "PeerArgumentError", "PeerError", "SyncTimeout",
           "abort_on_error", "launched"]


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


def agreed(exc: BaseException) -> BaseException:
    """Mark ``exc`` as raised on every rank of its communicator together, leaving the objects
    usable (an invalid call that every rank found invalid, or ranks that passed different
    arguments): a ``with`` block that it leaves frees its object collectively, as a normal
    exit does.  Any other exception leaving a block is this rank's own, and breaks the comm
    instead of making a collective call that the peers may never join.  Returns ``exc``."""
    exc.__hybridmpi_agreed__ = True  # type: ignore[attr-defined]
    return exc


def is_agreed(exc: BaseException | None) -> bool:
    """Whether ``exc`` was raised on every rank together (:func:`agreed`)."""
    return bool(getattr(exc, "__hybridmpi_agreed__", False))


class _AbortOnError:
    """What :func:`abort_on_error` returns: it guards from its creation, so that a call
    without ``with`` guards the rest of the program instead of doing nothing."""

    def __init__(self, code: int) -> None:
        self.code = code
        GUARDS[0] += 1
        self._previous = sys.excepthook
        sys.excepthook = self._uncaught
        self._open = True

    def _end(self, exc: BaseException | None) -> None:
        if self._open:
            self._open = False
            GUARDS[0] -= 1
            if sys.excepthook == self._uncaught:
                sys.excepthook = self._previous
        if exc is None:
            return
        if isinstance(exc, SystemExit):
            if exc.code not in (None, 0):
                abort_job(exc.code if isinstance(exc.code, int) else self.code, None,
                          message=None if isinstance(exc.code, int) else f"{exc.code}\n")
            return
        abort_job(self.code, "".join(traceback.format_exception(exc)))

    def _uncaught(self, kind: Any, exc: BaseException, tb: Any) -> None:
        self._end(exc)
        self._previous(kind, exc, tb)

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        self._end(exc)


def abort_on_error(code: int = 1) -> _AbortOnError:
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

    Called without ``with`` (``hybridmpi.abort_on_error()`` as a statement), it guards the rest
    of the program: an exception that nothing catches ends the job the same way (through
    ``sys.excepthook``).
    """
    return _AbortOnError(code)
