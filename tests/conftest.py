"""Launch MPI test programs under mpiexec with a timeout on the launcher too."""

import functools
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
# The C core's collectives in every layout the suite runs (one rank per node would take MPI's own
# calls by default), and no tuning table of this machine's cache: tests/test_tuning.py sets its
# own.  Every program the suite starts inherits these.
os.environ.setdefault("HYBRIDMPI_TUNE", "off")
os.environ.setdefault("HYBRIDMPI_TUNE_DIR", os.path.join(HERE, ".no-tuning-tables"))
MPIEXEC = os.environ.get("HYBRIDMPI_MPIEXEC") or shutil.which("mpiexec",
                                                               path=os.path.dirname(sys.executable)
                                                               + os.pathsep + os.environ["PATH"])


#: Under the sanitizers (.ci/sanitize sets HYBRIDMPI_SANITIZE=1) only these files run: the ones whose
#: time goes to the C core (collectives, ghost exchange, global memory, bounds, the error paths);
#: the rest spend it in Python, numpy, gmsh and plotting, and would take the leg past CI's time
#: (the whole suite took 38-52 minutes under ASan on the loaded 2-core VM).
SANITIZED = ("test_core.py", "test_bounds.py", "test_collectives.py", "test_globalmem.py",
             "test_halo.py", "test_views.py", "test_silent.py", "test_onerank.py", "test_profile.py",
             "test_errors.py", "test_tuning.py")


#: HYBRIDMPI_TEST_MAX_RANKS=K skips the runs of more than K ranks (the CI legs of Intel MPI and
#: of Open MPI from pip: MPICH's and Debian's Open MPI's legs run them; oversubscribed four to a
#: core, those take a large part of a leg's time)
MAX_RANKS = int(os.environ.get("HYBRIDMPI_TEST_MAX_RANKS") or 0)


#: HYBRIDMPI_TEST_SELECT=mpi (CI's legs of the other MPIs: Intel MPI, Open MPI from pip,
#: Debian's Open MPI) runs only the files whose outcome depends on the MPI library under
#: hybridmpi: the comm's set-up and its windows, the paths between nodes, the launchers' ways
#: with failing and signalled ranks, MPI's resources and limits, the PMPI library, the tuning
#: tables (keyed by the MPI), DOLFINx and PETSc.  The rest (the C core alone, the tools, the
#: command line, meshes, FEM, apps, plots, the house rules, the stress and fuzz soaks) runs in
#: the MPICH leg, the README's command.
PER_MPI = ("test_collectives.py", "test_halo.py", "test_globalmem.py", "test_views.py",
           "test_faults.py", "test_signals.py", "test_resources.py", "test_limits.py",
           "test_agreement.py", "test_onerank.py", "test_pmpi.py", "test_tuning.py", "test_drift.py",
           "test_interop.py", "test_docs.py", "test_share.py")
SELECT = os.environ.get("HYBRIDMPI_TEST_SELECT", "")
if SELECT not in ("", "mpi"):
    raise pytest.UsageError(f"HYBRIDMPI_TEST_SELECT={SELECT!r}: 'mpi' or unset")


#: HYBRIDMPI_TEST_DEEP=1 (run by hand before a release: docs/development.md) runs everything.  Without it (the
#: README's test command) the suite runs each layout and method once, at up to 4 ranks, in about
#: 13-16 minutes on a 2-core machine, and leaves to the deep run the 8-rank runs (oversubscribed four
#: to a core: 10-20 s each), the second size of a layout already run at another (the Halo's
#: cliques at 3 when 4 runs; global memory's cliques, the Halo's one-rank nodes, the memory order
#: and uneven virtual nodes at 4 when 3 runs), the longer soaks (17,000 Halos' lifecycle, which the
#: 16,000 Halos of test_silent.py stand for; 10,000 live Halos at 3 ranks, every fuzz reproducer
#: and signal at both sizes), the PMPI matrix past 2 ranks, and the full counts of a few cases
#: (tests/mpi/ reads HYBRIDMPI_TEST_DEEP: thousands of live global memories at every size, each
#: rank odd one out three times); each such test reads as skipped, with this reason.
DEEP = os.environ.get("HYBRIDMPI_TEST_DEEP") == "1"
DEEP_ONLY = (
    *(f"test_collectives.py::test_collectives[{c}]" for c in ("cliques2-3", "seq_cst-4", "node_size3-4",
                                                               "node_size1-3", "node-3", "node_size2-3")),
    "test_globalmem.py::test_globalmem[cliques2-4]", "test_globalmem.py::test_globalmem[seq_cst-4]",
    "test_globalmem.py::test_globalmem[node_size3-4]",
    "test_halo.py::test_halo[cliques2-3]", "test_halo.py::test_halo[seq_cst-4]",
    "test_halo.py::test_halo[node_size3-4]", "test_halo.py::test_halo[node_size1-4]",
    "test_signals.py::test_signals[4-args1]",
    "test_agreement.py::test_agreement[3-1]",
    "test_fuzz.py::test_lifecycle_17000_halos_and_tags",
    "test_fuzz.py::test_fuzz_findings_reproducers[4-node_size2]",
    "test_fuzz.py::test_fuzz_findings_reproducers[3]", "test_fuzz.py::test_fuzz_findings_reproducers[2]",
    "test_silent.py::test_nothing_silently_wrong[3]",
    "test_resources.py::test_ten_thousand_live_halos[3]",
    "test_pmpi.py::test_matrix[4-2]", "test_pmpi.py::test_matrix[6-3]",
    "test_pmpi.py::test_neighbor_matrix[4-None]", "test_pmpi.py::test_neighbor_matrix[2-1]",
    "test_pmpi.py::test_neighbor_edges_past_the_staging_area[3-None-None-4096]",
    "test_pmpi.py::test_neighbor_edges_past_the_staging_area[3-None-1073741824-None]",
)


