"""Give every rank its part of a partitioned mesh, in the local ordering of docs/design.md."""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ...comm.hybridcomm import HybridComm

import numpy as np

from ..._extras import MissingExtra
from ...ghost.pattern import GhostPattern
from .partition import ghost_pairs, tetrahedra


class LocalMesh:
    """One rank's part of a distributed mesh.

    Attributes:
        global_ids: int64 point ids in local order: inner points, boundary
            points grouped by the neighbor they go to, points going to
            several neighbors, then ghosts grouped by owner.
        n_owned: points owned by this rank (local ids ``0 .. n_owned-1``).
        points: coordinates in local order, shape ``(len(global_ids), 3)``.
        cells: every tetrahedron touching an owned point, in local ids.
        pattern: the :class:`~hybridmpi.GhostPattern` of the ghosts.
    """

    def __init__(self, global_ids: np.ndarray, n_owned: int, points: np.ndarray, cells: np.ndarray,
                 pattern: GhostPattern) -> None:
        self.global_ids = global_ids
        self.n_owned = n_owned
        self.points = points
        self.cells = cells
        self.pattern = pattern

    @property
    def size(self) -> int:
        """Owned plus ghost points."""
        return len(self.global_ids)

    def __repr__(self):
        return (f"<LocalMesh {self.n_owned} owned + {self.size - self.n_owned} ghost points, "
                f"{len(self.cells)} cells>")


def _split(m, part, nranks):
    """Every rank's global ids, owned count, coordinates and local cells."""
    n = len(m.points)
    tets = tetrahedra(m)
    g_rank, g_point = ghost_pairs(m, part)
    # How many ranks need each point, and which one when it is only one.
    need = np.bincount(g_point, minlength=n)
    only = np.zeros(n, dtype=np.int64)
    single = need[g_point] == 1
    only[g_point[single]] = g_rank[single]
    category = np.minimum(need, 2)  # 0 inner, 1 one neighbor, 2 several
    order = np.lexsort((np.arange(n), only, category, part))
    counts = np.bincount(part, minlength=nranks)
    starts = np.concatenate(([0], np.cumsum(counts)))
    local = np.empty(n, dtype=np.int64)
    local[order] = np.arange(n) - starts[part[order]]
    # Ghosts grouped by owner, each group in its owner's local order, so
    # that the owner's send list is increasing (runs).
    gorder = np.lexsort((local[g_point], part[g_point], g_rank))
    g_rank, g_point = g_rank[gorder], g_point[gorder]
    gstarts = np.concatenate(([0], np.cumsum(np.bincount(g_rank, minlength=nranks))))
    # Cells touching an owned point of each rank.
    nc = len(tets)
    key = np.unique(part[tets].ravel() * nc + np.repeat(np.arange(nc), 4))
    c_rank, c_cell = key // nc, key % nc
    cstarts = np.concatenate(([0], np.cumsum(np.bincount(c_rank, minlength=nranks))))
    scratch = np.empty(n, dtype=np.int64)
    parts = []
    for q in range(nranks):
        owned = order[starts[q]:starts[q + 1]]
        gids = np.concatenate((owned, g_point[gstarts[q]:gstarts[q + 1]]))
        scratch[gids] = np.arange(gids.size)
        cells = scratch[tets[c_cell[cstarts[q]:cstarts[q + 1]]]]
        parts.append({"gids": gids.astype(np.int64), "n_owned": int(owned.size),
                      "points": np.ascontiguousarray(m.points[gids], dtype=np.float64),
                      "cells": cells})
    return parts


def distribute_cube(hc: HybridComm, h: float) -> tuple[Any, LocalMesh]:
    """Rank 0 meshes the cube and partitions it for the job's ranks; every rank gets its part.

    The partition has two levels (node parts first) when ``hc`` spans
    several nodes of equal size.  Collective.

    Returns:
        (mesh on rank 0 and None elsewhere, this rank's LocalMesh)

    Raises:
        MissingExtra: gmsh, meshio or pymetis is not installed (every rank).
        ValueError: ``h`` out of range (every rank).
    """
    from .generate import cube
    from .partition import partition

    m = part = problem = None
    if hc.rank == 0:
        try:
            m = cube(h)
            two_level = hc.num_nodes > 1 and hc.size % hc.node_size == 0
            part = partition(m, hc.size, node_size=hc.node_size if two_level else None)
        except Exception as e:  # every rank raises the same, none waits in the scatter
            problem = e
    agreed = hc.comm.bcast(_portable(problem), root=0)
    if problem is not None:
        raise problem  # rank 0: with its traceback
    if agreed is not None:
        raise agreed
    return m, distribute(hc, m, part)


