"""Non-blocking one-sided operations: :class:`Request` and :func:`waitall`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .._native import errmap as _errmap
from ..comm._waits import wait_requests
from ..errors import FreedError


def put_flush(win: Any, origin: Any, rank: int, target: Any) -> None:
    """A blocking put across nodes: ``MPI_Put`` then ``MPI_Win_flush``."""
    win.Put(origin, rank, target)
    win.Flush(rank)


def get_flush(win: Any, origin: Any, rank: int, target: Any) -> None:
    """A blocking get across nodes: ``MPI_Get`` then ``MPI_Win_flush``."""
    win.Get(origin, rank, target)
    win.Flush(rank)


def _rma_timeout(hc, what):
    return _errmap.timed_out(hc.rank, hc.timeout, f"waiting for {what}", counter="rma")


class Owner:
    """What the requests of one GlobalMemory share (made once, with the memory)."""

    __slots__ = ("hc", "win", "freed")

    def __init__(self, hc, win):
        self.hc = hc      # the HybridComm (its rank, timeout and waits)
        self.win = win    # the memory's RMA window (None on one node)
        self.freed = False  # set by the memory's free(), which completed every transfer


class Request:
    """A non-blocking put or get (:meth:`GlobalMemory.Rput`, :meth:`GlobalMemory.Rget`).

    ``wait()`` returns once the transfer is complete at both ends (a put's
    data is in the target's memory; a get's data is in ``out``); ``test()``
    says whether it is, without blocking.  A request is waited once.
    """

    __slots__ = ("_owner", "_req", "_target", "_keep", "_done", "_waited", "_what")

    def __init__(self, owner, req, target, keep, what):
        self._owner = owner      # the memory's Owner: its HybridComm and window
        self._req = req          # MPI request, None when already complete
        self._target = target    # rank to flush for a put across nodes, else None
        self._keep = keep        # buffers that must live until completion
        self._done = req is None
        self._waited = False
        self._what = what

    def _finish(self):
        if self._target is not None:
            self._owner.win.Flush(self._target)
        self._done = True
        self._keep = None

    @staticmethod
    def _wait_all(requests: list[Request]) -> None:
        """:func:`waitall`: each element checked in turn (a Request, not yet waited, not listed
        before), then all waited."""
        pending: list[Request] = []
        seen: set[int] = set()
        for item in requests:
            if not isinstance(item, Request):
                raise TypeError(f"hybridmpi: waitall: expected Requests, got {type(item).__name__}")
            r: Request = item
            if r._waited:
                raise RuntimeError(f"hybridmpi: rank {r._owner.hc.rank}: waitall: a {r._what} request "
                                   "was already waited")
            if id(r) in seen:  # waiting it twice: RuntimeError, as Request.wait() twice
                raise RuntimeError(f"hybridmpi: rank {r._owner.hc.rank}: waitall: a {r._what} request "
                                   "is listed twice")
            seen.add(id(r))
            if not r._done:
                pending.append(r)
        for item in requests:
            waited: Request = item
            waited._waited = True
        if not pending:
            return
        first: Request = pending[0]
        hc = first._owner.hc
        reqs = []
        for item in pending:
            started: Request = item
            reqs.append(started._req)
        if wait_requests(hc.context, reqs, hc.timeout, notices=False) is not None:
            raise _rma_timeout(hc, f"waitall ({len(pending)} requests)")
        # one flush per window and target completes every put at its target
        flushes = {}
        for item in pending:
            done: Request = item
            if done._target is not None:
                win = done._owner.win
                flushes[(id(win), done._target)] = win
            done._done = True
            done._keep = None
        for (_, target), win in flushes.items():
            win.Flush(target)

    def _after_free(self):
        """The memory was freed before this request completed here: its free() completed the
        transfer (``Flush_all``) and its window may be gone, so no flush; the MPI request is
        completed and :class:`FreedError` raised."""
        self._done = True
        self._keep = None
        self._req.Wait()
        raise FreedError(f"hybridmpi: rank {self._owner.hc.rank}: {self._what} request waited "
                         "after its GlobalMemory was freed (free() completed the transfer)")

    def test(self) -> bool:
        """True once the transfer is complete (never blocks).

        Raises:
            FreedError: the memory was freed before the request completed.
        """
        if not self._done:
            if self._owner.freed:
                self._after_free()
            if self._req.Test():
                self._finish()
        return self._done

    def wait(self) -> None:
        """Block until the transfer is complete at both ends.

        Raises:
            RuntimeError: the request was already waited.
            SyncTimeout: not complete within the HybridComm's timeout.
            FreedError: the memory was freed before the request completed.
        """
        hc = self._owner.hc
        if self._waited:
            raise RuntimeError(f"hybridmpi: rank {hc.rank}: {self._what} request waited twice")
        self._waited = True
        if self._done:
            return
        if self._owner.freed:
            self._after_free()
        if wait_requests(hc.context, [self._req], hc.timeout, notices=False) is not None:
            raise _rma_timeout(hc, self._what)
        self._finish()


def waitall(requests: Iterable[Request]) -> None:
    """Wait for every request of a list (checked first: none may have been waited, none listed
    twice).

    Raises:
        TypeError: an element is not a Request.
        RuntimeError: a request was already waited, or is listed twice (nothing is waited then).
    """
    Request._wait_all(list(requests))  # noqa: SLF001 - the module's own
