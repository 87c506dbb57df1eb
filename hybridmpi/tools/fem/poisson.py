"""P1 finite elements for -Δu = f with Dirichlet data, solved by conjugate gradients.

Each rank assembles the matrix rows of its owned points over its local
cells (every tetrahedron touching an owned point), with ghost columns.
The load vector is assembled with every cell counted once (by the owner of
the cell's smallest global id) and the contributions to ghost points are
combined into their owners with ``Halo.reverse(op="add")``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..._extras import need_everywhere
from ...ghost.halo import Halo

if TYPE_CHECKING:
    from ...comm.hybridcomm import HybridComm
    from ..mesh.distribute import LocalMesh

# Degree-2 rule on the tetrahedron: four points, barycentric (a, b, b, b), weights 1/4.
_A, _B = 0.5854101966249685, 0.1381966011250105
QUAD = np.full((4, 4), _B)
np.fill_diagonal(QUAD, _A)


def _cell_geometry(points, cells):
    """Volumes and gradients of the four barycentric functions of every cell."""
    p = points[cells]
    jac = np.stack([p[:, 1] - p[:, 0], p[:, 2] - p[:, 0], p[:, 3] - p[:, 0]], axis=2)
    vol = np.abs(np.linalg.det(jac)) / 6
    inv = np.linalg.inv(jac)
    grads = np.empty((len(cells), 4, 3))
    grads[:, 1:, :] = inv
    grads[:, 0, :] = -inv.sum(axis=1)
    return vol, grads


def _quadrature_points(points, cells):
    """The four quadrature points of every cell: shape (cells, 4, 3)."""
    return np.einsum("qa,cad->cqd", QUAD, points[cells])


def _counted_here(lm):
    """Mask of the local cells this rank counts (it owns the cell's smallest global id)."""
    gid = lm.global_ids[lm.cells]
    first = np.take_along_axis(lm.cells, np.argmin(gid, axis=1)[:, None], axis=1)[:, 0]
    return first < lm.n_owned


def cube_boundary(hc: HybridComm, points: np.ndarray) -> np.ndarray:
    """Points on the faces of the global bounding box (the unit cube's boundary)."""
    lo = hc.allreduce(points.min(0) if len(points) else np.full(3, np.inf), "min")
    hi = hc.allreduce(points.max(0) if len(points) else np.full(3, -np.inf), "max")
    tol = 1e-10 * max(float((hi - lo).max()), 1.0)
    return np.any((np.abs(points - lo) <= tol) | (np.abs(points - hi) <= tol), axis=1)


class Poisson:
    """The assembled P1 system of -Δu = f, u = g on the boundary, on one rank's LocalMesh.

    Collective over ``hc``.

    Args:
        hc: the :class:`~hybridmpi.HybridComm`.
        lm: this rank's :class:`~hybridmpi.tools.mesh.LocalMesh`.
        f, g: callables mapping an ``(n, 3)`` array of points to ``n`` values.
        boundary: boolean mask over the local points (owned and ghost) of
            the Dirichlet points; default: the faces of the global bounding box.
        method: the Halo method of the ghost updates.

    Attributes:
        A: scipy.sparse CSR matrix, rows = owned points, columns = local ids;
            Dirichlet rows are identity rows and Dirichlet columns are moved
            to the right-hand side, so the system stays symmetric.
        b: right-hand side of the owned rows.
        n_inner: the first ``n_inner`` rows need no ghost value.
    """

    def __init__(self, hc: HybridComm, lm: LocalMesh, f: Callable[[np.ndarray], np.ndarray],
                 g: Callable[[np.ndarray], np.ndarray], *, boundary: np.ndarray | None = None,
                 method: str = "atomic") -> None:
        sp = need_everywhere(hc.comm, "scipy.sparse", "the FEM assembly")
        self.hc, self.lm = hc, lm
        n, size = lm.n_owned, lm.size
        vol, grads = _cell_geometry(lm.points, lm.cells)
        # Stiffness rows of the owned points, ghost columns included.
        k = vol[:, None, None] * np.einsum("cad,cbd->cab", grads, grads)
        rows = np.repeat(lm.cells, 4, axis=1).ravel()
        cols = np.tile(lm.cells, (1, 4)).ravel()
        own = rows < n
        a = sp.coo_matrix((k.ravel()[own], (rows[own], cols[own])), shape=(n, size)).tocsr()
        # Load vector: every cell once, ghost parts combined into their owners.
        mine = _counted_here(lm)
        cells = lm.cells[mine]
        qpts = _quadrature_points(lm.points, cells)
        fq = np.asarray(f(qpts.reshape(-1, 3)), dtype=np.float64).reshape(len(cells), 4)
        load = (vol[mine][:, None] / 4) * (fq @ QUAD)  # (cells, 4): sum_q w_q f(x_q) λ_a(x_q)
        b = np.zeros(size)
        np.add.at(b, cells.ravel(), load.ravel())
        self.halo = Halo(lm.pattern, method=method)
        self.halo.reverse(b, op="add")
        # Dirichlet data: known at every local point, owned or ghost.
        bnd = cube_boundary(hc, lm.points) if boundary is None else np.asarray(boundary, dtype=bool)
        if bnd.shape != (size,):
            raise ValueError(f"hybridmpi.tools.fem: boundary mask has shape {bnd.shape}, expected ({size},)")
        gval = np.zeros(size)
        gval[bnd] = np.asarray(g(lm.points[bnd]), dtype=np.float64)
        b = b[:n] - a @ gval
        keep = sp.diags((~bnd).astype(np.float64))
        a = (sp.diags((~bnd[:n]).astype(np.float64)) @ a @ keep).tocsr()
        a = (a + sp.coo_matrix((np.ones(int(bnd[:n].sum())), (np.flatnonzero(bnd[:n]),) * 2),
                               shape=(n, size))).tocsr()
        a.eliminate_zeros()
        b[bnd[:n]] = gval[:n][bnd[:n]]
        self.A, self.b, self.boundary, self.g_values = a, b, bnd, gval
        self.diag = a.diagonal()[:n] if n else np.zeros(0)
        # Rows with no ghost column come first in distribute's ordering; find
        # the split from the matrix so any numbering works.
        has_ghost = np.zeros(n, dtype=bool)
        if n:
            ghost_entries = a.indices >= n
            has_ghost[np.repeat(np.arange(n), np.diff(a.indptr))[ghost_entries]] = True
        self.inner = np.flatnonzero(~has_ghost)
        self.outer = np.flatnonzero(has_ghost)
        self.A_inner, self.A_outer = a[self.inner], a[self.outer]
        self.n_inner = int(self.inner.size)
        self._p: Any = None  # the shared search direction of cg()

    def matvec(self, p: np.ndarray, out: np.ndarray, exchange: Any = None) -> None:
        """out = A p; the ghost update of ``p`` overlaps the rows that need no ghost."""
        ex = exchange or self.halo
        ex.update_begin(p)
        out[self.inner] = self.A_inner @ p
        ex.update_end(p)
        out[self.outer] = self.A_outer @ p

    def cg(self, *, tol: float = 1e-10, maxiter: int | None = None, exchange: Any = None,
           allreduce: Any = None, fixed: int | None = None,
           shared: bool = True) -> tuple[np.ndarray, int, dict[str, float]]:
        """Jacobi-preconditioned conjugate gradients.

        Args:
            tol: stop when ||r|| <= tol ||b|| (2-norms over all ranks).
            maxiter: iteration limit (default 10 x the global unknowns).
            exchange: object with ``update_begin(x)``/``update_end(x)`` for
                the ghost updates (default this system's Halo).
            allreduce: ``f(float) -> float`` sum over ranks (default the
                hybrid ``hc.allreduce``).
            fixed: run exactly this many iterations (benchmarks), ignoring tol.
            shared: keep the search direction in a shared vector of the Halo
                (``Halo.vector()``, made at the first call and reused), whose
                updates inside a node read the owners' values in place; False:
                a private array.  Only with the system's own Halo.

        Returns:
            (x, iterations, seconds): the solution over the local points
            (ghosts updated), the iteration count, and the time spent in
            ``compute``, ``ghost`` (update_begin/update_end) and
            ``allreduce``, summed over iterations.
        """
        hc = self.hc
        red = allreduce or hc.allreduce
        n = self.lm.n_owned
        ex = exchange or self.halo
        if maxiter is None:
            maxiter = 10 * max(hc.allreduce(n), 1)
        x, q, r = self._cg_start(ex)
        d = np.where(self.diag != 0, self.diag, 1.0)
        z = r / d
        p = self._cg_direction(shared and exchange is None)
        p[:n] = z
        rz = red(float(r @ z))
        norm_b = red(float(self.b @ self.b)) ** 0.5 or 1.0
        t = {"compute": 0.0, "ghost": 0.0, "allreduce": 0.0}
        it = 0
        limit = fixed if fixed is not None else maxiter
        clock = time.perf_counter
        while it < limit:
            it += 1
            t0 = clock()
            ex.update_begin(p)
            t1 = clock()
            q[self.inner] = self.A_inner @ p
            t2 = clock()
            ex.update_end(p)
            t3 = clock()
            q[self.outer] = self.A_outer @ p
            pq = float(p[:n] @ q)
            t4 = clock()
            alpha = rz / red(pq)
            t5 = clock()
            x[:n] += alpha * p[:n]
            r -= alpha * q
            z = r / d
            rr, rz_local = float(r @ r), float(r @ z)
            t6 = clock()
            rr = red(rr)
            rz_new = red(rz_local)
            t7 = clock()
            p[:n] = z + (rz_new / rz) * p[:n]
            rz = rz_new
            t8 = clock()
            t["ghost"] += (t1 - t0) + (t3 - t2)
            t["compute"] += (t2 - t1) + (t4 - t3) + (t6 - t5) + (t8 - t7)
            t["allreduce"] += (t5 - t4) + (t7 - t6)
            if fixed is None and rr ** 0.5 <= tol * norm_b:
                break
        ex.update_begin(x)
        ex.update_end(x)
        return x, it, t

    def _cg_start(self, ex: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """cg()'s start: (x, q, r), x the Dirichlet values and zero elsewhere (ghosts updated by
        ``ex``), q = A x and the residual r = b - q."""
        n, size = self.lm.n_owned, self.lm.size
        x = np.zeros(size)
        x[self.boundary] = self.g_values[self.boundary]
        ex.update_begin(x)
        ex.update_end(x)
        q = np.empty(n)
        self.matvec(x, q, ex)
        r = self.b - q
        return x, q, r

    def _cg_direction(self, shared: bool) -> np.ndarray:
        """cg()'s search direction, zeroed: with ``shared``, the Halo's shared vector (made at
        the first call, collective like cg(), and reused); else a private array."""
        if shared:
            if self._p is None:
                self._p = self.halo.vector()  # collective, like cg()
            p = self._p
            p[...] = 0
        else:
            p = np.zeros(self.lm.size)
        assert p is not None
        return p

    def l2_error(self, x: np.ndarray, u: Callable[[np.ndarray], np.ndarray]) -> float:
        """||u_h - u||_L2 over the whole mesh (collective; ``x`` with ghosts updated)."""
        lm = self.lm
        mine = _counted_here(lm)
        cells = lm.cells[mine]
        vol, _ = _cell_geometry(lm.points, cells)
        qpts = _quadrature_points(lm.points, cells)
        uq = np.asarray(u(qpts.reshape(-1, 3)), dtype=np.float64).reshape(len(cells), 4)
        uh = x[cells] @ QUAD.T
        return self.hc.allreduce(float(((uh - uq) ** 2 @ np.full(4, 0.25) * vol).sum())) ** 0.5

    def free(self) -> None:
        """Free the Halo (collective)."""
        self.halo.free()


def solve_poisson(hc: HybridComm, local_mesh: LocalMesh, f: Callable[[np.ndarray], np.ndarray],
                  g: Callable[[np.ndarray], np.ndarray], *, method: str = "atomic",
                  tol: float = 1e-10) -> tuple[np.ndarray, int]:
    """Solve -Δu = f, u = g on the boundary of the mesh's bounding box, with P1 elements and CG.

    Collective over ``hc``.

    Args:
        hc: the :class:`~hybridmpi.HybridComm`.
        local_mesh: this rank's :class:`~hybridmpi.tools.mesh.LocalMesh`.
        f, g: callables mapping an ``(n, 3)`` array of points to ``n`` values.
        method: the Halo method of the ghost updates.
        tol: relative residual at which CG stops.

    Returns:
        (u, iterations): the solution at the owned points and the CG iteration count.
    """
    system = Poisson(hc, local_mesh, f, g, method=method)
    try:
        x, its, _ = system.cg(tol=tol)
    finally:
        system.free()
    return x[:local_mesh.n_owned].copy(), its
