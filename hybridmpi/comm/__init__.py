"""The comm: :class:`~hybridmpi.HybridComm` (``hybridcomm.py``: its set-up, errors, failure
notices and free) and what it owns: its collectives (``collectives.py``), the shared arena
(``arena.py``), the drop-ins over a plain communicator (``dropin.py``), and the failure handling
every wing uses: agreements that end on every rank alike (``_agree.py``), the waits on MPI
requests (``_waits.py``), ``free`` and the ``with`` statement (``_resource.py``), what the wings
see of a comm (``_context.py``), failure notices (``_notice.py``) and the environment profile's
hook (``_hooks.py``).  It calls the native core only, never a wing.

Importing this package imports none of its modules but the hooks; ``HybridComm`` loads on first
use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .hybridcomm import DEFAULT_RADIX, TAG_SLOTS, HybridComm, check_seconds, seconds_ns

#: the names of hybridcomm.py this package gives too (the module ``hybridmpi.comm`` held them)
__all__ = ["HybridComm", "DEFAULT_RADIX", "TAG_SLOTS", "check_seconds", "seconds_ns"]
_FROM_HYBRIDCOMM = frozenset(__all__)


def __getattr__(name: str) -> Any:
    """The names of ``__all__``, loaded on first use."""
    if name not in _FROM_HYBRIDCOMM:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.hybridcomm"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_FROM_HYBRIDCOMM))
