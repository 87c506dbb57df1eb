"""Partition the points of a tetrahedral mesh with METIS, and the statistics of a partition."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..._extras import need

# The six edges of a tetrahedron, as pairs of its vertex slots.
_EDGES = np.array([(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)])


def tetrahedra(m: Any) -> np.ndarray:
    """The tetrahedra of a meshio mesh ``m``: an (n, 4) int64 array of point ids.

    Raises:
        ValueError: ``m`` has no tetrahedra.
    """
    for c in m.cells:
        if c.type == "tetra":
            return np.asarray(c.data, dtype=np.int64)
    raise ValueError("hybridmpi.tools.mesh: the mesh has no tetrahedra")


def point_edges(m: Any) -> tuple[np.ndarray, np.ndarray]:
    """Unique edges ``(i, j)``, ``i < j``, of the tetrahedra of ``m``: two int64 arrays."""
    tets = tetrahedra(m)
    a = tets[:, _EDGES[:, 0]].ravel()
    b = tets[:, _EDGES[:, 1]].ravel()
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    key = np.unique(lo * len(m.points) + hi)
    return key // len(m.points), key % len(m.points)


def boundary_points(m: Any) -> np.ndarray:
    """Boolean mask of the points on the surface of ``m``: the vertices of the triangles that
    belong to one tetrahedron only."""
    tets = tetrahedra(m)
    faces = np.sort(np.concatenate([tets[:, [0, 1, 2]], tets[:, [0, 1, 3]], tets[:, [0, 2, 3]],
                                    tets[:, [1, 2, 3]]]), axis=1)
    _, first, counts = np.unique(faces, axis=0, return_index=True, return_counts=True)
    mask = np.zeros(len(m.points), dtype=bool)
    mask[faces[first[counts == 1]].ravel()] = True
    return mask


def _csr(n, i, j):
    """Symmetric CSR adjacency (xadj, adjncy) of ``n`` vertices from edges i-j."""
    src = np.concatenate((i, j))
    dst = np.concatenate((j, i))
    order = np.lexsort((dst, src))
    xadj = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=xadj[1:])
    return xadj, dst[order]


def _foreign_metis():
    """The path of a METIS shared library this process loaded (Debian's DOLFINx and PETSc
    bring one), else None.  pymetis's own METIS would then bind to its symbols, which take
    other integer sizes: it fails ("Input Error: Incorrect ufactor") or worse."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if "/libmetis" in path and "pymetis" not in path:
                    return path
    except OSError:
        pass
    return None


def _metis(n, i, j, nparts, seed):
    if nparts == 1:
        return np.zeros(n, dtype=np.int64)
    need("pymetis", "partitioning a mesh (METIS)")
    xadj, adjncy = _csr(n, i, j)
    if _foreign_metis():
        return _metis_apart(xadj, adjncy, nparts, seed)
    return _part_graph(xadj, adjncy, nparts, seed)


def _metis_apart(xadj, adjncy, nparts, seed):
    """pymetis in a fresh interpreter, where no other METIS is loaded."""
    import pickle
    import subprocess
    import sys

    code = ("import pickle, sys; from hybridmpi.tools.mesh.partition import _part_graph; "
            "a = pickle.load(sys.stdin.buffer); "
            "sys.stdout.buffer.write(pickle.dumps(_part_graph(*a)))")
    proc = subprocess.run([sys.executable, "-c", code], input=pickle.dumps((xadj, adjncy, nparts, seed)),
                          capture_output=True)
    if proc.returncode:
        raise RuntimeError("hybridmpi: mesh.partition: METIS in a separate process (another METIS "
                           f"is loaded here: {_foreign_metis()}) failed:\n"
                           f"{proc.stderr.decode(errors='replace')[-2000:]}")
    return pickle.loads(proc.stdout)


def _part_graph(xadj, adjncy, nparts, seed):
    pymetis = need("pymetis", "partitioning a mesh (METIS)")
    opts = pymetis.Options(seed=seed)
    if hasattr(pymetis, "CSRAdjacency"):  # pymetis >= 2025.2
        res = pymetis.part_graph(nparts, adjacency=pymetis.CSRAdjacency(xadj, adjncy), options=opts)
    else:
        res = pymetis.part_graph(nparts, xadj=xadj, adjncy=adjncy, options=opts)
    return np.asarray(res.vertex_part, dtype=np.int64)


