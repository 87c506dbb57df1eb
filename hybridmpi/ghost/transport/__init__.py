"""Transports of the Halo: one module per method, all with the same interface (the library's
two here; the paper's baselines in :mod:`hybridmpi.tools.baselines`, registered on import).

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
from .flat import Flat

#: the Halo's methods: "atomic" (shared memory on the node, messages across nodes) and "flat"
#: (messages only); the paper's baselines ("neighbor", "fence", "pscw", "lock") are added by
#: importing :mod:`hybridmpi.tools.baselines`, which the benchmarks, the demo and the tests do
METHODS: dict[str, Callable[[Exchange], Transport]] = {
    "atomic": Atomic,
    "flat": Flat,
}


def register(name: str, transport: Callable[[Exchange], Transport]) -> None:
    """Make ``Halo(pattern, method=name)`` build ``transport(exchange)`` (its Exchange), a
    :class:`~._base.Transport`: how :mod:`hybridmpi.tools.baselines` adds the paper's baselines.
    A name already taken by another transport, or ``"auto"`` (the Halo's choice), is an error."""
    if name == "auto" or METHODS.get(name, transport) is not transport:
        raise ValueError(f"hybridmpi: Halo method {name!r} is taken")
    METHODS[name] = transport


__all__ = ["METHODS", "PackFloor", "register"]