def _portable(e: Exception | None) -> Exception | None:
    """``e``, or a RuntimeError with its text where ``e`` does not survive pickling."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001 - any exception that cannot travel
        return RuntimeError(f"hybridmpi.tools.mesh: rank 0 failed: {type(e).__name__}: {e}")


def distribute_file(hc: HybridComm, path: str) -> tuple[Any, LocalMesh]:
    """Rank 0 reads a mesh file (any format meshio reads, tetrahedra) and partitions it for
    the job's ranks, as :func:`distribute_cube` does with the cube.  Collective.

    Returns:
        (mesh on rank 0 and None elsewhere, this rank's LocalMesh)

    Raises:
        FileNotFoundError: no such file (every rank).
        MissingExtra: meshio or pymetis is not installed on rank 0 (every rank).
        ValueError: the file cannot be read, has no tetrahedra, or has fewer points than
            ranks (every rank).
    """
    from .generate import load
    from .partition import partition

    m = part = None
    problem = None
    if hc.rank == 0:
        try:
            m = load(path)
            if len(m.points) < hc.size:
                raise ValueError(f"{len(m.points)} points cannot be shared by {hc.size} ranks")
            two_level = hc.num_nodes > 1 and hc.size % hc.node_size == 0
            part = partition(m, hc.size, node_size=hc.node_size if two_level else None)
        except Exception as e:  # every rank raises, none waits in the scatter
            problem = (type(e).__name__, f"{e}")
    problem = hc.comm.bcast(problem, root=0)
    if problem:
        kind, msg = problem
        if kind == "FileNotFoundError":
            raise FileNotFoundError(msg)
        if kind == "MissingExtra":
            raise MissingExtra(msg, name="meshio")
        raise ValueError(f"hybridmpi.tools.mesh: cannot use mesh file {path}: {msg}")
    return m, distribute(hc, m, part)


def distribute(hc: HybridComm, m: Any, part: Any, *, root: int = 0) -> LocalMesh:
    """Give every rank its part of a partitioned mesh (collective).

    Only ``root`` needs the mesh and the partition (other ranks may pass
    None); it computes every rank's local numbering and sends each its part,
    so memory on the other ranks stays proportional to their part.

    Args:
        hc: the :class:`~hybridmpi.HybridComm`.
        m: meshio.Mesh with tetrahedra (on ``root``).
        part: owning rank of every point, values in ``[0, hc.size)`` (on
            ``root``), e.g. from :func:`~hybridmpi.tools.mesh.partition`.
        root: the rank that holds the mesh.

    Returns:
        LocalMesh: this rank's points, cells and ghost pattern.

    Raises:
        ValueError: on every rank, when ``part`` does not fit the mesh or
            the communicator.
    """
    comm = hc.comm
    problem = parts = None
    if hc.rank == root:
        try:
            n = len(m.points)
            part = np.asarray(part)
            if part.shape != (n,) or part.dtype.kind not in "iu":
                problem = f"part must be an integer array of length {n}, got {part.dtype} {part.shape}"
            elif n and (part.min() < 0 or part.max() >= hc.size):
                problem = (f"part holds ranks {int(part.min())}..{int(part.max())}, but the "
                           f"communicator has {hc.size} ranks")
            else:
                parts = _split(m, part.astype(np.int64), hc.size)
        except (AttributeError, ValueError) as e:
            problem = str(e)
    problem = comm.bcast(problem, root=root)
    if problem:
        raise ValueError(f"hybridmpi.tools.mesh.distribute: {problem}")
    mine = comm.scatter(parts, root=root)
    k = mine["n_owned"]
    pattern = GhostPattern.from_global(hc, mine["gids"][:k], mine["gids"][k:])
    return LocalMesh(mine["gids"], k, mine["points"], mine["cells"], pattern)
