"""The profile's clock and the marks every layer leaves on it (a leaf: imports the C core only).

While a profile is on (``CLK[2]``), the C core stores the time of a call's first entry
(``CLK[0]``) and of its last return (``CLK[1]``) on CLOCK_MONOTONIC; the Python waits on MPI
requests mark the same two times with :func:`mark` and :func:`mark_end`.  The profile
(:mod:`hybridmpi.profiling.profile`) reads them; what it measures only writes them, so the waits and the
transports need nothing from the layer above them.
"""

from __future__ import annotations

import time

from .clib import lib

#: the C core's profile clock: [entry ns, return ns, on]
CLK = lib.hm_prof
#: CLOCK_MONOTONIC in nanoseconds, the C core's clock
now = time.monotonic_ns


def mark() -> None:
    """A Python wait on MPI requests begins: the call's entry time when none was stored."""
    if CLK[2] and not CLK[0]:
        CLK[0] = now()


def mark_end() -> None:
    """A Python wait on MPI requests ended."""
    if CLK[2]:
        CLK[1] = now()
