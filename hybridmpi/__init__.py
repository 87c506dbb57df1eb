"""hybridmpi: ghost updates, barriers and reductions over MPI-3 shared memory.

Importing this package imports nothing but the standard library and does not initialize
MPI: each public name is loaded on first use (the first HybridComm starts MPI).  So a
program can enter :func:`abort_on_error` before any import that could fail on one rank
(numpy, mpi4py, meshio...), as the ``hybridmpi`` command and the examples do.
"""

from __future__ import annotations

import importlib
import sys
import types
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


#: modules that moved when the package was organised by folder: an import of the old name gives
#: the module at its new home, with a DeprecationWarning (``hybridmpi.profile``, the class, never
#: was the profile's module's only name: that module is ``hybridmpi.profiling.profile``)
MOVED = {"halo": "ghost.halo", "pattern": "ghost.pattern", "interop": "ghost.interop",
         "ghost.transport": "ghost.exchange", "transport": "ghost.exchange", "arena": "comm.arena",
         "collectives": "comm.collectives",
         "dropin": "comm.dropin", "cli": "tools.cli", "demo": "tools.demo", "plot": "tools.plot",
         "bench": "tools.bench", "apps": "tools.apps", "fem": "tools.fem", "mesh": "tools.mesh",
         # the paper's baseline methods of the Halo, out of the library
         **{f"{pkg}.{m}": f"tools.baselines.{m}" for pkg in ("ghost.transport", "transport")
            for m in ("neighbor", "fence", "pscw", "lock")}}


#: the old names, the longest first (a moved module inside a moved package wins)
_MOVED_LONGEST_FIRST = sorted(MOVED, key=len, reverse=True)


class _Moved:
    """The import system's finder and loader of the old names in :data:`MOVED`."""

    @staticmethod
    def _target(fullname: str) -> str | None:
        head, _, rest = fullname.partition(".")
        if head != __name__:
            return None
        for old in _MOVED_LONGEST_FIRST:
            if rest == old or rest.startswith(old + "."):
                return f"{__name__}.{MOVED[old]}{rest[len(old):]}"
        return None

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if self._target(fullname) is None:
            return None
        from importlib.machinery import ModuleSpec

        loader: Any = self
        return ModuleSpec(fullname, loader)

    def create_module(self, spec: Any) -> types.ModuleType:
        new = self._target(spec.name)
        import warnings

        warnings.warn(f"{spec.name} moved to {new}; import it from there", DeprecationWarning,
                      stacklevel=2)
        return importlib.import_module(str(new))

    def exec_module(self, module: types.ModuleType) -> None:
        pass


# first: the path finder would otherwise find a moved package's submodules under the old name
if not any(isinstance(f, _Moved) for f in sys.meta_path):
    sys.meta_path.insert(0, _Moved())


def _start_env_profile(hc: Any) -> None:
    """Start the environment profile (HYBRIDMPI_PROFILE) of a new HybridComm."""
    from .profiling.env import start_env

    start_env(hc)


_hooks.START_ENV_PROFILE[:] = [_start_env_profile]