def partition(m: Any, nparts: int, *, node_size: int | None = None, seed: int = 0) -> np.ndarray:
    """The owning rank of every point, from METIS on the point-adjacency graph.

    With ``node_size``, two levels as in the paper's Section 6.4: first into
    ``nparts / node_size`` node parts, then each node part into
    ``node_size`` parts, so every node's region is connected; rank
    ``k * node_size + i`` gets part i of node part k.

    Args:
        m: meshio.Mesh with tetrahedra.
        nparts: number of parts (ranks), 1 <= nparts <= number of points.
        node_size: ranks per node, dividing ``nparts``.
        seed: METIS seed; the same seed gives the same partition.

    Returns:
        numpy int64 array of length ``len(m.points)``.

    Raises:
        ValueError: nparts < 1 or above the point count, or node_size not
            dividing nparts.
    """
    n = len(m.points)
    if type(nparts) is not int or nparts < 1:
        raise ValueError(f"hybridmpi.tools.mesh.partition: nparts must be an int >= 1, got {nparts!r}")
    if nparts > n:
        raise ValueError(f"hybridmpi.tools.mesh.partition: nparts = {nparts} exceeds the {n} points")
    if node_size is not None and (type(node_size) is not int or node_size < 1
                                  or nparts % node_size):
        raise ValueError(f"hybridmpi.tools.mesh.partition: node_size = {node_size!r} must be a "
                         f"positive int dividing nparts = {nparts}")
    i, j = point_edges(m)
    if node_size is None or node_size == nparts or node_size == 1:
        return _metis(n, i, j, nparts, seed)
    nodes = _metis(n, i, j, nparts // node_size, seed)
    part = np.empty(n, dtype=np.int64)
    for k in range(nparts // node_size):
        pts = np.flatnonzero(nodes == k)
        local = np.full(n, -1, dtype=np.int64)
        local[pts] = np.arange(pts.size)
        keep = (nodes[i] == k) & (nodes[j] == k)
        part[pts] = k * node_size + _metis(pts.size, local[i[keep]], local[j[keep]], node_size, seed)
    return part


def ghost_pairs(m: Any, part: Any) -> tuple[np.ndarray, np.ndarray]:
    """Every (rank, point) with the point owned elsewhere and sharing an edge with one of rank's points."""
    i, j = point_edges(m)
    cut = part[i] != part[j]
    ranks = np.concatenate((part[i[cut]], part[j[cut]]))
    points = np.concatenate((j[cut], i[cut]))
    key = np.unique(ranks * len(m.points) + points)
    return key // len(m.points), key % len(m.points)


def partition_stats(m: Any, part: Any, *, node_size: int | None = None, block: int = 3) -> dict[str, Any]:
    """Means per process of a partition, as the paper counts them in its Tables 2 and 3.

    A one-layer point halo: the ghosts of a rank are the points owned
    elsewhere that share a tetrahedron edge with one of its points.

    Args:
        m: meshio.Mesh with tetrahedra.
        part: owning rank of every point (from :func:`partition`).
        node_size: ranks per node (ranks ``k*node_size ..`` form node k);
            adds the intranode and internode figures.
        block: values per point exchanged (the paper sends 3).

    Returns:
        dict: ``processes``, ``owned``, ``ghosts``, ``points`` (owned +
        ghosts), ``neighbors``, ``data_kb`` (ghosts x block x 8 bytes /
        1000); with node_size also ``intra_neighbors``, ``intra_kb``,
        ``inter_processes`` (per node, processes with an internode
        neighbor), ``inter_neighbors`` and ``inter_kb``.

    Raises:
        ValueError: ``part`` of the wrong length, or node_size not
            dividing the number of processes.
    """
    part = np.asarray(part, dtype=np.int64)
    if part.shape != (len(m.points),):
        raise ValueError(f"hybridmpi.tools.mesh.partition_stats: part has shape {part.shape}, "
                         f"expected ({len(m.points)},)")
    nprocs = int(part.max()) + 1
    if node_size is not None and (type(node_size) is not int or node_size < 1 or nprocs % node_size):
        raise ValueError(f"hybridmpi.tools.mesh.partition_stats: node_size = {node_size!r} must divide "
                         f"the {nprocs} processes")
    ranks, points = ghost_pairs(m, part)
    owners = part[points]
    ghosts = np.bincount(ranks, minlength=nprocs)
    pairs = np.unique(ranks * nprocs + owners)
    pr, po = pairs // nprocs, pairs % nprocs
    kb = block * 8 / 1000
    out = {
        "processes": nprocs,
        "owned": len(part) / nprocs,
        "ghosts": float(ghosts.mean()),
        "points": float(len(part) + ghosts.sum()) / nprocs,
        "neighbors": pr.size / nprocs,
        "data_kb": float(ghosts.mean()) * kb,
    }
    if node_size is not None:
        nodes = nprocs // node_size
        same_pair = pr // node_size == po // node_size
        same_ghost = ranks // node_size == owners // node_size
        has_inter = np.zeros(nprocs, dtype=bool)
        has_inter[pr[~same_pair]] = True
        out.update({
            "node_size": node_size,
            "intra_neighbors": int(same_pair.sum()) / nprocs,
            "intra_kb": int(same_ghost.sum()) / nprocs * kb,
            "inter_processes": int(has_inter.sum()) / nodes,
            "inter_neighbors": int((~same_pair).sum()) / nprocs,
            "inter_kb": int((~same_ghost).sum()) / nprocs * kb,
        })
    return out
