"""Limits: MPI context ids, the free order of global memory, requests after free, and a
nearly full /dev/shm (MemoryError on every rank, never SIGBUS, never a hang)."""

import os
import shutil
import subprocess
import sys

import pytest
from conftest import MPIEXEC, mpi_flavor, run_mpi

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("ranks,args", [(2, []), (3, ["--node-size", "2"])])
def test_limits(ranks, args):
    run_mpi("limits_cases.py", ranks, *args, timeout=90)


def _private_shm_possible():
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return "needs root and unshare(1) for a private tmpfs on /dev/shm"
    p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                        "mount -t tmpfs -o size=1m tmpfs /dev/shm"], capture_output=True, text=True)
    return None if p.returncode == 0 else f"cannot mount a private tmpfs: {p.stderr.strip()}"


def test_nearly_full_dev_shm(tmp_path):
    """A few spare rooms of the sweep (scripts/shm_sweep.py): ok or MemoryError on every rank."""
    why = _private_shm_possible()
    if why:
        pytest.skip(why)
    if mpi_flavor() != "mpich":
        pytest.skip("the sweep's filling of /dev/shm is measured with MPICH")
    out = tmp_path / "sweep.json"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "shm_sweep.py"), "--max", "48",
                        "--step", "16", "--timeout", "30", "--json", str(out), "--mpiexec", MPIEXEC],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
