"""Waiting on MPI requests the library's way: spin, then yield the CPU; under the
HybridComm's deadline; ended early by a peer's failure notice.

Every Python wait on requests a peer must match goes through :func:`wait_requests`
(the internode collectives, the Halo's messages, sync_images and one-sided requests).
It returns why it stopped instead of raising, and each caller words its own error.
"""

from __future__ import annotations

import os
import time
from typing import Any, NamedTuple

from .._native import errmap as _errmap
from .._native.clib import ffi, lib
from .._native.marks import mark as prof_mark
from .._native.marks import mark_end as prof_mark_end
from .._native.tables import mpi

#: communicators whose Iprobe drives MPI's progress from the C core's waits once they stop
#: spinning (one per live HybridComm of several ranks)
_PROGRESS: list[Any] = []

#: the tag of that Iprobe: no message ever carries it.  A probe that matches returns without
#: driving progress (Open MPI's ob1 runs opal_progress only when nothing matched), and a probe
#: for any tag matched the first unreceived message on the comm (a flat Halo's message begun
#: by a peer, a failure notice): the spinning rank then never moved its own nonblocking
#: collectives and sends, and the peer waiting inside MPI for them waited out its deadline
#: (fuzz finding 41)
PROGRESS_TAG = 32701


def _held(_kind: Any, exc: BaseException, _tb: Any) -> None:
    """An exception that left the progress hook (a signal's: Python runs its handler as the
    hook starts, KeyboardInterrupt for Ctrl-C): cffi would print and drop it; it is held, the
    C wait ends as at its deadline, and the wait's caller raises it."""
    _errmap.hold(exc)


@ffi.def_extern(onerror=_held)
def hm_py_progress() -> None:
    """Drive MPI's progress from a C wait that stopped spinning: a peer may wait inside MPI for
    this rank (a nonblocking collective or message this rank started, RMA aimed at it) while
    this rank waits on shared memory for that peer (Open MPI progresses nothing by itself)."""
    if _PROGRESS:
        _PROGRESS[0].Iprobe(mpi().ANY_SOURCE, PROGRESS_TAG)


@ffi.def_extern(onerror=_held, error=-1)
def hm_py_notice(arg: Any) -> int:
    """The rank whose failure notice came (``arg``: a handle of the comm's Notices), else -1:
    the C core's waits between the nodes poll it (``hm_net.notice``)."""
    first = ffi.from_handle(arg).poll()
    return -1 if first is None else first


def notice_hook(notices: Any) -> tuple[Any, Any]:
    """The C function that polls ``notices`` and its argument (keep it alive while it is used)."""
    return lib.hm_py_notice, ffi.new_handle(notices)


def progress_on(comm: Any) -> None:
    """Let the C core's slow waits drive progress through ``comm`` (until progress_off)."""
    _PROGRESS.append(comm)
    lib.hm_set_progress(lib.hm_py_progress)


def progress_off(comm: Any) -> None:
    if comm in _PROGRESS:
        _PROGRESS.remove(comm)
    if not _PROGRESS:
        lib.hm_set_progress(ffi.NULL)


#: seconds a wait goes on after a failure notice arrived: a peer that failed in a later call
#: may have sent all it owed this one (it completed it) before it broke; what it sent, or
#: what healthy peers send, still completes the wait.  A peer that failed in this call never
#: sends, and the wait stops after this grace.
NOTICE_GRACE_S = 0.2


class Stopped(NamedTuple):
    """Why :func:`wait_requests` returned before its requests completed."""

    #: the rank whose failure notice ended the wait, else None
    notice: int | None
    #: on a timeout, the indices of the requests still incomplete
    late: list[int]


def wait_requests(ctx: Any, reqs: list[Any], timeout: float | None, *, notices: bool = True,
                  statuses: list[Any] | None = None) -> Stopped | None:
    """Complete ``reqs`` (their statuses into ``statuses``, when given).

    Args:
        ctx: the HybridComm's :class:`~hybridmpi.comm._context.Context` (its spin count, its
            failure notices).
        reqs: MPI requests.
        timeout: seconds, or None for no deadline.
        notices: poll for failure notices (requests that a peer must match).

    Returns:
        None once every request completed, else a :class:`Stopped`.
    """
    MPI = mpi()
    if MPI.Request.Testall(reqs, statuses):
        return None
    prof_mark()
    try:
        stop = _wait(ctx, reqs, timeout, notices, statuses, MPI)
    except BaseException as exc:
        lib.hm_wait_tick(0)
        # a signal (Ctrl-C raises here, between polls; SIGTERM through the C core's handler):
        # the comm breaks, so that the peers raise instead of waiting for this rank
        broken = getattr(ctx, "break_comm", None)
        if broken is not None:
            broken(f"an interrupted wait ({type(exc).__name__})")
        raise
    lib.hm_wait_tick(0)   # out of the wait: a SIGTERM now ends the process, as by default
    if stop is None:
        prof_mark_end()
    return stop


def _wait(ctx, reqs, timeout, notices, statuses, MPI):
    deadline = None if timeout is None else time.monotonic() + timeout
    polls, spin = 0, ctx.spin
    notice, grace = None, 0.0
    while not MPI.Request.Testall(reqs, statuses):
        polls += 1
        if notices and polls % 64 == 0:
            if notice is None:
                notice = ctx.notices.poll()
                grace = time.monotonic() + NOTICE_GRACE_S
            elif time.monotonic() > grace:
                return Stopped(notice, [])
        if deadline is not None and time.monotonic() > deadline:
            if notices and notice is None:
                notice = ctx.notices.poll()
            if notice is not None:   # the notice says why the wait ended (not this rank's clock)
                return Stopped(notice, [])
            return Stopped(None, [i for i, r in enumerate(reqs) if not r.Test()])
        if polls > spin:  # as the C core's waits: spin first, then let other ranks run
            if lib.hm_wait_tick(1):
                exc = _errmap.interruption()
                if exc is not None:
                    raise exc
            os.sched_yield()
    return None
