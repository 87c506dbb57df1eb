"""The comm: :class:`~hybridmpi.HybridComm` (``hybridcomm.py``: its set-up, errors, failure
notices and free) and what it owns: its collectives (``collectives.py``), the shared arena
(``arena.py``), the drop-ins over a plain communicator (``dropin.py``), and the failure handling
every wing uses: agreements that end on every rank alike (``_agree.py``), what a comm reads
of its process when it is made (``_env.py``), the waits on MPI
requests (``_waits.py``), ``free`` and the ``with`` statement (``_resource.py``), what the wings
see of a comm (``_context.py``), failure notices (``_notice.py``) and the environment profile's
hook (``_hooks.py``).  It calls the native core only, never a wing.

Importing this package imports none of its modules but the hooks; ``HybridComm`` loads on first
use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._env import check_seconds, seconds_ns
    from .hybridcomm import DEFAULT_RADIX, HybridComm
    from .room import TAG_SLOTS

#: the names this package gives too (the module ``hybridmpi.comm`` held them), by module
_HOMES = {"HybridComm": "hybridcomm", "DEFAULT_RADIX": "hybridcomm", "TAG_SLOTS": "room",
          "check_seconds": "_env", "seconds_ns": "_env"}
__all__ = ["HybridComm", "DEFAULT_RADIX", "TAG_SLOTS", "check_seconds", "seconds_ns"]


def __getattr__(name: str) -> Any:
    """The names of ``__all__``, loaded on first use."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
