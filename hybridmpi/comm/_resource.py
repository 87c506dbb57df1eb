"""What every collective object with a ``free()`` shares: the ``with`` statement frees it
(unless an exception that ends the job leaves it: see :func:`~hybridmpi.abort_on_error`)."""

from __future__ import annotations

from typing import Any

from .._jobs import ends_job
from ..errors import PeerError, is_agreed


def leave_on_error(ctx: Any, exc: BaseException | None) -> bool:
    """What every collective object's ``with`` block does when ``exc`` leaves it: whether to
    skip the collective free.  An exception that every rank raised together (agreed: an
    invalid call on every rank) leaves the objects usable, and the block frees collectively
    as a normal exit does.  Any other is this rank's own (or a peer's failure passed on): the
    comm breaks instead (error bits, failure notices: a peer waiting on this rank raises, as
    for a failure outside a block), and what the object frees then is only what needs no peer.
    Inside :func:`~hybridmpi.abort_on_error` the job ends: nothing is freed."""
    if exc is None:
        return False
    if ends_job(exc):
        return True
    if not is_agreed(exc):
        ctx.break_comm(f"an exception on this rank ({type(exc).__name__})",
                       notify=not isinstance(exc, PeerError))
    return False


class Freed:
    """``with obj:`` calls ``obj.free()`` at the end of the block (collective, idempotent;
    see :func:`leave_on_error` for a block left by an exception)."""

    hc: Any

    def free(self) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def __enter__(self) -> Any:
        return self

    def __copy__(self) -> Any:
        raise TypeError(f"hybridmpi: a {type(self).__name__} cannot be copied (it owns shared "
                        "memory and MPI objects, freed once)")

    def __exit__(self, *exc: Any) -> None:
        if not leave_on_error(self.hc.context, exc[1]):
            self.free()
