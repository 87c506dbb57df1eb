"""The ghost-update target table: every size, layout and block, private and shared vectors,
PETSc and DOLFINx, as medians of several runs of ``hybridmpi bench ghost --peers``.

    python scripts/ghost_table.py [--np 2] [--runs 3] [--sizes 4,20,78,312]
        [--mpiexec "mpiexec --oversubscribe"] [--out hybridmpi-results/ghost-table.json]

Run it where petsc4py and dolfinx import (docs/benchmarks.md: "Against PETSc and DOLFINx"); without them
the peer columns are empty.  Prints a Markdown table (µs, median over runs of the
per-run mean; ratios of the medians) and writes every run's documents to ``--out``.
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

SERIES = ("petsc", "dolfinx", "flat-numpy", "atomic", "atomic shared", "floor")


def one_run(a, layout, block, path):
    cmd = shlex.split(a.mpiexec) + ["-n", str(a.np), sys.executable, "-m", "hybridmpi", "bench",
                                    "ghost", "--sizes", a.sizes, "--layout", layout, "--block",
                                    str(block), "--methods", "atomic", "--peers", "--reps",
                                    str(a.reps), "--json", path] + (["--kb"] if a.unit == "kB" else [])
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=a.timeout)
    with open(path) as f:
        return json.load(f)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, default=2, help="ranks")
    p.add_argument("--runs", type=int, default=3, help="runs per configuration (median)")
    p.add_argument("--reps", type=int, default=7, help="repetitions per run")
    p.add_argument("--sizes", default="4,20,78,312", help="per neighbor, in --unit")
    p.add_argument("--unit", choices=["kB", "KiB"], default="kB",
                   help="kB (1000 bytes, the default: 4 kB stays under Open MPI's 4096-byte "
                   "eager limit) or KiB")
    p.add_argument("--layouts", default="runs,scattered")
    p.add_argument("--blocks", default="1,3")
    p.add_argument("--mpiexec", default="mpiexec", help="launcher and its options")
    p.add_argument("--timeout", type=float, default=600, help="seconds per run")
    p.add_argument("--out", default="hybridmpi-results/ghost-table.json")
    a = p.parse_args()
    docs, rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for layout in a.layouts.split(","):
            for block in map(int, a.blocks.split(",")):
                runs = []
                for i in range(a.runs):
                    print(f"# {layout} block {block}: run {i + 1}/{a.runs}", file=sys.stderr)
                    runs.append(one_run(a, layout, block, os.path.join(tmp, "run.json")))
                docs += runs
                for size in map(float, a.sizes.split(",")):
                    med = {}
                    for s in SERIES:
                        got = [r["mean"] for d in runs for r in d["results"]
                               if r["series"] == s and r["x"] == size]
                        med[s] = statistics.median(got) if got else None
                    rows.append((size, layout, block, med))
    head = ([a.unit, "layout", "block"] + [s for s in SERIES]
            + ["private/PETSc", "shared/PETSc", "shared/DOLFINx", "shared/floor"])
    print(f"# {docs[0]['mpi_library']}; {a.np} ranks; median of {a.runs} runs (µs)")
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))

    def ratio(x, y):
        return f"{x / y:.2f}" if x is not None and y else "-"

    for size, layout, block, m in rows:
        cells = [f"{size:g}", layout, str(block)] + [f"{m[s]:.2f}" if m[s] is not None else "-"
                                                     for s in SERIES]
        cells += [ratio(m["atomic"], m["petsc"]), ratio(m["atomic shared"], m["petsc"]),
                  ratio(m["atomic shared"], m["dolfinx"]), ratio(m["atomic shared"], m["floor"])]
        print("| " + " | ".join(cells) + " |")
    folder = os.path.dirname(a.out)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"runs": docs, "table": [{"kib": s, "layout": lay, "block": b, "median_us": m}
                                           for s, lay, b, m in rows]}, f, indent=1)
    print(f"# wrote {a.out}")


if __name__ == "__main__":
    main()
