"""An unchanged PETSc CG (petsc4py, KSPCG + Jacobi on the 2-D five-point Laplacian) with and without
the PMPI library: time per iteration, the iteration counts and residual histories, and inside
MPI_Allreduce the split between waiting for the last rank and the call itself.

    python bench/pmpi_cg.py [--dofs 2048,20000] [--ranks 2] [--runs 5] [--sf TYPE] [--library-sf TYPE]
                            [--json FILE]

``--sf`` is the star forest type of PETSc's scatters (MatMult's halo) in the runs without the
library, ``--library-sf`` in the runs with it (default: ``--sf``): ``--library-sf neighbor`` puts
the halo on the library's neighbourhood collectives too (docs/guide/pmpi.md), against PETSc's
default star forest without it.

It launches itself under ``mpiexec`` (the MPI of this environment's mpi4py and PETSc), each
configuration ``--runs`` times, alternating without and with the library.  A tracer
(``bench/pmpi/trace.c``, first in LD_PRELOAD in both) stamps every MPI_Allreduce's entry and
exit; per call, the last rank's arrival splits each rank's time into waiting (arrival to the
last arrival) and the call (the last arrival to its exit).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def child(a) -> None:
    """The PETSc program (under mpiexec)."""
    import petsc4py

    petsc4py.init(sys.argv[:1])
    from petsc4py import PETSc

    comm = PETSc.COMM_WORLD
    size = comm.getSize()
    m = int((a.dofs * size) ** 0.5)     # an m x m grid, rows split among the ranks
    A = PETSc.Mat().createAIJ([m * m, m * m], nnz=(5, 4), comm=comm)
    lo, hi = A.getOwnershipRange()
    for row in range(lo, hi):
        i, j = divmod(row, m)
        A.setValue(row, row, 4.0)
        for ii, jj in ((i - 1, j), (i + 1, j), (i, j - 1), (i, j + 1)):
            if 0 <= ii < m and 0 <= jj < m:
                A.setValue(row, ii * m + jj, -1.0)
    A.assemble()
    b = A.createVecLeft()
    b.set(1.0)
    x = A.createVecRight()
    ksp = PETSc.KSP().create(comm)
    ksp.setOperators(A)
    ksp.setType("cg")
    ksp.getPC().setType("jacobi")
    ksp.setTolerances(rtol=1e-30, atol=0.0, max_it=a.its)
    ksp.setConvergenceHistory()
    times = []
    for _ in range(a.reps + 1):
        x.set(0.0)
        comm.tompi4py().Barrier()
        t0 = time.perf_counter()
        ksp.solve(b, x)
        times.append((time.perf_counter() - t0) / max(ksp.getIterationNumber(), 1))
    times = times[1:]   # the first solve sets up
    if comm.getRank() == 0:
        print(json.dumps({"dofs_per_rank": (m * m) // size, "iterations": ksp.getIterationNumber(),
                          "reason": int(ksp.getConvergedReason()), "per_iteration_us":
                          [t * 1e6 for t in times],
                          "history": [float(r) for r in ksp.getConvergenceHistory()]}))


def split(trace_base: str, ranks: int) -> dict:
    """Median per call (us) of each rank's wait for the last arrival and of the last arrival to
    the last rank's exit, from the tracer's files."""
    import numpy as np

    stamps = [np.fromfile(f"{trace_base}.{r}", dtype=np.int64).reshape(-1, 2) for r in range(ranks)]
    n = min(len(s) for s in stamps)
    enter = np.stack([s[:n, 0] for s in stamps])
    leave = np.stack([s[:n, 1] for s in stamps])
    last = enter.max(axis=0)
    keep = slice(n // 4, n)   # past the set-up and the first solve
    wait = (last - enter)[:, keep].mean(axis=0)
    call = (leave.max(axis=0) - last)[keep]
    return {"calls": int(n), "wait_us": float(np.median(wait)) / 1e3, "call_us": float(np.median(call)) / 1e3}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--dofs", default="2048,20000", help="unknowns per rank (default 2048,20000)")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--runs", type=int, default=5, help="runs of each configuration (default 5)")
    p.add_argument("--its", type=int, default=300, help="CG iterations per solve (default 300)")
    p.add_argument("--reps", type=int, default=5, help="solves per run (default 5)")
    p.add_argument("--mpicc", help="compiler wrapper of the MPI (default: found for mpi4py's)")
    p.add_argument("--sf", default="basic", help="PETSc's star forest type without the library (basic)")
    p.add_argument("--library-sf", help="... with the library (default: --sf; neighbor: the halo on "
                   "the library's neighbourhood collectives)")
    p.add_argument("--json", default="hybridmpi-results/bench-pmpi-cg.json", help="output ('' for none)")
    a = p.parse_args(argv)
    if a.child:
        a.dofs = int(a.dofs)
        child(a)
        return 0
    sys.path.insert(0, str(HERE.parent))
    from hybridmpi.tools import pmpi

    t = pmpi.target(a.mpicc)
    lib = str(pmpi.library(a.mpicc))
    openmpi = t.family == "openmpi"
    mpiexec = str(Path(sys.prefix) / "bin" / "mpiexec") if (Path(sys.prefix) / "bin" / "mpiexec").exists() \
        else "mpiexec"
    rows = []
    print(f"# PETSc CG + Jacobi, {a.ranks} ranks, {a.its} iterations x {a.reps} solves; us per iteration "
          f"(median over {a.runs} runs of each run's median); MPI_Allreduce: wait for the last rank / "
          "last arrival to last exit")
    print(f"# {'dofs/rank':>9} {'MPI':>8} {'library':>8} {'ratio':>6} {'its':>5} {'max rel diff':>12} "
          f"{'wait MPI':>9} {'call MPI':>9} {'wait lib':>9} {'call lib':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        tracer = os.path.join(tmp, "libtrace.so")
        subprocess.run([*shlex.split(t.mpicc), "-O2", "-shared", "-fPIC", str(HERE / "pmpi" / "trace.c"),
                        "-o", tracer, "-ldl"], check=True)
        for dofs in map(int, a.dofs.split(",")):
            res = {False: [], True: []}
            for run in range(a.runs):
                for with_lib in (False, True):
                    preload = f"{tracer}:{lib}" if with_lib else tracer
                    base = os.path.join(tmp, f"trace-{dofs}-{run}-{int(with_lib)}")
                    sf = (a.library_sf or a.sf) if with_lib else a.sf
                    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                               HYBRIDMPI_TRACE=base, PETSC_OPTIONS=f"-sf_type {sf}")
                    cmd = [mpiexec, "-n", str(a.ranks)]
                    cmd += ["--oversubscribe", "-x", f"LD_PRELOAD={preload}", "-x", "HYBRIDMPI_TRACE", "-x",
                            "PETSC_OPTIONS"] if openmpi else ["-genv", "LD_PRELOAD", preload]
                    cmd += [sys.executable, __file__, "--child", "--dofs", str(dofs), "--its", str(a.its),
                            "--reps", str(a.reps)]
                    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
                    if out.returncode != 0:
                        raise SystemExit(f"{shlex.join(cmd)} failed:\n{out.stdout}\n{out.stderr}")
                    r = json.loads(next(x for x in out.stdout.splitlines() if x.startswith("{")))
                    r.update(split(base, a.ranks))
                    for f in glob.glob(base + ".*"):
                        os.unlink(f)
                    res[with_lib].append(r)
            med = {k: statistics.median(statistics.median(r["per_iteration_us"]) for r in v)
                   for k, v in res.items()}
            h0, h1 = res[False][0]["history"], res[True][0]["history"]
            diff = max(abs(x - y) / max(abs(x), 1e-300) for x, y in zip(h0, h1))
            row = {"dofs_per_rank": res[False][0]["dofs_per_rank"], "ranks": a.ranks,
                   "sf": {"mpi": a.sf, "library": a.library_sf or a.sf},
                   "mpi_us": med[False], "library_us": med[True], "ratio": med[True] / med[False],
                   "iterations": [res[False][0]["iterations"], res[True][0]["iterations"]],
                   "same_iterations": all(r["iterations"] == res[False][0]["iterations"]
                                          for v in res.values() for r in v),
                   "history_max_rel_diff": diff,
                   "wait_us": [statistics.median(r["wait_us"] for r in res[k]) for k in (False, True)],
                   "call_us": [statistics.median(r["call_us"] for r in res[k]) for k in (False, True)],
                   "runs": {"mpi": res[False], "library": res[True]}}
            for v in row["runs"].values():
                for r in v:
                    r.pop("history")
            rows.append(row)
            print(f"  {row['dofs_per_rank']:>9} {med[False]:8.2f} {med[True]:8.2f} {row['ratio']:6.3f} "
                  f"{res[True][0]['iterations']:>5} {diff:12.2e} {row['wait_us'][0]:9.3f} "
                  f"{row['call_us'][0]:9.3f} {row['wait_us'][1]:9.3f} {row['call_us'][1]:9.3f}", flush=True)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"benchmark": "pmpi-cg", "rows": rows}, indent=1))
        print(f"# wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
