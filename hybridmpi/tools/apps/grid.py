"""A block-decomposed structured grid with one-plane halos, and the ways to fill them.

Both stencil applications (heat3d, himeno) keep two arrays that take turns
(the step reads one and writes the other), so every exchange needs one
synchronization per step.  An exchange has three hooks around the step
that reads ``X`` and writes ``Y``:

- ``before(X)``: fill the halos of ``X`` (pull: Sendrecv, MPI messages,
  RMA gets; ``halo``: ``update_begin``);
- ``middle(X)``: between the inner cells and the shell next to the halos
  (``halo``: ``update_end``);
- ``after(Y)``: push the boundary planes of ``Y`` into the neighbours'
  halos of ``Y`` (coarray puts + ``sync_images``).
"""

import numpy as np

from ..._native.tables import mpi
from ...ghost.halo import Halo
from ...ghost.pattern import GhostPattern
from ...globalmem import Coarray, waitall


def split(n, parts, i):
    """(start, count) of block ``i`` of ``n`` cells in ``parts`` blocks (the first ones get one more)."""
    base, extra = divmod(n, parts)
    return i * base + min(i, extra), base + (i < extra)


class Grid:
    """The block of a global grid owned by this rank.

    Args:
        hc: the HybridComm.
        interior: global extents of the updated cells along the decomposed
            axes (the local array adds one halo plane on each side).
        full: extents of the axes that are not decomposed (the local array
            holds them whole).
        dims: ranks along each decomposed axis (default ``MPI.Compute_dims``).

    Attributes:
        dims, coords, lo (global index of the first owned cell per decomposed
        axis), owned (owned extents), shape (local array shape),
        neighbors: [(axis, side, rank)] with side -1 or +1.
    """

    def __init__(self, hc, interior, full=(), dims=None):
        MPI = mpi()
        self.hc = hc
        self.nd = len(interior)
        self.interior = tuple(interior)
        self.full = tuple(full)
        self.dims = list(dims) if dims else MPI.Compute_dims(hc.size, self.nd)
        if int(np.prod(self.dims)) != hc.size:
            raise ValueError(f"hybridmpi: Grid: dims {self.dims} do not multiply to {hc.size} ranks")
        for n, d in zip(self.interior, self.dims):
            if n < d:
                raise ValueError(f"hybridmpi: Grid: {n} cells cannot be split over {d} ranks")
        self.coords = self.coords_of(hc.rank)
        spans = [split(n, d, c) for n, d, c in zip(self.interior, self.dims, self.coords)]
        self.lo = tuple(s for s, _ in spans)
        self.owned = tuple(k for _, k in spans)
        self.shape = tuple(k + 2 for k in self.owned) + self.full
        self.neighbors = []
        for axis in range(self.nd):
            for side in (-1, 1):
                c = list(self.coords)
                c[axis] += side
                if 0 <= c[axis] < self.dims[axis]:
                    self.neighbors.append((axis, side, self.rank_of(c)))
        self.neighbor_ranks = sorted({r for _, _, r in self.neighbors})

    def coords_of(self, rank):
        """Coordinates of a rank (row-major, as MPI_Cart_create numbers them)."""
        coords = []
        for d in reversed(self.dims):
            coords.append(rank % d)
            rank //= d
        return tuple(reversed(coords))

    def rank_of(self, coords):
        r = 0
        for c, d in zip(coords, self.dims):
            r = r * d + c
        return r

    def shape_of(self, rank):
        """Local array shape of another rank."""
        coords = self.coords_of(rank)
        return tuple(split(n, d, c)[1] + 2 for n, d, c in zip(self.interior, self.dims, coords)) + self.full

    def plane(self, axis, side, halo, shape=None):
        """Index of the plane next to the side of ``axis``: the halo plane, or the owned plane
        that the neighbour on that side receives; the other decomposed axes span their owned
        cells, the full axes all of theirs.  ``shape``: another rank's array shape."""
        shape = shape or self.shape
        index = []
        for a in range(len(shape)):
            if a == axis:
                n = shape[a]
                index.append((0 if side < 0 else n - 1) if halo else (1 if side < 0 else n - 2))
            elif a < self.nd:
                index.append(slice(1, shape[a] - 1))
            else:
                index.append(slice(None))
        return tuple(index)

    def plane_shape(self, axis):
        """Shape of this rank's planes across ``axis`` (as :meth:`plane` indexes them)."""
        return tuple(n - 2 if a < self.nd else n for a, n in enumerate(self.shape) if a != axis)

    def gather(self, x, root=0):
        """The global interior (halos dropped) on ``root``, None elsewhere (collective)."""
        inner = np.ascontiguousarray(x[tuple(slice(1, -1) for _ in range(self.nd))])
        parts = self.hc.comm.gather((self.lo, inner), root=root)
        if self.hc.rank != root:
            return None
        whole = np.empty(self.interior + inner.shape[self.nd:], dtype=x.dtype)
        for lo, block in parts:
            whole[tuple(slice(s, s + k) for s, k in zip(lo, block.shape[:self.nd]))] = block
        return whole


