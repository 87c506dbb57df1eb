"""HybridComm: a node-aware communicator with shared-memory collectives.

Inside a node, barrier and allreduce run in the C core over one MPI-3 shared
window, synchronized with C11 release/acquire atomics on epoch counters.
Across nodes, the node leaders combine with plain MPI on ``leader_comm``
between the node's gather and release phases.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

import numpy as np

from ._agree import agree
from ._clib import ERRBIT, MISBIT, ffi, lib
from ._waits import wait_requests
from .arena import Arena
from .errors import FreedError, PeerError, SyncTimeout

#: numpy dtype -> C core type code
DTYPES: dict[np.dtype[Any], int] = {
    np.dtype(np.float64): lib.HM_F64,
    np.dtype(np.float32): lib.HM_F32,
    np.dtype(np.int64): lib.HM_I64,
    np.dtype(np.int32): lib.HM_I32,
    np.dtype(np.complex128): lib.HM_C128,
}
_F64, _I64, _C128 = lib.HM_F64, lib.HM_I64, lib.HM_C128
_barrier = lib.hm_barrier
_barrier_tree = lib.hm_barrier_tree
_barrier_diss = lib.hm_barrier_dissemination
_barrier_linear = lib.hm_barrier_linear
_allreduce_f64 = lib.hm_allreduce_f64
_allreduce_rd_f64 = lib.hm_allreduce_rd_f64
_DTYPE_NAMES = {code: dt.name for dt, code in DTYPES.items()}
_OPS = {"sum": lib.HM_SUM, "prod": lib.HM_PROD, "min": lib.HM_MIN, "max": lib.HM_MAX}
_OP_NAMES = {code: name for name, code in _OPS.items()}
_BARRIERS = {"dissemination": lib.HM_DISSEMINATION, "tree": lib.HM_TREE, "linear": lib.HM_LINEAR}
_ALLREDUCES = ("recursive_doubling", "tree")
#: payloads up to this many bytes go by recursive doubling (one node, allreduce="recursive_doubling")
RD_BYTES = lib.HM_RD_BYTES
_ORDERS = {"acq_rel": lib.HM_ACQ_REL, "seq_cst": lib.HM_SEQ_CST}

#: bytes of each rank's reduction slot; longer arrays go in chunks
SLOT_BYTES = 256 * 1024
# cffi views of arrays up to this size are cached between calls
_CACHE_BYTES = 64 * 1024
_CACHE_ENTRIES = 16
DEFAULT_RADIX = 4
_SPIN_DEDICATED = 2000
_SPIN_SHARED = 16

# Every HybridComm not yet freed, in creation order (freed at MPI finalize).
_LIVE: dict[int, HybridComm] = {}
#: communicators of broken HybridComms, never freed (HybridComm._free_comm)
_KEPT: list[Any] = []
_FINALIZE_HOOK: list[int] = []
_SERIALS = itertools.count()  # HybridComms made by this process, in order


def _mpi():
    from mpi4py import MPI

    return MPI


def _env_float(name):
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"hybridmpi: environment variable {name}={raw!r} is not a number") from None


#: seconds one wait lasts before it prints what it waits for (env HYBRIDMPI_WARN_AFTER; 0: never)
WARN_AFTER = 60.0
# the "failed" entry of the leaders' signatures when a node's call failed (1: a mismatch)
_FAILED = 2
# Waits longer than this are waits without a limit (int64 nanoseconds end near 292 years).
_FOREVER_S = 1e9
_KIND_NAMES = {lib.HM_K_BARRIER_TREE: "barrier(tree)", lib.HM_K_BARRIER_LINEAR: "barrier(linear)",
               lib.HM_K_BARRIER_DISS: "barrier(dissemination)",
               lib.HM_K_ALLREDUCE_TREE: "allreduce (tree)",
               lib.HM_K_ALLREDUCE_RD: "allreduce (recursive doubling)",
               lib.HM_K_BAD: "a collective with invalid arguments"}


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
        return f"{what} must be a number of seconds >= 0 or None, got {value!r}"
    return None


def _env_settings():
    """The environment variables that decide paths, read once per HybridComm: the values, or
    the problem with one of them (the ranks then agree on these values or raise)."""
    out = {}
    try:
        out["timeout"] = _env_float("HYBRIDMPI_TIMEOUT")
        spin = _env_float("HYBRIDMPI_SPIN")
        out["spin"] = None if spin is None else int(spin)
        warn = _env_float("HYBRIDMPI_WARN_AFTER")
        out["warn_after"] = WARN_AFTER if warn is None else warn
        out["cma"] = os.environ.get("HYBRIDMPI_CMA", "1").strip() != "0"
        profile = os.environ.get("HYBRIDMPI_PROFILE", "").strip()
        out["profile"] = None if profile in ("", "0") else profile
        for key, name in (("cma_bytes", "HYBRIDMPI_CMA_BYTES"),
                          ("zero_copy_bytes", "HYBRIDMPI_ZERO_COPY_BYTES")):
            v = _env_float(name)
            out[key] = None if v is None else int(v)
    except ValueError as e:
        return None, str(e).replace("hybridmpi: ", "")
    chaos = os.environ.get("HYBRIDMPI_CHAOS", "").strip()
    seed, _, most = chaos.partition(":")
    try:
        if chaos:
            int(seed), float(most or 0)
    except ValueError:
        return None, f"env HYBRIDMPI_CHAOS={chaos!r} is not SEED[:MAX_US]"
    problem = (check_seconds(out["timeout"], "env HYBRIDMPI_TIMEOUT")
               or check_seconds(out["warn_after"], "env HYBRIDMPI_WARN_AFTER"))
    if problem is None and out["spin"] is not None and out["spin"] < 0:
        problem = f"env HYBRIDMPI_SPIN must be >= 0, got {out['spin']}"
    return out, problem


def _chaos(rank):
    """Turn on the C core's chaos hook from env HYBRIDMPI_CHAOS=SEED[:MAX_US] (drift tests:
    random yields, spins and sleeps of up to MAX_US microseconds, default 200, at protocol
    points; each rank draws its own sequence)."""
    raw = os.environ.get("HYBRIDMPI_CHAOS", "").strip()
    if not raw or raw == "0":
        return
    seed, _, most = raw.partition(":")
    lib.hm_set_chaos(int(seed) * 7919 + rank + 1, int(float(most or 200) * 1000))


@ffi.def_extern()
def hm_py_warn(word, value, seen, waited):
    """Once per wait that lasts HYBRIDMPI_WARN_AFTER seconds: say on stderr what this rank
    waits for, and keep waiting (a hang is diagnosed even without a timeout)."""
    import sys

    addr = int(ffi.cast("uintptr_t", word))
    where = "a Halo, global-memory or sync_images call"
    for hc in _LIVE.values():
        st = hc._st
        if st is None:
            continue
        size = lib.hm_coll_segment_bytes(SLOT_BYTES)
        for nr in range(hc.node_size):
            base = int(ffi.cast("uintptr_t", hc._segs[nr]))
            if base <= addr < base + size:
                late = [hc.node_ranks[r] for r in range(hc.node_size)
                        if lib.hm_load(hc._segs[r] + lib.HM_OFF_ENTERED, lib.HM_ACQ_REL) < st.epoch]
                where = (f"collective call {st.epoch} of {hc!r}, on a word of rank "
                         f"{hc.node_ranks[nr]}; ranks that have not entered it: {late}")
        for obj in [*hc._children.values(), hc._gm]:
            describe = getattr(obj, "_describe_word", None)
            what = describe(addr) if describe is not None else None
            if what:
                where = what
    rank = next((hc.rank for hc in _LIVE.values()), "?")
    flags = " (error bits set)" if seen >> 62 else ""
    print(f"hybridmpi: rank {rank} has waited {waited:.0f} s in {where}: the word at {addr:#x} "
          f"reads {seen & ((1 << 62) - 1)}{flags}, it needs {value}; still waiting "
          "(HYBRIDMPI_WARN_AFTER)", file=sys.stderr, flush=True)


def _free_all_at_finalize(*_args):
    for hc in list(_LIVE.values()):
        hc.free()
    return 0


def _install_finalize_hook(MPI):
    # Attributes of COMM_SELF are deleted first thing in MPI_Finalize, while
    # MPI still works: the standard place to release cached MPI objects.
    if _FINALIZE_HOOK:
        return
    keyval = MPI.Comm.Create_keyval(delete_fn=_free_all_at_finalize)
    MPI.COMM_SELF.Set_attr(keyval, True)
    _FINALIZE_HOOK.append(keyval)


def _describe_round(value):
    return "no call yet" if value == 0 else f"reached call {value}"


def _describe(value):
    """Say what a node counter value means (2e-1: arrived at call e, 2e: released it)."""
    if value == 0:
        return "no call yet"
    if value % 2:
        return f"arrived at call {(value + 1) // 2}"
    return f"released call {value // 2}"


def op_code(op: Any, MPI: Any = None) -> int:
    """Return the C core code of a reduction operation.

    Args:
        op: ``"sum"``, ``"prod"``, ``"min"``, ``"max"`` or ``MPI.SUM``,
            ``MPI.PROD``, ``MPI.MIN``, ``MPI.MAX``.

    Raises:
        ValueError: unknown operation name.
        TypeError: neither a string nor one of those MPI operations.
    """
    if type(op) is str:
        code = _OPS.get(op)
        if code is None:
            raise ValueError(f"hybridmpi: unknown op {op!r}; use one of {sorted(_OPS)}")
        return code
    MPI = MPI or _mpi()
    for name, mop in (("sum", MPI.SUM), ("prod", MPI.PROD), ("min", MPI.MIN), ("max", MPI.MAX)):
        if op == mop:
            return _OPS[name]
    raise TypeError(f"hybridmpi: unsupported op {op!r}; use 'sum', 'prod', 'min', 'max' "
                    "or MPI.SUM, MPI.PROD, MPI.MIN, MPI.MAX")


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
        radix: arity of the node tree used by barrier and allreduce.
        spin: polls spent spinning before a wait yields the CPU; default:
            env ``HYBRIDMPI_SPIN``, else 2000 when each rank of the node has
            a core of its own and 16 when ranks outnumber cores.
        allreduce: ``"recursive_doubling"`` (the default: payloads up to
            96 bytes on one node go through a butterfly with no release
            phase) or ``"tree"`` (the paper's Algorithm 3 for every size).

    Attributes:
        comm, node_comm, leader_comm (``MPI.COMM_NULL`` off the leaders),
        node_rank, node_size, node_id, num_nodes, is_leader, rank, size.

    Raises:
        TypeError: ``comm`` is not an intracommunicator.
        ValueError: bad ``node_size``, ``memory_order``, ``timeout``,
            ``radix`` or ``spin``, or ranks that disagree on them.
    """

    def __init__(self, comm: Any = None, *, node_size: int | None = None,
                 memory_order: str = "acq_rel", timeout: float | None = None,
                 radix: int = DEFAULT_RADIX, spin: int | None = None,
                 allreduce: str = "recursive_doubling") -> None:
        MPI = _mpi()
        self._MPI = MPI
        self._st = None
        if comm is None:
            comm = MPI.COMM_WORLD
        if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
            raise TypeError(f"hybridmpi: HybridComm needs an MPI intracommunicator, got {comm!r}")
        # Checks that need no communication come first, then the ones that
        # need all ranks' view, so that every rank raises the same error.
        problem = self._check_args(node_size, memory_order, timeout, radix, spin)
        if problem is None and allreduce not in _ALLREDUCES:
            problem = f"allreduce must be one of {list(_ALLREDUCES)}, got {allreduce!r}"
        env, env_problem = _env_settings()
        problem = problem or env_problem
        # The environment decides paths (zero copy, cross-memory attach) and waits: every
        # rank must have the same, or ranks would take different collectives.
        agreed = None if env is None else {k: v for k, v in env.items() if k not in ("spin", "warn_after")}
        # rank 0's random number names this HybridComm in failure notices: a notice left over
        # from a freed one (MPI may reuse its context) is told apart and dropped
        nonce = int.from_bytes(os.urandom(7), "little")
        views = agree(comm, problem, "HybridComm()",
                      data=(node_size, radix, allreduce, agreed, nonce))
        if len({v[0:2] for v in views}) != 1:
            raise ValueError("hybridmpi: HybridComm(): ranks passed different node_size or "
                             f"radix: {[v[0:2] for v in views]}")
        if len({v[2] for v in views}) != 1:
            raise ValueError("hybridmpi: HybridComm(): ranks passed different allreduce: "
                             f"{[v[2] for v in views]}")
        differ = sorted(k for k in (agreed or {}) if len({repr(v[3][k]) for v in views}) != 1)
        if differ:
            raise ValueError("hybridmpi: HybridComm(): ranks have different environment settings "
                             f"({', '.join(differ)}): "
                             f"{[{k: v[3][k] for k in differ} for v in views]}; set them alike on "
                             "every rank")
        self.env = env
        self._nonce = views[0][4]
        _chaos(comm.Get_rank())
        if timeout is None:
            timeout = env["timeout"]
        if spin is None:
            spin = env["spin"]

        self.comm = comm.Dup()
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        physical = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        if spin is None:
            cores = set()
            for mask in physical.allgather(sorted(os.sched_getaffinity(0))):
                cores.update(mask)
            spin = _SPIN_DEDICATED if physical.Get_size() <= len(cores) else _SPIN_SHARED
        if node_size is not None:
            self.node_comm = physical.Split(physical.Get_rank() // node_size, key=self.rank)
            physical.Free()
        else:
            self.node_comm = physical
        self.node_rank = self.node_comm.Get_rank()
        self.node_size = self.node_comm.Get_size()
        self.is_leader = self.node_rank == 0
        self.leader_comm = self.comm.Split(0 if self.is_leader else MPI.UNDEFINED, key=self.rank)
        ids = (self.leader_comm.Get_rank(), self.leader_comm.Get_size()) if self.is_leader else None
        self.node_id, self.num_nodes = self.node_comm.bcast(ids, root=0)
        self.node_ranks = self.node_comm.allgather(self.rank)
        self.memory_order = memory_order
        self.timeout = timeout if timeout and timeout < _FOREVER_S else None
        self.radix = radix

        # One region more than needed, so each segment can start on a
        # 128-byte boundary; shared mappings are page-aligned in every
        # process, so every process finds the same aligned offset.
        seg_bytes = lib.hm_coll_segment_bytes(SLOT_BYTES) + lib.HM_REGION
        info = MPI.Info.Create()
        info.Set("alloc_shared_noncontig", "true")
        try:
            self._win = MPI.Win.Allocate_shared(seg_bytes, 1, info=info, comm=self.node_comm)
        finally:
            info.Free()
        self._segs = ffi.new("char *[]", self.node_size)
        for r in range(self.node_size):
            buf, _ = self._win.Shared_query(r)
            self._segs[r] = ffi.cast("char *", -(-buf.address // lib.HM_REGION) * lib.HM_REGION)
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
        self._st = st
        self._live = st  # None once freed or broken: one check on hot paths
        self._leader_multi = self.is_leader and self.num_nodes > 1
        # Recursive doubling needs the whole node in one phase: one node only.
        self.allreduce_method = allreduce
        self._one_node = self.num_nodes == 1
        self._rd = allreduce == "recursive_doubling" and self._one_node and self.node_size > 1
        # The drop-in barrier calls the C core straight through this (None when
        # several nodes need the leaders' MPI_Barrier, or once freed or broken).
        self._one_node_st = st if self._one_node else None
        self._rd_st = st if self._rd else None  # likewise for the drop-in allreduce
        self._broken = None
        self._f64 = ffi.new("double[1]")
        self._scalar = {_I64: ffi.new("int64_t[1]"), _C128: ffi.new("double[2]")}
        self._sig_buf = np.zeros(9, dtype=np.int64)
        self._bufs: dict[Any, Any] = {}
        self._mpi_ops = [MPI.SUM, MPI.PROD, MPI.MIN, MPI.MAX]
        self._children: dict[int, Any] = {}  # Halos and global memory built on this comm, freed with it
        self._profile = None   # the hybridmpi.profile that records this comm's calls
        self._env_profile = None
        self._serial = next(_SERIALS)
        self._tags = 0
        self._notices: list[np.ndarray] = []  # the failure notice this rank sent (_break)
        self._notice_from = None  # the first rank whose failure notice came
        self.arena = Arena(self)  # shared memory of Halos and global memory
        self._gm = None  # the state of sync_images, made with the first GlobalMemory
        self._cma = None  # _cma_pids(): not probed yet
        _install_finalize_hook(MPI)
        _LIVE[id(self)] = self
        if env["profile"]:
            from .profile import start_env

            start_env(self)

    @staticmethod
    def _check_args(node_size, memory_order, timeout, radix, spin):
        if node_size is not None and (type(node_size) is not int or node_size < 1):
            return f"node_size must be a positive int or None, got {node_size!r}"
        if memory_order not in _ORDERS:
            return f"memory_order must be 'acq_rel' or 'seq_cst', got {memory_order!r}"
        problem = check_seconds(timeout, "timeout")
        if problem:
            return problem
        if type(radix) is not int or not 2 <= radix <= 16:
            return f"radix must be an int from 2 to 16, got {radix!r}"
        if spin is not None and (type(spin) is not int or spin < 0):
            return f"spin must be an int >= 0 or None, got {spin!r}"
        return None

    # ------------------------------------------------------------------ life

    def free(self) -> None:
        """Release the window and communicators (collective).  Idempotent."""
        _LIVE.pop(id(self), None)
        if self._st is None:
            return
        if self._env_profile is not None:
            from .profile import stop_env

            stop_env(self)
        elif self._profile is not None:
            self._profile._stop()
            self._profile._state = "failed"
        for child in list(self._children.values()):
            child.free()
        if self._gm is not None:
            self._gm.free()
            self._gm = None
        self.arena.free()
        self._st = self._live = self._one_node_st = self._rd_st = None
        self._bufs = {}
        MPI = self._MPI
        if MPI.Is_finalized():
            return
        self._win.Unlock_all()
        self._win.Free()
        if self.leader_comm != MPI.COMM_NULL:
            self._free_comm(self.leader_comm)
        self._free_comm(self.node_comm)
        self._free_comm(self.comm)

    def _free_comm(self, c):
        """Free an MPI communicator of this HybridComm, unless a failed call broke it: messages
        of that call may still be in flight on it, and MPI may give a freed communicator's
        context to a new one, whose calls would then receive them.  Those are kept (one set
        per failure)."""
        if self._broken is not None:
            _KEPT.append(c)
        else:
            c.Free()

    def _cma_pids(self):
        """The process ids of this node's ranks (by node rank) if every rank can read every
        other node rank's memory with process_vm_readv (cross-memory attach), else None.
        Collective over the whole communicator the first time (cached)."""
        if self._cma is None:
            import os

            MPI = self._MPI
            word = np.array([os.getpid(), self.rank], dtype=np.int64)
            peers = self.node_comm.allgather((os.getpid(), word.ctypes.data, self.rank))
            ok = self.node_size > 1
            got = np.zeros(2, dtype=np.int64)
            for pid, addr, rank in peers:
                if ok and rank != self.rank:
                    ok = bool(lib.hm_cma_probe(pid, ffi.cast("void *", addr),
                                               ffi.cast("void *", got.ctypes.data), 16))
                    ok = ok and got.tolist() == [pid, rank]
            ok = self.comm.allreduce(int(ok), op=MPI.MIN)  # word stays alive until here
            self._cma = [pid for pid, _, _ in peers] if ok else False
        return self._cma or None

    def _adopt(self, child):
        """Register a Halo, GlobalMemory or Coarray made on this comm (freed with it; recorded
        by a profile that is on)."""
        self._children[id(child)] = child
        if self._profile is not None:
            self._profile._adopt(child)

    def _next_tag(self):
        """A number for the next Halo's MPI tags (Halos are built collectively, in order)."""
        self._tags += 1
        return self._tags

    def __enter__(self) -> HybridComm:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None and self._st is not None:
            # an exception leaves the block on this rank: peers waiting for this rank in a
            # call raise too (error bits, notice), and then meet it in the collective free
            self._break(f"an exception on this rank ({exc_type.__name__})",
                        notify=not issubclass(exc_type, PeerError))
        self.free()

    @property
    def closed(self) -> bool:
        """True once :meth:`free` was called."""
        return self._st is None

    def _unusable(self):
        if self._broken is not None:
            return RuntimeError(f"hybridmpi: rank {self.rank}: this HybridComm is unusable after "
                                f"an earlier error ({self._broken}); free it")
        return FreedError(f"hybridmpi: rank {self.rank}: HybridComm used after free()")

    def __repr__(self):
        state = "freed" if self._st is None else f"{self.num_nodes} node(s)"
        return (f"<HybridComm rank {self.rank}/{self.size} node {self.node_id} "
                f"rank {self.node_rank}/{self.node_size}, {state}>")

    # ------------------------------------------------------------ errors

    def _fail(self, rc, what):
        """Turn a C core return code into an exception.  A mismatch found by the algorithm
        itself reaches the same verdict on every rank and leaves the comm usable; ranks in
        different collectives, a failed peer or a timeout leave error bits in the node's
        words, so every rank raises and the comm becomes unusable."""
        st = self._st
        err = st.err
        if rc == lib.HM_EMISMATCH and err.bad_rank == lib.HM_BAD_ELSEWHERE:
            raise ValueError(f"hybridmpi: {what}: ranks on different nodes passed different "
                             "arguments (count, dtype or op)")
        if rc == lib.HM_EMISMATCH and err.bad_kind != err.root_kind:
            self._break("ValueError")
            bad, me = self.node_ranks[err.bad_rank], self.node_ranks[err.peer]
            raise ValueError(f"hybridmpi: {what}: ranks are in different collective calls: rank {bad} "
                             f"called {self._call(err.bad_kind, err.bad_count, err.bad_dtype, err.bad_op)}"
                             f", rank {me} called "
                             f"{self._call(err.root_kind, err.root_count, err.root_dtype, err.root_op)}")
        if rc == lib.HM_EMISMATCH:
            bad = self.node_ranks[err.bad_rank]
            # the tree compares with the node root; recursive doubling names the
            # rank with the smallest arguments in err.peer
            other = self.node_ranks[err.peer if err.root_kind == lib.HM_K_ALLREDUCE_RD else 0]
            raise ValueError(
                f"hybridmpi: {what}: ranks passed different arguments: rank {bad} passed "
                f"{self._sig(err.bad_count, err.bad_dtype, err.bad_op)}, rank "
                f"{other} passed {self._sig(err.root_count, err.root_dtype, err.root_op)}"
            )
        if rc == lib.HM_EPEER:
            raise self._peer_error(what, None if err.peer < 0 else self.node_ranks[err.peer],
                                   int(err.seen))
        if rc == lib.HM_ETIMEOUT:
            missing = [self.node_ranks[r] for r in range(self.node_size)
                       if lib.hm_load(self._segs[r] + lib.HM_OFF_ENTERED, lib.HM_ACQ_REL) < st.epoch]
            call = int(err.epoch)
            if err.counter == lib.HM_CNT_LINEAR:
                peer, counter = None, "linear-arrival"
                waited = (f"the arrival counter of node root rank {self.node_ranks[0]} "
                          f"stayed at {err.seen} of {call} calls' arrivals")
            elif err.counter == lib.HM_CNT_ROUND:
                peer, counter = self.node_ranks[err.peer], "round"
                waited = (f"rank {peer} did not reach call {call} "
                          f"(its signal says: {_describe_round(int(err.seen))})")
            else:
                peer = self.node_ranks[err.peer]
                counter = "arrive" if err.counter == lib.HM_CNT_ARRIVE else "release"
                waited = (f"rank {peer} did not {counter} at call {call} "
                          f"(its counter says: {_describe(int(err.seen))})")
            msg = f"hybridmpi: rank {self.rank} timed out after {self.timeout:g} s in {what}: {waited}"
            if missing:
                msg += f"; ranks that have not entered call {call}: {missing}"
            raise self._timeout(msg, peer, counter, call, missing)
        raise RuntimeError(f"hybridmpi: {what}: C core returned {rc}")

    def _peer_error(self, what, peer, seen):
        """The error of a rank that found a peer's error bits (ValueError for a mismatch)."""
        who = "another rank" if peer is None else f"rank {peer}"
        if seen & MISBIT:
            self._break("ValueError", notify=False)
            return ValueError(f"hybridmpi: rank {self.rank}: {what}: {who} found that ranks passed "
                              "different arguments or are in different calls (see its error)")
        self._break("PeerError", notify=False)
        return PeerError(f"hybridmpi: rank {self.rank}: {what}: {who} failed in this call "
                         "(see its error); this rank stops too", rank=self.rank, peer=peer)

    def _break(self, why, notify=True):
        """Make this comm unusable, and make every peer that waits on this rank raise instead of
        waiting: error bits in every word this rank writes on its node (collectives, every
        Halo, sync_images) and, with ``notify`` (this rank's own failure rather than one passed
        on from a peer, whose notice every rank already has), a failure notice to every other
        rank, which the waits on MPI requests poll."""
        first = self._broken is None
        self._broken = self._broken or why
        self._live = self._one_node_st = self._rd_st = None
        if not first or self._st is None or self._MPI.Is_finalized():
            return
        bits = ERRBIT | (MISBIT if why == "ValueError" else 0)
        lib.hm_coll_poison(self._st, bits)
        for child in list(self._children.values()):
            poison = getattr(child, "_poison", None)
            if poison is not None:
                poison(bits)
        if self._gm is not None:
            self._gm.poison(bits)
        if notify and self.size > 1:
            from .transport._base import ERROR_TAG

            note = np.array([self._nonce], dtype=np.int64)
            self._notices.append(note)  # kept alive until the HybridComm is freed
            for r in range(self.size):
                if r != self.rank:
                    self.comm.Isend(note, r, ERROR_TAG).Free()

    @staticmethod
    def _call(kind, count, dtype, op):
        name = _KIND_NAMES.get(int(kind), f"collective {kind}")
        if kind in (lib.HM_K_ALLREDUCE_TREE, lib.HM_K_ALLREDUCE_RD):
            name += " " + HybridComm._sig(count, dtype, op)
        return name

    def _bad_call(self, exc):
        """Raise ``exc``, a local argument error, after telling the peers: the call is made
        as a barrier with an 'invalid arguments' signature, which completes when every rank
        of the communicator found its arguments invalid (then the comm stays usable) and
        makes every other rank raise ValueError otherwise."""
        st = self._live
        if st is None or self.size == 1:
            raise exc
        rc = lib.hm_coll_bad(st)
        if rc == lib.HM_OK and self.num_nodes > 1:
            if self.is_leader:
                sig = self._leader_sig(lib.HM_K_BAD, 0, 0, 0, 0)
                if self._sig_differs(sig):
                    self._break("ValueError")
        if rc != lib.HM_OK:
            self._break(type(exc).__name__)
        raise exc

    def _leader_sig(self, kind, count, dt, opc, failed):
        """Allreduce (max) of the node signatures over the leaders: what each node called."""
        sig = self._sig_buf
        sig[:] = (failed, kind, -kind, count, -count, dt, -dt, opc, -opc)
        self._leader_call(self.leader_comm.Iallreduce,
                          (self._MPI.IN_PLACE, sig, self._MPI.MAX))
        return sig

    def _other_node_failed(self, sig, what):
        """At a leader: raise PeerError (breaking the comm poisons the node) if a node's call
        failed."""
        if sig[0] == _FAILED:
            raise self._peer_error(f"{what} (on another node)", None, ERRBIT)

    @staticmethod
    def _sig_differs(sig):
        return bool(sig[0] or sig[1] != -sig[2] or sig[3] != -sig[4] or sig[5] != -sig[6]
                    or sig[7] != -sig[8])

    def _timeout(self, msg, peer, counter, epoch, missing):
        self._break("SyncTimeout")
        return SyncTimeout(msg, rank=self.rank, peer=peer, counter=counter, epoch=epoch,
                           missing=missing)

    @staticmethod
    def _sig(count, dtype, op):
        return (f"(count={count}, dtype={_DTYPE_NAMES.get(dtype, dtype)}, "
                f"op={_OP_NAMES.get(op, op)})")

    def _leader_wait(self, req, what):
        """Complete an internode request, under the deadline if there is one.  A failure
        notice from a rank of another node (a Halo call failed there, so that rank will not
        join) ends the wait with PeerError."""
        stop = wait_requests(self, [req], self.timeout)
        if stop is None:
            return
        if stop.notice is not None:
            raise self._peer_error(what, stop.notice, ERRBIT)
        others = [r for r in range(self.leader_comm.Get_size()) if r != self.leader_comm.Get_rank()]
        raise self._timeout(
            f"hybridmpi: rank {self.rank} timed out after {self.timeout:g} s in {what}: "
            f"the leaders of other nodes (node ids {others}) did not all join",
            None, "internode", int(self._st.epoch), [])

    def _failure_notice(self):
        """The rank whose failure notice (``_break``) this rank received, else None."""
        from .transport._base import ERROR_TAG

        if self._notice_from is None:
            MPI = self._MPI
            status = MPI.Status()
            while self.comm.Iprobe(MPI.ANY_SOURCE, ERROR_TAG, status):
                note = np.empty(1, dtype=np.int64)
                self.comm.Recv(note, status.Get_source(), ERROR_TAG)
                if int(note[0]) == self._nonce:  # else left over from a freed HybridComm
                    self._notice_from = status.Get_source()
                    break
        return self._notice_from

    # ------------------------------------------------------------ barrier

    def barrier(self, *, method: str = "dissemination") -> None:
        """Block until every rank of the communicator has called it.

        Memory: every write that any rank made to shared memory before the
        call is visible to every rank after it (a "barrier", not a mere sync).

        Args:
            method: ``"dissemination"`` (the default: ceil(log2 n) rounds of
                pairwise signals, one hop at two ranks), ``"tree"`` (k-ary
                tree, paper Algorithm 2) or ``"linear"`` (all arrive at the
                node root, Algorithm 1).  Across nodes, dissemination and
                tree both gather the node up its tree, let the leaders meet
                in ``MPI_Barrier`` and release the node down the tree.

        Raises:
            ValueError: unknown method.
            SyncTimeout: a peer did not arrive within the timeout.
        """
        st = self._one_node_st
        if st is not None and method == "dissemination":
            rc = _barrier_diss(st)
            if rc:
                self._fail(rc, "barrier(dissemination)")
            return
        st = self._live
        if st is None:
            raise self._unusable()
        m = _BARRIERS.get(method) if type(method) is str else None
        if m is None:
            self._bad_call(ValueError(f"hybridmpi: barrier method must be one of {list(_BARRIERS)}, "
                                      f"got {method!r}"))
        if not self._leader_multi:
            if m == lib.HM_DISSEMINATION:
                # one phase only: on several nodes the node's ranks all take the tree
                rc = _barrier_diss(st) if self._one_node else _barrier_tree(st)
            elif m == lib.HM_TREE:
                rc = _barrier_tree(st)
            else:
                rc = _barrier_linear(st)
            if rc:
                self._fail(rc, f"barrier({method})")
            return
        if m == lib.HM_DISSEMINATION:
            m = lib.HM_TREE
        rc = lib.hm_barrier(st, m, lib.HM_GATHER)
        # The leaders meet in an allreduce of what their nodes called (a barrier too), so a
        # node that failed or called something else makes every node raise.
        kind = lib.HM_K_BARRIER_TREE if m == lib.HM_TREE else lib.HM_K_BARRIER_LINEAR
        sig = self._leader_sig(kind, 0, 0, 0, _FAILED if rc else 0)
        if rc:
            self._fail(rc, f"barrier({method})")
        self._other_node_failed(sig, f"barrier({method})")
        if self._sig_differs(sig):
            self._break("ValueError")
            raise ValueError(f"hybridmpi: rank {self.rank}: barrier({method}): the ranks of another node "
                             "failed or are in a different collective call")
        lib.hm_barrier(st, m, lib.HM_RELEASE)

    # ------------------------------------------------------------ allreduce

    def _reduce(self, sptr, rptr, count, dt, opc, total=None):
        """Reduce ``count`` elements (fitting in one slot) at raw addresses: one chunk of
        ``total`` elements (default ``count``), which the ranks' signatures hold."""
        st = self._st
        total = count if total is None else total
        if not self._leader_multi:
            if self._rd and total * lib.hm_dtype_size(dt) <= RD_BYTES:
                rc = lib.hm_allreduce_rd(st, sptr, rptr, count, dt, opc)
            else:
                rc = lib.hm_allreduce_chunk(st, sptr, rptr, count, total, dt, opc, 3)
            if rc:
                self._fail(rc, "allreduce")
            return
        rc = lib.hm_allreduce_chunk(st, sptr, rptr, count, total, dt, opc, lib.HM_GATHER)
        # The leaders first agree that every node passed the same arguments:
        # combining buffers of different sizes would be erroneous MPI, and a
        # node whose ranks disagreed or failed must not leave the others waiting.
        bad = _FAILED if rc else int(lib.hm_allreduce_verdict(st, 0) != -1)
        sig = self._leader_sig(lib.HM_K_ALLREDUCE_TREE, total, dt, opc, bad)
        if rc:
            self._fail(rc, "allreduce")
        self._other_node_failed(sig, "allreduce")
        if self._sig_differs(sig):
            lib.hm_allreduce_verdict(st, 1)
        elif count:
            dtype = _NP_OF_CODE[dt]
            slot = np.frombuffer(ffi.buffer(lib.hm_coll_slot(st, 0), count * dtype.itemsize),
                                 dtype=dtype)
            self._leader_call(self.leader_comm.Iallreduce,
                              (self._MPI.IN_PLACE, slot, self._mpi_ops[opc]))
        rc = lib.hm_allreduce_chunk(st, ffi.NULL, rptr, count, total, dt, opc, lib.HM_RELEASE)
        if rc:
            self._fail(rc, "allreduce")

    def _leader_call(self, nonblocking, args, what="allreduce"):
        """Run an internode collective (under the deadline if there is one); if it fails,
        the node's ranks waiting for this leader get its error bits."""
        try:
            self._leader_wait(nonblocking(*args), what)
        except BaseException:
            self._break("PeerError")
            raise

    def _buf(self, arr):
        """A cffi view of a contiguous array, cached for small arrays.

        Making the view costs more than a small reduction, so views of up to
        ``_CACHE_BYTES`` are kept (with their array, which then cannot be
        resized in place) for the next call with the same array.
        """
        hit = self._bufs.get(id(arr))
        if hit is not None and hit[0] is arr:
            return hit[1]
        buf = ffi.from_buffer("char[]", arr)
        if arr.nbytes <= _CACHE_BYTES:
            if len(self._bufs) >= _CACHE_ENTRIES:
                self._bufs.pop(next(iter(self._bufs)))
            self._bufs[id(arr)] = (arr, buf)
        return buf

    def _reduce_array(self, send, recv, dt, opc):
        """Reduce contiguous arrays of equal size, in slot-sized chunks."""
        n = recv.size
        itemsize = recv.itemsize
        rbuf = self._buf(recv)
        sbuf = rbuf if send is None else self._buf(send)
        per = SLOT_BYTES // itemsize
        for start in range(0, max(n, 1), per):
            k = min(per, n - start)
            off = start * itemsize
            self._reduce(sbuf + off, rbuf + off, k, dt, opc, n)

    def allreduce(self, x: Any, op: Any = "sum") -> Any:
        """Combine ``x`` over all ranks and return the result on every rank.

        The combination order is fixed (a tree over each node, then MPI
        across node leaders), so repeated runs give the same bits.

        Args:
            x: Python int, float or complex; numpy scalar; or numpy array of
                float64, float32, int64, int32 or complex128 (a copy is made
                if it is not contiguous).
            op: ``"sum"``, ``"prod"``, ``"min"``, ``"max"`` or the MPI ops.

        Returns:
            The result, of the same kind as ``x`` (a new array for arrays).

        Raises:
            TypeError: unsupported type or dtype, or min/max of complex.
            ValueError: unknown op; ranks of a node passed different sizes,
                dtypes or ops.
            SyncTimeout: a peer did not arrive within the timeout.
        """
        st = self._rd_st
        if st is not None and type(x) is float and type(op) is str:
            opc = _OPS.get(op)
            if opc is not None:
                r = _allreduce_rd_f64(st, x, opc)
                if r != r and st.err.code:
                    self._fail(st.err.code, "allreduce")
                return r
        st = self._live
        if st is None:
            raise self._unusable()
        try:
            opc = self._op(op)
            tx = type(x)
            if tx is float:
                buf = self._f64
                buf[0] = x
                dt, convert = _F64, _first
            elif tx is int:
                buf = self._scalar[_I64]
                try:
                    buf[0] = x
                except OverflowError:
                    raise ValueError(f"hybridmpi: allreduce: int {x} does not fit in int64") from None
                dt, convert = _I64, _first_int
            elif tx is complex:
                if opc >= lib.HM_MIN:
                    raise TypeError("hybridmpi: allreduce: min and max are not defined for complex")
                buf = self._scalar[_C128]
                buf[0] = x.real
                buf[1] = x.imag
                dt, convert = _C128, _complex
            elif isinstance(x, (np.ndarray, np.generic)):
                arr = np.asarray(x)
                dt = self._dtype_code(arr.dtype, opc, "allreduce")
                out = np.array(arr, order="C", copy=True)
            else:
                raise TypeError(f"hybridmpi: allreduce: unsupported type {tx.__name__}; pass an int, "
                                "float, complex, numpy scalar or numpy array")
        except (TypeError, ValueError) as exc:
            self._bad_call(exc)
        if tx is float and not self._leader_multi:
            r = _allreduce_rd_f64(st, x, opc) if self._rd else _allreduce_f64(st, x, opc)
            if r != r and st.err.code:
                self._fail(st.err.code, "allreduce")
            return r
        if isinstance(x, (np.ndarray, np.generic)):
            self._reduce_array(None, out, dt, opc)
            return out if isinstance(x, np.ndarray) else out[()]
        self._reduce(buf, buf, 1, dt, opc)
        return convert(buf)

    def _op(self, op):
        """The C core code of a reduction op (a name or an MPI op)."""
        opc = _OPS.get(op) if type(op) is str else None
        return op_code(op, self._MPI) if opc is None else opc

    @staticmethod
    def _dtype_code(dtype, opc, what):
        dt = DTYPES.get(dtype)
        if dt is None:
            raise TypeError(f"hybridmpi: {what}: unsupported dtype {dtype}; use one of "
                            f"{sorted(d.name for d in DTYPES)}")
        if dt == _C128 and opc >= lib.HM_MIN:
            raise TypeError(f"hybridmpi: {what}: min and max are not defined for complex")
        return dt

    def Allreduce(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: Any = "sum") -> None:
        """Combine numpy buffers over all ranks into ``recvbuf`` (in place).

        Args:
            sendbuf: C-contiguous numpy array, or ``MPI.IN_PLACE`` to use
                ``recvbuf`` as input.
            recvbuf: writeable C-contiguous numpy array with the same dtype
                and size as ``sendbuf``.
            op: as for :meth:`allreduce`.

        Raises:
            TypeError: not numpy arrays, unsupported dtype, min/max of complex.
            ValueError: non-contiguous or read-only buffers, size or dtype
                mismatch, unknown op, ranks that disagree.
            SyncTimeout: a peer did not arrive within the timeout.
        """
        st = self._live
        if st is None:
            raise self._unusable()
        try:
            opc = self._op(op)
            if type(recvbuf) is not np.ndarray:
                raise TypeError(f"hybridmpi: Allreduce: recvbuf must be a numpy array, "
                                f"got {type(recvbuf).__name__}")
            dt = self._dtype_code(recvbuf.dtype, opc, "Allreduce")
            flags = recvbuf.flags
            if not flags.c_contiguous:
                raise ValueError("hybridmpi: Allreduce: recvbuf must be C-contiguous")
            if not flags.writeable:
                raise ValueError("hybridmpi: Allreduce: recvbuf is read-only")
            if sendbuf is self._MPI.IN_PLACE:
                sendbuf = None  # type: ignore[assignment]
            elif type(sendbuf) is not np.ndarray:
                raise TypeError("hybridmpi: Allreduce: sendbuf must be a numpy array or "
                                f"MPI.IN_PLACE, got {type(sendbuf).__name__}")
            elif sendbuf.dtype != recvbuf.dtype or sendbuf.size != recvbuf.size:
                raise ValueError(f"hybridmpi: Allreduce: sendbuf ({sendbuf.dtype}, {sendbuf.size}) "
                                 f"and recvbuf ({recvbuf.dtype}, {recvbuf.size}) differ")
            elif not sendbuf.flags.c_contiguous:
                raise ValueError("hybridmpi: Allreduce: sendbuf must be C-contiguous")
        except (TypeError, ValueError) as exc:
            self._bad_call(exc)
        self._reduce_array(sendbuf, recvbuf, dt, opc)


_NP_OF_CODE = {code: dt for dt, code in DTYPES.items()}


def _first(buf):
    return buf[0]


def _first_int(buf):
    return int(buf[0])


def _complex(buf):
    return complex(buf[0], buf[1])
