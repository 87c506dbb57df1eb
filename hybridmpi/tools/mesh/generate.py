"""Tetrahedral meshes of the unit cube (gmsh), cached on disk, and reading any mesh file (meshio)."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ... import settings
from ..._extras import need

#: the shipped cube meshes (made by scripts/ship_meshes.py): hybridmpi/meshes/ in an installed
#: package, meshes/ in the source tree (an editable install)
SHIPPED = next((p for p in (Path(__file__).resolve().parents[2] / "meshes",
                            Path(__file__).resolve().parents[3] / "meshes") if p.is_dir()),
               Path(__file__).resolve().parents[2] / "meshes")


def _cache_dir(cache_dir):
    if cache_dir is not None:
        return Path(cache_dir)
    return settings.cache_dir()


def mesh_name(h: float) -> str:
    """File name of the cube mesh of characteristic length ``h``."""
    return f"cube-h{h:g}.vtu"


def tetrahedra(m: Any) -> Any:
    """A meshio.Mesh with only the tetrahedra of ``m`` and only their vertices, renumbered."""
    meshio = need("meshio", "the mesh pipeline")
    blocks = [c.data for c in m.cells if c.type == "tetra"]
    if not blocks:
        raise ValueError("hybridmpi.tools.mesh: the mesh has no tetrahedra")
    tets = np.concatenate(blocks).astype(np.int64)
    used, inverse = np.unique(tets, return_inverse=True)
    points = np.ascontiguousarray(m.points[used, :3], dtype=np.float64)
    return meshio.Mesh(points, [("tetra", inverse.reshape(-1, 4).astype(np.int64))])


def load(path: str | os.PathLike[str]) -> Any:
    """Read any mesh file that meshio reads and keep its tetrahedra.

    Args:
        path: file name (the format comes from the extension).

    Returns:
        meshio.Mesh: points (float64, 3 columns) and one ``"tetra"`` cell block.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the mesh has no tetrahedra.
    """
    meshio = need("meshio", "reading a mesh file")
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"hybridmpi.tools.mesh.load: no such file: {path}")
    return tetrahedra(meshio.read(path))


def _generate(h):
    """Mesh the unit cube with gmsh's HXT algorithm at characteristic length ``h``."""
    gmsh = need("gmsh", "generating the cube mesh")
    meshio = need("meshio", "the mesh pipeline")
    gmsh.initialize(interruptible=False)
    try:
        gmsh.option.setNumber("General.Terminal", 0)
        gmsh.option.setNumber("General.NumThreads", 1)  # the same mesh on every run
        gmsh.model.add("cube")
        gmsh.model.occ.addBox(0, 0, 0, 1, 1, 1)
        gmsh.model.occ.synchronize()
        gmsh.option.setNumber("Mesh.MeshSizeMin", h)
        gmsh.option.setNumber("Mesh.MeshSizeMax", h)
        gmsh.option.setNumber("Mesh.Algorithm3D", 10)  # HXT
        gmsh.model.mesh.generate(3)
        tags, coords, _ = gmsh.model.mesh.getNodes()
        etypes, _, enodes = gmsh.model.mesh.getElements(3)
    finally:
        gmsh.finalize()
    tets = [np.asarray(n, dtype=np.int64).reshape(-1, 4) for t, n in zip(etypes, enodes) if t == 4]
    lookup = np.zeros(int(tags.max()) + 1, dtype=np.int64)
    lookup[tags.astype(np.int64)] = np.arange(tags.size)
    points = np.asarray(coords, dtype=np.float64).reshape(-1, 3)
    return tetrahedra(meshio.Mesh(points, [("tetra", lookup[np.concatenate(tets)])]))


def generate_cube(h: float) -> Any:
    """The unit cube meshed afresh by gmsh at characteristic length ``h``, as :func:`cube` makes
    it when no file has it, but neither read from nor written to the shipped meshes or the cache
    (``h`` is not checked; the mesh benchmark times this).

    Returns:
        meshio.Mesh with one ``"tetra"`` cell block.
    """
    return _generate(h)


def cube(h: float, *, cache_dir: str | None = None) -> Any:
    """The unit cube meshed with tetrahedra of characteristic length ``h``.

    Made by gmsh (MeshSizeMin = MeshSizeMax = h, HXT 3D algorithm), only
    the tetrahedra's vertices kept.  The shipped meshes (``meshes/``) are
    read first; any other ``h`` is generated once into the cache folder and
    read from there afterwards.  Generating a mesh that takes more than
    about a second prints a progress message on stderr.

    Args:
        h: characteristic length, 0 < h <= 1.
        cache_dir: folder of generated meshes; default env
            ``HYBRIDMPI_CACHE``, else ``~/.cache/hybridmpi/meshes``.

    Returns:
        meshio.Mesh with one ``"tetra"`` cell block.

    Raises:
        ValueError: ``h`` out of range.
    """
    meshio = need("meshio", "the cube mesh")
    if isinstance(h, bool) or not isinstance(h, (int, float)) or not 0 < h <= 1:
        raise ValueError(f"hybridmpi.tools.mesh.cube: h must be a number in (0, 1], got {h!r}")
    name = mesh_name(h)
    for folder in (SHIPPED, _cache_dir(cache_dir)):
        path = folder / name
        if path.exists():
            return tetrahedra(meshio.read(path))
    slow = h < 0.04
    t0 = time.perf_counter()
    if slow:
        print(f"hybridmpi: meshing the unit cube with h = {h:g} (about {int(0.72 / h**3):,} "
              "points; written to the cache for next time)...", file=sys.stderr, flush=True)
    m = _generate(h)
    folder = _cache_dir(cache_dir)
    folder.mkdir(parents=True, exist_ok=True)
    # Write under a temporary name, then rename: concurrent callers never read half a file.
    fd, tmp = tempfile.mkstemp(suffix=".vtu", dir=folder)
    os.close(fd)
    meshio.write(tmp, m)
    os.replace(tmp, folder / name)
    if slow:
        print(f"hybridmpi: {len(m.points):,} points, {len(m.cells[0].data):,} tetrahedra in "
              f"{time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return m
