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

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "HybridComm":
        from .hybridcomm import HybridComm

        return HybridComm
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
