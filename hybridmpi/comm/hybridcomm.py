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

import numpy as np

from .. import settings
from .._native import errmap as _errmap
from .._native.clib import Calls, ffi, lib, operations
from .._native.tables import as_int
from .._native.tables import mpi as _mpi
from ..errors import PeerError, SyncTimeout, agreed
from . import tuning
from ._agree import agree, complete, register, safe_repr, unregister
from ._context import Context
from ._hooks import START_ENV_PROFILE
from ._notice import Notices, new_nonce
from ._resource import leave_on_error
from ._waits import progress_off, progress_on
from .arena import Arena, allocate_shared
from .collectives import SLOT_BYTES, Collectives, Plan
from .room import HYBRIDCOMM_IDS, check_room, commit

_ALLREDUCES = ("recursive_doubling", "tree")
#: the paths a HybridComm's barrier and allreduce may take: the tuning's choice, the C core,
#: MPI's own calls
_COLLECTIVES = ("auto", "core", "mpi")
_ORDERS = {"acq_rel": lib.HM_ACQ_REL, "seq_cst": lib.HM_SEQ_CST}

DEFAULT_RADIX = 4
_MAX_SPIN = 2**62  # polls (an int64 in the C core)

# Every HybridComm not yet freed, in creation order (freed at MPI finalize).
_LIVE: dict[int, HybridComm] = {}
#: communicators of broken HybridComms, never freed (HybridComm._free_comm)
_KEPT: list[Any] = []
_FINALIZE_HOOK: list[int] = []
_SERIALS = itertools.count()  # HybridComms made by this process, in order
#: identifiers of live Halos on one HybridComm (each takes MPI tags 100 + 2 * id, + 1)
TAG_SLOTS = 16000




# Waits longer than this are waits without a limit (int64 nanoseconds end near 292 years).
_FOREVER_S = 1e9


def seconds_ns(value):
    """Nanoseconds of a validated number of seconds for the C core (0: no limit)."""
    if value is None or value == 0 or value >= _FOREVER_S:
        return 0
    return max(1, int(value * 1e9))


