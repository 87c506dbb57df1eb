"""HybridComm: a node-aware communicator with shared-memory collectives.

Inside a node, barrier and allreduce run in the C core over one MPI-3 shared
window, synchronized with C11 release/acquire atomics on epoch counters.
Across nodes, the node leaders combine with plain MPI on ``leader_comm``
between the node's gather and release phases.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import operator
import os
import signal
from typing import Any, ClassVar

from .. import settings
from .._native import errmap as _errmap
from .._native.clib import Calls, ffi, lib, operations
from .._native.tables import mpi as _mpi
from ..errors import PeerError, SyncTimeout, agreed
from . import tuning
from ._agree import agree, register, safe_repr, unregister
from ._context import Context
from ._env import (
    FOREVER_S,
    LIVE,
    ORDERS,
    chaos,
    check_args,
    check_seconds,
    ctrl_c_deferred,
    env_settings,
    install_finalize_hook,
    seconds_ns,
)
from ._hooks import START_ENV_PROFILE
from ._notice import Notices, new_nonce
from ._resource import leave_on_error
from ._waits import progress_off, progress_on
from .arena import Arena, allocate_shared
from .collectives import SLOT_BYTES, Collectives, Plan
from .room import HYBRIDCOMM_IDS, TagIds, check_room, commit

_ALLREDUCES = ("recursive_doubling", "tree")
#: the paths a HybridComm's barrier and allreduce may take: the tuning's choice, the C core,
#: MPI's own calls
_COLLECTIVES = ("auto", "core", "mpi")

DEFAULT_RADIX = 4

#: communicators of broken HybridComms, never freed (HybridComm._free_comm)
_KEPT: list[Any] = []
_SERIALS = itertools.count()  # HybridComms made by this process, in order




def _by_collectives(name: str) -> Any:
    """HybridComm's method ``name``, run by its :class:`Collectives` (the comm's ``Calls``
    table sends each call there directly once the comm is made: this runs only before)."""
    impl = getattr(Collectives, name)

    def method(self, *args, **kwargs):
        return getattr(self._coll, name)(*args, **kwargs)
    method.__name__, method.__qualname__, method.__doc__ = name, f"HybridComm.{name}", impl.__doc__
    method.__signature__ = inspect.signature(impl)  # type: ignore[attr-defined]
    return method


@operations(*Collectives.OPERATIONS)
class HybridComm:
    """A communicator split into nodes, with shared-memory collectives.

    Collective over ``comm``.  The communicator is duplicated, so traffic on
    it never mixes with the caller's.

    Args:
        comm: an intracommunicator (default ``MPI.COMM_WORLD``).
        node_size: split each physical node into virtual nodes of this many
            ranks (to exercise the internode path on one machine).
        memory_order: ``"acq_rel"`` (release stores, acquire loads) or
            ``"seq_cst"`` (sequential consistency for every atomic).
        timeout: seconds any wait may last before :class:`SyncTimeout`;
            default: env ``HYBRIDMPI_TIMEOUT``, else no limit.
        radix: arity of the node tree used by barrier and allreduce; default:
            the tuning table's (``hybridmpi tune`` times the candidates where a
            node has more than 2 ranks), else 4.
        spin: polls spent spinning before a wait yields the CPU; default:
            env ``HYBRIDMPI_SPIN``, else 2000 when each rank of the node has
            a core of its own and 16 when ranks outnumber cores.
        allreduce: ``"recursive_doubling"`` (the default: on one node the
            C core chooses by size: up to 96 bytes a butterfly with no
            release phase, up to 32 KiB over the node's ranks the direct
            allreduce, larger ones the tree) or ``"tree"`` (the paper's
            Algorithm 3 for every size).
        collectives: the path of barrier and allreduce: ``"auto"`` (the
            default: a tuning table's choice for this host, MPI and layout
            where ``hybridmpi tune`` wrote one, else MPI's own calls where
            every node has one rank with a core of its own and the C core
            elsewhere; env ``HYBRIDMPI_TUNE``), ``"core"`` or ``"mpi"``
            (MPI's own calls, with MPI's rules for erroneous calls:
            docs/guide/tuning.md).

    Attributes:
        comm, node_comm, leader_comm (``MPI.COMM_NULL`` off the leaders),
        node_rank, node_size, node_id, num_nodes, is_leader, rank, size;
        collective_path (``"core"`` or ``"mpi"``) and tuning (where that
        choice came from, in words); layout (what a tuning table is keyed by);
        node_ranks (the ranks of this node, by node rank) and node_index
        (their node ranks, by rank); closed (True once :meth:`free` was
        called); context (what the other layers use of the comm: a
        ``hybridmpi.comm._context.Context``, not a public API).

    Raises:
        TypeError: ``comm`` is not an intracommunicator.
        ValueError: bad ``node_size``, ``memory_order``, ``timeout``,
            ``radix`` or ``spin``, or ranks that disagree on them.
    """

    __slots__ = ("_calls", "__dict__", "__weakref__")
    OPERATIONS: ClassVar[tuple[str, ...]]   # set by @operations
    RECORDED_AS = "HybridComm"

    barrier = _by_collectives("barrier")
    allreduce = _by_collectives("allreduce")
    Allreduce = _by_collectives("Allreduce")

    def __init__(self, comm: Any = None, *, node_size: int | None = None,
                 memory_order: str = "acq_rel", timeout: float | None = None,
                 radix: int | None = None, spin: int | None = None,
                 allreduce: str = "recursive_doubling", collectives: str = "auto") -> None:
        MPI = _mpi()
        self._calls = Calls(self.OPERATIONS)  # what serves and records barrier and allreduce
        self._coll: Any = None   # its Collectives, once made
        self._MPI = MPI
        self._st = None
        #: True before the comm is made and once it is freed (an attribute: one dictionary
        #: lookup on the drop-ins' hot path)
        self.closed = True
        if comm is None:
            comm = MPI.COMM_WORLD
        if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
            raise TypeError(f"hybridmpi: HybridComm needs an MPI intracommunicator, got {comm!r}")
        env, node_size, radix, spin = self._agree_args(comm, node_size, memory_order, timeout, radix,
                                                       spin, allreduce, collectives)
        if timeout is None:
            timeout = env["timeout"]
        if spin is None:
            spin = env["spin"]
        spin = self._split(MPI, comm, node_size, spin)
        try:
            #: the path of barrier and allreduce, "core" or "mpi", and where the choice came from
            self.collective_path, self.tuning, tuned_radix = self._tuned(MPI, collectives)
        except Exception:
            self._free_split()
            raise
        if radix is None:
            radix = tuned_radix or DEFAULT_RADIX
        self.memory_order = memory_order
        self.timeout = timeout if timeout and timeout < FOREVER_S else None
        self.radix = radix
        st = self._init_core(MPI, radix, spin, memory_order, env)
        self._init_state(MPI, st, allreduce)
        if self.collective_path == "calibrate":
            self._calibrate(MPI, st, allreduce)
        install_finalize_hook(MPI)
        LIVE[id(self)] = self
        if env["profile"]:
            for start in START_ENV_PROFILE:   # registered by the package (the profile is above)
                start(self)

    def _agree_args(self, comm, node_size, memory_order, timeout, radix, spin, allreduce, collectives):
        """Check the arguments and the environment on every rank, and agree (collective):
        (env settings, node_size, radix, spin) as ints, or the same error on every rank.
        Sets ``env`` and the nonce."""
        # Checks that need no communication come first, then the ones that
        # need all ranks' view, so that every rank raises the same error.
        try:   # nothing raises on one rank alone (a __repr__ or __index__ that raises)
            problem = check_args(node_size, memory_order, timeout, radix, spin)
            if problem is None and (type(allreduce) is not str or allreduce not in _ALLREDUCES):
                problem = f"allreduce must be one of {list(_ALLREDUCES)}, got {safe_repr(allreduce)}"
            if problem is None and (type(collectives) is not str or collectives not in _COLLECTIVES):
                problem = (f"collectives must be one of {list(_COLLECTIVES)}, got "
                           f"{safe_repr(collectives)}")
            if problem is None:  # numpy integers become ints (checked above)
                node_size = None if node_size is None else operator.index(node_size)
                radix = None if radix is None else operator.index(radix)
                spin = None if spin is None else operator.index(spin)
        except Exception as e:  # noqa: BLE001 - agreed like any other problem
            problem = TypeError, f"an argument could not be checked ({type(e).__name__}: {e})"
        env, env_problem = env_settings()
        problem = problem or env_problem
        # The environment decides paths (zero copy, cross-memory attach) and waits: every
        # rank must have the same, or ranks would take different collectives.
        agreed = None if env is None else {k: v for k, v in env.items()
                                           if k not in ("spin", "warn_after", "tune_dir")}
        # rank 0's random number names this HybridComm in failure notices: a notice left over
        # from a freed one (MPI may reuse its context) is told apart and dropped
        nonce = new_nonce()
        # bounded by this rank's timeout (valid or not, agreed below) or env HYBRIDMPI_TIMEOUT:
        # a rank here while a peer is in another call raises SyncTimeout instead of waiting
        local = timeout if check_seconds(timeout, "") is None and timeout else None
        views = agree(comm, problem, "HybridComm()", deadline=local or (env or {}).get("timeout"),
                      data=(node_size, radix, allreduce, agreed, nonce, collectives))
        if len({v[0:2] for v in views}) != 1:
            raise _errmap.ranks_differ("HybridComm()", "node_size or radix", [v[0:2] for v in views])
        if len({v[2] for v in views}) != 1:
            raise _errmap.ranks_differ("HybridComm()", "allreduce", [v[2] for v in views])
        if len({v[5] for v in views}) != 1:
            raise _errmap.ranks_differ("HybridComm()", "collectives", [v[5] for v in views])
        differ = sorted(k for k in (agreed or {}) if len({repr(v[3][k]) for v in views}) != 1)
        if differ:
            raise ValueError("hybridmpi: HybridComm(): ranks have different environment settings "
                             f"({', '.join(differ)}): "
                             f"{[{k: v[3][k] for k in differ} for v in views]}; set them alike on "
                             "every rank")
        self.env = env
        self._nonce = views[0][4]
        chaos(comm.Get_rank())
        return env, node_size, radix, spin

    def _split(self, MPI, comm, node_size, spin):
        """Duplicate ``comm`` and split it into nodes (virtual ones of ``node_size``) and their
        leaders (collective); returns the spin count (None: chosen from the cores)."""
        self.comm = comm.Dup()
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        physical = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        cores = set()
        for mask in physical.allgather(sorted(os.sched_getaffinity(0))):
            cores.update(mask)
        #: cores the ranks of this physical node may run on, and whether they are fewer than
        #: its ranks (the tuning table's layout)
        self._cores = len(cores)
        self._shared_cores = max(physical.Get_size(), settings.local_ranks()) > len(cores)
        if spin is None:
            spin = lib.HM_SPIN_DEDICATED if physical.Get_size() <= len(cores) else lib.HM_SPIN_SHARED
        if node_size is not None:
            self.node_comm = physical.Split(physical.Get_rank() // node_size, key=self.rank)
            physical.Free()
        else:
            self.node_comm = physical
        self.node_rank = self.node_comm.Get_rank()
        self.node_size = self.node_comm.Get_size()
        self.is_leader = self.node_rank == 0
        self.leader_comm = self.comm.Split(0 if self.is_leader else MPI.UNDEFINED, key=self.rank)
        # each node's leader and host, by node id: a rank whose wait on another node times out
        # names them
        ids = (self.leader_comm.Get_rank(), self.leader_comm.Get_size(),
               self.leader_comm.allgather((self.rank, MPI.Get_processor_name()))) \
            if self.is_leader else None
        self.node_id, self.num_nodes, self._leaders = self.node_comm.bcast(ids, root=0)
        self.node_ranks = self.node_comm.allgather(self.rank)
        #: the node rank of each rank of this node (the inverse of node_ranks)
        self.node_index = {r: i for i, r in enumerate(self.node_ranks)}
        return spin

    def _init_core(self, MPI, radix, spin, memory_order, env):
        """The node's shared window of collective words and the C core's state over it, with
        its wait policy (collective on the node).  Its room in /dev/shm and the MPI's context
        ids are checked first, and its pages committed before the C core writes them: on
        failure every rank frees what it made and raises (RuntimeError, MemoryError)."""
        nbytes = lib.hm_coll_segment_bytes(SLOT_BYTES)
        try:
            check_room(self, nbytes, "HybridComm()", ids=HYBRIDCOMM_IDS)
            self._win, bases, _ = allocate_shared(self, nbytes)
            commit(self, bases[self.node_rank], nbytes, "HybridComm()", undo=self._win.Free)
        except (MemoryError, RuntimeError):
            self._free_split()
            raise
        self._segs = ffi.new("char *[]", [ffi.cast("char *", b) for b in bases])
        # Load/store access to the window is legal inside a passive epoch;
        # the C11 atomics do the ordering.
        self._win.Lock_all(MPI.MODE_NOCHECK)
        st = ffi.new("hm_coll *")
        lib.hm_coll_init(st, self.node_rank, self.node_size, radix, self._segs, SLOT_BYTES)
        st.policy.spin = spin
        st.policy.order = ORDERS[memory_order]
        st.policy.timeout_ns = seconds_ns(self.timeout)
        st.policy.warn_ns = seconds_ns(env["warn_after"])
        if st.policy.warn_ns:
            lib.hm_set_warn(lib.hm_py_warn)
        self._win.Sync()
        self.node_comm.Barrier()
        return st

    def _free_split(self):
        """Free the communicators of :meth:`_split` (a HybridComm that could not be made)."""
        if self.leader_comm != self._MPI.COMM_NULL:
            self.leader_comm.Free()
        self.node_comm.Free()
        self.comm.Free()

    def _init_state(self, MPI, st, allreduce):
        """The state of a new comm over the C core's ``st``: children, identifiers, failure
        notices, Context, arena, and its Collectives with their Plan."""
        self._st = st
        self.closed = False
        self.allreduce_method = allreduce
        self._broken = None
        self._broken_by: int | None = None   # the peer whose error broke it here, when known
        self._broken_as: str | None = None   # the class this rank raised then, when known
        self._children: dict[int, Any] = {}  # Halos and global memory built on this comm, freed with it
        self._tags = TagIds()   # the identifiers of its live Halos
        self._notices = Notices(self.comm, self._nonce, MPI)  # this rank's and the peers' (_break)
        self._services: dict[str, Any] = {}  # other layers' state per comm (_service)
        #: what the transports, the waits and the arena see of this comm
        self.context = Context(self, MPI, st, self._notices, serial=next(_SERIALS),
                               children=self._children, hooks=dict(
                                   service=self._service, free_comm=self._free_comm,
                                   broken=lambda: self._broken,
                                   take_id=lambda: self._tags.take(self.context, self.comm, self._MPI),
                                   broken_cause=lambda: (self._broken_by, self._broken_as),
                                   release_id=self._tags.release, break_comm=self._break,
                                   peer_error=self._peer_error, describe_word=self._where_word,
                                   calls=self._calls,
                                   agree_free=self._agree_free, agree_views=self._agree_views))
        self.arena = self.context.arena = Arena(self.context)  # shared memory of Halos, global memory
        register(self.comm, self.context)  # agreements over it poll its notices, keep its deadline
        if self.size > 1:
            progress_on(self.comm)   # the C core's slow waits drive MPI's progress
            # SIGTERM left at its default: inside a wait it raises SystemExit(143), which breaks
            # the comm (the peers raise PeerError); elsewhere it still ends the process
            lib.hm_catch_signal(signal.SIGTERM)
        #: how barrier and allreduce run, chosen once
        self.plan = Plan.of(self.num_nodes, self.node_size, self.is_leader, allreduce,
                            mpi=self.collective_path == "mpi")
        self._coll = Collectives(self, st, self._segs, self.plan, self._leaders,
                                 break_comm=self._break, peer_error=self._peer_error)
        self._coll.serve(self._calls)

    def _tuned(self, MPI, collectives):
        """The path of this comm's barrier and allreduce, ``"core"`` or ``"mpi"``, where the
        choice came from, and the table's radix (None: none, or the ranks' differ):
        ``collectives`` when it names one, else the tuning
        (:func:`hybridmpi.comm.tuning.choose`), alike on every rank (collective): a table that
        one rank cannot take raises ValueError on every rank; ranks whose views differ (tables
        of different hosts) take the core.  Sets :attr:`layout`."""
        facts = self.comm.allgather((self.node_size if self.is_leader else 0, self._cores,
                                     self._shared_cores))
        #: what a tuning table's choice depends on besides the host and the MPI
        self.layout = tuning.Layout.of(facts, self.num_nodes)
        if collectives != "auto":
            return collectives, f"collectives={collectives!r}", None
        return tuning.agreed(self.comm, MPI, self.layout)

    def _calibrate(self, MPI, st, allreduce):
        """Time the core's collectives (made by :meth:`_init_state`) against MPI's own calls'
        (made here) on every rank (collective: :func:`hybridmpi.comm.tuning.calibrate`), keep
        the faster path's and free the other's; the choice is cached as a table.  A failure
        (a peer's error, the deadline) frees this comm and raises on every rank."""
        core = self._coll
        plan = Plan.of(self.num_nodes, self.node_size, self.is_leader, allreduce, mpi=True)
        mpi = None
        try:
            mpi = Collectives(self, st, self._segs, plan, self._leaders,
                              break_comm=self._break, peer_error=self._peer_error)
            with ctrl_c_deferred():
                rows, seconds = tuning.calibrate(core, mpi)
        except BaseException as e:
            # the peers stop waiting on this rank (those in MPI's own call without a deadline
            # wait as in any MPI program) and raise PeerError
            self._break(f"rank {self.rank} failed in HybridComm()'s calibration "
                        f"({type(e).__name__})", raised=type(e).__name__)
            if mpi is not None:
                self._drop_collectives(mpi)
            with contextlib.suppress(Exception):
                self.free()
            raise
        choice = tuning.calibrated(MPI, self.layout, rows, seconds, keep=self.node_rank == 0)
        # (self.tuning: why no table was taken)
        self.collective_path, self.tuning = choice.path, f"{choice.source}; {self.tuning}"
        if self.collective_path == "mpi":
            self.plan, self._coll = plan, mpi
            self._drop_collectives(core)
            mpi.serve(self._calls)
        else:
            st.net = ffi.NULL
            self._drop_collectives(mpi)

    def _drop_collectives(self, coll):
        """Free the MPI objects of a Collectives the comm does not keep (its leaders' ops, its
        duplicate communicator), or keep them where a request of theirs is pending."""
        own = coll.own_comm()
        pending = coll.pending_between_nodes()
        if pending is not None:
            _KEPT.append((pending, own))
            return
        coll.free_between_nodes()
        if own is not None:
            self._free_comm(own)

    # ------------------------------------------------------------------ life

    def free(self) -> None:
        """Release the window and communicators (collective).  Idempotent."""
        if self._st is None:
            LIVE.pop(id(self), None)
            return
        # the collective frees below run only when every rank frees this comm (else it breaks)
        if not self._MPI.Is_finalized():
            self._agree_free(f"HybridComm {self._nonce:x}")
        LIVE.pop(id(self), None)
        unregister(self.comm)
        progress_off(self.comm)
        ctx = self.context
        if ctx.env_profile is not None:
            ctx.env_profile.end_env()
        elif ctx.profile is not None:
            ctx.profile.owner.abandon()
        for child in list(self._children.values()):
            child.free()
        services, self._services = self._services, {}
        for s in services.values():
            free = getattr(s, "free", None)
            if free is not None:
                free()
        self.arena.free()
        self._stop(None)   # every later call raises FreedError
        self._st = None
        self.closed = True
        MPI = self._MPI
        if MPI.Is_finalized():
            return
        if self._broken is not None:   # MPI_Win_free is collective: a peer may never come
            _KEPT.append(self._win)
        else:
            self._win.Unlock_all()
            self._win.Free()
        pending = self._coll.pending_between_nodes() if self._coll is not None else None
        own = self._coll.own_comm() if self._coll is not None else None
        if pending is not None:   # MPI may still complete it: its buffers, ops and comms stay
            _KEPT.append((pending, self.leader_comm, own))
        elif self._coll is not None:
            self._coll.free_between_nodes()
        if pending is None:
            if self.leader_comm != MPI.COMM_NULL:
                self._free_comm(self.leader_comm)
            if own is not None:   # MPI's own calls' duplicate: as the comm's own
                self._free_comm(own)
        self._free_comm(self.node_comm)
        self._free_comm(self.comm)

    def _agree_free(self, what):
        """Whether the collective MPI frees of ``what`` (an object of this comm, named the same
        on every rank) may run: every rank frees it now.  A bounded agreement first, so that a
        rank never waits in MPI_Win_free for a peer that broke (its notice ends the agreement:
        this comm breaks too, False; also when a peer did not come within the timeout) or that
        frees another object (RuntimeError on every rank, before anything is freed).  False at
        once when this comm broke."""
        return self._agree_views(what, None) is not None

    def _agree_views(self, what, mine):
        """:meth:`_agree_free` that also gathers ``mine`` from every rank: their list, or None
        where _agree_free is False."""
        if self._broken is not None or self._st is None:
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

    def _free_comm(self, c):
        """Free an MPI communicator of this HybridComm, unless a failed call broke it: messages
        of that call may still be in flight on it, and MPI may give a freed communicator's
        context to a new one, whose calls would then receive them.  Those are kept (one set
        per failure)."""
        if self._broken is not None:
            _KEPT.append(c)
        else:
            c.Free()

    def _service(self, name, make):
        """The state that another layer keeps once per HybridComm (global memory's sync_images
        counters, the cross-memory attach probe), made by ``make(self)`` on first use.  Its
        ``poison(bits)`` runs when the comm breaks, its ``free()`` after the children's, and
        its ``describe_word(addr)`` names the words a hang waits on, where it has them."""
        s = self._services.get(name)
        if s is None:
            s = self._services[name] = make(self)
        return s

    def _where_word(self, addr):
        """What a wait on the word at ``addr`` waits for, in words, if the word is one of this
        comm's collective segments or of its children or services; else None."""
        st = self._st
        if st is None:
            return None
        where = None
        size = lib.hm_coll_segment_bytes(SLOT_BYTES)
        for nr in range(self.node_size):
            base = int(ffi.cast("uintptr_t", self._segs[nr]))
            if base <= addr < base + size:
                where = (f"collective call {st.epoch} of {self!r}, on a word of rank "
                         f"{self.node_ranks[nr]}; ranks that have not entered it: "
                         f"{self._coll.not_entered()}")
        for describe in self._hooks("describe_word"):
            what = describe(addr)
            if what:
                where = what
        return where

    def _hooks(self, name):
        """The children's ``name`` hooks (given to ``context.adopt``), then the services'
        (their method ``name``): ``poison`` or ``describe_word``."""
        hooks = [h[name] for h in self.context.hooks.values() if h.get(name) is not None]
        return hooks + [getattr(s, name) for s in self._services.values() if hasattr(s, name)]

    def __copy__(self) -> Any:
        raise TypeError("hybridmpi: a HybridComm cannot be copied (it owns shared memory and "
                        "communicators, freed once)")

    def __enter__(self) -> HybridComm:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._st is None or not leave_on_error(self.context, exc):
            self.free()   # collective unless the comm broke (then nothing waits on a peer)

    def __repr__(self):
        state = "freed" if self._st is None else f"{self.num_nodes} node(s)"
        return (f"<HybridComm rank {self.rank}/{self.size} node {self.node_id} "
                f"rank {self.node_rank}/{self.node_size}, {state}>")

    # ------------------------------------------------------------ errors

    def _peer_error(self, what, peer, seen=None, also=""):
        """The error of a rank that found a peer's error bits ``seen`` (None: got its failure
        notice); ``also`` is appended to the message.  The comm breaks."""
        exc = _errmap.peer_error(self.rank, what, peer, seen, also)
        self._break(_errmap.breaks(exc), notify=False, by=peer, raised=type(exc).__name__)
        return exc

    def _stop(self, why):
        """No C call object serves this comm's operations any more, and its collectives raise:
        it broke (``why``) or was freed (None)."""
        self._calls.close()
        if self._coll is not None:
            self._coll.stop(why, self._broken_by, self._broken_as)

    def _break(self, why, notify=True, by=None, raised=None):
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
        self._stop(why)
        if not first or self._st is None or self._MPI.Is_finalized():
            return
        bits = _errmap.poison_bits(why)
        lib.hm_coll_poison(self._st, bits)
        for poison in self._hooks("poison"):
            poison(bits)
        # across nodes a notice passed on is needed too: a rank on another node may wait on this
        # one alone, and the peer whose error this rank passes on may not be its neighbour
        if (notify or self.num_nodes > 1) and self.size > 1:
            self._notices.send()

