"""The PMPI library's benchmark (docs/pmpi.md): a C loop of MPI_Allreduce (8 B) and MPI_Barrier,
run as it is and under the library, at each MPI's default and fastest thread levels, in the
same run.

    python bench/pmpi.py [--venv DIR ...] [--ranks 2,4] [--runs 3] [--iters 20000] [--json FILE]

Each ``--venv`` is a Python environment with hybridmpi and mpi4py for one MPI (default: this
one); its ``mpiexec`` (or the one on PATH) launches, its MPI's wrapper compiles
``bench/pmpi/loop.c`` and the library.  Every configuration runs ``--runs`` times, alternating
with and without the library; the table gives the median over runs of each run's median per
call, and the ratio with/without.  Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
LEVELS = ("funneled", "multiple")
PROBE = ("from hybridmpi.tools import pmpi; t = pmpi.target(); print(pmpi.library()); print(t.mpicc); "
         "print(t.libmpi); print(t.family); from mpi4py import MPI; "
         "print(MPI.Get_library_version().splitlines()[0].strip())")


def describe(venv: Path) -> dict:
    """The library, wrapper, libmpi and launcher of one environment's MPI."""
    python = venv / "bin" / "python"
    out = subprocess.run([str(python), "-c", PROBE], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=str(HERE.parent))).stdout.splitlines()
    lib, mpicc, libmpi, family, version = out[:5]
    mpiexec = venv / "bin" / "mpiexec"
    return {"venv": str(venv), "library": lib, "mpicc": mpicc, "libmpi": libmpi, "family": family,
            "mpi": version, "mpiexec": str(mpiexec) if mpiexec.exists() else "mpiexec"}


def build_loop(mpi: dict, folder: Path) -> str:
    exe = folder / f"loop-{mpi['family']}-{abs(hash(mpi['libmpi']))}"
    libmpi = Path(mpi["libmpi"])
    subprocess.run([*shlex.split(mpi["mpicc"]), "-O2", str(HERE / "pmpi" / "loop.c"), "-o", str(exe),
                    f"-L{libmpi.parent}", f"-Wl,-rpath,{libmpi.parent}", f"-l:{libmpi.name}"],
                   check=True)
    return str(exe)


def launch(mpi: dict, ranks: int, argv: list[str], preload: str | None) -> dict:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = [mpi["mpiexec"], "-n", str(ranks)]
    if mpi["family"] == "openmpi":
        cmd += ["--oversubscribe", "--bind-to", "none"]
        if preload:
            cmd += ["-x", f"LD_PRELOAD={preload}"]
    elif preload:
        cmd += ["-genv", "LD_PRELOAD", preload]
    out = subprocess.run(cmd + argv, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"{shlex.join(cmd + argv)} failed:\n{out.stdout}\n{out.stderr}")
    return json.loads(next(line for line in out.stdout.splitlines() if line.startswith("{")))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--venv", action="append", type=Path, help="an environment per MPI (default: this)")
    p.add_argument("--ranks", default="2", help="rank counts, comma-separated (default 2)")
    p.add_argument("--runs", type=int, default=3, help="runs of each configuration (default 3)")
    p.add_argument("--iters", type=int, default=20000, help="calls per repetition (default 20000)")
    p.add_argument("--reps", type=int, default=7, help="repetitions per run (default 7)")
    p.add_argument("--json", default="hybridmpi-results/bench-pmpi.json", help="output ('' for none)")
    a = p.parse_args(argv)
    venvs = a.venv or [Path(sys.prefix)]
    rows = []
    print("# PMPI library: time per call (us), median over runs of each run's median; "
          "ratio = with / without")
    print(f"# {'MPI':<34} {'ranks':>5} {'level':>9} {'call':>9} {'MPI':>8} {'library':>8} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for venv in venvs:
            mpi = describe(venv)
            exe = build_loop(mpi, Path(tmp))
            for ranks in map(int, a.ranks.split(",")):
                for level in LEVELS:
                    runs = {False: [], True: []}
                    for _ in range(a.runs):
                        for with_lib in (False, True):
                            runs[with_lib].append(launch(mpi, ranks, [exe, level, str(a.iters), str(a.reps)],
                                                         mpi["library"] if with_lib else None))
                    for call in ("allreduce", "barrier"):
                        base = statistics.median(r[f"{call}_median"] for r in runs[False])
                        lib = statistics.median(r[f"{call}_median"] for r in runs[True])
                        row = {"mpi": mpi["mpi"], "family": mpi["family"], "ranks": ranks, "level": level,
                               "provided": runs[False][0]["provided"], "call": call, "mpi_us": base,
                               "library_us": lib, "ratio": lib / base,
                               "runs_mpi": [r[f"{call}_median"] for r in runs[False]],
                               "runs_library": [r[f"{call}_median"] for r in runs[True]]}
                        rows.append(row)
                        print(f"  {mpi['mpi'][:34]:<34} {ranks:>5} {row['provided']:>9} {call:>9} "
                              f"{base:8.3f} {lib:8.3f} {lib / base:6.2f}", flush=True)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"benchmark": "pmpi", "iters": a.iters, "reps": a.reps,
                                            "runs": a.runs, "rows": rows}, indent=1))
        print(f"# wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
