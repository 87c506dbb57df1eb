"""Collective agreement on errors: every rank checks its own arguments, then every rank
raises the same exception, or none does."""

from __future__ import annotations

from typing import Any

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
