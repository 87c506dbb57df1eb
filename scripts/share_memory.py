"""Memory per node against ranks per node: ``hybridmpi.share`` against a copy per rank.

    python scripts/share_memory.py [--ranks 2,4,8] [--mb 1000] [--reps 3] [--out bench/results]

Runs ``hybridmpi bench share`` under this environment's ``mpiexec`` at each rank count (one
node), keeps each JSON (``share-{N}ranks-{mpi}.json``), prints one table (node MB of PSS grown
while the arrays live, time, the root's peak RSS) and draws ``share-memory.png``.
"""

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.dirname(sys.executable)


def run(ranks, mb, reps, out, mpi, again=True):
    path = os.path.join(out, f"share-{ranks}ranks-{mpi}.json")
    if not again:
        with open(path) as f:
            return json.load(f)
    cmd = [os.path.join(BIN, "mpiexec"), "-n", str(ranks), os.path.join(BIN, "hybridmpi"), "bench", "share",
           "--mb", str(mb), "--reps", str(reps), "--pickle-mb", "0", "--json", path]
    print("#", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, timeout=1800, stdout=subprocess.DEVNULL)
    with open(path) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="2,4,8")
    ap.add_argument("--mb", type=float, default=1000.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--mpi", default="mpich", help="a label for the file names")
    ap.add_argument("--out", default=os.path.join(HERE, "..", "bench", "results"))
    ap.add_argument("--plot-only", action="store_true", help="the table and figure of the JSON kept")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rows = []
    print(f"{'ranks':>5} {'series':>11} {'node MB':>9} {'MB/rank':>8} {'median ms':>10} {'root peak MB':>13}")
    for n in [int(r) for r in a.ranks.split(",")]:
        doc = run(n, a.mb, a.reps, a.out, a.mpi, again=not a.plot_only)
        for r in doc["results"]:
            med = sorted(r["samples"])[len(r["samples"]) // 2] / 1e3
            rows.append((n, r["series"], r["node_mb"], med, r["root_peak_mb"]))
            print(f"{n:>5} {r['series']:>11} {r['node_mb']:>9.1f} {r['per_rank_mb']:>8.1f} {med:>10.1f} "
                  f"{r['root_peak_mb']:>13.1f}", flush=True)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# matplotlib is missing: no figure (pip install 'hybridmpi[plot]')")
        return
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for series, style in (("MPI Bcast", "o-"), ("share", "s-")):
        pts = [(n, mb) for n, s, mb, _, _ in rows if s == series]
        ax.plot([p[0] for p in pts], [p[1] / 1e3 for p in pts], style,
                label="a copy per rank (MPI Bcast)" if series == "MPI Bcast" else "hybridmpi.share")
    ax.set_xlabel("ranks on the node")
    ax.set_ylabel("GB the node holds more (PSS)")
    ax.set_title(f"a {a.mb / 1e3:g} GB array on every rank (the root's own aside)", fontsize=10)
    ax.legend()
    ax.grid(alpha=0.3)
    png = os.path.join(a.out, "share-memory.png")
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    print(f"# wrote {png}")


if __name__ == "__main__":
    main()
