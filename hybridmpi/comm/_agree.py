"""Collective agreement on errors: every rank checks its own arguments, then every rank
raises the same exception, or none does.

An agreement waits as every other call of the library waits: on non-blocking MPI requests,
under the deadline (the HybridComm's timeout, or env ``HYBRIDMPI_TIMEOUT`` before a HybridComm
exists), and, on a HybridComm's communicator, ended by a peer's failure notice.  So a rank in a
constructor while a peer is in another call, or failed, raises instead of waiting forever.
What a rank sends is pickled inside a ``try``: a value that cannot be pickled, or whose
``repr`` raises, is a problem agreed like any other, never a raise on one rank alone.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import settings
from .._native import errmap as _errmap
from .._native.tables import mpi
from ..errors import PeerError, agreed
from ._waits import wait_requests

#: what a rank found wrong: None, a message (ValueError), or (exception class, message)
Problem = Any

#: the Context of each live HybridComm, by the id of its communicator (registered by the comm):
#: an agreement over that communicator polls its failure notices and keeps its deadline
_CONTEXTS: dict[int, tuple[Any, Any]] = {}


class _Alone:
    """What :func:`wait_requests` needs of a context where there is no HybridComm yet."""

    spin = 16


def register(comm: Any, ctx: Any) -> None:
    """Make agreements over ``comm`` (a HybridComm's own communicator) notice-aware."""
    _CONTEXTS[id(comm)] = (comm, ctx)


def unregister(comm: Any) -> None:
    """Forget ``comm`` (its HybridComm was freed)."""
    hit = _CONTEXTS.get(id(comm))
    if hit is not None and hit[0] is comm:
        del _CONTEXTS[id(comm)]


def safe_repr(value: Any, most: int = 80) -> str:
    """``repr(value)`` for a message: never raises, at most ``most`` characters."""
    try:
        text = repr(value)
    except Exception as e:  # noqa: BLE001 - a user's __repr__ may raise anything
        text = f"<a {type(value).__name__} whose repr raised {type(e).__name__}>"
    return text if len(text) <= most else text[:most - 3] + "..."


def checked(check: Callable[..., Any], rank: int, *args: Any) -> Any:
    """``check(*args)``, a rank's check of its arguments; an exception from it (a ``__repr__``
    or ``__index__`` that raises, an object numpy refuses) becomes the problem (TypeError)
    instead of a raise on this rank alone."""
    try:
        return check(*args)
    except Exception as e:  # noqa: BLE001 - whatever it is, the peers must hear of it
        return TypeError, f"rank {rank}: an argument could not be checked ({type(e).__name__}: {e})"


def _timeout_s(ctx: Any, deadline: float | None = None) -> float | None:
    """The deadline of an agreement: the HybridComm's, else ``deadline``, else env
    HYBRIDMPI_TIMEOUT."""
    if ctx is not None:
        ns = int(ctx.policy.timeout_ns)
        return ns / 1e9 if ns else None
    if deadline is not None:
        return deadline if 0 < deadline < 1e9 else None
    return settings.timeout()


def _wait(comm: Any, req: Any, where: str, ctx: Any, deadline: float | None = None) -> None:
    """Complete ``req`` like every other wait: spin then yield, under the deadline, and on a
    HybridComm's communicator ended by a failure notice (PeerError, the comm broken)."""
    timeout = _timeout_s(ctx, deadline)
    stop = wait_requests(ctx or _Alone, [req], timeout, notices=ctx is not None)
    if stop is None:
        return
    rank = comm.Get_rank()
    if stop.notice is not None:
        raise ctx.peer_error(where, stop.notice)
    if ctx is not None:
        ctx.break_comm("SyncTimeout")
    raise _errmap.timed_out(rank, timeout, f"in {where}", "not every rank of the communicator joined "
                            "it (a rank in another call, or one that failed or never calls)",
                            counter="agreement")


def _pickled(problem: tuple[str, Problem], data: Any, rank: int) -> bytes:
    """((where, problem), data) pickled; a value that cannot be pickled becomes the problem."""
    where, problem = problem
    try:
        return pickle.dumps(((where, problem), data))
    except Exception as e:  # noqa: BLE001 - a lambda, a generator, an object that refuses
        why = f"{type(e).__name__}: {e}"
    try:   # the problem alone: it says what was wrong with the argument (data may be it)
        if problem:
            return pickle.dumps(((where, problem), None))
    except Exception:  # noqa: BLE001 - the problem's own class or message cannot travel
        pass
    return pickle.dumps(((where, (TypeError, f"rank {rank}: an argument cannot be sent to the "
                                             f"other ranks to be compared ({why})")), None))


def exchange(comm: Any, blob: bytes, where: str, ctx: Any = None,
             deadline: float | None = None) -> list[bytes]:
    """Allgather ``blob`` from every rank (two non-blocking collectives, each waited under the
    deadline and, with ``ctx``, ended by failure notices); every rank's bytes in rank order."""
    MPI = mpi()
    size = comm.Get_size()
    mine = np.array([len(blob)], dtype=np.int64)
    sizes = np.empty(size, dtype=np.int64)
    _wait(comm, comm.Iallgather(mine, sizes), where, ctx, deadline)
    displs = np.zeros(size, dtype=np.int64)
    np.cumsum(sizes[:-1], out=displs[1:])
    out = np.empty(max(int(sizes.sum()), 1), dtype=np.uint8)
    send = np.frombuffer(blob, dtype=np.uint8) if blob else np.empty(0, dtype=np.uint8)
    _wait(comm, comm.Iallgatherv(send, [out, (sizes, displs), MPI.BYTE]), where, ctx, deadline)
    return [out[d:d + n].tobytes() for d, n in zip(displs.tolist(), sizes.tolist())]


def context_of(comm: Any) -> Any:
    """The Context of the HybridComm whose communicator is ``comm``, else None."""
    hit = _CONTEXTS.get(id(comm))
    return hit[1] if hit is not None and hit[0] is comm else None


def _usable(ctx: Any, where: str) -> None:
    if ctx is not None and ctx.broken() is not None:
        # this rank already told every peer (its notice): none waits for it here
        ctx.notices.progress()
        raise unusable(ctx.rank, f"{where}: its HybridComm is unusable after an earlier error "
                                 f"{ctx.earlier_error()}; free it", ctx.broken())


def unusable(rank: int, message: str, why: str) -> RuntimeError:
    """The error of a call on an object (or HybridComm) that broke earlier for ``why``:
    PeerError when a peer's failure broke it (as the call that found it raised), else
    RuntimeError; ``message`` says what."""
    cls = PeerError if why == "PeerError" else RuntimeError
    return cls(f"hybridmpi: rank {rank}: {message}")


# Collectives of constructors: each waits as every other wait (spin then yield, under the
# deadline, ended by a peer's failure notice or a signal, which breaks the comm), never in a
# blocking MPI call that a failed or interrupted peer would leave waiting forever.  ``ctx``:
# the HybridComm's Context (its deadline, notices and failure handling); ``comm``: its
# communicator or node communicator.

def complete(ctx: Any, comm: Any, req: Any, where: str) -> None:
    """Complete the non-blocking collective ``req`` on ``comm``."""
    _wait(comm, req, where, ctx)


def barrier(ctx: Any, comm: Any, where: str) -> None:
    """A barrier over ``comm``."""
    _usable(ctx, where)
    _wait(comm, comm.Ibarrier(), where, ctx)


def allgather(ctx: Any, comm: Any, obj: Any, where: str) -> list[Any]:
    """Every rank's ``obj`` (pickled), in rank order."""
    _usable(ctx, where)
    return [pickle.loads(b) for b in exchange(comm, pickle.dumps(obj), where, ctx)]


def alltoall(ctx: Any, comm: Any, objs: list[Any], where: str) -> list[Any]:
    """``objs[r]`` to rank ``r``; what every rank sent to this one, in rank order (small objects:
    every rank's list travels to every rank)."""
    me = comm.Get_rank()
    return [theirs[me] for theirs in allgather(ctx, comm, objs, where)]


def agree(comm: Any, problem: Problem, where: str, *, data: Any = None,
          more: bool = False, deadline: float | None = None) -> list[Any]:
    """Allgather every rank's ``problem`` and ``data``; raise the first problem on every rank.

    Waits under the deadline and, on a HybridComm's communicator, polls its failure notices
    (see the module's docstring): a peer in another call, or failed, makes this rank raise
    SyncTimeout or PeerError instead of waiting forever.

    Args:
        comm: an mpi4py communicator; every rank of it calls.
        problem: None, a message, or ``(exception class, message)``.
        where: the call, the start of the message (``"hybridmpi: {where}: {message}"``).
        data: anything; a value that cannot be pickled makes a TypeError on every rank.
        more: append how many more ranks found problems.
        deadline: seconds, on a communicator that is not a HybridComm's (default: env
            ``HYBRIDMPI_TIMEOUT``; none).

    Returns:
        Every rank's ``data``, in rank order.

    Raises:
        The first rank's problem (ValueError unless a class was given), on every rank, which
        names that rank when some rank found none.
        SyncTimeout: not every rank joined within the deadline.
        PeerError: a peer's HybridComm broke (its failure notice came).
    """
    ctx = context_of(comm)
    _usable(ctx, where)
    views = [pickle.loads(b) for b in exchange(comm, _pickled((where, problem), data, comm.Get_rank()),
                                                where, ctx, deadline)]
    calls = [w for (w, _), _ in views]
    if len(set(calls)) > 1:   # ranks in different constructors or frees: none goes on
        raise agreed(_errmap.calls_differ(comm.Get_rank(), where, calls))
    views = [(p, d) for (_, p), d in views]
    bad = [(r, p) for r, (p, _) in enumerate(views) if p]
    if bad:
        first, problem = bad[0]
        exc, text = problem if isinstance(problem, tuple) else (ValueError, problem)
        if len(bad) < len(views) and not text.startswith("rank "):   # one rank's: name it
            text = f"rank {first}: {text}"
        if more and len(bad) > 1:
            text += f" (and {len(bad) - 1} more rank(s) found problems)"
        raise agreed(exc(f"hybridmpi: {where}: {text}"))
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
