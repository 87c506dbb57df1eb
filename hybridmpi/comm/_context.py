"""The runtime state of a HybridComm: :class:`Context`, which the comm is the face of.

A HybridComm splits its communicator into nodes, sets up the C core's collective state and then
makes one Context, which owns everything the comm is while it runs: its communicators and
layout, its failure notices and whether (and why) it broke, the Halos, global memory and
coarrays made on it, the state other layers keep per comm, and its collectives.  The transports,
the waits, the arena, global memory and the profile are handed the Context (as mpi4py's
``util.pkl5`` is handed its primitive), so that none of them imports or reaches into the API
layer, and a newcomer sees in one place everything a layer under the API may touch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._native import errmap as _errmap
from .._native.clib import ffi, lib
from ..errors import PeerError, SyncTimeout, agreed
from ._agree import agree
from ._notice import Notices

#: MPI objects of broken HybridComms, never freed (:meth:`Context.free_comm`), and those of
#: freed ones that a pending request may still use
KEPT: list[Any] = []


def describe(rank: int, size: int, node_id: int, node_rank: int, node_size: int,
             state: str) -> str:
    """A HybridComm in words, as its ``repr`` and the hang reports name it."""
    return f"<HybridComm rank {rank}/{size} node {node_id} rank {node_rank}/{node_size}, {state}>"


class Context:
    """A HybridComm's runtime state (made by the HybridComm once its node is set up): the comm
    layer's one seam.  What the transports, the waits, the arena, the Halos, global memory and
    the profile need of a comm is here, by name, and nothing outside ``hybridcomm.py`` and this
    module touches a HybridComm's private state.

    Attributes:
        MPI: mpi4py's MPI module.
        comm, node_comm, leader_comm: the HybridComm's communicators (``leader_comm`` is
            ``MPI.COMM_NULL`` off the node leaders).
        rank, size, node_rank, node_size, node_id, num_nodes, is_leader: its layout.
        node_ranks: the ranks of this node, by node rank; node_index: the inverse.
        coll: the C core's collective state (``hm_coll *``), whose ``policy`` (spin count,
            memory order, deadline) every wait copies; ``spin``: its spin count.
        segs: the node's collective segments (``char *[]``, by node rank), of ``seg_bytes``.
        notices: the comm's failure notices (:class:`hybridmpi.comm._notice.Notices`).
        arena: the comm's shared arena (set once it is made).
        serial: the comm's number, in the order comms were made on this rank.
        children: the Halos, global memory and coarrays made on the comm (by ``id``), freed
            with it (:meth:`adopt`, :meth:`disown`).
        collectives: the comm's :class:`~hybridmpi.comm.collectives.Collectives` (set once
            made; replaced where a calibration chose MPI's own calls).
        profile: the recorder of the :class:`hybridmpi.profile` that is on (set by the
            profile: its ``owner``, ``adopt(obj)``, ``forget(obj)``), else None; env_profile:
            the HYBRIDMPI_PROFILE profile, else None; clock_offset: the profile's offset of
            this node's clock (None until measured).
        calls: the comm's operations (barrier, allreduce, Allreduce) as a ``Calls`` table,
            through which a profile records them.
        tags: the identifiers of the comm's live Halos (a :class:`~hybridmpi.comm.room.TagIds`).
    """

    __slots__ = ("MPI", "comm", "node_comm", "leader_comm", "rank", "size", "node_rank",
                 "node_size", "node_id", "num_nodes", "is_leader", "node_ranks", "node_index",
                 "coll", "spin", "segs", "seg_bytes", "notices", "arena", "serial", "children",
                 "collectives", "profile", "env_profile", "clock_offset", "calls", "tags",
                 "_child_hooks", "_services", "_broken", "_broken_by", "_broken_as", "_freed")

    def __init__(self, hc: Any, MPI: Any, coll: Any, *, segs: Any, seg_bytes: int, nonce: int,
                 serial: int, calls: Any, tags: Any) -> None:
        self.MPI = MPI
        self.comm, self.node_comm, self.leader_comm = hc.comm, hc.node_comm, hc.leader_comm
        self.rank: int = hc.rank
        self.size: int = hc.size
        self.node_rank: int = hc.node_rank
        self.node_size: int = hc.node_size
        self.node_id: int = hc.node_id
        self.num_nodes: int = hc.num_nodes
        self.is_leader: bool = hc.is_leader
        self.node_ranks = tuple(hc.node_ranks)
        self.node_index = dict(hc.node_index)
        self.coll, self.spin = coll, int(coll.policy.spin)
        self.segs, self.seg_bytes = segs, seg_bytes
        self.notices = Notices(self.comm, nonce, MPI)   # this rank's and the peers' (break_comm)
        self.arena: Any = None
        self.serial = serial
        self.children: dict[int, Any] = {}
        self.collectives: Any = None
        self.profile: Any = None
        self.env_profile: Any = None
        self.clock_offset: int | None = None
        self.calls, self.tags = calls, tags
        self._child_hooks: dict[int, tuple[Any, Any]] = {}   # (poison, describe_word) by id
        self._services: dict[str, Any] = {}   # other layers' state per comm (service)
        self._broken: str | None = None
        self._broken_by: int | None = None    # the peer whose error broke it here, when known
        self._broken_as: str | None = None    # the class this rank raised then, when known
        self._freed = False

    def __repr__(self) -> str:
        return describe(self.rank, self.size, self.node_id, self.node_rank, self.node_size,
                        "freed" if self._freed else f"{self.num_nodes} node(s)")

    @property
    def policy(self) -> Any:
        """The wait policy (a cffi ``hm_wait_policy``) that the C core's waits copy."""
        return self.coll.policy

    # ------------------------------------------------------------ what lives on the comm

    def take_id(self) -> int:
        """A Halo identifier, the same on every rank (collective)."""
        return int(self.tags.take(self, self.comm, self.MPI))

    def release_id(self, ident: int) -> None:
        """Return a Halo identifier taken by :meth:`take_id`."""
        self.tags.release(ident)

    def service(self, name: str, make: Callable[[Context], Any]) -> Any:
        """The state that a lower layer keeps once per HybridComm (global memory's
        sync_images counters, the cross-memory attach probe), made by ``make(context)`` on first
        use.  Its ``free()`` runs after the children's when the comm is freed, its
        ``poison(bits)`` when the comm breaks, and its ``describe_word(addr)`` names the words a
        hang waits on, where it has them."""
        s = self._services.get(name)
        if s is None:
            s = self._services[name] = make(self)
        return s

    def adopt(self, obj: Any, *, poison: Callable[[int], None] | None = None,
              describe_word: Callable[[int], str | None] | None = None) -> None:
        """Register a Halo, GlobalMemory or Coarray made on the comm (freed with it; recorded
        by a profile that is on), with its hooks: ``poison(bits)``, error bits in the words it
        writes when the comm breaks; ``describe_word(addr)``, what a wait on ``addr`` waits
        for, if the word is its own (hang diagnosis)."""
        self.children[id(obj)] = obj
        if poison is not None or describe_word is not None:
            self._child_hooks[id(obj)] = (poison, describe_word)
        if self.profile is not None:
            self.profile.adopt(obj)

    def disown(self, obj: Any) -> None:
        """Take ``obj`` out of the children (it was freed, or is freed by its owner)."""
        self.children.pop(id(obj), None)
        self._child_hooks.pop(id(obj), None)

    def free_children(self) -> None:
        """Free the comm's Halos, global memory and coarrays, then the other layers' state."""
        for child in list(self.children.values()):
            child.free()
        services, self._services = self._services, {}
        for s in services.values():
            free = getattr(s, "free", None)
            if free is not None:
                free()

    def _hooks(self, which: int, name: str) -> list[Any]:
        """The children's hooks (``which``: 0 poison, 1 describe_word), then the services'
        method ``name``."""
        hooks = [h[which] for h in self._child_hooks.values() if h[which] is not None]
        return hooks + [getattr(s, name) for s in self._services.values() if hasattr(s, name)]

    def describe_word(self, addr: int) -> str | None:
        """What a wait on the word at ``addr`` waits for, in words, if the word is one of this
        comm's collective segments or of its children or services (hang diagnosis); else None."""
        if self._freed:
            return None
        where = None
        for nr in range(self.node_size):
            base = int(ffi.cast("uintptr_t", self.segs[nr]))
            if base <= addr < base + self.seg_bytes:
                where = (f"collective call {self.coll.epoch} of {self!r}, on a word of rank "
                         f"{self.node_ranks[nr]}; ranks that have not entered it: "
                         f"{self.collectives.not_entered()}")
        for describe_word in self._hooks(1, "describe_word"):
            what = describe_word(addr)
            if what:
                where = what
        return where

    # ------------------------------------------------------------ failure

    def broken(self) -> str | None:
        """Why the HybridComm broke (an earlier error), else None."""
        return self._broken

    def earlier_error(self) -> str:
        """The earlier error that broke the HybridComm, in words (its kind, and the peer whose
        failure it was when known)."""
        return earlier_error(self._broken, self._broken_by, self._broken_as)

    def peer_error(self, what: str, peer: int | None, seen: int | None = None,
                   also: str = "") -> Exception:
        """The exception of a rank that found a peer's error bits ``seen`` (None: got its
        failure notice); ``also`` is appended to the message.  The comm breaks."""
        exc = _errmap.peer_error(self.rank, what, peer, seen, also)
        self.break_comm(_errmap.breaks(exc), notify=False, by=peer, raised=type(exc).__name__)
        return exc

    def stop(self, why: str | None) -> None:
        """No C call object serves this comm's operations any more, and its collectives raise:
        it broke (``why``) or was freed (None)."""
        self.calls.close()
        if self.collectives is not None:
            self.collectives.stop(why, self._broken_by, self._broken_as)

    def break_comm(self, why: str, notify: bool = True, by: int | None = None,
                   raised: str | None = None) -> None:
        """Make this comm unusable, and make every peer that waits on this rank raise instead of
        waiting: error bits in every word this rank writes on its node (collectives, every
        Halo, sync_images) and, with ``notify`` (this rank's own failure rather than one passed
        on from a peer, whose notice every rank already has), a failure notice to every other
        rank, which the waits on MPI requests poll.  ``by``: the peer whose error this rank met,
        when known (the comm's later errors name it; it may have passed on another's);
        ``raised``: the class this rank raised, when known (they name it too)."""
        first = self._broken is None
        self._broken = self._broken or why
        if first:
            self._broken_by, self._broken_as = by, raised
        self.stop(why)
        if not first or self._freed or self.MPI.Is_finalized():
            return
        bits = _errmap.poison_bits(why)
        lib.hm_coll_poison(self.coll, bits)
        for poison in self._hooks(0, "poison"):
            poison(bits)
        # across nodes a notice passed on is needed too: a rank on another node may wait on this
        # one alone, and the peer whose error this rank passes on may not be its neighbour
        if (notify or self.num_nodes > 1) and self.size > 1:
            self.notices.send()

    # ------------------------------------------------------------ freeing

    def mark_freed(self) -> None:
        """The comm was freed: every later call raises FreedError."""
        self.stop(None)
        self._freed = True

    def free_comm(self, c: Any) -> None:
        """Free an MPI communicator of this comm, unless a failed call broke it: messages of
        that call may still be in flight on it, and MPI may give a freed communicator's context
        to a new one, whose calls would then receive them.  Those are kept (one set per
        failure)."""
        if self._broken is not None:
            KEPT.append(c)
        else:
            c.Free()

    def agree_free(self, what: str) -> bool:
        """Whether the collective MPI frees of ``what`` (an object of this comm, named the same
        on every rank) may run: every rank frees it now.  A bounded agreement first, so that a
        rank never waits in MPI_Win_free for a peer that broke (its notice ends the agreement:
        this comm breaks too, False; also when a peer did not come within the timeout) or that
        frees another object (RuntimeError on every rank, before anything is freed).  False at
        once when this comm broke."""
        return self.agree_views(what, None) is not None

    def agree_views(self, what: str, mine: Any) -> list[Any] | None:
        """:meth:`agree_free` that also gathers ``mine`` from every rank (what each still views
        of the arena): their list, or None where agree_free is False."""
        if self._broken is not None or self._freed:
            return None
        if self.size == 1:
            return [mine]
        try:   # one call name: the objects compared below
            views = agree(self.comm, None, "free()", data=(what, mine))
        except (PeerError, SyncTimeout):   # the comm broke (a peer's notice, or none came in
            return None                    # time): nothing collective follows, and free goes on
        names = [v[0] for v in views]
        if len(set(names)) != 1:
            raise agreed(_errmap.frees_differ(self.rank, names))
        return [v[1] for v in views]


def earlier_error(why: str | None, by: int | None, raised: str | None = None) -> str:
    """The earlier error that broke a HybridComm, as its later errors name it: ``(PeerError)``,
    or ``(PeerError, seen from rank 2)``: the peer whose error bits or failure notice this rank
    met (the failure may have begun at another rank, which that peer passed on).  It names
    ``raised``, the class this rank raised, where the caller knows it: ``why`` says
    "ValueError" for any argument error (the kind of error bits the comm leaves), a peer's
    (``PeerArgumentError`` here) or this rank's own (which may be a ``TypeError``)."""
    name = raised or why
    return f"({name})" if by is None else f"({name}, seen from rank {by})"
