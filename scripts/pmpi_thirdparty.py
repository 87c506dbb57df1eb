"""Programs nobody here wrote, unchanged, with and without the PMPI library (docs/pmpi.md):
each must end as it ends without it.

    python scripts/pmpi_thirdparty.py [--only mpi4py,imb,petsc,fortran,dolfinx,...] [--ranks 1,2,3,4]
                                      [--mpi4py-src DIR] [--library SO] [--json FILE]

Run it with the Python of the environment whose MPI is under test (mpi4py's MPI):

- ``mpi4py``: mpi4py's own test suite (``test/main.py`` of its sdist, ``--mpi4py-src``; fetched
  from PyPI when absent): the same tests fail with the library as without it, at each rank count.
- ``imb``: ``IMB-MPI1 Allreduce Barrier`` (Intel MPI Benchmarks, shipped with ``impi-rt``;
  ``--imb PATH``), which checks nothing itself: both runs must end with exit code 0 and print
  every message size.
- ``petsc``: PETSc's KSP tutorial ``ex2`` (``libpetsc3.18-dev-examples``, built with PETSc's own
  makefile), CG + Jacobi with ``-ksp_monitor``: the same iteration count and residual history
  equal to rounding (relative 1e-8: at 3 ranks the sums combine in another order than the
  MPI's, and 250 CG iterations amplify the last bits).
- ``fortran``: ``tests/pmpi/fortran_use_mpi.f90`` and ``fortran_mpif.f90`` with the MPI's
  ``mpif90`` (they check their own results).
- ``dolfinx``: ``tests/pmpi/dolfinx_poisson.py`` (DOLFINx 0.5's Poisson problem with CG + Jacobi):
  the same solution to rounding.
- ``dolfinx-scatter``: ``tests/pmpi/dolfinx_scatter.py`` (DOLFINx 0.5's ``la.Vector`` scatters,
  forward and reverse, block size 3, and ``MatrixCSR.finalize``: MPI_Ineighbor_alltoallv + MPI_Wait
  on a dist-graph communicator): the same hashes and sums, bit for bit.
- ``petsc-neighbor``: PETSc's neighbourhood SF (``-sf_type neighbor``: one MPI_Ineighbor_alltoallv
  and an MPI_Waitall of one request per scatter): ksp ``ex2`` as in ``petsc`` (the same iterations
  and residuals, relative 1e-8), and ``tests/pmpi/petsc_dmda.c`` (DMGlobalToLocal and
  DMLocalToGlobal ADD_VALUES on a 3-D DMDA, dof 3, box stencil), whose hashes must be the same bit
  for bit.

The neighbourhood checks report the library's ``neighbor fast`` and ``neighbor passed on``
counters summed over the ranks (``HYBRIDMPI_PMPI_STATS=1``).

Prints one line per check and writes JSON; exit code 1 if any check differs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
try:   # the installed hybridmpi (a wheel in CI's Intel MPI leg), else this source tree's
    from hybridmpi.tools import pmpi
except ImportError:
    sys.path.insert(0, str(ROOT))
    from hybridmpi.tools import pmpi

MPI4PY_SDIST = ("https://files.pythonhosted.org/packages/75/83/231445bbcf7ef10864746c244ff2d82000011449b"
                "79275642c5d4ed8c8f4/mpi4py-4.1.2.tar.gz")


class Runner:
    def __init__(self, family: str, lib: str):
        self.family, self.lib = family, lib
        bin_mpiexec = Path(sys.prefix) / "bin" / "mpiexec"
        self.mpiexec = str(bin_mpiexec) if bin_mpiexec.exists() else "mpiexec"

    def run(self, n: int, argv: list[str], with_lib: bool, env=None, cwd=None, timeout=900):
        e = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                 HYBRIDMPI_PMPI_STATS="1")
        e.update(env or {})
        cmd = [self.mpiexec, "-n", str(n)]
        if self.family == "openmpi":
            cmd += ["--oversubscribe", "-x", "HYBRIDMPI_PMPI_STATS"]
            cmd += ["-x", f"LD_PRELOAD={self.lib}"] if with_lib else []
        else:
            e.setdefault("I_MPI_WAIT_MODE", "1")
            cmd += ["-genv", "LD_PRELOAD", self.lib] if with_lib else []
        try:
            p = subprocess.run(cmd + argv, env=e, cwd=cwd, capture_output=True, text=True, timeout=timeout)
            return p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired as x:
            return 124, f"timed out after {timeout} s\n{x.stdout}\n{x.stderr}"


def fast_calls(out: str) -> int:
    return counter(out, "allreduce fast")


def counter(out: str, name: str) -> int:
    """One of the library's counters (HYBRIDMPI_PMPI_STATS=1), summed over the ranks."""
    return sum(int(m) for m in re.findall(rf"(\d+) {name}\b", out))


