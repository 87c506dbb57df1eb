"""Mesh pipeline (serial parts): cube, partition, statistics by hand, the partition command."""

import subprocess
import sys

import meshio
import numpy as np
import pytest
from conftest import run_mpi

from hybridmpi.tools import mesh


def tet_volumes(m):
    p = m.points[m.cells[0].data]
    return np.linalg.det(np.stack([p[:, 1] - p[:, 0], p[:, 2] - p[:, 0], p[:, 3] - p[:, 0]], 1)) / 6


@pytest.fixture(scope="module")
def cube05():
    return mesh.cube(0.05)


def test_cube_volume_and_boundary(cube05, tmp_path):
    m = cube05
    assert m.cells[0].type == "tetra" and len(m.cells) == 1
    assert np.isclose(np.abs(tet_volumes(m)).sum(), 1.0, rtol=1e-12)
    assert m.points.min() >= -1e-12 and m.points.max() <= 1 + 1e-12
    # Faces that belong to one tetrahedron only form the boundary: the six unit squares.
    t = m.cells[0].data
    faces = np.sort(np.concatenate([t[:, [0, 1, 2]], t[:, [0, 1, 3]], t[:, [0, 2, 3]], t[:, [1, 2, 3]]]), 1)
    uniq, count = np.unique(faces, axis=0, return_counts=True)
    outer = uniq[count == 1]
    p = m.points[outer]
    area = np.linalg.norm(np.cross(p[:, 1] - p[:, 0], p[:, 2] - p[:, 0]), axis=1).sum() / 2
    assert np.isclose(area, 6.0, rtol=1e-9)
    on_face = np.any(np.isclose(p, 0.0, atol=1e-9) | np.isclose(p, 1.0, atol=1e-9), axis=2)
    assert on_face.all()
    # boundary_points: the vertices of those faces, which on the cube are the points on its faces.
    from hybridmpi.tools.mesh import boundary_points
    surface = boundary_points(m)
    assert np.array_equal(np.flatnonzero(surface), np.unique(outer))
    on_cube = np.any(np.isclose(m.points, 0.0, atol=1e-9) | np.isclose(m.points, 1.0, atol=1e-9), axis=1)
    assert np.array_equal(surface, on_cube)
    # Every point is a vertex of some tetrahedron; the paper's density at h = 0.05.
    assert np.unique(t).size == len(m.points)
    assert 5000 < len(m.points) < 9000


def test_cube_cache_and_load(tmp_path):
    m = mesh.cube(0.3, cache_dir=tmp_path)
    cached = tmp_path / "cube-h0.3.vtu"
    assert cached.exists()
    again = mesh.cube(0.3, cache_dir=tmp_path)
    assert np.array_equal(again.points, m.points)
    assert np.array_equal(again.cells[0].data, m.cells[0].data)
    # load() keeps only the tetrahedra and their vertices.
    extra = meshio.Mesh(np.vstack([m.points, [[5.0, 5.0, 5.0]]]),
                        [("triangle", np.array([[0, 1, 2]])), ("tetra", m.cells[0].data)])
    path = tmp_path / "mixed.vtu"
    meshio.write(path, extra)
    back = mesh.load(path)
    assert len(back.points) == len(m.points) and len(back.cells) == 1
    with pytest.raises(FileNotFoundError):
        mesh.load(tmp_path / "nope.vtu")
    for bad in (0, -1, 2, "0.1", None):
        with pytest.raises(ValueError, match="h must be"):
            mesh.cube(bad, cache_dir=tmp_path)