def check_seconds(value, what):
    """None, or the problem with a number of seconds (None or a number >= 0; inf: no limit)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or value != value or value < 0:
        return f"{what} must be a number of seconds >= 0 or None, got {safe_repr(value)}"
    return None


def _env_settings():
    """The environment settings a HybridComm reads once (settings.per_comm): the values, or
    the problem with one of them (the ranks then agree on these values or raise)."""
    try:
        out = settings.per_comm()
    except ValueError as e:
        return None, str(e)
    problem = (check_seconds(out["timeout"], "env HYBRIDMPI_TIMEOUT")
               or check_seconds(out["warn_after"], "env HYBRIDMPI_WARN_AFTER"))
    if problem is None and out["spin"] is not None and out["spin"] < 0:
        problem = f"env HYBRIDMPI_SPIN must be >= 0, got {out['spin']}"
    return out, problem


@contextlib.contextmanager
def _ctrl_c_deferred():
    """A first SIGINT (Ctrl-C) in the block is delivered when the block ends (in the main
    thread; elsewhere nothing changes), a second at once: MPI's own calls block without a
    deadline, so a rank that left the calibration between two of them on KeyboardInterrupt
    would leave its peers waiting in MPI for it; all ranks leave it together instead (mpiexec
    sends the signal to every rank)."""
    pending = []

    def later(signum, frame):
        if pending:
            raise KeyboardInterrupt
        pending.append(signum)

    try:
        old = signal.signal(signal.SIGINT, later)
    except (ValueError, TypeError):   # not the main thread, or a handler set outside Python
        old = None
    try:
        yield
    finally:
        if old is not None:
            signal.signal(signal.SIGINT, old)
            if pending:
                signal.raise_signal(signal.SIGINT)


def _chaos(rank):
    """Turn on the C core's chaos hook from env HYBRIDMPI_CHAOS=SEED[:MAX_US] (drift tests:
    random yields, spins and sleeps of up to MAX_US microseconds, default 200, at protocol
    points; each rank draws its own sequence)."""
    found = settings.chaos()
    if found is not None:
        seed, most = found
        lib.hm_set_chaos(seed * 7919 + rank + 1, int(most * 1000))


@ffi.def_extern()
def hm_py_warn(word, value, seen, waited):
    """Once per wait that lasts HYBRIDMPI_WARN_AFTER seconds: say on stderr what this rank
    waits for, and keep waiting (a hang is diagnosed even without a timeout)."""
    import sys

    addr = int(ffi.cast("uintptr_t", word))
    where = "a Halo, global-memory or sync_images call"
    for hc in _LIVE.values():
        where = hc.context.describe_word(addr) or where
    rank = next((hc.rank for hc in _LIVE.values()), "?")
    print(f"hybridmpi: rank {rank} has waited {waited:.0f} s in {where}: the word at {addr:#x} "
          f"reads {_errmap.describe_word_value(seen)}, it needs {value}; still waiting "
          "(HYBRIDMPI_WARN_AFTER)", file=sys.stderr, flush=True)


def _free_all_at_finalize(*_args):
    for hc in list(_LIVE.values()):
        try:
            hc.free()
        except Exception as e:  # noqa: BLE001 - MPI_Finalize goes on; say what was left
            import sys

            print(f"hybridmpi: at MPI_Finalize, {hc!r} was not freed: {e}", file=sys.stderr)
    return 0


def _install_finalize_hook(MPI):
    # Attributes of COMM_SELF are deleted first thing in MPI_Finalize, while
    # MPI still works: the standard place to release cached MPI objects.
    if _FINALIZE_HOOK:
        return
    keyval = MPI.Comm.Create_keyval(delete_fn=_free_all_at_finalize)
    MPI.COMM_SELF.Set_attr(keyval, True)
    _FINALIZE_HOOK.append(keyval)


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
        self.timeout = timeout if timeout and timeout < _FOREVER_S else None
        self.radix = radix
        st = self._init_core(MPI, radix, spin, memory_order, env)
        self._init_state(MPI, st, allreduce)
        if self.collective_path == "calibrate":
            self._calibrate(MPI, st, allreduce)
        _install_finalize_hook(MPI)
        _LIVE[id(self)] = self
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
            problem = self._check_args(node_size, memory_order, timeout, radix, spin)
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
        env, env_problem = _env_settings()
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
        _chaos(comm.Get_rank())
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
        st.policy.order = _ORDERS[memory_order]
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
        self._tags = np.zeros(TAG_SLOTS // 64 + 1, dtype=np.uint64)  # bit i: identifier i taken
        self._notices = Notices(self.comm, self._nonce, MPI)  # this rank's and the peers' (_break)
        self._services: dict[str, Any] = {}  # other layers' state per comm (_service)
        #: what the transports, the waits and the arena see of this comm
        self.context = Context(self, MPI, st, self._notices, serial=next(_SERIALS),
                               children=self._children, hooks=dict(
                                   service=self._service, free_comm=self._free_comm,
                                   broken=lambda: self._broken, take_id=self._take_id,
                                   broken_cause=lambda: (self._broken_by, self._broken_as),
                                   release_id=self._release_id, break_comm=self._break,
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
        per_node = [n for n, _, _ in facts if n]
        #: what a tuning table's choice depends on besides the host and the MPI
        self.layout = layout = tuning.Layout(self.size, self.num_nodes,
                                             (min(per_node), max(per_node)),
                                             min(c for _, c, _ in facts), any(s for _, _, s in facts))
        if collectives != "auto":
            return collectives, f"collectives={collectives!r}", None
        try:
            mine: tuple[str, str | None] = tuning.choose(MPI, layout), None
        except Exception as e:  # noqa: BLE001 - whatever it is, every rank must hear of it
            reason = str(e) if isinstance(e, tuning.TableError) else \
                f"the tuning table could not be chosen ({type(e).__name__}: {e})"
            mine = tuning.Choice("core", ""), " ".join(reason.split())[:300]
        views = self.comm.allgather(mine)
        problems = [(r, p) for r, (_, p) in enumerate(views) if p]
        if problems:
            r, p = problems[0]
            raise ValueError(f"hybridmpi: HybridComm(): rank {r}: {p}")
        if any(c.calibrate for c, _ in views):   # some rank has no table: every rank times both
            return "calibrate", next(c.source for c, _ in views if c.calibrate), None
        if len({c.path for c, _ in views}) != 1:
            return "core", ("the default (the ranks' tuning tables differ: "
                            f"{sorted({c.source for c, _ in views})})"), None
        radices = {c.radix for c, _ in views}
        if len(radices) > 1:
            return views[0][0].path, f"{views[0][0].source} (the ranks' radices differ: the default)", None
        return views[0][0].path, views[0][0].source, radices.pop()

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
            with _ctrl_c_deferred():
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

    @staticmethod
    def _check_args(node_size, memory_order, timeout, radix, spin):
        """This rank's problem with the arguments (None if none).  Integers may be numpy
        integers (not bools); nothing here raises, so every rank reaches the agreement."""
        if node_size is not None and (as_int(node_size) is None or node_size < 1):
            return f"node_size must be a positive int or None, got {safe_repr(node_size)}"
        if type(memory_order) is not str or memory_order not in _ORDERS:
            return f"memory_order must be 'acq_rel' or 'seq_cst', got {safe_repr(memory_order)}"
        problem = check_seconds(timeout, "timeout")
        if problem:
            return problem
        if radix is not None and (as_int(radix) is None or not 2 <= radix <= lib.HM_MAX_RADIX):
            return (f"radix must be an int from 2 to {lib.HM_MAX_RADIX} or None, got "
                    f"{safe_repr(radix)}")
        if spin is not None and (as_int(spin) is None or not 0 <= spin <= _MAX_SPIN):
            return f"spin must be an int from 0 to {_MAX_SPIN} or None, got {safe_repr(spin)}"
        return None

    # ------------------------------------------------------------------ life

    def free(self) -> None:
        """Release the window and communicators (collective).  Idempotent."""
        if self._st is None:
            _LIVE.pop(id(self), None)
            return
        # the collective frees below run only when every rank frees this comm (else it breaks)
        if not self._MPI.Is_finalized():
            self._agree_free(f"HybridComm {self._nonce:x}")
        _LIVE.pop(id(self), None)
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

    def _take_id(self):
        """An identifier (0 <= id < TAG_SLOTS) that no live Halo holds on any rank, the same
        on every rank (collective: one Allreduce of the ranks' taken sets, so identifiers freed
        in different orders on different ranks are never handed out twice); None when all
        are taken.  Freed identifiers are reused: nothing wraps around onto a live one.
        The Allreduce is non-blocking and waited on as every agreement is (under the timeout,
        ended by a peer's failure notice): a peer interrupted between the constructor's
        agreement and this call (Ctrl-C) made the others wait in a blocking MPI_Allreduce for
        ever (found by test_signals' Halo constructor loop, 2 runs in 14)."""
        taken = self._tags.copy()
        complete(self.context, self.comm,
                 self.comm.Iallreduce(self._MPI.IN_PLACE, taken, op=self._MPI.BOR), "Halo()")
        free = np.flatnonzero(np.unpackbits(~taken.view(np.uint8), bitorder="little")[:TAG_SLOTS])
        if free.size == 0:
            return None
        i = int(free[0])
        self._tags[i >> 6] |= np.uint64(1 << (i & 63))
        return i

    def _release_id(self, i):
        """Give back an identifier of :meth:`_take_id` (a Halo was freed)."""
        self._tags[i >> 6] &= ~np.uint64(1 << (i & 63))

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