def _only_files(items, files, reason):
    """Skip, with ``reason``, every test whose file is not one of ``files``."""
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if item.path.name not in files:
            item.add_marker(skip)


def pytest_collection_modifyitems(config, items):
    if not DEEP:
        skip = pytest.mark.skip(reason="deep run only (HYBRIDMPI_TEST_DEEP=1, run by hand): "
                                       "8 ranks, a second size of a layout, a long soak")
        for item in items:
            spec = getattr(item, "callspec", None)
            ranks = spec.params.get("ranks") if spec is not None else None
            if isinstance(ranks, int) and ranks > 4 or \
                    any(item.nodeid.endswith(d) for d in DEEP_ONLY):
                item.add_marker(skip)
    if os.environ.get("HYBRIDMPI_SANITIZE") == "1":
        _only_files(items, SANITIZED, "HYBRIDMPI_SANITIZE: only the files of the C paths run")
    if SELECT == "mpi":
        _only_files(items, PER_MPI, "HYBRIDMPI_TEST_SELECT=mpi: the files whose outcome depends on "
                                    "the MPI library run (conftest.py PER_MPI)")
    if MAX_RANKS:
        skip = pytest.mark.skip(reason=f"HYBRIDMPI_TEST_MAX_RANKS={MAX_RANKS}")
        for item in items:
            spec = getattr(item, "callspec", None)
            ranks = spec.params.get("ranks") if spec is not None else None
            if isinstance(ranks, int) and ranks > MAX_RANKS:
                item.add_marker(skip)


def _shm_in_use():
    """The /dev/shm files some live process has open or mapped."""
    used = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as maps:
                used.update(line.split(None, 5)[5].strip() for line in maps
                            if "/dev/shm/" in line and len(line.split(None, 5)) == 6)
            fd_dir = f"/proc/{pid}/fd"
            used.update(os.readlink(os.path.join(fd_dir, fd)) for fd in os.listdir(fd_dir))
        except OSError:
            continue
    return {os.path.basename(p) for p in used if p.startswith("/dev/shm/")}


def _shm_names():
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def _remove_unused(names, wait=0.0):
    """Unlink those of ``names`` in /dev/shm that no live process uses, waiting up to ``wait``
    seconds for the ranks of a job the launcher just ended to go."""
    deadline = time.monotonic() + wait
    while names:
        names &= _shm_names()
        for name in names - _shm_in_use():
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except OSError:
                pass
            names.discard(name)
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)


_SESSION_SHM = _shm_names()


@pytest.fixture(autouse=True)
def _clean_dev_shm():
    """What a test's MPI jobs leave in /dev/shm (MPICH's and Open MPI's segments of the jobs
    that tests abort or kill on purpose) is removed after the test, so that runs do not fill
    a container's 64 MB /dev/shm.  Only files made during the test that no live process has
    open or mapped go; a test that checks that nothing is left looks before this runs."""
    before = _shm_names()
    yield
    _remove_unused(_shm_names() - before, wait=2.0)


def pytest_sessionfinish(session):
    """The same for the whole session: what was made during it and is unused at its end."""
    _remove_unused(_shm_names() - _SESSION_SHM, wait=2.0)


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
    check_summary(proc.stdout, " ".join([script, *map(str, args), f"on {n} ranks"]))
    return proc.stdout