def neighbor_calls(out: str) -> str:
    return f"{counter(out, 'neighbor fast')} neighbor calls on the core, " \
           f"{counter(out, 'neighbor passed on')} passed on"


def check_mpi4py(r: Runner, ranks, src, modules=()):
    if src is None:
        folder = Path(tempfile.mkdtemp())
        tgz = folder / "mpi4py.tar.gz"
        urllib.request.urlretrieve(MPI4PY_SDIST, tgz)
        with tarfile.open(tgz) as t:
            t.extractall(folder)
        src = next(folder.glob("mpi4py-*"))
    for n in ranks:
        got = {}
        for with_lib in (False, True):
            main_py = str(Path(src) / "test" / "main.py")
            rc, out = r.run(n, [sys.executable, main_py, "-q", *modules], with_lib)
            failed = sorted(set(re.findall(r"^(?:FAIL|ERROR): (\S+ \([^)]*\))", out, re.M)))
            ran = re.findall(r"Ran (\d+) tests", out) + re.findall(r"skipped=(\d+)", out)
            got[with_lib] = (rc, failed, ran, fast_calls(out), neighbor_calls(out))
        # a run that printed no test count did not run the suite: never a pass
        same = got[False][1] == got[True][1] and got[False][2] == got[True][2] != []
        if not got[True][2]:
            print(out[-3000:], file=sys.stderr)
        yield {"check": f"mpi4py suite, {n} ranks", "ok": same,
               "detail": f"ran, skipped {got[False][2]} / {got[True][2]}, failing without "
                         f"{len(got[False][1])} / with {len(got[True][1])}, {got[True][3]} allreduces on "
                         f"the core, {got[True][4]}",
               "only_without": sorted(set(got[False][1]) - set(got[True][1])),
               "only_with": sorted(set(got[True][1]) - set(got[False][1]))}


def check_imb(r: Runner, ranks, imb, libmpi):
    # the binary (Intel MPI's) finds the libmpi under test first: Intel MPI's own, or MPICH's
    # (one ABI)
    env = {"LD_LIBRARY_PATH": os.pathsep.join(filter(None, [str(Path(libmpi).parent),
                                                          os.environ.get("LD_LIBRARY_PATH")]))}
    for n in ranks:
        if n < 2:
            continue
        res = {}
        for with_lib in (False, True):
            rc, out = r.run(n, [imb, "-npmin", str(n), "-iter", "200", "-msglog", "0:12",
                                "Allreduce", "Barrier"], with_lib, env=env)
            rows = re.findall(r"^\s+(\d+)\s+\d+\s+[\d.]+\s+[\d.]+\s+([\d.]+)", out, re.M)
            res[with_lib] = (rc, len(rows), out)
        ok = res[False][0] == 0 and res[True][0] == 0 and res[False][1] == res[True][1] > 0
        yield {"check": f"IMB-MPI1 Allreduce Barrier, {n} ranks", "ok": ok,
               "detail": f"exit {res[False][0]}/{res[True][0]}, {res[True][1]} sizes, "
                         f"{fast_calls(res[True][2])} allreduces on the core"}


PETSC_TUTORIALS = Path("/usr/share/petsc/3.18/share/petsc/examples/src/ksp/ksp/tutorials")
EX2_OPTIONS = ["-m", "120", "-n", "120", "-ksp_type", "cg", "-pc_type", "jacobi", "-ksp_monitor",
               "-ksp_rtol", "1e-10"]


