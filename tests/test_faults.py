"""Faults: a rank that raises or is killed ends the job within the timeout, naming the rank;
normal runs and runs whose errors the program catches leave nothing in /dev/shm."""

import os
import re
import time

import pytest
from conftest import launch, mpi_flavor

FAULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpi", "fault.py")
ENV = {"FAULT_TIMEOUT": "3"}


def shm():
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


@pytest.mark.parametrize("mode", ["raise-update", "raise-barrier"])
def test_raise_others_name_the_rank(mode):
    """Without `python -m mpi4py`: the other ranks get SyncTimeout naming rank 1 (or PeerError
    from the rank that timed out), then the job ends."""
    t0 = time.monotonic()
    rc, out = launch(3, [FAULT, mode], env=ENV, abort=False, check=False, timeout=60)
    assert rc != 0 and time.monotonic() - t0 < 45, out
    assert "injected fault on rank 1" in out, out
    timeouts = 0
    for r in (0, 2):
        m = re.search(rf"rank {r}: SyncTimeout peer=(\S+) missing=\[([\d, ]*)\]", out)
        if m:
            timeouts += 1
            assert 1 in [int(v) for v in m.group(2).split(",") if v.strip()], out
        else:
            assert re.search(rf"rank {r}: PeerError peer=(0|2)", out), out
    assert timeouts >= 1, out


def test_raise_under_mpi4py_aborts_the_job():
    """The documented use: `python -m mpi4py` turns the uncaught exception into MPI_Abort."""
    t0 = time.monotonic()
    rc, out = launch(3, [FAULT, "raise-update"], env=ENV, check=False, timeout=60)
    assert rc != 0 and "injected fault on rank 1" in out and time.monotonic() - t0 < 30, out


def test_raise_inside_with_block_reaches_every_rank():
    """No timeout: rank 1 raises in its own code inside `with HybridComm`; leaving the block
    breaks the comm, so the others raise PeerError instead of waiting, and all free it."""
    t0 = time.monotonic()
    rc, out = launch(3, [FAULT, "with-block"], abort=False, check=False, timeout=60)
    assert rc != 0 and time.monotonic() - t0 < 30, out
    assert "injected fault on rank 1" in out, out
    for r in (0, 2):
        assert re.search(rf"rank {r}: PeerError peer=\d", out), out


def test_abort_on_error_ends_the_job():
    """No timeout, no `python -m mpi4py`: `hybridmpi.abort_on_error()` prints the failing
    rank's traceback and aborts the job."""
    t0 = time.monotonic()
    rc, out = launch(3, [FAULT, "abort-on-error"], abort=False, check=False, timeout=60)
    assert rc != 0 and time.monotonic() - t0 < 30, out
    assert "rank 1 failed; aborting the job" in out and "injected fault on rank 1" in out, out


def test_abort_on_error_without_with_guards_the_rest():
    """``hybridmpi.abort_on_error()`` called as a statement (no ``with``) is not a silent no-op:
    an uncaught exception later in the program aborts the job."""
    t0 = time.monotonic()
    rc, out = launch(3, [FAULT, "abort-on-error-bare"], abort=False, check=False, timeout=60)
    assert rc != 0 and time.monotonic() - t0 < 30, out
    assert "rank 1 failed; aborting the job" in out and "injected fault on rank 1" in out, out


def killed_rank_1(fault_timeout, limit):
    """Rank 1 dies by SIGKILL in the middle of updates, the launcher's cleanup off: each survivor
    must raise by itself (SyncTimeout naming rank 1 at the timeout, or PeerError from the rank
    that timed out) within the timeout plus 2 s (plus 5 s of start-up), and the job end."""
    t0 = time.monotonic()
    rc, out = launch(3, [FAULT, "kill"], env={"FAULT_TIMEOUT": str(fault_timeout)}, check=False,
                     timeout=limit, cleanup=False)
    took = time.monotonic() - t0
    assert rc != 0, out
    for r in (0, 2):
        assert re.search(rf"rank {r}: (SyncTimeout peer=\d+ missing=\[.*1.*\]|PeerError peer=[02])",
                         out), out
    assert took < fault_timeout + 2 + 5, f"{took:.1f} s (start-up included):\n{out}"


def test_sigkill_survivors_raise():
    killed_rank_1(float(ENV["FAULT_TIMEOUT"]), 60)


def test_sigkill_check_fails_on_a_planted_hang():
    """The check above fails when the survivors do not raise by themselves: here they wait
    for 600 s, and the launcher ends the job at 8 s."""
    with pytest.raises(AssertionError):
        killed_rank_1(600, 8)


@pytest.mark.parametrize("mode", ["clean", "caught"])
def test_nothing_left_in_dev_shm(mode):
    if mpi_flavor() != "mpich" and not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    before = shm()
    out = launch(3, [FAULT, mode], env=ENV)
    assert out.count("done") == 3, out
    assert shm() - before == set()
