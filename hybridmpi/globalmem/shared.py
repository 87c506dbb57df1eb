"""One copy per node: read-only arrays that every rank of a node reads from the same memory.

:func:`share` takes a numpy array (or a dict, list or tuple of them) from one rank and gives
every rank the same structure of read-only arrays with its values.  The bytes live once per
node, in the HybridComm's shared arena (the node leader's part of a block; the other ranks'
parts are empty): the node leaders receive them by MPI (a broadcast in pieces of at most
:data:`PIECE_BYTES`, so any size works), and every rank of a node views its leader's copy.
The ``fill=`` form writes straight into that memory instead, on one rank of each node or on
the root only.

Collective over the communicator, in the same order on every rank, and so are
:meth:`Shared.update` and :meth:`Shared.free`.  Shapes, dtypes and sizes are agreed on every
rank before any memory is taken: bad input raises the same exception on every rank, and what
was taken is given back.  The arrays follow the arena's rules: they keep their memory (and
values) past ``free()`` and the comm's free, never see another object's bytes, and the memory
goes back once no rank views it.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, NamedTuple

import numpy as np

from .._native import errmap as _errmap
from .._native.tables import mpi
from ..comm._agree import agree, barrier, complete, safe_repr
from ..comm._resource import Freed
from ..comm.arena import MAX_BYTES
from ..comm.dropin import hybrid
from ..comm.hybridcomm import HybridComm
from ..errors import FreedError, agreed, is_agreed

#: the most bytes one MPI broadcast between node leaders moves (a count that fits an int)
PIECE_BYTES = 2**30
#: each array starts on a boundary of this many bytes (a cache line; every dtype's alignment)
ALIGN = 64
#: the deepest nesting of dicts, lists and tuples taken (a structure that contains itself ends)
MAX_DEPTH = 32
#: where ``fill=`` runs: one rank of each node, or the root only (then the leaders' broadcast)
FILL_ON = ("root", "node")


class Spec(NamedTuple):
    """What every rank agrees on before any memory is taken."""

    #: the structure, arrays replaced by ``("a", i)`` (dicts ``("d", [(key, sub)])``, lists
    #: ``("l", [sub])``, tuples ``("t", [sub])``)
    template: Any
    #: (shape, dtype) of each array, in the template's order
    leaves: tuple
    #: byte offset of each array in the node's copy
    offsets: tuple
    #: bytes of the node's copy
    nbytes: int


def _layout(template: Any, leaves: list) -> Spec:
    offsets, total = [], 0
    for shape, dt in leaves:
        total = -(-total // ALIGN) * ALIGN
        offsets.append(total)
        total += math.prod(shape) * dt.itemsize
    if total > MAX_BYTES:
        raise ValueError(f"the arrays are {total} bytes, more than the {MAX_BYTES} a block may hold")
    return Spec(template, tuple(leaves), tuple(offsets), total)


def _leaf_dtype(dt: Any, path: str) -> np.dtype:
    try:
        dt = np.dtype(dt)
    except Exception as e:  # noqa: BLE001 - whatever numpy refuses is the caller's error
        raise TypeError(f"{path}: not a numpy dtype ({safe_repr(dt)}: {e})") from None
    if dt.hasobject:
        raise TypeError(f"{path}: dtype {dt} holds Python objects (pointers into one process), "
                        "which cannot be shared; use a fixed-size dtype")
    return dt


def _deeper(path: str, depth: int) -> None:
    if depth >= MAX_DEPTH:
        raise ValueError(f"{path}: nested deeper than {MAX_DEPTH} levels (a structure that "
                         "contains itself?)")


def _container(x: Any, path: str) -> tuple[str, list]:
    """(kind, [(key, child)]) of a dict, list or tuple; TypeError for anything else."""
    if isinstance(x, dict):
        for k in x:
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                raise TypeError(f"{path}: a dict key must be a str or an int, got {safe_repr(k)}")
        return "d", list(x.items())
    if isinstance(x, (list, tuple)):
        return ("t" if isinstance(x, tuple) else "l"), list(enumerate(x))
    raise TypeError(f"{path} is a {type(x).__name__}, not a numpy array (or a dict, list or "
                    "tuple of them)")


def _template(kind: str, subs: list) -> Any:
    return (kind, subs) if kind == "d" else (kind, [s for _, s in subs])


def _arrays(x: Any, path: str, depth: int, arrays: list, leaves: list) -> Any:
    if isinstance(x, np.ndarray):
        leaves.append((tuple(int(n) for n in x.shape), _leaf_dtype(x.dtype, path)))
        arrays.append(x)
        return ("a", len(arrays) - 1)
    _deeper(path, depth)
    kind, children = _container(x, path)
    return _template(kind, [(k, _arrays(v, f"{path}[{k!r}]", depth + 1, arrays, leaves))
                            for k, v in children])


def data_spec(x: Any) -> tuple[Spec, list]:
    """The root's arrays: their spec and the arrays, in the template's order."""
    if x is None:
        raise TypeError("the root passed None: the root passes the arrays (the other ranks None)")
    arrays: list = []
    leaves: list = []
    return _layout(_arrays(x, "x", 0, arrays, leaves), leaves), arrays


def _is_shape(s: Any) -> bool:
    """An int, or a tuple of ints (a shape, not a structure of shapes)."""
    def dim(n):
        return isinstance(n, (int, np.integer)) and not isinstance(n, (bool, np.bool_))
    return dim(s) or isinstance(s, tuple) and all(dim(n) for n in s)


def _sized(dtype: Any, dims: tuple, path: str) -> tuple[tuple, np.dtype]:
    """The shape and dtype of an array of ``dims`` elements of ``dtype`` as numpy makes it: a
    subarray dtype's dimensions join the shape; a string or void dtype needs its size."""
    dt = _leaf_dtype(dtype, path)
    if dt.subdtype is not None:
        base, sub = dt.subdtype
        dims, dt = dims + tuple(sub), base
    if dt.itemsize == 0 and dt.kind in "SUV" and dt.names is None:
        raise TypeError(f"{path}: dtype {dt.str} has no size (give one: S16, U8, V4)")
    return dims, dt


