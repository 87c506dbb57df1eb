"""The collectives of a HybridComm: barrier, allreduce and Allreduce.

Inside a node they run in the C core on the HybridComm's shared segments; across
nodes each node's leader joins the other leaders between the node's gather and release
phases, in the C core too (``cext/hm_net.c``, which the PMPI library runs as well; the
leaders' ``hm_net`` is made in ``_net.py``).  :class:`Collectives` is an object the
:class:`~hybridmpi.HybridComm` owns (made with the comm, over its C state and segments), and
:class:`Plan` how it runs them, chosen once when the comm is made; the set-up, breaking and
the failure notices are in ``hybridcomm.py``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from .._native import errmap as _errmap
from .._native.clib import Coll, ffi, lib
from .._native.tables import DTYPES, OPS, op_code
from ..errors import FreedError, agreed
from ._agree import exchange, unusable
from ._context import earlier_error
from ._net import Net

_F64, _C128 = lib.HM_F64, lib.HM_C128
_PYINT, _SUM, _PROD = lib.HM_PYINT, lib.HM_SUM, lib.HM_PROD
_INF = float("inf")
#: integers of smaller magnitude are exact in a float64
_EXACT = 2**53
# The tables' lookups bound once: a name imported with "from" is called as a module
# attribute would be (no LOAD_METHOD in CPython 3.11), 0.1 us more per call.
_op_of = OPS.get
_dtype_of = DTYPES.get
_barrier_tree = lib.hm_barrier_tree
_barrier_linear = lib.hm_barrier_linear
_BARRIERS = {"dissemination": lib.HM_DISSEMINATION, "tree": lib.HM_TREE, "linear": lib.HM_LINEAR}
#: the kind a leader tells the other leaders for each barrier method across nodes
_BARRIER_KINDS = {lib.HM_DISSEMINATION: lib.HM_K_BARRIER_DISS, lib.HM_TREE: lib.HM_K_BARRIER_TREE,
                  lib.HM_LINEAR: lib.HM_K_BARRIER_LINEAR}
#: bytes of each rank's reduction slot; longer arrays go in chunks
SLOT_BYTES = 256 * 1024
# cffi views of arrays up to this size are cached between calls
_CACHE_BYTES = 64 * 1024
_CACHE_ENTRIES = 16
#: offset of the word in which a node's leader publishes the collective call whose internode
#: part it waits on (read by a rank of its node that timed out waiting on it, which then names
#: the other nodes)
LEADER_WAIT = lib.HM_OFF_ENTERED + lib.HM_OFF_LEADER_WAIT
#: the default of a required argument, so that its absence is agreed as an invalid call
_NO_ARG: Any = object()


class Plan(NamedTuple):
    """How this rank's collectives run, chosen once when the comm is made: the one place that
    decides which path a call takes (:meth:`Collectives.serve` gives the comm's ``Calls`` table
    a ``Coll`` for each C call named here, and the methods take the same ones).  The ranks of a
    node agree on every field but ``leader_multi`` and what follows from it."""

    #: every rank is on one node: the node's part is the whole call
    one_node: bool
    #: this rank leads its node and there are several nodes: the leaders' MPI calls go between
    #: the node's gather and release phases (the C core's hm_net_*, called from Python)
    leader_multi: bool
    #: the C core may choose the allreduce's algorithm by size (recursive doubling up to
    #: HM_RD_BYTES, the direct one, the tree: ``hm_allreduce_node``'s ``any``; one node of several
    #: ranks, and ``allreduce="recursive_doubling"``)
    recursive_doubling: bool
    #: the C core's call that is this rank's whole part of a dissemination barrier (several
    #: nodes: the node's tree, the leader's MPI call in between), or None
    node_barrier: str | None
    #: the same for an allreduce of one float
    node_allreduce: str | None
    #: every rank calls MPI's own barrier and allreduce over the comm (the tuning table chose
    #: them for this layout: ``hm_net_mpi_*``), with no part on the node
    mpi: bool = False

    @classmethod
    def of(cls, num_nodes: int, node_size: int, is_leader: bool, allreduce: str, *,
           mpi: bool = False) -> Plan:
        one_node = num_nodes == 1
        if mpi:
            return cls(one_node, False, False, "hm_barrier_mpi", "hm_allreduce_mpi_f64", True)
        leader_multi = is_leader and num_nodes > 1
        # recursive doubling needs the whole node in one phase: one node only
        rd = allreduce == "recursive_doubling" and one_node and node_size > 1
        if leader_multi:
            return cls(one_node, True, rd, None, None)
        return cls(one_node, False, rd, "hm_barrier_dissemination" if one_node else "hm_barrier_tree",
                   "hm_allreduce_rd_f64" if rd else "hm_allreduce_f64")


class Collectives:
    """barrier, allreduce and Allreduce of a HybridComm (which makes it, and serves its
    operations by it: :meth:`serve`).

    Args:
        hc: the comm (its layout, communicators, timeout and context are read once).
        st: the C core's collective state over the node's segments ``segs``.
        plan: how the calls run (:class:`Plan`).
        leaders: each node's leader and host, by node id.
        break_comm, peer_error: its Context's (``Context.break_comm`` and ``Context.peer_error``).
    """

    __slots__ = ("rank", "size", "num_nodes", "node_size", "node_id", "node_ranks", "is_leader",
                 "comm", "leader_comm", "timeout", "context", "_MPI", "_st", "_live", "_segs",
                 "_leaders", "plan", "_leader_multi", "_rd", "_node_barrier", "_node_allreduce",
                 "_f64", "_scalar", "_net", "_net_keep", "_mpi", "_mpi_comm", "_arrays", "_arrays_name",
                 "_bufs", "_mpi_ops", "_int_bounds", "_broken", "_broken_words", "_break",
                 "_peer_error")

    rank: int
    size: int
    num_nodes: int
    node_size: int
    node_id: int
    is_leader: bool
    comm: Any
    leader_comm: Any
    timeout: float | None
    context: Any
    _node_barrier: Any     # the plan's C calls (cffi functions), None for a leader across nodes
    _node_allreduce: Any

    def __init__(self, hc: Any, st: Any, segs: Any, plan: Plan, leaders: list[tuple[int, str]], *,
                 break_comm: Callable[..., None], peer_error: Callable[..., Exception]) -> None:
        for name in ("rank", "size", "num_nodes", "node_size", "node_id", "is_leader", "comm",
                     "leader_comm", "timeout", "context"):
            setattr(self, name, getattr(hc, name))
        self.node_ranks = tuple(hc.node_ranks)
        MPI = self._MPI = hc.context.MPI
        self._st = st
        self._live = st      # None once freed or broken: one check on every call
        self._segs = segs
        self._leaders = leaders
        #: how the calls run; what every call reads of it is also kept as attributes
        self.plan = plan
        self._leader_multi, self._rd = plan.leader_multi, plan.recursive_doubling
        self._node_barrier = getattr(lib, plan.node_barrier) if plan.node_barrier else None
        self._node_allreduce = getattr(lib, plan.node_allreduce) if plan.node_allreduce else None
        #: the C call of an array's whole allreduce off a leader across nodes (the C call
        #: objects take its address)
        self._arrays_name = "hm_allreduce_mpi" if plan.mpi else "hm_allreduce_node"
        self._arrays = getattr(lib, self._arrays_name)
        self._f64 = ffi.new("double[1]")
        self._scalar = {lib.HM_I64: ffi.new("int64_t[1]"), lib.HM_C128: ffi.new("double[2]")}
        # a leader across nodes: the C core's side between the nodes, over the leaders' comm;
        # MPI's own calls: the same over a communicator of every rank that nothing else uses
        # (a call that timed out may stay pending there, and must not meet the agreements made
        # over hc.comm): the leaders' one where every rank leads its node, else a duplicate
        self._mpi = plan.mpi
        self._mpi_comm = None
        self._net_keep: Net | None = None
        if plan.mpi:
            self._mpi_comm = hc.leader_comm if hc.num_nodes == hc.size else hc.comm.Dup()
            self._net_keep = Net(self._mpi_comm, hc.context.notices, MPI, mpi=True,
                                 blocking=hc.timeout is None)
        else:
            self._net_keep = Net(hc.leader_comm, hc.context.notices, MPI) if plan.leader_multi else None
        self._net = self._net_keep.net if self._net_keep else ffi.NULL
        if plan.mpi:
            st.net = self._net
        self._bufs: dict[Any, Any] = {}
        self._mpi_ops = [MPI.SUM, MPI.PROD, MPI.MIN, MPI.MAX]
        self._int_bounds: tuple[int, ...] | None = None  # set on the first allreduce of a Python int
        self._broken: str | None = None
        self._broken_words = ""
        self._break = break_comm
        self._peer_error = peer_error

    #: the comm's operations that this object runs
    OPERATIONS = ("barrier", "allreduce", "Allreduce")

    def serve(self, calls: Any) -> None:
        """Serve the comm's operations (its ``Calls`` table): by these methods, and where the
        plan names a C call (one node, or off a leader across nodes), by that one call
        (``Coll``: ``barrier()``, ``allreduce`` of a float or an array and ``Allreduce``, about
        0.1 us less than a Python method and a cffi call for a float, 1-2 us less for an
        array), which declines anything else."""
        for name in self.OPERATIONS:
            calls.delegate(name, getattr(self, name))
        if self._leader_multi:
            return
        MPI = self._MPI
        address = int(ffi.cast("uintptr_t", self._st))
        arrays = (int(ffi.cast("uintptr_t", ffi.addressof(lib, self._arrays_name))), self._rd,
                  np.ndarray, dict(DTYPES), MPI.IN_PLACE, tuple(self._mpi_ops))
        for kind, name, fn, what in ((0, "barrier", self.plan.node_barrier, "barrier(dissemination)"),
                                     (1, "allreduce", self.plan.node_allreduce, "allreduce"),
                                     (2, "Allreduce", None, "allreduce")):
            fn_address = int(ffi.cast("uintptr_t", ffi.addressof(lib, fn))) if fn else 0
            calls.serve(name, Coll(kind, address, fn_address,
                                   functools.partial(self._fail, what=what), OPS, arrays))

    def stop(self, why: str | None, by: int | None = None, raised: str | None = None) -> None:
        """Every later call raises: the comm broke (``why``; ``by``: the peer whose error this
        rank met, when known) or was freed (None)."""
        self._live = None
        if why is None:
            self._st = None
            self._bufs = {}
        elif self._broken is None:
            self._broken, self._broken_words = why, earlier_error(why, by, raised)

    def pending_between_nodes(self) -> Any:
        """The leaders' ``Net`` while a request of it is incomplete (a wait between the nodes
        failed: MPI may still write into its buffers), else None."""
        keep = self._net_keep
        return keep if keep is not None and lib.hm_net_pending(keep.net) else None

    def free_between_nodes(self) -> None:
        """Free the leaders' MPI objects of the ``Net`` (its ops), when no request of it is
        pending (:meth:`pending_between_nodes` is None); before the leaders' comm."""
        if self._net_keep is not None:
            self._net_keep.free()

    def own_comm(self) -> Any:
        """The duplicate communicator that MPI's own calls run on, where this object made one
        (the comm frees it as its own: kept where a failed call broke it), else None."""
        return self._mpi_comm if self._mpi_comm is not None and self._mpi_comm != self.leader_comm \
            else None

    def _bad_call(self, exc):
        """Raise ``exc``, a local argument error, after telling the peers: the call is made
        as a barrier with an 'invalid arguments' signature, which completes when every rank
        of the communicator found its arguments invalid (then the comm stays usable) and
        makes every other rank raise ValueError otherwise."""
        st = self._live
        if st is None or self.size == 1 or self._mpi:   # MPI's own calls: as MPI, this rank's
            raise exc                                   # error is its own (the guide's tuning)
        rc = lib.hm_coll_bad(st)
        if _errmap.ok(rc) and self._leader_multi:
            net_rc = lib.hm_net_bad(st, self._net)
            if net_rc:   # another node's call was valid (ValueError), or the leaders' call failed
                self._fail(net_rc, _errmap.KIND_NAMES[lib.HM_K_BAD], exc)
        if not _errmap.ok(rc):
            self._break(type(exc).__name__)
        elif self._live is not None:   # every rank found its arguments invalid: the comm is usable
            agreed(exc)
        raise exc

    def _bad_args(self, call, args, kwargs, missing):
        """An allreduce called with other arguments than ``call`` takes: TypeError on every rank
        (``missing``: what it lacked, in words, or '')."""
        self._bad_call(TypeError(f"hybridmpi: {call} got {len(args)} more argument(s), keywords "
                                 f"{sorted(kwargs)}{missing}"))

    # ------------------------------------------------------------ errors

    def _fail(self, rc, what, local=None):
        """Raise the exception of a C core collective call that returned ``rc`` (the error map:
        :func:`hybridmpi._native.errmap.collective`), breaking the comm where the map says so;
        ``local``, this rank's own argument error, rather than a disagreement's."""
        st = self._st
        if self._mpi:
            what = f"{what} (MPI's own call)"
        exc, why, notify = _errmap.collective(
            rc, st.err, what, rank=self.rank, node_ranks=self.node_ranks, timeout=self.timeout,
            other_node_invalid=self._leader_multi and self._net.sig[1] == lib.HM_K_BAD,
            leader_note=lambda: self._leader_waits(int(st.epoch)),
            leaders_waited=lambda call: (self._other_leaders()
                                         if self._leader_waits_on_nodes(call) else None),
            missing=self.not_entered, other_leaders=self._other_leaders, local=local,
            mpi_call=self._mpi)
        if why is not None:
            self._break(why, notify=notify, by=getattr(exc, "peer", None), raised=type(exc).__name__)
        raise exc

    def not_entered(self):
        """The ranks of this node that have not entered the current collective call."""
        epoch = self._st.epoch
        return [self.node_ranks[r] for r in range(self.node_size)
                if lib.hm_load(self._segs[r] + lib.HM_OFF_ENTERED, lib.HM_ACQ_REL) < epoch]

    def _leader_waits_on_nodes(self, call):
        """Whether this rank is not its node's leader and the leader waits on the other nodes in
        collective call ``call`` (the word it publishes before that wait)."""
        return self.num_nodes > 1 and not self.is_leader and \
            lib.hm_load(self._segs[0] + LEADER_WAIT, lib.HM_ACQ_REL) == call

    def _leader_waits(self, call):
        """What this node's leader waits on, when it waits on the other nodes in collective call
        ``call`` and this rank is not the leader; else ''."""
        if not self._leader_waits_on_nodes(call):
            return ""
        return (f"; this node's leader, rank {self.node_ranks[0]}, was waiting since call {call} on "
                f"the leaders of the other nodes, which had not all joined: {self._other_leaders()}")

    def _other_leaders(self):
        """The leaders of the other nodes and their hosts, in words."""
        return ", ".join(f"rank {r} (node {i}, host {h})" for i, (r, h) in enumerate(self._leaders)
                         if i != self.node_id)

    def _unusable(self):
        if self._broken is not None and self._st is not None:  # broken, not yet freed
            self.context.notices.progress()
            return unusable(self.rank, "this HybridComm is unusable after an earlier error "
                            f"{self._broken_words}; free it", self._broken)
        return FreedError(f"hybridmpi: rank {self.rank}: HybridComm used after free()")

    # ------------------------------------------------------------ the calls

    def barrier(self, *args: Any, method: str = "dissemination", **kwargs: Any) -> None:
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
            TypeError: any other argument (on every rank: the call is agreed invalid).
            SyncTimeout: a peer did not arrive within the timeout.
        """
        if args or kwargs:
            self._bad_call(TypeError(f"hybridmpi: barrier() takes only the keyword 'method', got "
                                     f"{len(args)} positional argument(s) and keywords {sorted(kwargs)}"))
        st = self._live
        if st is None:
            raise self._unusable()
        m = _BARRIERS.get(method) if type(method) is str else None
        if m is None:
            self._bad_call(ValueError(f"hybridmpi: barrier method must be one of {list(_BARRIERS)}, "
                                      f"got {method!r}"))
        if not self._leader_multi:
            if m == lib.HM_DISSEMINATION or self._mpi:
                rc = self._node_barrier(st)   # the plan's (several nodes: the node's tree)
            elif m == lib.HM_TREE:
                rc = _barrier_tree(st)
            else:
                rc = _barrier_linear(st)
            if rc:
                self._fail(rc, f"barrier({method})")
            return
        # The leaders meet in an allreduce of what their nodes called (a barrier too), so a
        # node that failed or called something else (another method too) makes every node raise.
        rc = lib.hm_net_barrier(st, self._net, lib.HM_TREE if m == lib.HM_DISSEMINATION else m,
                                _BARRIER_KINDS[m])
        if rc:
            self._fail(rc, f"barrier({method})")

    def _reduce(self, sptr, rptr, count, dt, opc):
        """Reduce ``count`` elements at raw addresses: the node's whole call, any size (the C
        core chooses the algorithm and chunks), or at a leader across nodes, the node's call
        with the leaders' between its gather and release phases."""
        if self._leader_multi:
            rc = lib.hm_net_allreduce(self._st, self._net, sptr, rptr, count, dt, opc)
        else:   # the plan's: the node's call, or MPI's own (the same form)
            rc = self._arrays(self._st, sptr, rptr, count, dt, opc, self._rd)
        if rc:
            self._fail(rc, "allreduce")

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

    def _overlap(self, a, b):
        """Whether the memory of C-contiguous arrays ``a`` and ``b`` overlaps without starting at
        the same address (the same buffer is reduced in place); their addresses from the cached
        views (``__array_interface__`` builds a dict per call: 1 us of a 5 us call)."""
        x = int(ffi.cast("uintptr_t", self._buf(a)))
        y = int(ffi.cast("uintptr_t", self._buf(b)))
        return x != y and x < y + b.nbytes and y < x + a.nbytes

    def _reduce_array(self, send, recv, dt, opc):
        """Reduce contiguous arrays of equal size."""
        rbuf = self._buf(recv)
        self._reduce(rbuf if send is None else self._buf(send), rbuf, recv.size, dt, opc)

    def allreduce(self, x: Any = _NO_ARG, op: Any = "sum", *args: Any, **kwargs: Any) -> Any:
        """Combine ``x`` over all ranks and return the result on every rank.

        The combination order is fixed (a tree over each node, then MPI
        across node leaders), so repeated runs give the same bits.

        Args:
            x: Python int, float or complex; numpy scalar; or numpy array of
                float64, float32, int64, int32 or complex128 (a copy is made
                if it is not contiguous).
            op: ``"sum"``, ``"prod"``, ``"min"``, ``"max"`` or the MPI ops.  Min and max of
                floats are IEEE 754-2019's minimum and maximum, whatever the algorithm and
                layout (a NaN gives a NaN; -0.0 is below 0.0); the complex product is C99's.

        Returns:
            The result, of the same kind as ``x`` (a new array for arrays).
            Python ints come back exact, of any size, as mpi4py's; numpy
            integers wrap on overflow, as MPI's reductions do.

        Raises:
            TypeError: unsupported type or dtype, or min/max of complex.
            ValueError: unknown op; ranks of a node passed different sizes,
                dtypes or ops.
            SyncTimeout: a peer did not arrive within the timeout.

        Any other argument (none, more than two, another keyword) raises TypeError on every
        rank: the call is agreed invalid.
        """
        if x is _NO_ARG or args or kwargs:
            self._bad_args("allreduce(x, op='sum')", args, kwargs, " and no x" if x is _NO_ARG else "")
        try:
            opc = self._op(op)
            tx = type(x)
            if tx is float or tx is int:
                pass  # below, after the agreement on bad arguments
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
        except Exception as exc:  # noqa: BLE001 - whatever it is, the peers must hear of it
            self._bad_call(exc)
        # usable? (checked after the arguments: an op's __eq__ or an array's __array__ may free it)
        st = self._live
        if st is None:
            raise self._unusable()
        if tx is float:
            if self._node_allreduce is not None:
                r = self._node_allreduce(st, x, opc)   # the plan's
                if r != r and st.err.code:
                    self._fail(st.err.code, "allreduce")
                return r
            buf, dt, convert = self._f64, _F64, _first
            buf[0] = x
        elif tx is int:
            return self._allreduce_int(x, opc)
        if isinstance(x, (np.ndarray, np.generic)):
            self._reduce_array(None, out, dt, opc)
            return out if isinstance(x, np.ndarray) else out[()]
        self._reduce(buf, buf, 1, dt, opc)
        return convert(buf)

    def _allreduce_int(self, x, opc):
        """The allreduce of a Python int, exact.

        It travels as a float64 (of its own type code, HM_PYINT, so that an int here and a
        float elsewhere is a mismatch) while that is exact: a value past the op's bound goes
        as an infinity.  Every rank then decides alike, whatever order combined the values:
        below 2**53 the result is exact (the bounds keep every partial sum there, and a
        product of nonzero factors never shrinks back below it once rounded; one with a 0
        factor is 0, or nan when an infinity went in); an infinity sent makes it inf or nan,
        and every rank takes the exact path.
        """
        bound = (self._int_bounds or self._set_int_bounds())[opc]
        buf = self._f64
        buf[0] = float(x) if -bound < x < bound else (_INF if x > 0 else -_INF)
        self._reduce(buf, buf, 1, _PYINT, opc)
        r = buf[0]
        if -_EXACT < r < _EXACT:
            return int(r)
        return self._exact_int(x, opc)

    def _set_int_bounds(self):
        """The bounds below which (in magnitude) a Python int goes as a float64, by op code:
        sum's keeps every partial sum of ``size`` values below 2**53; prod's keeps every
        partial product finite (an inf times a 0 would be nan in one order and 0 in another);
        min's and max's is 2**53."""
        bounds = [_EXACT] * len(OPS)
        bounds[_SUM] = _EXACT // self.size
        bounds[_PROD] = 2 ** max(1, min(53, 1023 // self.size))
        self._int_bounds = tuple(bounds)
        return self._int_bounds

    def _exact_int(self, x, opc):
        """The allreduce of Python ints, exact: every rank's int gathered (the agreements'
        exchange over the duplicated communicator: under the deadline, ended by a failure
        notice) and folded in rank order."""
        nbytes = (x.bit_length() + 8) // 8  # room for the sign bit
        raw = exchange(self.comm, x.to_bytes(nbytes, "little", signed=True),
                       "allreduce of Python ints (the exact path)", self.context)
        return _FOLDS[opc]([int.from_bytes(b, "little", signed=True) for b in raw])

    def _op(self, op):
        """The C core code of a reduction op (a name or an MPI op)."""
        opc = _op_of(op) if type(op) is str else None
        return op_code(op, self._MPI) if opc is None else opc

    @staticmethod
    def _dtype_code(dtype, opc, what):
        dt = _dtype_of(dtype)
        if dt is None:
            raise TypeError(f"hybridmpi: {what}: unsupported dtype {dtype}; use one of "
                            f"{sorted(d.name for d in DTYPES)}")
        if dt == _C128 and opc >= lib.HM_MIN:
            raise TypeError(f"hybridmpi: {what}: min and max are not defined for complex")
        return dt

    def Allreduce(self, sendbuf: np.ndarray = _NO_ARG, recvbuf: np.ndarray = _NO_ARG, op: Any = "sum",
                  *args: Any, **kwargs: Any) -> None:
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
        if sendbuf is _NO_ARG or recvbuf is _NO_ARG or args or kwargs:
            self._bad_args("Allreduce(sendbuf, recvbuf, op='sum')", args, kwargs,
                           " and not both buffers" if recvbuf is _NO_ARG else "")
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
            elif self._overlap(sendbuf, recvbuf):
                raise ValueError("hybridmpi: Allreduce: sendbuf and recvbuf overlap (and are not "
                                 "the same buffer); pass MPI.IN_PLACE as sendbuf to reduce in place")
        except Exception as exc:  # noqa: BLE001 - whatever it is, the peers must hear of it
            self._bad_call(exc)
        if self._live is None:   # (after the arguments, as in allreduce)
            raise self._unusable()
        self._reduce_array(sendbuf, recvbuf, dt, opc)



def _first(buf):
    return buf[0]


#: the exact fold of Python ints, in rank order, by op code
_FOLDS = {lib.HM_SUM: sum, lib.HM_PROD: math.prod, lib.HM_MIN: min, lib.HM_MAX: max}


def _complex(buf):
    return complex(buf[0], buf[1])
