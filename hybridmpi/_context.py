"""What the layers under the API receive of a HybridComm: :class:`Context` (a leaf).

The transports, the waits on MPI requests and the shared arena use a HybridComm's
communicators, its node layout, its wait policy, its failure notices and a few of its
services, and nothing else.  The HybridComm makes one Context and hands that down (as mpi4py's
``util.pkl5`` is handed its primitive), so that a transport neither imports nor reaches into the
API layer, and a newcomer sees in one place everything a transport may touch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Context:
    """A HybridComm as the transports, waits and arena see it (made by the HybridComm).

    Attributes:
        MPI: mpi4py's MPI module.
        comm, node_comm, leader_comm: the HybridComm's communicators (``leader_comm`` is
            ``MPI.COMM_NULL`` off the node leaders).
        rank, size, node_rank, node_size, node_id, num_nodes, is_leader: its layout.
        node_ranks: the ranks of this node, by node rank; node_index: the inverse.
        coll: the C core's collective state (``hm_coll *``), whose ``policy`` (spin count,
            memory order, deadline) every wait copies; ``spin``: its spin count.
        notices: the comm's failure notices (:class:`hybridmpi._notice.Notices`).
        arena: the comm's shared arena (set once it is made).
    """

    __slots__ = ("MPI", "comm", "node_comm", "leader_comm", "rank", "size", "node_rank",
                 "node_size", "node_id", "num_nodes", "is_leader", "node_ranks", "node_index",
                 "coll", "spin", "notices", "arena", "_service", "_free_comm", "_broken")

    def __init__(self, hc: Any, MPI: Any, coll: Any, notices: Any, *, service: Callable[..., Any],
                 free_comm: Callable[[Any], None], broken: Callable[[], str | None]) -> None:
        self.MPI = MPI
        for name in ("comm", "node_comm", "leader_comm", "rank", "size", "node_rank",
                     "node_size", "node_id", "num_nodes", "is_leader"):
            setattr(self, name, getattr(hc, name))
        self.node_ranks = tuple(hc.node_ranks)
        self.node_index = dict(hc.node_index)
        self.coll, self.spin, self.notices = coll, int(coll.policy.spin), notices
        self.arena: Any = None
        self._service, self._free_comm, self._broken = service, free_comm, broken

    @property
    def policy(self) -> Any:
        """The wait policy (a cffi ``hm_wait_policy``) that the C core's waits copy."""
        return self.coll.policy

    def broken(self) -> str | None:
        """Why the HybridComm broke (an earlier error), else None."""
        return self._broken()

    def service(self, name: str, make: Callable[[Context], Any]) -> Any:
        """The state that a lower layer keeps once per HybridComm, made by ``make(context)`` on
        first use (freed with the comm: its ``free()``; poisoned when the comm breaks: its
        ``_poison(bits)``; named in hang reports: its ``_describe_word(addr)``)."""
        return self._service(name, lambda _hc: make(self))

    def free_comm(self, c: Any) -> None:
        """Free a communicator made from this comm's, unless the comm broke (then it is kept:
        messages of the failed call may still arrive on it)."""
        self._free_comm(c)