def _shapes(shape: Any, dtype: Any, path: str, depth: int, leaves: list) -> Any:
    if _is_shape(shape):
        dims = (int(shape),) if not isinstance(shape, tuple) else tuple(int(n) for n in shape)
        if any(n < 0 for n in dims):
            raise ValueError(f"shape{path}: a negative dimension in {dims}")
        # (a list where the shape is one: numpy's spelling of a record, [("a", "f8"), ...])
        leaves.append(_sized(dtype, dims, f"dtype{path}"))
        return ("a", len(leaves) - 1)
    per = isinstance(dtype, (dict, list))   # one dtype per array, in the shapes' structure
    _deeper(f"shape{path}", depth)
    kind, children = _container(shape, f"shape{path}")
    if per:
        dtypes = dict(_container(dtype, f"dtype{path}")[1])
        if set(dtypes) != {k for k, _ in children}:
            raise ValueError(f"dtype{path} has other keys or length than shape{path}")
    return _template(kind, [(k, _shapes(v, dtypes[k] if per else dtype, f"{path}[{k!r}]", depth + 1,
                                        leaves)) for k, v in children])


def fill_spec(shape: Any, dtype: Any) -> Spec:
    """The spec of ``shape=`` and ``dtype=`` (a shape, or a dict, list or tuple of them; one
    dtype, or a dict or list of them in the shapes' structure)."""
    leaves: list = []
    return _layout(_shapes(shape, dtype, "", 0, leaves), leaves)


def _build(template: Any, arrays: list) -> Any:
    kind, sub = template
    if kind == "a":
        return arrays[sub]
    if kind == "d":
        return {k: _build(t, arrays) for k, t in sub}
    out = [_build(t, arrays) for t in sub]
    return tuple(out) if kind == "t" else out


def _raised(e: Exception, rank: int, what: str) -> tuple[type[Exception], str]:
    """A user's exception as a problem every rank raises: its class where it is Python's own
    (every rank can load it) and can be made from a message, else RuntimeError."""
    cls: type[Exception] = type(e)
    try:
        cls("probe")
        if cls.__module__ != "builtins":   # a class of a module some rank may not have
            cls = RuntimeError
    except Exception:  # noqa: BLE001 - a class that needs other arguments
        cls = RuntimeError
    return cls, f"rank {rank}: {what} raised {type(e).__name__}: {safe_repr(e, 400)}"


def comm_of(comm: Any) -> HybridComm:
    """The HybridComm of ``comm`` (a HybridComm, an mpi4py intracommunicator, or None for
    ``MPI.COMM_WORLD``: the drop-ins' cached one)."""
    hc = comm if isinstance(comm, HybridComm) else hybrid(comm)
    if hc.closed:
        raise FreedError(f"hybridmpi: rank {hc.rank}: share() on a freed HybridComm")
    return hc


