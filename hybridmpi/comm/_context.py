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
    """A HybridComm as the layers under and above it see it (made by the HybridComm): the comm
    layer's one seam.  Nothing outside ``hybridcomm.py`` touches a HybridComm's private state; what
    the transports, the waits, the arena, the Halos, global memory and the profile need of it
    is here, by name.

    Attributes:
        MPI: mpi4py's MPI module.
        comm, node_comm, leader_comm: the HybridComm's communicators (``leader_comm`` is
            ``MPI.COMM_NULL`` off the node leaders).
        rank, size, node_rank, node_size, node_id, num_nodes, is_leader: its layout.
        node_ranks: the ranks of this node, by node rank; node_index: the inverse.
        coll: the C core's collective state (``hm_coll *``), whose ``policy`` (spin count,
            memory order, deadline) every wait copies; ``spin``: its spin count.
        notices: the comm's failure notices (:class:`hybridmpi.comm._notice.Notices`).
        arena: the comm's shared arena (set once it is made).
        serial: the comm's number, in the order comms were made on this rank.
        children: the Halos, global memory and coarrays made on the comm (by ``id``), freed
            with it (:meth:`adopt`, :meth:`disown`); hooks: their hooks (by ``id``).
        profile: the recorder of the :class:`hybridmpi.profile` that is on (set by the
            profile: its ``owner``, ``adopt(obj)``, ``forget(obj)``), else None; env_profile:
            the HYBRIDMPI_PROFILE profile, else None; clock_offset: the profile's offset of
            this node's clock (None until measured).
        take_id, release_id: a Halo identifier, the same on every rank (collective), and its
            return (the HybridComm's :class:`~hybridmpi.comm.room.TagIds`).
        break_comm: ``break_comm(why, notify=True, raised=None)`` makes the comm unusable and
            its waiting peers raise (its ``_break``; ``raised``: the class this rank raised,
            which its later errors name).
        peer_error: ``peer_error(what, peer, seen=None, also="")``, the exception of a rank
            that found a peer's error bits ``seen``, or (None) its failure notice; it breaks
            the comm (its ``_peer_error``).
        describe_word: ``describe_word(addr)``, what a wait on ``addr`` waits for, in words,
            if the word is this comm's or its children's (hang diagnosis), else None.
        agree_free: ``agree_free(what)``, whether the collective frees of an object may run: a
            bounded agreement that every rank frees ``what`` now (False once the comm broke,
            also by a peer's notice that ends it; RuntimeError on every rank when ranks free
            different objects).
        agree_views: ``agree_views(what, mine)``, the same agreement carrying a value from
            every rank (what each still views of the arena): their list, or None once the
            comm broke.
        calls: the comm's operations (barrier, allreduce, Allreduce) as a ``Calls`` table,
            through which a profile records them.
    """

    __slots__ = ("MPI", "comm", "node_comm", "leader_comm", "rank", "size", "node_rank",
                 "node_size", "node_id", "num_nodes", "is_leader", "node_ranks", "node_index",
                 "coll", "spin", "notices", "arena", "serial", "children", "profile",
                 "env_profile", "clock_offset", "hooks", "take_id", "release_id", "break_comm",
                 "peer_error", "describe_word", "calls", "agree_free", "agree_views", "_service",
                 "_free_comm", "_broken", "_broken_cause")

    def __init__(self, hc: Any, MPI: Any, coll: Any, notices: Any, *, serial: int,
                 children: dict[int, Any], hooks: dict[str, Callable[..., Any]]) -> None:
        self.MPI = MPI
        for name in ("comm", "node_comm", "leader_comm", "rank", "size", "node_rank",
                     "node_size", "node_id", "num_nodes", "is_leader"):
            setattr(self, name, getattr(hc, name))
        self.node_ranks = tuple(hc.node_ranks)
        self.node_index = dict(hc.node_index)
        self.coll, self.spin, self.notices = coll, int(coll.policy.spin), notices
        self.arena: Any = None
        self.serial, self.children = serial, children
        self.hooks: dict[int, dict[str, Any]] = {}
        self.profile: Any = None
        self.env_profile: Any = None
        self.clock_offset: int | None = None
        self.take_id, self.release_id = hooks["take_id"], hooks["release_id"]
        self.break_comm, self.peer_error = hooks["break_comm"], hooks["peer_error"]
        self.describe_word = hooks["describe_word"]
        self.calls = hooks["calls"]
        self.agree_free = hooks["agree_free"]
        self.agree_views = hooks["agree_views"]
        self._service, self._free_comm = hooks["service"], hooks["free_comm"]
        self._broken, self._broken_cause = hooks["broken"], hooks["broken_cause"]

    @property
    def policy(self) -> Any:
        """The wait policy (a cffi ``hm_wait_policy``) that the C core's waits copy."""
        return self.coll.policy

    def broken(self) -> str | None:
        """Why the HybridComm broke (an earlier error), else None."""
        return self._broken()

    def earlier_error(self) -> str:
        """The earlier error that broke the HybridComm, in words (its kind, and the peer whose
        failure it was when known)."""
        return earlier_error(self._broken(), *self._broken_cause())

    def service(self, name: str, make: Callable[[Context], Any]) -> Any:
        """The state that a lower layer keeps once per HybridComm, made by ``make(context)`` on
        first use (freed with the comm: its ``free()``; poisoned when the comm breaks: its
        ``poison(bits)``; named in hang reports: its ``describe_word(addr)``)."""
        return self._service(name, lambda _hc: make(self))

    def free_comm(self, c: Any) -> None:
        """Free a communicator made from this comm's, unless the comm broke (then it is kept:
        messages of the failed call may still arrive on it)."""
        self._free_comm(c)

    def adopt(self, obj: Any, *, poison: Callable[[int], None] | None = None,
              describe_word: Callable[[int], str | None] | None = None) -> None:
        """Register a Halo, GlobalMemory or Coarray made on the comm (freed with it; recorded
        by a profile that is on), with its hooks: ``poison(bits)``, error bits in the words it
        writes when the comm breaks; ``describe_word(addr)``, what a wait on ``addr`` waits
        for, if the word is its own (hang diagnosis)."""
        self.children[id(obj)] = obj
        if poison is not None or describe_word is not None:
            self.hooks[id(obj)] = {"poison": poison, "describe_word": describe_word}
        if self.profile is not None:
            self.profile.adopt(obj)

    def disown(self, obj: Any) -> None:
        """Take ``obj`` out of the children (it was freed, or is freed by its owner)."""
        self.children.pop(id(obj), None)
        self.hooks.pop(id(obj), None)


def earlier_error(why: str | None, by: int | None, raised: str | None = None) -> str:
    """The earlier error that broke a HybridComm, as its later errors name it: ``(PeerError)``,
    or ``(PeerError, seen from rank 2)``: the peer whose error bits or failure notice this rank
    met (the failure may have begun at another rank, which that peer passed on).  It names
    ``raised``, the class this rank raised, where the caller knows it: ``why`` says
    "ValueError" for any argument error (the kind of error bits the comm leaves), a peer's
    (``PeerArgumentError`` here) or this rank's own (which may be a ``TypeError``)."""
    name = raised or why
    return f"({name})" if by is None else f"({name}, seen from rank {by})"