@pytest.mark.parametrize("nparts,node_size", [(2, None), (3, None), (4, None), (8, None), (8, 4), (6, 3)])
def test_partition_balanced_and_deterministic(cube05, nparts, node_size):
    part = mesh.partition(cube05, nparts, node_size=node_size, seed=1)
    counts = np.bincount(part, minlength=nparts)
    assert part.shape == (len(cube05.points),) and counts.size == nparts
    assert np.all(np.abs(counts - counts.mean()) <= 0.05 * counts.mean()), counts
    assert np.array_equal(part, mesh.partition(cube05, nparts, node_size=node_size, seed=1))
    if node_size:
        # Each node's region is connected.
        i, j = mesh.point_edges(cube05)
        for k in range(nparts // node_size):
            inside = part // node_size == k
            pts = np.flatnonzero(inside)
            keep = inside[i] & inside[j]
            seen = {pts[0]}
            frontier = [pts[0]]
            nbrs = {}
            for a, b in zip(i[keep], j[keep]):
                nbrs.setdefault(a, []).append(b)
                nbrs.setdefault(b, []).append(a)
            while frontier:
                v = frontier.pop()
                for w in nbrs.get(v, ()):
                    if w not in seen:
                        seen.add(w)
                        frontier.append(w)
            assert len(seen) == pts.size


def test_partition_errors(cube05):
    for bad in (0, -2, 2.0):
        with pytest.raises(ValueError, match="nparts"):
            mesh.partition(cube05, bad)
    with pytest.raises(ValueError, match="exceeds"):
        mesh.partition(cube05, len(cube05.points) + 1)
    with pytest.raises(ValueError, match="node_size"):
        mesh.partition(cube05, 8, node_size=3)


def two_tets():
    return meshio.Mesh(np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 1]], float),
                       [("tetra", np.array([[0, 1, 2, 3], [1, 2, 3, 4]]))])


def test_stats_by_hand():
    m = two_tets()
    s = mesh.partition_stats(m, np.array([0, 0, 1, 1, 1]), node_size=1)
    # rank 0 owns {0, 1}, ghosts {2, 3, 4}; rank 1 owns {2, 3, 4}, ghosts {0, 1}.
    want = {"processes": 2, "owned": 2.5, "ghosts": 2.5, "points": 5.0, "neighbors": 1.0,
            "data_kb": 0.06, "intra_neighbors": 0.0, "intra_kb": 0.0, "inter_processes": 1.0,
            "inter_neighbors": 1.0, "inter_kb": 0.06}
    for k, v in want.items():
        assert np.isclose(s[k], v), (k, s[k], v)
    s = mesh.partition_stats(m, np.array([0, 1, 2, 3, 3]), node_size=2)
    # ghosts: rank 0 {1,2,3}, rank 1 {0,2,3,4}, rank 2 {0,1,3,4}, rank 3 {0,1,2}; every rank
    # has 3 neighbors, one of them on its node; 5 of the 14 ghosts come from the same node.
    want = {"owned": 1.25, "ghosts": 3.5, "points": 4.75, "neighbors": 3.0, "data_kb": 0.084,
            "intra_neighbors": 1.0, "intra_kb": 0.03, "inter_processes": 2.0,
            "inter_neighbors": 2.0, "inter_kb": 0.054}
    for k, v in want.items():
        assert np.isclose(s[k], v), (k, s[k], v)
    s = mesh.partition_stats(m, np.array([0, 1, 2, 3, 3]), block=1)
    assert np.isclose(s["data_kb"], 3.5 * 8 / 1000) and "intra_kb" not in s
    with pytest.raises(ValueError, match="shape"):
        mesh.partition_stats(m, np.array([0, 1]))
    with pytest.raises(ValueError, match="node_size"):
        mesh.partition_stats(m, np.array([0, 1, 2, 3, 3]), node_size=3)


def hybridmpi_cmd(*args):
    return subprocess.run([sys.executable, "-m", "hybridmpi", *args], capture_output=True, text=True,
                          timeout=300)


def test_partition_command():
    out = hybridmpi_cmd("partition", "--h", "0.1", "--parts", "8", "--node-size", "4")
    assert out.returncode == 0, out.stderr
    assert "owned points" in out.stdout and "internode data (kB)" in out.stdout
    owned = float(next(line for line in out.stdout.splitlines() if line.startswith("owned")).split()[-1])
    assert owned == pytest.approx(len(mesh.cube(0.1).points) / 8)
    for bad in (["partition", "--parts", "0"], ["partition", "--h", "7", "--parts", "2"],
                ["partition", "--parts", "8", "--node-size", "3", "--h", "0.1"], ["frobnicate"]):
        out = hybridmpi_cmd(*bad)
        assert out.returncode == 2, (bad, out.stdout, out.stderr)
        assert len(out.stderr.strip().splitlines()) <= 2 and "Traceback" not in out.stderr, out.stderr


@pytest.mark.parametrize("ranks,args", [(1, []), (2, []), (3, []), (4, []), (8, []),
                                        (4, ["--node-size", "2"]), (8, ["--node-size", "3"])])
def test_distribute(ranks, args):
    run_mpi("mesh_cases.py", ranks, *args)
