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