#: (program, case, reason) of every case a harness program skipped in this pytest run
SKIPPED_CASES = []
#: (seconds, program, case) of every harness case run in this pytest run; with
#: HYBRIDMPI_TEST_SLOWEST=N the session ends with the N slowest (where a leg's time goes)
CASE_TIMES = []


def check_summary(stdout, what):
    """The harness's verdict (tests/mpi/_harness.py): no case failed and at least one passed.
    A run whose every case was skipped (too few ranks, a missing feature) is a pytest skip with
    the reasons; cases skipped beside passed ones are listed at the end of the session."""
    m = re.search(r"^SUMMARY: (\d+) passed, (\d+) failed(?:, (\d+) skipped)?\b", stdout, re.M)
    assert m, f"{what}: no harness summary line:\n{stdout}"
    passed, failed, skipped = (int(g or 0) for g in m.groups())
    assert failed == 0, stdout
    reasons = re.findall(r"^(\w+): skipped \((.*)\) \(", stdout, re.M)
    assert len(reasons) == skipped, stdout
    SKIPPED_CASES.extend((what, case, why) for case, why in reasons)
    CASE_TIMES.extend((float(t), what, case) for case, t in
                      re.findall(r"^(\w+): (?:ok|skipped .*) \((\d+\.\d+) s\)$", stdout, re.M))
    if not passed:
        assert skipped, f"{what}: no case ran:\n{stdout}"
        pytest.skip(f"{what}: every case skipped: " + "; ".join(f"{c}: {w}" for c, w in reasons))


def pytest_terminal_summary(terminalreporter):
    if SKIPPED_CASES:
        terminalreporter.section(f"harness cases skipped inside MPI programs: {len(SKIPPED_CASES)}")
        for what, case, why in SKIPPED_CASES:
            terminalreporter.line(f"{what}: {case}: {why}")
    slowest = int(os.environ.get("HYBRIDMPI_TEST_SLOWEST") or 0)
    if slowest and CASE_TIMES:
        total = sum(t for t, _, _ in CASE_TIMES)
        terminalreporter.section(f"slowest harness cases ({len(CASE_TIMES)} cases, {total:.0f} s in all)")
        for t, what, case in sorted(CASE_TIMES, reverse=True)[:slowest]:
            terminalreporter.line(f"{t:7.2f} s  {case}  ({what})")


def no_cleanup():
    """The launcher's arguments and the command prefix under which a rank that dies leaves the
    others running (the launcher's own cleanup off), so that a test of how survivors notice a
    killed rank tests the library, not the launcher (which ends MPICH's job 0.2-1 s after a
    SIGKILL).  Hydra (MPICH, Intel MPI): ``-disable-auto-cleanup`` keeps the others running
    after a rank's exit with an error, but still ends them after a death by signal, and tells
    them of a failure by SIGUSR1, whose default action ends a process.  So each rank runs under
    a shell that ignores SIGUSR1 (ignored stays ignored across exec) and turns the death into
    an exit status.  Open MPI's launcher has no such switch: skip."""
    if mpi_flavor() == "openmpi":
        pytest.skip("Open MPI's launcher always ends the job when a rank dies")
    return ["-disable-auto-cleanup"], ["sh", "-c", 'trap "" USR1; "$@"; exit $?', "sh"]


def launch(n, argv, *, env=None, cwd=None, timeout=240, abort=True, check=True, cleanup=True):
    """Run ``python [-m mpi4py] ARGV`` on ``n`` ranks; return stdout.

    With ``abort`` (the default) an uncaught exception aborts every rank.
    With ``check=False`` return (exit code, stdout + stderr) instead of
    failing on a non-zero exit code.  With ``cleanup=False`` the launcher
    leaves the other ranks running when one dies (:func:`no_cleanup`).
    """
    full_env = dict(os.environ, HYBRIDMPI_TIMEOUT="60", OPENBLAS_NUM_THREADS="1")
    full_env.update(env or {})
    cmd = [MPIEXEC, "-n", str(n)]
    wrap = []
    if not cleanup:
        flags, wrap = no_cleanup()
        cmd += flags
    if mpi_flavor() == "impi":
        full_env.setdefault("I_MPI_WAIT_MODE", "1")
    if mpi_flavor() == "openmpi":
        full_env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        cmd += ["--oversubscribe", "--timeout", str(timeout)]
    else:
        full_env["MPIEXEC_TIMEOUT"] = str(timeout)
    cmd += [*wrap, sys.executable, *(["-m", "mpi4py"] if abort else []), *argv]
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
