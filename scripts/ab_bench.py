"""Compare two trees of hybridmpi on the same benchmarks in one run: ``bench KIND`` of each tree,
alternating (old, new, old, new, ...), and the median over runs of each series' median time.

    python scripts/ab_bench.py --old /tmp/old [--new .] [--runs 5] [--ranks 2] [--json ab.json]
                               [--extra "--node-size 1"]

``--old`` and ``--new`` are source trees with their compiled modules built in place (``python
setup.py build_ext --inplace``); each run puts one first on ``PYTHONPATH``.  Prints one row per
benchmark series (old µs, new µs, new/old) and writes JSON.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

#: the benchmarks the issue's "no speed lost" target names, briefly
KINDS = {
    "ghost": ["--sizes", "4,20,78", "--block", "1", "--iters", "2000", "--reps", "7"],
    "barrier": ["--iters", "5000", "--reps", "9"],
    "allreduce": ["--sizes", "1,8,1024", "--iters", "5000", "--reps", "9"],
    "rma": ["--sizes", "8,4096", "--iters", "2000", "--reps", "7"],
}


def run(tree, kind, args, ranks, mpiexec):
    """The medians of each series of one run of ``bench KIND`` with ``tree`` first on the path."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "b.json")
        env = dict(os.environ, PYTHONPATH=os.path.abspath(tree), OPENBLAS_NUM_THREADS="1",
                   MPIEXEC_TIMEOUT="600")
        subprocess.run([mpiexec, "-n", str(ranks), sys.executable, "-m", "hybridmpi", "bench", kind,
                        *args, "--json", out], env=env, check=True, capture_output=True, cwd=tmp,
                       timeout=660)
        with open(out) as f:
            doc = json.load(f)
    return {f"{r['series']} @ {r['x']}": statistics.median(r["samples"]) for r in doc["results"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", default=".")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--json", default="ab.json")
    ap.add_argument("--extra", default="", help="arguments added to every benchmark's command "
                    "(e.g. '--node-size 1': virtual nodes of one rank, every call across nodes)")
    ap.add_argument("--mpiexec", default=shutil.which("mpiexec", path=os.path.dirname(sys.executable)
                                                      + os.pathsep + os.environ["PATH"]))
    a = ap.parse_args()
    got = {}
    for kind in a.kinds.split(","):
        for i in range(a.runs):
            for name, tree in (("old", a.old), ("new", a.new)):
                for series, t in run(tree, kind, KINDS[kind] + a.extra.split(), a.ranks,
                                     a.mpiexec).items():
                    got.setdefault((kind, series), {"old": [], "new": []})[name].append(t)
            print(f"# {kind}: run {i + 1} of {a.runs}", file=sys.stderr, flush=True)
    print(f"# A/B, {a.ranks} ranks {a.extra}, {a.runs} alternating runs per tree; median over runs "
          "of each run's median (us)")
    print(f"# {'benchmark':<10} {'series':<44} {'old':>10} {'new':>10} {'new/old':>8}")
    rows = []
    for (kind, series), v in got.items():
        if not v["old"] or not v["new"]:   # a series one tree's benchmark does not have
            print(f"  {kind:<10} {series[:44]:<44} (in the {'new' if v['new'] else 'old'} tree only)")
            continue
        old, new = statistics.median(v["old"]), statistics.median(v["new"])
        rows.append({"benchmark": kind, "series": series, "old_us": old, "new_us": new,
                     "ratio": new / old if old else None, "old_runs": v["old"], "new_runs": v["new"]})
        print(f"  {kind:<10} {series[:44]:<44} {old:>10.3f} {new:>10.3f} {new / old if old else 0:>8.3f}")
    with open(a.json, "w") as f:
        json.dump({"ranks": a.ranks, "runs": a.runs, "extra": a.extra, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