def _form(x: Any, shape: Any, dtype: Any, fill: Any, root: Any, fill_on: Any, hc: HybridComm,
          update: Spec | None) -> tuple[Any, Any]:
    """This rank's problem (or None) and what it says of its call: (form, root, fill_on, its
    spec or None); ``update``: the spec the values must keep."""
    me = hc.rank
    if isinstance(root, (bool, np.bool_)) or not isinstance(root, (int, np.integer)):
        return (TypeError, f"root must be an int, got {safe_repr(root)}"), None
    root = int(root)
    if not 0 <= root < hc.size:
        return (ValueError, f"root {root} is out of range (the communicator has {hc.size} ranks)"), None
    if fill_on not in FILL_ON:
        return (ValueError, f"fill_on must be one of {FILL_ON}, got {safe_repr(fill_on)}"), None
    form = "data" if fill is None else "fill"
    if form == "data" and (shape is not None or dtype is not None) and update is None:
        return (TypeError, "shape= and dtype= go with fill= (without it, the root's arrays "
                           "give them)"), None
    if form == "fill" and x is not None:
        return (TypeError, "x and fill= are two forms: pass one"), None
    if form == "fill" and not callable(fill):
        return (TypeError, f"fill must be callable, got {safe_repr(fill)}"), None
    spec = None
    if form == "fill":
        if update is None:
            if shape is None:
                return (TypeError, "fill= needs shape= (and dtype=) on every rank"), None
            spec = fill_spec(shape, np.float64 if dtype is None else dtype)
    elif me == root:
        spec = data_spec(x)[0]
    if update is not None and spec is not None and spec != update:
        return (ValueError, f"rank {me}: the new arrays' structure, shapes or dtypes "
                            f"{_described(spec)} differ from the shared ones {_described(update)}"), None
    return None, (form, root, fill_on, spec, hc.node_id)


def _described(spec: Spec) -> str:
    leaves = [f"{dt}{list(shape)}" for shape, dt in spec.leaves[:4]]
    more = f" and {len(spec.leaves) - 4} more" if len(spec.leaves) > 4 else ""
    return f"({', '.join(leaves)}{more})"


def _agreed_call(hc: HybridComm, problem: Any, said: Any, where: str) -> tuple[str, int, str, Spec, int]:
    """Agree on the call (every rank's problem first): form, root, fill_on, the spec and the
    root's node."""
    if problem is not None:
        problem = problem[0], (problem[1] if problem[1].startswith("rank ") else
                               f"rank {hc.rank}: {problem[1]}")
    views = agree(hc.comm, problem, where, data=said)
    for i, what in enumerate(("forms (x or fill=)", "roots", "fill_on")):
        if len({v[i] for v in views}) != 1:
            raise agreed(_errmap.ranks_differ(where, what, [v[i] for v in views]))
    form, root, fill_on = views[0][:3]
    if form == "data":
        spec = views[root][3]
    else:
        specs = [v[3] for v in views]
        if any(s is not None and s != specs[0] for s in specs):
            raise agreed(_errmap.ranks_differ(where, "shapes or dtypes", [_described(s) if s else
                                                                          "none" for s in specs]))
        spec = specs[0]
    return form, root, fill_on, spec, views[root][4]


def _call(hc: HybridComm, where: str, x: Any, shape: Any, dtype: Any, fill: Any, root: Any,
          fill_on: Any, update: Spec | None = None) -> tuple[str, int, str, Spec, int]:
    """This rank's checks, then the agreement: every rank raises the same error, or none."""
    try:
        problem, said = _form(x, shape, dtype, fill, root, fill_on, hc, update)
    except (TypeError, ValueError) as e:
        problem, said = (type(e), str(e)), None
    except Exception as e:  # noqa: BLE001 - a __repr__, __index__ or dtype that raises
        problem, said = (TypeError, f"an argument could not be checked ({type(e).__name__}: {e})"), None
    return _agreed_call(hc, problem, said, where)


