"""Ctrl-C (SIGINT) and SIGTERM during every kind of wait raise on the signalled rank, and PeerError
on its peers (3 ranks on one node; 4 on two virtual nodes, where the waits on MPI requests run)."""

import pytest
from conftest import run_mpi


@pytest.mark.parametrize("ranks,args", [(3, []), (4, ["--node-size", "2"])])
def test_signals(ranks, args):
    run_mpi("signal_cases.py", ranks, *args)


def test_sigterm_outside_a_wait_still_ends_the_process(tmp_path):
    """Outside the library's waits SIGTERM keeps its default action: the process dies by it."""
    import os
    import subprocess
    import sys

    from conftest import MPIEXEC, mpi_flavor

    prog = tmp_path / "term.py"
    prog.write_text(
        "import os, signal, time\n"
        "from mpi4py import MPI\n"
        "import hybridmpi\n"
        "hc = hybridmpi.HybridComm(MPI.COMM_WORLD)\n"
        "hc.barrier()\n"
        "if hc.rank == 0:\n"
        "    print('rank 0 sends SIGTERM to itself', flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(0.5)\n"
        "    print('rank 0 survived', flush=True)\n"
        "time.sleep(3)\n")
    cmd = [MPIEXEC, "-n", "2"]
    env = dict(os.environ)
    if mpi_flavor() == "openmpi":
        cmd += ["--oversubscribe"]
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    proc = subprocess.run([*cmd, sys.executable, str(prog)], capture_output=True, text=True,
                          timeout=60, env=env)
    out = proc.stdout + proc.stderr
    assert "sends SIGTERM" in out and "survived" not in out, (proc.returncode, out)
    if mpi_flavor() != "openmpi":   # (Open MPI's prterun may count a SIGTERM death as a clean exit)
        assert proc.returncode != 0 and ("15" in out or "Terminated" in out), (proc.returncode, out)
