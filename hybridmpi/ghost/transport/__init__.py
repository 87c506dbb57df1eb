"""Transports of the Halo: one module per method, all with the same interface.

A transport is built from the Halo's frozen :class:`~._base.Exchange` and offers
``begin(d, x, e)``, ``end(d, x, e, op)``, ``run(d, x, e, op)`` and ``free()``
(:class:`~._base.Transport`), where ``d`` is FWD (owners to ghosts) or REV (ghosts
into owners), ``x`` a cffi view of the vector and ``e`` the call's epoch (1, 2, ...
per direction).  A failure raises :class:`~hybridmpi._native.errmap.Fault`, which the Halo turns into
its exception.
"""

from collections.abc import Callable

from ._base import Exchange, PackFloor, Transport
from .atomic import Atomic
from .fence import Fence
from .flat import Flat
from .lock import Lock
from .neighbor import Neighbor
from .pscw import PSCW

METHODS: dict[str, Callable[[Exchange], Transport]] = {
    "atomic": Atomic,
    "flat": Flat,
    "neighbor": Neighbor,
    "fence": Fence,
    "pscw": PSCW,
    "lock": Lock,
}

__all__ = ["METHODS", "PackFloor"]
