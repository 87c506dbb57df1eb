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
from . import tuning
from ._agree import agree, register, safe_repr, unregister
from ._context import KEPT, Context, describe
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
from ._notice import new_nonce
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

_SERIALS = itertools.count()  # HybridComms made by this process, in order




def _by_collectives(name: str) -> Any:
    """HybridComm's method ``name``, run by its :class:`Collectives` (the comm's ``Calls``
    table sends each call there directly once the comm is made: this runs only before)."""
    impl = getattr(Collectives, name)

    def method(self, *args, **kwargs):
        return getattr(self.context.collectives, name)(*args, **kwargs)
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
            release phase, the direct allreduce while the node's ranks
            times the bytes are at most :attr:`direct_total` (32 KiB, or a
            tuning table's gate), larger ones the reduce-scatter and
            allgather) or ``"tree"`` (the paper's Algorithm 3 for every
            size).
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
        radix and direct_total (the node tree's arity and the direct
        allreduce's gate, node ranks times bytes, that this comm took);
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
        self.context: Any = None   # its runtime state, once its node is set up
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
            tuned = self._tuned(MPI, collectives)
            #: the path of barrier and allreduce, "core" or "mpi", and where the choice came from
            self.collective_path, self.tuning = tuned.path, tuned.source
        except Exception:
            self._free_split()
            raise
        if radix is None:
            radix = tuned.radix or DEFAULT_RADIX
        self.memory_order = memory_order
        self.timeout = timeout if timeout and timeout < FOREVER_S else None
        self.radix = radix
        st = self._init_core(MPI, radix, spin, memory_order, env)
        if tuned.direct_total is not None:   # (checked: tuning.check)
            lib.hm_coll_set_direct_total(st, tuned.direct_total)
        #: the direct allreduce's gate on one node: node ranks times bytes at most this
        self.direct_total = int(st.direct_total)
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
        """The state of a new comm over the C core's ``st``: its Context (children,
        identifiers, failure notices), arena, and its Collectives with their Plan."""
        self._st = st
        self.closed = False
        self.allreduce_method = allreduce
        #: the comm's runtime state, which the transports, the waits and the arena see of it
        ctx = self.context = Context(self, MPI, st, segs=self._segs,
                                     seg_bytes=lib.hm_coll_segment_bytes(SLOT_BYTES),
                                     nonce=self._nonce, serial=next(_SERIALS), calls=self._calls,
                                     tags=TagIds())
        self.arena = ctx.arena = Arena(ctx)  # shared memory of Halos, global memory
        register(self.comm, ctx)  # agreements over it poll its notices, keep its deadline
        if self.size > 1:
            progress_on(self.comm)   # the C core's slow waits drive MPI's progress
            # SIGTERM left at its default: inside a wait it raises SystemExit(143), which breaks
            # the comm (the peers raise PeerError); elsewhere it still ends the process
            lib.hm_catch_signal(signal.SIGTERM)
        #: how barrier and allreduce run, chosen once
        self.plan = Plan.of(self.num_nodes, self.node_size, self.is_leader, allreduce,
                            mpi=self.collective_path == "mpi")
        ctx.collectives = Collectives(self, st, self._segs, self.plan, self._leaders,
                                      break_comm=ctx.break_comm, peer_error=ctx.peer_error)
        ctx.collectives.serve(self._calls)

    def _tuned(self, MPI, collectives):
        """The path of this comm's barrier and allreduce, ``"core"`` or ``"mpi"``, where the
        choice came from, and the tables' radix and direct allreduce gate (a
        :class:`~hybridmpi.comm.tuning.Tuned`): ``collectives`` when it names one, else the tuning
        (:func:`hybridmpi.comm.tuning.choose`), alike on every rank (collective): a table that
        one rank cannot take raises ValueError on every rank; ranks whose views differ (tables
        of different hosts) take the core.  Sets :attr:`layout`."""
        facts = self.comm.allgather((self.node_size if self.is_leader else 0, self._cores,
                                     self._shared_cores))
        #: what a tuning table's choice depends on besides the host and the MPI
        self.layout = tuning.Layout.of(facts, self.num_nodes)
        if collectives != "auto":
            return tuning.Tuned(collectives, f"collectives={collectives!r}")
        return tuning.agreed(self.comm, MPI, self.layout)

    def _calibrate(self, MPI, st, allreduce):
        """Time the core's collectives (made by :meth:`_init_state`) against MPI's own calls'
        (made here) on every rank (collective: :func:`hybridmpi.comm.tuning.calibrate`), keep
        the faster path's and free the other's; the choice is cached as a table.  A failure
        (a peer's error, the deadline) frees this comm and raises on every rank."""
        ctx = self.context
        core = ctx.collectives
        plan = Plan.of(self.num_nodes, self.node_size, self.is_leader, allreduce, mpi=True)
        mpi = None
        try:
            mpi = Collectives(self, st, self._segs, plan, self._leaders,
                              break_comm=ctx.break_comm, peer_error=ctx.peer_error)
            with ctrl_c_deferred():
                rows, seconds = tuning.calibrate(core, mpi)
        except BaseException as e:
            # the peers stop waiting on this rank (those in MPI's own call without a deadline
            # wait as in any MPI program) and raise PeerError
            ctx.break_comm(f"rank {self.rank} failed in HybridComm()'s calibration "
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
            self.plan, ctx.collectives = plan, mpi
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
            KEPT.append((pending, own))
            return
        coll.free_between_nodes()
        if own is not None:
            self.context.free_comm(own)

    # ------------------------------------------------------------------ life

    def free(self) -> None:
        """Release the window and communicators (collective).  Idempotent."""
        if self._st is None:
            LIVE.pop(id(self), None)
            return
        ctx = self.context
        # the collective frees below run only when every rank frees this comm (else it breaks)
        if not self._MPI.Is_finalized():
            ctx.agree_free(f"HybridComm {self._nonce:x}")
        LIVE.pop(id(self), None)
        unregister(self.comm)
        progress_off(self.comm)
        if ctx.env_profile is not None:
            ctx.env_profile.end_env()
        elif ctx.profile is not None:
            ctx.profile.owner.abandon()
        ctx.free_children()
        self.arena.free()
        ctx.mark_freed()   # every later call raises FreedError
        self._st = None
        self.closed = True
        if not self._MPI.Is_finalized():
            self._free_mpi(ctx)

    def _free_mpi(self, ctx):
        """Free the comm's window and communicators (collective), or keep those that a broken
        comm or a pending request may still use."""
        MPI = self._MPI
        if ctx.broken() is not None:   # MPI_Win_free is collective: a peer may never come
            KEPT.append(self._win)
        else:
            self._win.Unlock_all()
            self._win.Free()
        coll = ctx.collectives   # None where the comm's making failed before them
        pending = coll.pending_between_nodes() if coll is not None else None
        own = coll.own_comm() if coll is not None else None
        if pending is not None:   # MPI may still complete it: its buffers, ops and comms stay
            KEPT.append((pending, self.leader_comm, own))
            return
        if coll is not None:
            coll.free_between_nodes()
        if self.leader_comm != MPI.COMM_NULL:
            ctx.free_comm(self.leader_comm)
        if own is not None:   # MPI's own calls' duplicate: as the comm's own
            ctx.free_comm(own)
        ctx.free_comm(self.node_comm)
        ctx.free_comm(self.comm)

    def __copy__(self) -> Any:
        raise TypeError("hybridmpi: a HybridComm cannot be copied (it owns shared memory and "
                        "communicators, freed once)")

    def __enter__(self) -> HybridComm:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._st is None or not leave_on_error(self.context, exc):
            self.free()   # collective unless the comm broke (then nothing waits on a peer)

    def __repr__(self):
        if self.context is not None:
            return repr(self.context)
        return describe(self.rank, self.size, self.node_id, self.node_rank, self.node_size,
                        "not made")
