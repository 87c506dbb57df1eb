"""The PMPI library on neighbourhood collectives (docs/guide/pmpi.md): unchanged DOLFINx, mpi4py
and PETSc ghost updates, 2 ranks, with and without the library.

    python bench/pmpi_neighbor.py [--only dolfinx,mpi4py,petsc] [--kb 4,78,312] [--dofs 2048,20000]
                                  [--runs 5] [--reps 5000] [--quick] [--library SO] [--json FILE]

Run it with the Python of Debian's stack (DOLFINx 0.5, petsc4py 3.18, mpi4py on Open MPI 4.1:
``.venv-debian/bin/python``), alone on the machine.  It launches itself under that MPI's
``mpiexec`` ``--runs`` times per configuration, alternating the configurations; the library's runs
set ``HYBRIDMPI_PMPI_AFTER=0`` (every communicator is set up at its first call) and
``HYBRIDMPI_PMPI_STATS=1`` (the ``nb fast`` column: the library's ``neighbor fast`` counter summed
over the ranks, 0 when it passed every call on to MPI).

- ``dolfinx``: ``la.Vector.scatter_forward()`` and ``scatter_reverse(add)`` whole calls (pack, one
  MPI_Ineighbor_alltoallv on a dist-graph communicator, MPI_Wait, unpack) on an IndexMap whose
  ghosts are ``--kb`` KiB (of doubles) owned by the other rank;
- ``mpi4py``: what DOLFINx calls, alone: ``Ineighbor_alltoallv`` on
  ``Create_dist_graph_adjacent`` of the other rank, then ``Wait``, the same sizes; the time of the
  call (it returns a request) and of the Wait apart;
- ``inside`` (rows of both): the time inside the neighbourhood call and its wait, from
  MPI_Ineighbor_alltoallv's entry to the exit of the MPI_Wait that completes it, without Python or
  DOLFINx's packing: a stackable timer (``bench/pmpi_timer.c``, built with the MPI's wrapper)
  preloaded in every run, in front of the library where it is loaded, gives each rank's median
  (the table: the largest rank's, median over runs);
- ``petsc``: a petsc4py loop of ``MatMult`` on the 2-D five-point Laplacian (``--dofs`` rows per
  rank), its halo exchanged by PETSc's default SF (persistent Isend/Irecv), by ``-sf_type neighbor``
  (one MPI_Ineighbor_alltoallv, then an MPI_Waitall of that one request, per MatMult) without the
  library, and by that with it; then ``VecScatterBegin`` and ``VecScatterEnd`` apart, timed around
  each call, on a VecScatter of MatMult's halo (the same ghost columns and SF type).

Times are microseconds per call: within a run, each call's time is the maximum over the ranks,
and the run gives the median over ``--reps`` calls (after ``--reps // 10`` warm-up calls); the
table gives the median over runs.  ``ratio`` is with / without the library (PETSc: neighbor with /
neighbor without; ``nbr/def``: neighbor / default SF, both without).  The JSON keeps every run's
median, and, for PETSc, ``-log_view``'s mean per call of VecScatterBegin/End in the MatMult loop
(one descheduled call on a busy machine moves a mean by milliseconds: not in the table).

On an idle 2-core machine the defaults take about 2 minutes (about 25 s per run), ``--quick``
(one run of 20 calls: does it work) about 5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


# ---- the programs (under mpiexec) ----------------------------------------------------------------

def per_call(comm, samples) -> list[float]:
    """Each call's time (us), the maximum over the ranks, on rank 0 (None elsewhere)."""
    import numpy as np

    every = comm.gather(np.asarray(samples, dtype=np.float64), root=0)
    return None if every is None else (np.max(np.stack(every), axis=0) * 1e6).tolist()


