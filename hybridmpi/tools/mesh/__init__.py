"""Mesh pipeline: gmsh cube, METIS partition, partition statistics, distributed local meshes.

Imports gmsh and pymetis only when a function needs them.
"""

from .distribute import LocalMesh, distribute, distribute_cube, distribute_file
from .generate import cube, load
from .partition import boundary_points, partition, partition_stats, point_edges

__all__ = ["LocalMesh", "boundary_points", "cube", "distribute", "distribute_cube", "distribute_file",
           "load", "partition", "partition_stats", "point_edges"]
