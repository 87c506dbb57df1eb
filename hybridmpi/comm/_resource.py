"""What every collective object with a ``free()`` shares: the ``with`` statement frees it
(unless an exception that ends the job leaves it: see :func:`~hybridmpi.abort_on_error`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
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

    def __exit__(self, *exc: Any) -> None:
        if not leave_on_error(self.hc.context, exc[1]):
            self.free()


class Recorded:
    """An object whose operations a profile records (HybridComm, Halo, GlobalMemory, Coarray).

    The profile hands the object a wrapper maker; the object installs one wrapper per operation
    as an instance attribute over its method, setting aside the C fast paths it had installed
    there, and at the profile's end takes them away and gives the fast paths back (or closes
    them, once the object was freed).  Only the object edits its own attributes.
    """

    def _drop_hot(self) -> None:
        """Close the C fast paths that are made again by the next calls (a Halo's); the others
        are set aside and given back."""

    def _record(self, names: Iterable[str], wrap: Callable[[str, Callable[..., Any]], Any]) -> None:
        """Install ``wrap(name, method)`` over each operation ``name`` (``method``: the class's,
        bound: what the wrapper calls)."""
        self._drop_hot()
        names = list(names)
        attrs = self.__dict__
        attrs["_recorded"] = (names, {n: attrs[n] for n in names if n in attrs})
        for n in names:
            attrs[n] = wrap(n, getattr(type(self), n).__get__(self))

    def _close_set_aside(self) -> None:
        """Close the fast paths a profile set aside (the object is being freed: a reference
        to one kept by the caller then raises FreedError instead of reaching freed memory)."""
        _, saved = self.__dict__.get("_recorded", ((), {}))
        for fast in saved.values():
            getattr(fast, "close", lambda: None)()

    def _unrecord(self) -> None:
        """Take the wrappers away; give back the fast paths set aside (closed instead when
        the object was freed meanwhile)."""
        if getattr(self, "closed", False) is not False:
            self._close_set_aside()
        attrs = self.__dict__
        names, saved = attrs.pop("_recorded", ((), {}))
        self._drop_hot()   # a recording hot path first: its fallback is a wrapper
        for n in names:
            attrs.pop(n, None)
        if getattr(self, "closed", False) is False:
            attrs.update(saved)
