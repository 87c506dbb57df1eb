"""The profile of a whole run (env ``HYBRIDMPI_PROFILE``): each HybridComm profiled from its
creation to its free, or to the end of the run; printed there, and written as JSON where the
variable names a ``.json`` file."""

from __future__ import annotations

import sys
from typing import Any

from .._native.tables import mpi
from .profile import profile


class EnvProfile:
    """A HybridComm's environment profile (its context's ``env_profile``): ``end_env()`` at the
    comm's free ends it, prints, writes the JSON."""

    __slots__ = ("hc", "prof")

    def __init__(self, hc: Any) -> None:
        self.hc = hc
        self.prof = profile(hc)
        self.prof.__enter__()

    def end_env(self) -> None:
        """End the profile at the comm's free (called by HybridComm.free): print, write JSON."""
        stop_env(self.hc)


_AT_EXIT: list[Any] = []


def start_env(hc):
    """HYBRIDMPI_PROFILE: profile ``hc`` until its free, or the end of the run."""
    hc.context.env_profile = EnvProfile(hc)
    if not _AT_EXIT:
        # after mpi4py's own exit handler was registered (it finalizes MPI), so this runs first
        import atexit
        import weakref

        _AT_EXIT.append(weakref.WeakSet())
        atexit.register(_at_exit)
    _AT_EXIT[0].add(hc)


def _at_exit():
    """The end of a run that profiled with HYBRIDMPI_PROFILE: the comms not freed end their
    profile here (collective), unless the program ended with an uncaught exception."""
    if hasattr(sys, "last_value"):
        # an uncaught exception ends this rank: break its comms, so that peers ending their
        # profiles raise PeerError instead of waiting for it
        for hc in list(_AT_EXIT[0]):
            ctx = hc.context
            if ctx.env_profile is not None and ctx.broken() is None and not mpi().Is_finalized():
                ctx.break_comm("an uncaught exception")
        return
    for hc in sorted(_AT_EXIT[0], key=lambda h: h.context.serial):
        if hc.context.env_profile is not None and not mpi().Is_finalized():
            stop_env(hc)


def stop_env(hc):
    """At the free of a HybridComm profiled by HYBRIDMPI_PROFILE: end, print, write JSON."""
    ctx = hc.context
    env = ctx.env_profile
    if env is None:
        return
    ctx.env_profile = None
    prof = env.prof
    if ctx.broken() is not None:
        prof.abandon()
        return
    prof.__exit__(None, None, None)
    prof.print(file=sys.stderr if hc.env.get("profile") == "stderr" else None)
    path = hc.env.get("profile")
    if path and path.endswith(".json"):
        prof.to_json(path)
