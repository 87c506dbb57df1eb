"""Collective agreement on errors: every rank checks its own arguments, then every rank
raises the same exception, or none does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._types import mpi

#: what a rank found wrong: None, a message (ValueError), or (exception class, message)
Problem = Any


def agree(comm: Any, problem: Problem, where: str, *, data: Any = None,
          more: bool = False) -> list[Any]:
    """Allgather every rank's ``problem`` and ``data``; raise the first problem on every rank.

    Args:
        comm: an mpi4py communicator; every rank of it calls.
        problem: None, a message, or ``(exception class, message)``.
        where: the call, the start of the message (``"hybridmpi: {where}: {message}"``).
        data: anything picklable, gathered from every rank.
        more: append how many more ranks found problems.

    Returns:
        Every rank's ``data``, in rank order.

    Raises:
        The first rank's problem (ValueError unless a class was given), on every rank.
    """
    views = comm.allgather((problem, data))
    bad = [p for p, _ in views if p]
    if bad:
        exc, text = bad[0] if isinstance(bad[0], tuple) else (ValueError, bad[0])
        if more and len(bad) > 1:
            text += f" (and {len(bad) - 1} more rank(s) found problems)"
        raise exc(f"hybridmpi: {where}: {text}")
    return [d for _, d in views]


def create_agreed(hc: Any, make: Callable[[], Any], *, failed: str, exc: type[Exception],
                  where: str, hint: str = "", free: Callable[[Any], None] | None = None,
                  undo: Callable[[], None] | None = None) -> Any:
    """Make an MPI object on every rank of ``hc.comm`` with ``make()``; if it failed on any
    rank, every rank frees what it made and raises the first rank's error.

    Args:
        hc: the HybridComm (its comm, rank and MPI).
        make: the constructor; an ``MPI.Exception`` from it is the failure.
        failed: the MPI call, for the message (``"MPI_Win_create"``).
        exc: the exception class every rank raises.
        where: the call, the start of the message.
        hint: appended to the message.
        free: frees what ``make`` returned (default: its ``Free()``).
        undo: run too on failure, after ``free``.

    Returns:
        What ``make`` returned.
    """
    made, error = None, None
    try:
        made = make()
    except mpi().Exception as e:
        error = f"rank {hc.rank}: {failed} failed: {e}{hint}"
    try:
        agree(hc.comm, error and (exc, error), where)
    except exc:
        if made is not None:
            (free or (lambda m: m.Free()))(made)
        if undo is not None:
            undo()
        raise
    return made
