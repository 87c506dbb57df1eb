"""P1 Poisson with CG: one answer on 1-8 ranks, every layout and method; h² convergence; `solve`."""

import json
import os
import re
import subprocess
import sys

import meshio
import numpy as np
import pytest
from conftest import mpirun, run_mpi

HERE = os.path.dirname(os.path.abspath(__file__))
SOLUTIONS = {}


@pytest.mark.parametrize("ranks,args", [(1, []), (2, []), (3, []), (4, []), (8, []),
                                        (4, ["--node-size", "2"]), (8, ["--node-size", "3"])])
def test_same_solution(ranks, args):
    out = run_mpi("fem_cases.py", ranks, *args, "--only", "case_every_method_matches_serial")
    SOLUTIONS[(ranks, *args)] = np.array(json.loads(re.search(r"SOLUTION (\[.*\])", out).group(1)))
    first = next(iter(SOLUTIONS.values()))
    for key, sol in SOLUTIONS.items():
        assert np.allclose(sol, first, rtol=1e-10, atol=1e-12), key


def test_convergence():
    out = run_mpi("fem_cases.py", 2, "--only", "case_convergence_h2")
    assert "orders" in out


def test_solve_command_and_example(tmp_path):
    vtu = tmp_path / "u.vtu"
    out = mpirun(2, "solve", "--h", "0.1", "--vtu", str(vtu))
    its = int(re.search(r"iterations\s+(\d+)", out).group(1))
    err = float(re.search(r"L2 error\s+(\S+)", out).group(1))
    assert 10 < its < 200 and 1e-3 < err < 5e-2, out
    assert re.search(r"compute [\d.]+ us .* ghost [\d.]+ us .* allreduce [\d.]+ us", out), out
    m = meshio.read(vtu)
    assert np.abs(m.point_data["u"] - m.point_data["u_exact"]).max() < 0.1
    example = subprocess.run([sys.executable, os.path.join(HERE, "..", "examples", "poisson.py"), "0.1"],
                             capture_output=True, text=True, timeout=300)
    assert example.returncode == 0 and "iterations, L2 error" in example.stdout, example.stderr


def ball_mesh(path):
    """A ball cut out of the shipped cube mesh (h = 0.1): a domain that is not a box."""
    m = meshio.read(os.path.join(HERE, "..", "meshes", "cube-h0.1.vtu"))
    tets = m.cells_dict["tetra"]
    keep = np.linalg.norm(m.points[tets].mean(axis=1) - 0.5, axis=1) < 0.45
    meshio.write(path, meshio.Mesh(m.points, [("tetra", tets[keep])]), file_format="gmsh22")
    return path


def test_solve_on_a_mesh_file(tmp_path):
    path = ball_mesh(str(tmp_path / "ball.msh"))
    out = {n: mpirun(n, "solve", "--mesh", path) for n in (1, 3)}
    for n, text in out.items():
        assert f"on mesh {path}" in text and f"on {n} ranks" in text, text
        its = int(re.search(r"iterations\s+(\d+)", text).group(1))
        err = float(re.search(r"L2 error\s+(\S+)", text).group(1))
        assert 5 < its < 200 and 1e-4 < err < 5e-2, text
    errs = {n: re.search(r"L2 error\s+(\S+)", text).group(1) for n, text in out.items()}
    assert abs(float(errs[1]) - float(errs[3])) < 1e-6 * float(errs[1]), errs
    bad = subprocess.run([sys.executable, "-m", "hybridmpi", "solve", "--mesh", str(tmp_path / "no.vtu")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "no such file" in bad.stderr and "Traceback" not in bad.stderr