class Shared(Freed):
    """Arrays with one copy per node, read-only on every rank (:func:`share` returns their
    :attr:`value`; this object also replaces their values and gives their memory back).

    Collective over the communicator; see :func:`share` for the arguments.

    Attributes:
        hc: the HybridComm.
        root, fill_on: as given.
        nbytes: bytes of each node's copy (its arrays, each starting on a 64-byte boundary).
        closed: True once :meth:`free` was called.
    """

    RECORDED_AS = "Shared"

    def __init__(self, x: Any = None, root: int = 0, comm: Any = None, *, shape: Any = None,
                 dtype: Any = None, fill: Any = None, fill_on: str = "root") -> None:
        hc = comm_of(comm)
        self.hc = hc
        self.closed = True
        self._value: Any = None
        form, self.root, self.fill_on, spec, self._root_node = _call(hc, "share()", x, shape, dtype,
                                                                     fill, root, fill_on)
        self._spec = spec
        self.nbytes = spec.nbytes
        self._block = hc.arena.alloc(spec.nbytes if hc.is_leader else 0, "share()")
        try:
            self._move(form, x, fill, scratch=False)
        except Exception as e:
            if is_agreed(e):   # every rank is here: the memory goes back (collective)
                self._block.free()
            raise
        self._value = _build(spec.template, self._over("read"))
        self.closed = False
        ctx = hc.context
        #: its number among the comm's shared arrays, the same on every rank (made collectively,
        #: in one order): free() checks that every rank frees the same one
        self._serial = next(ctx.service("share_serials", lambda _ctx: itertools.count(1)))
        ctx.adopt(self)

    @property
    def value(self) -> Any:
        """The read-only arrays, in the structure the root passed (dicts, lists and tuples;
        a tuple's subclass comes back as a tuple).

        Raises:
            FreedError: after :meth:`free`.
        """
        if self._value is None:
            raise FreedError(f"hybridmpi: rank {self.hc.rank}: Shared.value after free()")
        return self._value

    def _over(self, kind: str) -> list:
        """The arrays, in the template's order: over this node's copy, read-only (``"read"``)
        or writable (``"node"``), or private ones to fill (``"private"``)."""
        spec, leader = self._spec, self.hc.node_ranks[0]
        if kind == "private":
            return [np.empty(shape, dtype=dt) for shape, dt in spec.leaves]
        return [self._block.array(dt, math.prod(shape), leader, offset=off,
                                  readonly=kind == "read").reshape(shape)
                for (shape, dt), off in zip(spec.leaves, spec.offsets, strict=True)]

    def _write(self, form: str, x: Any, fill: Any, scratch: bool) -> tuple[Any, list | None]:
        """This rank's part of writing the values: the root's arrays copied in, or ``fill``
        run where it runs.  Returns (the problem, or None; the private arrays it filled)."""
        hc, spec = self.hc, self._spec
        fills = form == "fill" and (self.fill_on == "node" and hc.is_leader or
                                    self.fill_on == "root" and hc.rank == self.root)
        made = None
        try:
            if form == "data" and hc.rank == self.root:
                for dst, src in zip(self._over("node"), data_spec(x)[1], strict=True):
                    np.copyto(dst, src, casting="no")
            elif fills:
                made = self._over("private" if scratch else "node")
                fill(_build(spec.template, made))
        except Exception as e:  # noqa: BLE001 - the user's function or input: every rank hears
            return _raised(e, hc.rank, "fill" if fills else "copying x"), made
        except BaseException as e:   # an interrupt, an exit: this rank's own; the peers
            hc.context.break_comm(f"an exception on this rank ({type(e).__name__})")  # hear
            raise
        return None, made

    def _move(self, form: str, x: Any, fill: Any, *, scratch: bool) -> None:
        """The values into every node's copy (collective): the root's arrays copied in, or
        ``fill`` run on its ranks (into private arrays first when ``scratch``: an update that
        raises leaves the old values), then the leaders' broadcast, then every rank waits."""
        hc, spec = self.hc, self._spec
        ctx = hc.context
        problem, made = self._write(form, x, fill, scratch)
        agree(hc.comm, problem, "share() writing the values")
        if scratch and form == "fill":   # every filler succeeded: the values go in now
            for dst, src in zip(self._over("node") if made else (), made or (), strict=True):
                np.copyto(dst, src, casting="no")
            # whole before the node's leader sends them (the root may not be the leader)
            barrier(ctx, hc.node_comm, "share()")
        del made
        if hc.num_nodes > 1 and hc.is_leader and spec.nbytes and (form == "data" or self.fill_on == "root"):
            MPI = mpi()
            node = self._block.array(np.dtype(np.uint8), spec.nbytes, hc.node_ranks[0])
            for off in range(0, spec.nbytes, PIECE_BYTES):
                piece = node[off:off + PIECE_BYTES]
                complete(ctx, hc.leader_comm,
                         hc.leader_comm.Ibcast([piece, MPI.BYTE], root=self._root_node), "share()")
            del node, piece
        barrier(ctx, hc.comm, "share()")   # every node's copy is whole before any rank reads it

    def update(self, x: Any = None, *, fill: Any = None) -> None:
        """Replace the values (collective): the root's new arrays (``x``, the same structure,
        shapes and dtypes), or ``fill`` run as at creation.  Every rank sees the old values
        until it calls, and the new ones once the call returns; never a mix (a ``fill`` that
        raises leaves the old values: it writes into private arrays, copied in once every
        filler succeeded).

        Raises:
            ValueError: on every rank, when the root's arrays differ in structure, shape or
                dtype (nothing is written).
            FreedError: after :meth:`free`.
        """
        if self.closed:
            raise FreedError(f"hybridmpi: rank {self.hc.rank}: Shared.update() after free()")
        form = _call(self.hc, "Shared.update()", x, None, None, fill, self.root,
                              self.fill_on, update=self._spec)[0]
        self._move(form, x, fill, scratch=True)

    def free(self) -> None:
        """Give the memory back (collective, every rank freeing its shared arrays in the same
        order).  Idempotent.  Arrays kept past it keep their values; the memory goes once no
        rank views it.

        Raises:
            RuntimeError: on every rank, when ranks free different Shared objects (nothing is
                freed: free them in one order).
        """
        ctx = self.hc.context
        if self.closed:
            ctx.disown(self)
            return
        finalized = mpi().Is_finalized()
        if not finalized:
            ctx.agree_free(f"Shared {self._serial}")
        ctx.disown(self)
        self.closed = True
        self._value = None   # the arrays this object held: gone now unless the caller keeps them
        block, self._block = self._block, None
        shared = False
        hc = self.hc
        if hc.size > hc.num_nodes and not finalized:   # node peers view the leader's part
            viewed = ctx.agree_views(f"Shared {self._serial} views", block.pins > 0)
            shared = viewed is None or any(viewed)
        block.free(shared=shared)

    def __repr__(self) -> str:
        state = "freed" if self.closed else f"{len(self._spec.leaves)} arrays, {self.nbytes} bytes a node"
        return f"<Shared rank {self.hc.rank}/{self.hc.size} root {self.root}, {state}>"


