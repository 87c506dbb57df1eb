"""hybridmpi: ghost updates, barriers and reductions over MPI-3 shared memory.

Importing this package imports nothing but the standard library and does not initialize
MPI: each public name is loaded on first use (the first HybridComm starts MPI).  So a
program can enter :func:`abort_on_error` before any import that could fail on one rank
(numpy, mpi4py, meshio...), as the ``hybridmpi`` command and the examples do.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .comm import _hooks

__version__ = "0.1.0"

#: public name -> the module that defines it
_HOME = {
    "Coarray": "globalmem", "GlobalMemory": "globalmem", "Request": "globalmem",
    "waitall": "globalmem", "Shared": "globalmem", "share": "globalmem",
    "FreedError": "errors", "PatternError": "errors", "PeerArgumentError": "errors",
    "PeerError": "errors", "SyncTimeout": "errors", "abort_on_error": "errors",
    "GhostPattern": "ghost.pattern", "Halo": "ghost.halo", "HybridComm": "comm.hybridcomm",
    "allreduce": "comm.dropin", "barrier": "comm.dropin", "hybrid": "comm.dropin",
    "profile": "profiling.profile", "MissingExtra": "_extras",
}

if TYPE_CHECKING:
    from ._extras import MissingExtra
    from .comm.dropin import allreduce, barrier, hybrid
    from .comm.hybridcomm import HybridComm
    from .errors import FreedError, PatternError, PeerArgumentError, PeerError, SyncTimeout, abort_on_error
    from .ghost.halo import Halo
    from .ghost.pattern import GhostPattern
    from .globalmem import Coarray, GlobalMemory, Request, Shared, share, waitall
    from .profiling.profile import profile

__all__ = [
           "Coarray",
           "GlobalMemory",
           "Request",
           "FreedError",
           "GhostPattern",
           "Halo",
           "HybridComm",
           "MissingExtra",
           "PatternError",
           "PeerArgumentError",
           "PeerError",
           "Shared",
           "SyncTimeout",
           "__version__",
           "abort_on_error",
           "allreduce",
           "barrier",
           "hybrid",
           "profile",
           "share",
           "waitall",
]


def __getattr__(name: str) -> Any:
    """A public name, loaded on first use (PEP 562) and kept."""
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))


def _start_env_profile(hc: Any) -> None:
    """Start the environment profile (HYBRIDMPI_PROFILE) of a new HybridComm."""
    from .profiling.env import start_env

    start_env(hc)


_hooks.START_ENV_PROFILE[:] = [_start_env_profile]