class GridExchange:
    """Fills nothing: one rank alone, or the base of the others."""

    uses_coarrays = False

    def __init__(self, grid, dtype):
        self.grid = grid
        self.dtype = np.dtype(dtype)

    def arrays(self):
        """The two arrays the step alternates between (zeroed)."""
        return [np.zeros(self.grid.shape, self.dtype) for _ in range(2)]

    def before(self, x):
        pass

    def middle(self, x):
        pass

    def after(self, y):
        pass

    def free(self):
        pass


class SendRecv(GridExchange):
    """Flat MPI: ``Sendrecv`` of each face, one axis and side after the other."""

    def __init__(self, grid, dtype):
        super().__init__(grid, dtype)
        MPI = mpi()
        self.plan = []
        for axis in range(grid.nd):
            for side in (-1, 1):
                c = list(grid.coords)
                c[axis] += side
                dest = grid.rank_of(c) if 0 <= c[axis] < grid.dims[axis] else MPI.PROC_NULL
                c[axis] -= 2 * side
                src = grid.rank_of(c) if 0 <= c[axis] < grid.dims[axis] else MPI.PROC_NULL
                out = grid.plane(axis, side, False)
                into = grid.plane(axis, -side, True)
                buf = np.empty(grid.plane_shape(axis), self.dtype)
                self.plan.append((dest, src, out, into, buf))

    def before(self, x):
        comm = self.grid.hc.comm
        for dest, src, out, into, buf in self.plan:
            comm.Sendrecv(np.ascontiguousarray(x[out]), dest, 7, buf, src, 7)
            if src >= 0:
                x[into] = buf


class FaceMessages(GridExchange):
    """MPI ``Isend``/``Irecv`` of the faces: one axis after the other with a wait each
    (``per_axis``, the Himeno reference), or all at once with one wait."""

    def __init__(self, grid, dtype, per_axis):
        super().__init__(grid, dtype)
        self.groups = {}
        for axis, side, rank in grid.neighbors:
            into = grid.plane(axis, side, True)
            buf = np.empty(grid.plane_shape(axis), self.dtype)
            key = axis if per_axis else 0
            self.groups.setdefault(key, []).append((rank, grid.plane(axis, side, False), into, buf,
                                                    axis * 2 + (side > 0)))

    def before(self, x):
        comm, MPI = self.grid.hc.comm, mpi()
        for group in self.groups.values():
            # the tag says which face of the receiver the message fills
            reqs = [comm.Irecv(buf, rank, 9 + tag) for rank, _, _, buf, tag in group]
            sends = [np.ascontiguousarray(x[out]) for _, out, _, _, _ in group]
            reqs += [comm.Isend(s, rank, 9 + (tag ^ 1)) for (rank, _, _, _, tag), s in zip(group, sends)]
            MPI.Request.Waitall(reqs)
            for _, _, into, buf, _ in group:
                x[into] = buf


class FlatRMA(GridExchange):
    """Flat MPI RMA with no locality: a window on each array, ``Rget`` + ``Wait`` of each face
    from the neighbour's array (passive target, ``Lock_all``) between two ``MPI_Barrier``."""

    def __init__(self, grid, dtype):
        super().__init__(grid, dtype)
        self.plan = []
        from mpi4py.util import dtlib

        mpitype = dtlib.from_numpy_dtype(self.dtype)  # a new datatype, freed below
        self.types = []
        for axis, side, rank in grid.neighbors:
            shape = grid.shape_of(rank)
            src = grid.plane(axis, -side, False, shape)
            spans = [range(*i.indices(n)) if isinstance(i, slice) else range(i, i + 1)
                     for i, n in zip(src, shape)]
            subs = [len(r) for r in spans]
            t = mpitype.Create_subarray(list(shape), subs, [r.start for r in spans]).Commit()
            self.types.append(t)
            into = grid.plane(axis, side, True)
            self.plan.append((rank, t, into, np.empty(subs, self.dtype)))
        if not mpitype.is_predefined:
            mpitype.Free()
        self.wins = {}

    def arrays(self):
        MPI = mpi()
        xs = super().arrays()
        for x in xs:
            win = MPI.Win.Create(x, x.itemsize, comm=self.grid.hc.comm)
            win.Lock_all()
            self.wins[id(x)] = win
        return xs

    def before(self, x):
        comm = self.grid.hc.comm
        comm.Barrier()  # the neighbours' planes are written
        win = self.wins[id(x)]
        for rank, t, into, buf in self.plan:
            win.Rget(buf, rank, (0, 1, t)).Wait()
            x[into] = buf.reshape(x[into].shape)
        # MPI moves a get only while its target is inside MPI: nobody leaves for the
        # computation (or a shared-memory wait) before every get aimed at it is done
        comm.Barrier()

    def free(self):
        for win in self.wins.values():
            win.Unlock_all()
            win.Free()
        for t in self.types:
            t.Free()
        self.wins = {}