def build_petsc(source: Path) -> Path:
    """A PETSc program built with PETSc's own makefile rules, in a fresh folder."""
    petsc_dir = os.environ.get("PETSC_DIR", "/usr/lib/petscdir/petsc3.18/x86_64-linux-gnu-real")
    work = Path(tempfile.mkdtemp())
    shutil.copy(source, work)
    (work / "makefile").write_text("include ${PETSC_DIR}/lib/petsc/conf/variables\n"
                                   "include ${PETSC_DIR}/lib/petsc/conf/rules\n"
                                   "include ${PETSC_DIR}/lib/petsc/conf/test\n")
    subprocess.run(["make", source.stem], cwd=work, check=True, capture_output=True,
                   env=dict(os.environ, PETSC_DIR=petsc_dir, PETSC_ARCH=""))
    return work / source.stem


def residuals(r: Runner, n: int, ex2: Path, extra=()):
    """ex2's residual history without and with the library: (exit code, norms, output) each, and
    the largest relative difference."""
    hist = {}
    for with_lib in (False, True):
        rc, out = r.run(n, [str(ex2), *EX2_OPTIONS, *extra], with_lib)
        hist[with_lib] = (rc, [float(x) for x in re.findall(r"KSP Residual norm (\S+)", out)], out)
    a, b = hist[False][1], hist[True][1]
    diff = max((abs(x - y) / max(abs(x), 1e-300) for x, y in zip(a, b)), default=0.0)
    ok = hist[False][0] == hist[True][0] == 0 and len(a) == len(b) > 0 and diff <= 1e-8
    return ok, hist, diff


def check_petsc(r: Runner, ranks):
    ex2 = build_petsc(PETSC_TUTORIALS / "ex2.c")
    for n in ranks:
        ok, hist, diff = residuals(r, n, ex2)
        yield {"check": f"PETSc ksp ex2 CG, {n} ranks", "ok": ok,
               "detail": f"{len(hist[False][1])}/{len(hist[True][1])} iterations, residuals differ by "
                         f"{diff:.1e} at most, {fast_calls(hist[True][2])} allreduces on the core"}


def check_petsc_neighbor(r: Runner, ranks):
    """ex2 and a DMDA program under PETSc's neighbourhood SF (-sf_type neighbor)."""
    ex2 = build_petsc(PETSC_TUTORIALS / "ex2.c")
    dmda = build_petsc(ROOT / "tests" / "pmpi" / "petsc_dmda.c")
    for n in ranks:
        ok, hist, diff = residuals(r, n, ex2, ["-sf_type", "neighbor"])
        yield {"check": f"PETSc ksp ex2 CG -sf_type neighbor, {n} ranks", "ok": ok,
               "detail": f"{len(hist[False][1])}/{len(hist[True][1])} iterations, residuals differ by "
                         f"{diff:.1e} at most, {neighbor_calls(hist[True][2])}"}
        res = {}
        for with_lib in (False, True):
            rc, out = r.run(n, [str(dmda), "-n", "16", "-steps", "20", "-sf_type", "neighbor"], with_lib)
            res[with_lib] = (rc, re.findall(r"^(?:rank \d+ hash \w+|grid .*)$", out, re.M), out)
        a, b = res[False][1], res[True][1]
        ok = res[False][0] == res[True][0] == 0 and a == b and len(a) == n + 1
        yield {"check": f"PETSc DMDA global-to-local -sf_type neighbor, {n} ranks", "ok": ok,
               "detail": f"exit {res[False][0]}/{res[True][0]}, {'same' if a == b else 'different'} "
                         f"hashes ({len(a) - 1} ranks), {neighbor_calls(res[True][2])}"}


def check_fortran(r: Runner, ranks, mpif90):
    work = Path(tempfile.mkdtemp())
    for name, flags in (("fortran_use_mpi", []), ("fortran_mpif", ["-fallow-argument-mismatch"])):
        exe = work / name
        subprocess.run([*shlex.split(mpif90), "-O1", *flags, str(ROOT / "tests" / "pmpi" / f"{name}.f90"),
                        "-o", str(exe)], check=True, capture_output=True)
        for n in ranks:
            rc, out = r.run(n, [str(exe)], True)
            ok = rc == 0 and " ok" in out and (n == 1 or fast_calls(out) > 0)
            yield {"check": f"Fortran {name}, {n} ranks", "ok": ok,
                   "detail": f"exit {rc}, {fast_calls(out)} allreduces on the core"}


