"""Launch MPI test programs under mpiexec with a timeout on the launcher too."""

import functools
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
MPIEXEC = os.environ.get("HYBRIDMPI_MPIEXEC") or shutil.which("mpiexec",
                                                               path=os.path.dirname(sys.executable)
                                                               + os.pathsep + os.environ["PATH"])


#: Under the sanitizers (.ci/sanitize sets HYBRIDMPI_SANITIZE=1) only these files run: the ones whose
#: time goes to the C core (collectives, ghost exchange, global memory, bounds, the error paths);
#: the rest spend it in Python, numpy, gmsh and plotting, and would take the leg past CI's time
#: (the whole suite took 38-52 minutes under ASan on the loaded 2-core VM).
SANITIZED = ("test_core.py", "test_bounds.py", "test_collectives.py", "test_globalmem.py",
             "test_halo.py", "test_views.py", "test_silent.py", "test_onerank.py", "test_profile.py",
             "test_errors.py")


#: HYBRIDMPI_TEST_MAX_RANKS=K skips the runs of more than K ranks (the CI legs of Intel MPI and
#: of Open MPI from pip: MPICH's and Debian's Open MPI's legs run them; oversubscribed four to a
#: core, those take a large part of a leg's time)
MAX_RANKS = int(os.environ.get("HYBRIDMPI_TEST_MAX_RANKS") or 0)


def pytest_collection_modifyitems(config, items):
    if os.environ.get("HYBRIDMPI_SANITIZE") == "1":
        skip = pytest.mark.skip(reason="HYBRIDMPI_SANITIZE: only the files of the C paths run")
        for item in items:
            if item.path.name not in SANITIZED:
                item.add_marker(skip)
    if MAX_RANKS:
        skip = pytest.mark.skip(reason=f"HYBRIDMPI_TEST_MAX_RANKS={MAX_RANKS}")
        for item in items:
            spec = getattr(item, "callspec", None)
            ranks = spec.params.get("ranks") if spec is not None else None
            if isinstance(ranks, int) and ranks > MAX_RANKS:
                item.add_marker(skip)


@functools.lru_cache(maxsize=None)
def mpi_flavor():
    """'openmpi', 'impi'' (Intel MPI: MPICH's launcher and flags, but no cliques) or 'mpich',
    from the launcher's own words."""
    out = subprocess.run([MPIEXEC, "--version"], capture_output=True, text=True).stdout
    if "Open MPI" in out or "OpenRTE" in out:
        return "openmpi"
    return "impi" if "Intel(R) MPI" in out else "mpich"


def run_mpi(script, n, *args, env=None, timeout=240):
    """Run ``script`` on ``n`` ranks; fail the test unless every rank passed.

    The program's own harness makes ranks agree; here the exit code and the
    summary line decide, and a hang ends at ``timeout`` seconds.
    """
    if MPIEXEC is None:
        pytest.fail("mpiexec not found: install the 'mpich' or 'openmpi' extra")
    full_env = dict(os.environ)
    full_env.setdefault("HYBRIDMPI_TIMEOUT", "60")
    full_env.setdefault("OPENBLAS_NUM_THREADS", "1")  # one core per rank
    full_env["PYTHONUNBUFFERED"] = "1"
    full_env.update(env or {})
    cmd = [MPIEXEC, "-n", str(n)]
    if mpi_flavor() == "impi":  # more ranks than cores: its waits yield (25x faster at 8 on 2)
        full_env.setdefault("I_MPI_WAIT_MODE", "1")
    if mpi_flavor() == "openmpi":
        full_env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        full_env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        cmd += ["--oversubscribe", "--timeout", str(timeout)]
    else:
        full_env["MPIEXEC_TIMEOUT"] = str(timeout)
    cmd += [sys.executable, "-m", "mpi4py", os.path.join(HERE, "mpi", script), *map(str, args)]
    try:
        proc = subprocess.run(cmd, env=full_env, capture_output=True, text=True,
                              timeout=timeout + 30)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{script} on {n} ranks hung past {timeout + 30} s:\n{e.stdout}\n{e.stderr}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{script} on {n} ranks failed (rc={proc.returncode}):\n{out}"
    assert "SUMMARY:" in proc.stdout and " 0 failed" in proc.stdout, out
    return proc.stdout


def launch(n, argv, *, env=None, cwd=None, timeout=240, abort=True, check=True):
    """Run ``python [-m mpi4py] ARGV`` on ``n`` ranks; return stdout.

    With ``abort`` (the default) an uncaught exception aborts every rank.
    With ``check=False`` return (exit code, stdout + stderr) instead of
    failing on a non-zero exit code.
    """
    full_env = dict(os.environ, HYBRIDMPI_TIMEOUT="60", OPENBLAS_NUM_THREADS="1")
    full_env.update(env or {})
    cmd = [MPIEXEC, "-n", str(n)]
    if mpi_flavor() == "impi":
        full_env.setdefault("I_MPI_WAIT_MODE", "1")
    if mpi_flavor() == "openmpi":
        full_env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        cmd += ["--oversubscribe", "--timeout", str(timeout)]
    else:
        full_env["MPIEXEC_TIMEOUT"] = str(timeout)
    cmd += [sys.executable, *(["-m", "mpi4py"] if abort else []), *argv]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 30, env=full_env,
                             cwd=cwd)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{argv} on {n} ranks hung past {timeout + 30} s:\n{e.stdout}\n{e.stderr}")
    if not check:
        return out.returncode, out.stdout + out.stderr
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def mpirun(n, *args, cwd=None, timeout=240):
    """Run ``python -m hybridmpi ARGS`` on ``n`` ranks; return stdout."""
    return launch(n, ["-m", "hybridmpi", *args], cwd=cwd, timeout=timeout)
