"""The Halo's exchange: one object moves a Halo's data, by method "atomic" (shared buffers
synchronized by C11 epoch counters inside a node, persistent MPI messages across nodes) or
"flat" (MPI messages with every neighbor, fresh per call: the MPI baseline).

A call of direction ``d`` (FWD: owners to ghosts; REV: ghosts into owners) with epoch ``e``
(1, 2, ... per direction) runs in four steps, as PETSc's ``sfbasic.c`` does:

1. ``begin``: post the receives from the other nodes;
2. ``begin``: pack the values for the other nodes and start their sends;
3. ``begin``: pack the values for the node peers into the shared buffer of the epoch's parity
   and release-store READY = e in each receiver's segment;
4. ``end``: unpack.  Forward: the node peers' buffers whichever is ready first (acquire-wait
   READY >= e, copy, release-store DONE = e in the sender's segment), then the messages.
   Reverse: the messages, then every channel in the order of the sending ranks, so the
   combined values have the same bits whatever the timing.

A sender waits DONE >= e - 2 before it packs a buffer again; there is no node-wide barrier.
When every peer is on the node, a whole call is one C call (``hm_xchg_both``, the Halo's hot
path).  Two more ways to move the part inside a node run over the same counters
(:class:`ZeroCopy`): shared vectors read in place by their readers, and private arrays read
by cross-memory attach.

A failure raises :class:`~hybridmpi._native.errmap.Fault`, which the Halo turns into the
exception users see.  The paper's baselines (:mod:`hybridmpi.tools.baselines`) implement the
same :class:`Transport` interface and join :data:`METHODS` through :func:`register`.

The package: :mod:`.method` (the :class:`Spec` a method is made from and the
:class:`Transport` interface), :mod:`.channels` (the C core's channels and MPI requests under
the deadline), :mod:`.messages` (messages across nodes), :mod:`.shared` (the node's shared
window and the :class:`Exchange`), :mod:`.zerocopy` (shared vectors read in place, cross-memory
attach).  What the Halo and the baselines use is imported from here.
"""

from collections.abc import Callable

from ..._native.errmap import Fault
from .channels import Chan, Xchg, check, complete, private_chans, release
from .messages import Messages
from .method import CMA_BYTES, CMA_MIN_RUN, FWD, REV, ZERO_COPY_BYTES, Paths, Spec, Transport
from .shared import COUNTER, NO_ROOM_HINT, Direction, Exchange, SharedWindow, flat
from .zerocopy import ZeroCopy, cma_pids

__all__ = ["CMA_BYTES", "CMA_MIN_RUN", "COUNTER", "FWD", "METHODS", "NO_ROOM_HINT", "REV",
           "ZERO_COPY_BYTES", "Chan", "Direction", "Exchange", "Fault", "Messages", "Paths",
           "SharedWindow", "Spec", "Transport", "Xchg", "ZeroCopy", "check", "cma_pids",
           "complete", "flat", "private_chans", "register", "release"]

#: the Halo's methods: "atomic" (shared memory on the node, messages across nodes) and "flat"
#: (messages only); the paper's baselines ("neighbor", "fence", "pscw", "lock") are added by
#: importing :mod:`hybridmpi.tools.baselines`, which the benchmarks, the demo and the tests do
METHODS: dict[str, Callable[[Spec], Transport]] = {"atomic": Exchange, "flat": flat}


def register(name: str, transport: Callable[[Spec], Transport]) -> None:
    """Make ``Halo(pattern, method=name)`` build ``transport(spec)`` (its :class:`Spec`), a
    :class:`Transport`: how :mod:`hybridmpi.tools.baselines` adds the paper's baselines.
    A name already taken by another transport, or ``"auto"`` (the Halo's choice), is an error."""
    if name == "auto" or METHODS.get(name, transport) is not transport:
        raise ValueError(f"hybridmpi: Halo method {name!r} is taken")
    METHODS[name] = transport