def check_dolfinx(r: Runner, ranks):
    for n in ranks:
        res = {}
        for with_lib in (False, True):
            script = str(ROOT / "tests" / "pmpi" / "dolfinx_poisson.py")
            rc, out = r.run(n, [sys.executable, script], with_lib)
            m = re.search(r"norm ([\d.e+-]+) iterations (\d+)", out)
            found = (float(m.group(1)), int(m.group(2))) if m else None
            res[with_lib] = (rc, found, fast_calls(out))
        a, b = res[False][1], res[True][1]
        ok = res[False][0] == res[True][0] == 0 and a is not None and b is not None and a[1] == b[1] \
            and abs(a[0] - b[0]) <= 1e-12 * abs(a[0])
        yield {"check": f"DOLFINx Poisson, {n} ranks", "ok": ok,
               "detail": f"solution norm and iterations {a} / {b}, {res[True][2]} allreduces on the core"}


def check_dolfinx_scatter(r: Runner, ranks):
    script = str(ROOT / "tests" / "pmpi" / "dolfinx_scatter.py")
    for n in ranks:
        res = {}
        for with_lib in (False, True):
            rc, out = r.run(n, [sys.executable, script, "--steps", "20"], with_lib)
            res[with_lib] = (rc, re.findall(r"^(?:mesh|ring|matrix) +scatters .*$", out, re.M), out)
        a, b = res[False][1], res[True][1]
        ok = res[False][0] == res[True][0] == 0 and a == b and len(a) == 3
        if not ok:
            print(res[True][2][-3000:], file=sys.stderr)
        yield {"check": f"DOLFINx 0.5 scatters (vector bs 3, MatrixCSR), {n} ranks", "ok": ok,
               "detail": f"exit {res[False][0]}/{res[True][0]}, "
                         f"{'same bits' if a == b else 'different bits'} in {len(a)}/{len(b)} parts, "
                         f"{neighbor_calls(res[True][2])}",
               "without": a, "with": b}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="mpi4py,imb,petsc,fortran,dolfinx,dolfinx-scatter,petsc-neighbor")
    p.add_argument("--ranks", default="1,2,3,4")
    p.add_argument("--mpi4py-src", help="an unpacked mpi4py sdist (default: fetched from PyPI)")
    p.add_argument("--mpi4py-modules", help="only these test modules, comma-separated (Intel MPI "
                   "2021.18 crashes in the whole suite without the library)")
    p.add_argument("--imb", default=shutil.which("IMB-MPI1") or str(Path(sys.prefix) / "bin" / "IMB-MPI1"),
                   help="IMB-MPI1 (default: on PATH, or beside this Python: impi-rt ships it)")
    p.add_argument("--mpif90", default=shutil.which("mpif90") or "mpif90")
    p.add_argument("--json", default="hybridmpi-results/pmpi-thirdparty.json")
    p.add_argument("--library", help="a PMPI library built already (default: pmpi.library(), built "
                   "from this tree's cext/ when needed)")
    a = p.parse_args(argv)
    t = pmpi.target()
    r = Runner(t.family, a.library or str(pmpi.library()))
    ranks = [int(x) for x in a.ranks.split(",")]
    modules = a.mpi4py_modules.split(",") if a.mpi4py_modules else []
    checks = {"mpi4py": lambda: check_mpi4py(r, ranks, a.mpi4py_src, modules),
              "imb": lambda: check_imb(r, ranks, a.imb, t.libmpi),
              "petsc": lambda: check_petsc(r, ranks),
              "fortran": lambda: check_fortran(r, ranks, a.mpif90),
              "dolfinx": lambda: check_dolfinx(r, ranks),
              "dolfinx-scatter": lambda: check_dolfinx_scatter(r, ranks),
              "petsc-neighbor": lambda: check_petsc_neighbor(r, ranks)}
    results = []
    for name in a.only.split(","):
        for res in checks[name]():
            results.append(res)
            print(f"{'ok  ' if res['ok'] else 'DIFF'} {res['check']}: {res['detail']}", flush=True)
            for k in ("only_without", "only_with"):
                if res.get(k):
                    print(f"     {k}: {res[k]}")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"mpi": t.family, "libmpi": str(t.libmpi), "results": results},
                                           indent=1))
    return 0 if all(x["ok"] for x in results) else 1


if __name__ == "__main__":
    sys.exit(main())