def child_dolfinx(a) -> None:
    import numpy as np
    from dolfinx import la
    from dolfinx.cpp.common import IndexMap
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    other = (rank + 1) % size
    out = {"sizes": []}
    for kb in a.kb:
        g = kb * 1024 // 8
        owned = max(2 * g, 4096)
        imap = IndexMap(comm, owned, (other * owned + np.arange(g)).astype(np.int64),
                        np.full(g, other, dtype=np.int32))
        x = la.vector(imap, 1)
        x.array[:] = np.random.default_rng(rank).random(x.array.size)
        row = {"kb": kb, "values": g}
        for name, call in (("forward", x.scatter_forward),
                           ("reverse", lambda x=x: x.scatter_reverse(la.ScatterMode.add))):
            for _ in range(max(a.reps // 10, 1)):
                call()
            t = np.empty(a.reps)
            comm.Barrier()
            for i in range(a.reps):
                t0 = time.perf_counter()
                call()
                t[i] = time.perf_counter() - t0
            us = per_call(comm, t)
            if rank == 0:
                row[name] = statistics.median(us)
        out["sizes"].append(row)
    if rank == 0:
        print(json.dumps({"mpi": MPI.Get_library_version().splitlines()[0].strip(" \0"), **out}), flush=True)


def child_mpi4py(a) -> None:
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    other = (rank + 1) % size
    graph = comm.Create_dist_graph_adjacent([other], [other], reorder=False)
    out = {"sizes": []}
    for kb in a.kb:
        g = kb * 1024 // 8
        send = np.random.default_rng(rank).random(g)
        recv = np.empty(g)
        sm, rm = [send, ([g], [0]), MPI.DOUBLE], [recv, ([g], [0]), MPI.DOUBLE]
        for _ in range(max(a.reps // 10, 1)):
            graph.Ineighbor_alltoallv(sm, rm).Wait()
        call, wait = np.empty(a.reps), np.empty(a.reps)
        comm.Barrier()
        for i in range(a.reps):
            t0 = time.perf_counter()
            req = graph.Ineighbor_alltoallv(sm, rm)
            t1 = time.perf_counter()
            req.Wait()
            t2 = time.perf_counter()
            call[i], wait[i] = t1 - t0, t2 - t1
        c, w, t = per_call(comm, call), per_call(comm, wait), per_call(comm, call + wait)
        if rank == 0:
            out["sizes"].append({"kb": kb, "values": g, "call": statistics.median(c),
                                 "wait": statistics.median(w), "total": statistics.median(t)})
    graph.Free()
    if rank == 0:
        print(json.dumps({"mpi": MPI.Get_library_version().splitlines()[0].strip(" \0"), **out}), flush=True)


def child_petsc(a) -> None:
    import numpy as np
    import petsc4py

    petsc4py.init(sys.argv[:1] + ["-log_view"] + (["-sf_type", a.sf] if a.sf != "default" else []))
    from petsc4py import PETSc

    comm = PETSc.COMM_WORLD
    mpi = comm.tompi4py()
    size = comm.getSize()
    m = int(round((a.dofs * size) ** 0.5))   # an m x m grid, rows split among the ranks
    A = PETSc.Mat().createAIJ([m * m, m * m], nnz=(5, 4), comm=comm)
    lo, hi = A.getOwnershipRange()
    for row in range(lo, hi):
        i, j = divmod(row, m)
        A.setValue(row, row, 4.0)
        for ii, jj in ((i - 1, j), (i + 1, j), (i, j - 1), (i, j + 1)):
            if 0 <= ii < m and 0 <= jj < m:
                A.setValue(row, ii * m + jj, -1.0)
    A.assemble()
    x, y = A.createVecs()
    x.setRandom()
    # MatMult's own halo again, timed apart: a VecScatter (the SF type the options give, as
    # MatMult's) from x to the columns of [lo, hi)'s rows that other ranks own
    rows = np.arange(lo, hi)
    cols = np.concatenate([rows - m, rows + m, rows[rows % m != 0] - 1, rows[rows % m != m - 1] + 1])
    off = ((cols < lo) | (cols >= hi)) & (cols >= 0) & (cols < m * m)
    ghosts = np.unique(cols[off]).astype(PETSc.IntType)
    halo = PETSc.Vec().createSeq(len(ghosts), comm=PETSc.COMM_SELF)
    scatter = PETSc.Scatter().create(x, PETSc.IS().createGeneral(ghosts, comm=PETSc.COMM_SELF), halo, None)
    out = {"dofs_per_rank": (m * m) // size, "ghosts": mpi.gather(len(ghosts), root=0)}

    def timed(name, call):
        for _ in range(max(a.reps // 10, 1)):
            call()
        t = []
        mpi.Barrier()
        for _ in range(a.reps):
            t0 = time.perf_counter()
            call()
            t.append(time.perf_counter() - t0)
        us = per_call(mpi, t)
        if mpi.rank == 0:
            out[name] = statistics.median(us)

    # the MatMult loop in a stage of its own: -log_view's section for it (printed at
    # PetscFinalize, after the JSON line) gives the mean per call of VecScatterBegin/End (the
    # maximum over the ranks); petsc4py 3.18's Log.Event("VecScatterEnd").getPerfInfo() counts 0
    stage = PETSc.Log.Stage(LOG_STAGE)
    stage.push()
    timed("matmult", lambda: A.mult(x, y))
    stage.pop()
    begin, end = [], []
    for _ in range(max(a.reps // 10, 1)):
        scatter.begin(x, halo)
        scatter.end(x, halo)
    mpi.Barrier()
    for _ in range(a.reps):
        t0 = time.perf_counter()
        scatter.begin(x, halo)
        t1 = time.perf_counter()
        scatter.end(x, halo)
        begin.append(t1 - t0)
        end.append(time.perf_counter() - t1)
    b, e, t = per_call(mpi, begin), per_call(mpi, end), per_call(mpi, np.add(begin, end))
    if mpi.rank == 0:
        from mpi4py import MPI

        out.update(begin=statistics.median(b), end=statistics.median(e), halo=statistics.median(t))
        print(json.dumps({"mpi": MPI.Get_library_version().splitlines()[0].strip(" \0"), "sf": a.sf, **out}),
              flush=True)


LOG_STAGE = "timed MatMult"
LOG_EVENTS = ("MatMult", "VecScatterBegin", "VecScatterEnd")


def log_times(out: str) -> dict:
    """Microseconds per call (the maximum over the ranks' totals / the count) of LOG_EVENTS in the
    stage LOG_STAGE of -log_view's table."""
    section = re.split(rf"--- Event Stage \d+: {LOG_STAGE}\n", out, maxsplit=1)[1]
    section = section.split("--- Event Stage", 1)[0]
    got = {}
    for name in LOG_EVENTS:
        m = re.search(rf"^{name}\s+(\d+)\s+\S+\s+(\S+)", section, re.M)
        got[f"log_mean_{name}"] = float(m.group(2)) / int(m.group(1)) * 1e6
    return got


# ---- the runner ------------------------------------------------------------------------------

def build_timer(t) -> str:
    """bench/pmpi_timer.c built with the MPI's wrapper (``t``: pmpi.target()), in the library's
    cache folder."""
    from hybridmpi.tools import pmpi

    out = pmpi.cache_dir() / f"pmpi-timer-{t.family}.so"
    src = HERE / "pmpi_timer.c"
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([*shlex.split(t.mpicc), "-O2", "-shared", "-fPIC", str(src), "-o", str(out), "-ldl"],
                       check=True, capture_output=True, text=True)
    return str(out)


def inside(stderr: str) -> dict:
    """The stackable timer's medians (bench/pmpi_timer.c): bytes sent per call -> the largest
    rank's median microseconds from MPI_Ineighbor_alltoallv's entry to its wait's exit."""
    got: dict = {}
    for b, us in re.findall(r"pmpi_timer: rank \d+: bytes (\d+): calls \d+ median_us ([\d.]+)", stderr):
        got[b] = max(got.get(b, 0.0), float(us))
    return got


def launch(mpi: dict, argv: list[str], with_lib: bool) -> tuple[dict, int]:
    """One run under mpiexec, the timer in front of the library (or alone): rank 0's JSON line,
    with the timer's medians, and the library's neighbor fast count."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    cmd = [mpi["mpiexec"], "-n", str(mpi["ranks"])]
    extra = {"HYBRIDMPI_PMPI_AFTER": "0", "HYBRIDMPI_PMPI_STATS": "1"} if with_lib else {}
    env.update(extra)
    preload = f"{mpi['timer']}:{mpi['library']}" if with_lib else mpi["timer"]
    if mpi["family"] == "openmpi":
        cmd += ["--oversubscribe", "-x", "OPENBLAS_NUM_THREADS", "-x", "OMP_NUM_THREADS"]
        cmd += [f for k in extra for f in ("-x", k)]
        cmd += ["-x", f"LD_PRELOAD={preload}"]
    else:
        cmd += ["-genv", "LD_PRELOAD", preload]
    cmd += [sys.executable, __file__, *argv]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"{shlex.join(cmd)} failed:\n{out.stdout}\n{out.stderr[-5000:]}")
    fast = sum(int(n) for n in re.findall(r"(\d+) neighbor fast\b", out.stderr))
    got = json.loads(next(x for x in out.stdout.splitlines() if x.startswith("{")))
    got["inside"] = inside(out.stderr)
    mpi.setdefault("version", got.pop("mpi"))
    if "--sf" in argv:
        got.update(log_times(out.stdout))
    return got, fast


def med(values) -> float:
    return statistics.median(values)


def bench_dolfinx(mpi, a, kind: str) -> list[dict]:
    """kind "dolfinx" or "mpi4py": runs alternating without and with the library."""
    argv = ["--child", kind, "--kb", ",".join(map(str, a.kb)), "--reps", str(a.reps)]
    runs = {False: [], True: []}
    for _ in range(a.runs):
        for with_lib in (False, True):
            runs[with_lib].append(launch(mpi, argv, with_lib))
    rows = []
    calls = ("forward", "reverse", "inside") if kind == "dolfinx" else ("call", "wait", "total", "inside")
    for i, kb in enumerate(a.kb):
        for call in calls:
            # inside: the timer's, by the bytes a call sends (DOLFINx: both directions, the same)
            series = {w: [r[0]["inside"].get(str(r[0]["sizes"][i]["values"] * 8), float("nan"))
                          if call == "inside" else r[0]["sizes"][i][call] for r in runs[w]]
                      for w in (False, True)}
            base, lib = med(series[False]), med(series[True])
            rows.append({"part": kind, "kb": kb, "values": runs[False][0][0]["sizes"][i]["values"],
                         "call": call, "mpi_us": base, "library_us": lib, "ratio": lib / base,
                         "runs_mpi": series[False], "runs_library": series[True],
                         "neighbor_fast": [r[1] for r in runs[True]]})
    return rows


def bench_petsc(mpi, a) -> list[dict]:
    configs = (("default", False), ("neighbor", False), ("neighbor", True))
    rows = []
    for dofs in a.dofs:
        runs = {c: [] for c in configs}
        for _ in range(a.runs):
            for sf, with_lib in configs:
                runs[(sf, with_lib)].append(launch(mpi, ["--child", "petsc", "--dofs", str(dofs), "--sf", sf,
                                                         "--reps", str(a.reps)], with_lib))
        for key, call in (("matmult", "MatMult"), ("begin", "VecScatterBegin"), ("end", "VecScatterEnd"),
                          ("halo", "Begin + End")):
            us = {c: med(r[0][key] for r in runs[c]) for c in configs}
            rows.append({"part": "petsc", "dofs_per_rank": runs[configs[0]][0][0]["dofs_per_rank"],
                         "call": call, "default_us": us[configs[0]],
                         "mpi_us": us[configs[1]], "library_us": us[configs[2]],
                         "ratio": us[configs[2]] / us[configs[1]],
                         "neighbor_vs_default": us[configs[1]] / us[configs[0]],
                         "runs": {f"{sf}{' library' if w else ''}": [r[0][key] for r in runs[(sf, w)]]
                                  for sf, w in configs},
                         "neighbor_fast": [r[1] for r in runs[configs[2]]]})
            if key == "matmult":   # means, which one descheduled call spoils: in the JSON only
                rows[-1]["log_view_mean_us"] = {
                    f"{sf}{' library' if w else ''}": {e: med(r[0][f"log_mean_{e}"] for r in runs[(sf, w)])
                                                       for e in LOG_EVENTS} for sf, w in configs}
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", choices=("dolfinx", "mpi4py", "petsc"), help=argparse.SUPPRESS)
    p.add_argument("--sf", default="default", help=argparse.SUPPRESS)
    p.add_argument("--only", default="dolfinx,mpi4py,petsc")
    p.add_argument("--kb", default="4,78,312", help="KiB per neighbour, DOLFINx and mpi4py (default "
                   "4,78,312)")
    p.add_argument("--dofs", default="2048,20000", help="rows per rank, PETSc (default 2048,20000)")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--runs", type=int, default=5, help="runs of each configuration (default 5)")
    p.add_argument("--reps", type=int, default=5000, help="timed calls per size and run (default 5000)")
    p.add_argument("--quick", action="store_true", help="1 run of 20 calls: does it work")
    p.add_argument("--library", help="a PMPI library built already (default: pmpi.library())")
    p.add_argument("--json", help="output ('' for none; default bench/results/pmpi-neighbor-2ranks-"
                   "debian-openmpi.json, with --quick hybridmpi-results/bench-pmpi-neighbor-quick.json)")
    a = p.parse_args(argv)
    a.kb = [int(k) for k in a.kb.split(",")]
    a.dofs = [int(d) for d in a.dofs.split(",")]
    if a.child:
        a.dofs = a.dofs[0]
        {"dolfinx": child_dolfinx, "mpi4py": child_mpi4py, "petsc": child_petsc}[a.child](a)
        return 0
    if a.quick:
        a.runs, a.reps = 1, 20
    if a.json is None:
        a.json = "hybridmpi-results/bench-pmpi-neighbor-quick.json" if a.quick else \
            str(HERE / "results" / f"pmpi-neighbor-{a.ranks}ranks-debian-openmpi.json")
    sys.path.insert(0, str(HERE.parent))
    from hybridmpi.tools import pmpi

    t = pmpi.target()
    mpiexec = Path(sys.prefix) / "bin" / "mpiexec"
    mpi = {"family": t.family, "libmpi": str(t.libmpi), "ranks": a.ranks,
           "library": a.library or str(pmpi.library()),
           "mpiexec": str(mpiexec) if mpiexec.exists() else "mpiexec", "timer": build_timer(t)}
    only = a.only.split(",")
    rows = []
    started = time.time()
    head = f"{a.ranks} ranks, {a.reps} calls x {a.runs} runs; us per call, median over runs"
    for kind in ("dolfinx", "mpi4py"):
        if kind not in only:
            continue
        what = "DOLFINx la.Vector scatters (whole call)" if kind == "dolfinx" else \
            "mpi4py Ineighbor_alltoallv + Wait on a dist-graph communicator"
        print(f"# {what}, {head}; ratio = with / without the library")
        print(f"# {'call':>8} {'KiB/nbr':>8} {'doubles':>8} {'MPI':>9} {'library':>9} {'ratio':>6} "
              f"{'nb fast':>8}")
        got = bench_dolfinx(mpi, a, kind)
        for r in got:
            print(f"  {r['call']:>8} {r['kb']:>8} {r['values']:>8} {r['mpi_us']:9.2f} {r['library_us']:9.2f} "
                  f"{r['ratio']:6.3f} {max(r['neighbor_fast']):>8}", flush=True)
        rows += got
    if "petsc" in only:
        print(f"# PETSc MatMult (2-D Laplacian), {head}; SF: default (no library), neighbor without and with "
              "the library; ratio = neighbor with / without; nbr/def = neighbor / default, both without")
        print(f"# {'dofs/rank':>9} {'call':>15} {'default':>9} {'neighbor':>9} {'library':>9} {'ratio':>6} "
              f"{'nbr/def':>7} {'nb fast':>8}")
        got = bench_petsc(mpi, a)
        for r in got:
            print(f"  {r['dofs_per_rank']:>9} {r['call']:>15} {r['default_us']:9.2f} {r['mpi_us']:9.2f} "
                  f"{r['library_us']:9.2f} {r['ratio']:6.3f} {r['neighbor_vs_default']:7.3f} "
                  f"{max(r['neighbor_fast']):>8}", flush=True)
        rows += got
    print(f"# {time.time() - started:.0f} s")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({
            "benchmark": "pmpi-neighbor", "mpi": mpi.get("version"),
            "library": mpi["library"], "ranks": a.ranks, "runs": a.runs, "reps": a.reps,
            "settings": {"HYBRIDMPI_PMPI_AFTER": "0"}, "rows": rows}, indent=1))
        print(f"# wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