class CoarrayExchange(GridExchange):
    """The library's global memory: two coarrays of the largest local shape (each rank uses
    the corner of its own shape).  ``get``: blocking section gets of the neighbours' planes
    after ``sync_images``; ``get-nb``: the same with ``Rget`` and one ``waitall``; ``put``:
    puts of this rank's planes into the neighbours' halos (``nb``: ``Rput`` + ``waitall``),
    then ``sync_images``."""

    uses_coarrays = True

    def __init__(self, grid, dtype, mode):
        super().__init__(grid, dtype)
        self.mode = mode
        hc = grid.hc
        big = tuple(max(s) for s in zip(*[grid.shape_of(r) for r in range(hc.size)]))
        self.coarrays = [Coarray(hc, big, dtype) for _ in range(2)]
        mine = tuple(slice(0, n) for n in grid.shape)
        self.views = [c.local[mine] for c in self.coarrays]
        self.of = {id(v): c for v, c in zip(self.views, self.coarrays)}
        self.plan = []
        for axis, side, rank in grid.neighbors:
            shape = grid.shape_of(rank)
            into = grid.plane(axis, side, True)
            self.plan.append((rank, grid.plane(axis, -side, False, shape), into,
                              grid.plane(axis, -side, True, shape), grid.plane(axis, side, False),
                              np.empty(grid.plane_shape(axis), self.dtype)))
        self.nbrs = grid.neighbor_ranks

    def arrays(self):
        return self.views

    def before(self, x):
        if self.mode not in ("get", "get-nb"):
            return
        a = self.of[id(x)]
        a.sync_images(self.nbrs)
        if self.mode == "get":
            for rank, theirs, into, _, _, _ in self.plan:
                x[into] = a[rank][theirs]
            return
        waitall([a.Rget(rank, theirs, buf) for rank, theirs, _, _, _, buf in self.plan])
        for _, _, into, _, _, buf in self.plan:
            x[into] = buf

    def after(self, y):
        if self.mode not in ("put", "put-nb"):
            return
        a = self.of[id(y)]
        if self.mode == "put":
            for rank, _, _, their_halo, mine, _ in self.plan:
                a[rank][their_halo] = y[mine]
        else:
            waitall([a.Rput(rank, their_halo, np.ascontiguousarray(y[mine]))
                     for rank, _, _, their_halo, mine, _ in self.plan])
        a.sync_images(self.nbrs)

    def free(self):
        for c in self.coarrays:
            c.free()


class HaloExchange(GridExchange):
    """A :class:`~hybridmpi.Halo` on the grid's GhostPattern (the faces' cells, in the same
    row-major order on both sides): ``update_begin`` before the inner cells, ``update_end``
    before the shell."""

    def __init__(self, grid, dtype, method="atomic"):
        super().__init__(grid, dtype)
        ids = np.arange(int(np.prod(grid.shape))).reshape(grid.shape)
        send, recv = {}, {}
        for axis, side, rank in grid.neighbors:
            send[rank] = np.concatenate([send.get(rank, np.zeros(0, np.int64)),
                                         ids[grid.plane(axis, side, False)].ravel()])
            recv[rank] = np.concatenate([recv.get(rank, np.zeros(0, np.int64)),
                                         ids[grid.plane(axis, side, True)].ravel()])
        self.pattern = GhostPattern(grid.hc, send=send, recv=recv, size=ids.size)
        self.halo = Halo(self.pattern, dtype=self.dtype, method=method)
        self.flat = {}

    def arrays(self):
        xs = super().arrays()
        self.flat = {id(x): x.reshape(-1) for x in xs}
        return xs

    def before(self, x):
        self.halo.update_begin(self.flat[id(x)])

    def middle(self, x):
        self.halo.update_end(self.flat[id(x)])

    def free(self):
        self.halo.free()


def make_exchange(name, grid, dtype):
    """The exchange called ``name`` (see each application's list)."""
    if grid.hc.size == 1:
        return GridExchange(grid, dtype)
    if name == "sendrecv":
        return SendRecv(grid, dtype)
    if name in ("mpi", "mpi-nb"):
        return FaceMessages(grid, dtype, per_axis=name == "mpi")
    if name == "rma":
        return FlatRMA(grid, dtype)
    if name in ("get", "get-nb", "put"):
        return CoarrayExchange(grid, dtype, name)
    if name == "coarray":
        return CoarrayExchange(grid, dtype, "put-nb")
    if name == "halo":
        return HaloExchange(grid, dtype)
    raise ValueError(f"hybridmpi: unknown exchange {name!r}")
