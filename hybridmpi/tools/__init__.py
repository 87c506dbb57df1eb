"""The tools built on hybridmpi's public API, which the library itself never imports: the
``hybridmpi`` command (:mod:`~hybridmpi.tools.cli`, also ``python -m hybridmpi``), the demo and
its figures (``demo``, ``plot``), the benchmarks (``bench``), the applications heat3d and Himeno
(``apps``), the P1 Poisson solver (``fem``) and the mesh pipeline (``mesh``).

Import each as a module of its own (``from hybridmpi.tools import mesh``): importing this package
imports none of them, so the command's extras (meshio, gmsh, pymetis, scipy, matplotlib) load
only where a tool needs them.
"""
