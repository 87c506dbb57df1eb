"""DOLFINx IndexMaps and PETSc star forests as GhostPatterns, at 1-4 ranks (tests/mpi/interop_cases.py).

They run where dolfinx and petsc4py import (the system stack, the third leg of .ci/run) and skip
elsewhere; the check runs in a subprocess, so this process never initializes MPI."""

import functools
import subprocess
import sys

import pytest
from conftest import run_mpi


@functools.lru_cache(maxsize=None)
def available():
    code = ("import importlib.util as u; print(u.find_spec('dolfinx') is not None, "
            "u.find_spec('petsc4py') is not None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120).stdout.split()
    return out == ["True", "True"]


@pytest.mark.parametrize("args", [[], ["--node-size", "1"]], ids=["node", "node_size1"])
@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_interop(ranks, args):
    if not available():
        pytest.skip("dolfinx and petsc4py do not import here (the system stack has them)")
    if ranks == 1 and args:
        pytest.skip("one rank has one layout")
    run_mpi("interop_cases.py", ranks, *args, timeout=300)


@pytest.mark.parametrize("args", [[], ["--node-size", "1"]], ids=["node", "node_size1"])
@pytest.mark.parametrize("ranks", [2, 3])
def test_interop_duck_typed(ranks, args):
    """The cases on fake IndexMaps and star forests: they need neither dolfinx nor petsc4py."""
    run_mpi("interop_cases.py", ranks, *args, "--only", "case_fake_ids_as_from_global", timeout=120)


def test_partition_after_import_dolfinx():
    """DOLFINx brings its own libmetis: after `import dolfinx` (or petsc4py), mesh.partition
    still gives the same parts as in a process without it (pymetis then runs apart)."""
    if not available():
        pytest.skip("dolfinx and petsc4py do not import here (the system stack has them)")
    code = ("import sys\n"
            "if sys.argv[1] == 'yes':\n"
            "    import dolfinx, petsc4py  # noqa\n"
            "from hybridmpi.tools import mesh\n"
            "m = mesh.cube(0.2)\n"
            "print(mesh.partition(m, 4, seed=3).tolist())\n")
    outs = []
    for first in ("yes", "no"):
        p = subprocess.run([sys.executable, "-c", code, first], capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 0, p.stderr
        outs.append(p.stdout)
    assert outs[0] == outs[1] and len(outs[0]) > 100, outs