def share(x: Any = None, root: int = 0, comm: Any = None, *, shape: Any = None, dtype: Any = None,
          fill: Any = None, fill_on: str = "root") -> Any:
    """The root's arrays on every rank, read-only, with one copy per node (collective).

    Two forms:

    - ``share(x, root)``: on ``root``, ``x`` is a numpy array of any fixed-size dtype
      (structured too), or a dict (str or int keys), list or tuple of them, nested; the other
      ranks pass None (what they pass is not read).  The node leaders receive the bytes by MPI
      once; every rank of a node views its node's copy.
    - ``share(shape=..., dtype=..., fill=f)``, with the same arguments on every rank: ``f(out)``
      writes the values into ``out``, writable arrays over the shared memory in the structure
      of ``shape`` (a shape, or a dict, list or tuple of shapes; ``dtype`` one dtype, or a
      dict or list of them in that structure; default float64).  With ``fill_on="root"`` it
      runs on ``root`` only, then the leaders' broadcast (where the source exists only there);
      with ``fill_on="node"`` on one rank of each node (where every node can read the source),
      and nothing moves between nodes.  ``f`` must not keep ``out``.

    Args:
        x: the root's arrays (data form).
        root: the rank whose arrays (or ``fill``) give the values; the same on every rank.
        comm: a HybridComm, an mpi4py intracommunicator (its cached HybridComm, as the
            drop-ins), or None: ``MPI.COMM_WORLD``.

    Returns:
        The same structure of read-only numpy arrays (C order) on every rank, identical to the
        root's.  Their memory lives until the comm is freed (:class:`Shared` gives it back
        sooner), and past it while an array views it.

    Raises:
        TypeError: on every rank: the root's ``x`` is None, not arrays, holds object arrays;
            a bad ``root``, ``shape``, ``dtype`` or ``fill``.
        ValueError: on every rank: ``root`` out of range, ranks passing different roots,
            forms, ``fill_on``, shapes or dtypes; more than ``arena.MAX_BYTES``.
        MemoryError: on every rank, when a node's copy does not fit in /dev/shm (the message
            says how much is free).
        FreedError: the HybridComm was freed.
        The exception of ``fill`` (its class where it can be rebuilt from a message, else
        RuntimeError), on every rank; nothing is kept.
    """
    return Shared(x, root, comm, shape=shape, dtype=dtype, fill=fill, fill_on=fill_on).value
