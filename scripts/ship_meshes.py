"""Make the small cube meshes shipped in meshes/ (h = 0.1 and 0.05).

Usage: python scripts/ship_meshes.py [--h 0.1,0.05] [--out meshes]
"""

import argparse
import os
import time

import meshio

from hybridmpi.tools.mesh.generate import SHIPPED, _generate, mesh_name


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--h", default="0.1,0.05", help="characteristic lengths")
    p.add_argument("--out", default=str(SHIPPED), help="output folder")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for h in map(float, a.h.split(",")):
        t0 = time.perf_counter()
        m = _generate(h)
        path = os.path.join(a.out, mesh_name(h))
        meshio.write(path, m, compression="zlib")
        print(f"{path}: {len(m.points)} points, {len(m.cells[0].data)} tetrahedra, "
              f"{time.perf_counter() - t0:.1f} s, {os.path.getsize(path) / 1e3:.0f} kB")


if __name__ == "__main__":
    main()
