"""IMB-MPI1 Allreduce and Barrier with and without the PMPI library, alternating runs, in one layout.

    python bench/pmpi_imb.py --imb .venv-impi/bin/IMB-MPI1 [--ranks 2] [--runs 5]
        [--node-size 1] [--json FILE]

IMB-MPI1 (Intel MPI Benchmarks, shipped with ``impi-rt``) runs on this environment's MPI (its
``libmpi`` found first: MPICH's, the same ABI as Intel MPI's) under this environment's
``mpiexec``; ``--node-size`` sets ``HYBRIDMPI_PMPI_NODE_SIZE`` (virtual nodes).  Each
configuration runs ``--runs`` times, alternating; the table gives the median of the runs' t_avg
per call and size, and the ratio with / without.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

from hybridmpi.tools import pmpi

ap = argparse.ArgumentParser()
ap.add_argument("--imb", required=True)
ap.add_argument("--ranks", type=int, default=2)
ap.add_argument("--runs", type=int, default=5)
ap.add_argument("--node-size", type=int)
ap.add_argument("--iters", type=int, default=2000)
ap.add_argument("--json")
a = ap.parse_args()

lib = pmpi.library()
target = pmpi.target()
mpiexec = str(Path(sys.executable).with_name("mpiexec"))
env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(filter(None, [str(Path(target.libmpi).parent),
                                                                      os.environ.get("LD_LIBRARY_PATH")])),
           MPIEXEC_TIMEOUT="600", HYBRIDMPI_PMPI_STATS="1")
if a.node_size:
    env["HYBRIDMPI_PMPI_NODE_SIZE"] = str(a.node_size)


def once(with_lib):
    cmd = [mpiexec, "-n", str(a.ranks), *(["-genv", "LD_PRELOAD", lib] if with_lib else []), a.imb,
           "-npmin", str(a.ranks), "-iter", str(a.iters), "-msglog", "0:12", "-time", "60",
           "Allreduce", "Barrier"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=True)
    rows, call = {}, None
    for line in out.stdout.splitlines():
        m = re.match(r"# Benchmarking (\w+)", line)
        if m:
            call = m.group(1)
            continue
        m = re.match(r"^\s+(\d+)\s+\d+\s+[\d.]+\s+[\d.]+\s+([\d.]+)\s*$", line)    # bytes, t_avg
        if m and call == "Allreduce":
            rows[(call, int(m.group(1)))] = float(m.group(2))
        m = re.match(r"^\s+\d+\s+[\d.]+\s+[\d.]+\s+([\d.]+)\s*$", line)             # barrier: t_avg
        if m and call == "Barrier":
            rows[(call, 0)] = float(m.group(1))
    counters = re.findall(r"hybridmpi pmpi: rank \d+ of \d+: (.*)", out.stderr)
    return rows, counters[:1]


runs = {False: [], True: []}
seen = []
for _ in range(a.runs):
    for w in (False, True):
        rows, counters = once(w)
        runs[w].append(rows)
        if w and counters:
            seen = counters
keys = sorted(set(runs[False][0]) & set(runs[True][0]))
table = []
for k in keys:
    wo = statistics.median(r[k] for r in runs[False])
    wi = statistics.median(r[k] for r in runs[True])
    table.append({"call": k[0], "bytes": k[1], "without_us": wo, "with_us": wi, "ratio": wi / wo,
                  "runs_without": [r[k] for r in runs[False]], "runs_with": [r[k] for r in runs[True]]})
print(f"# IMB-MPI1 under the PMPI library: {a.ranks} ranks, node size {a.node_size or 'the machine'}, "
      f"{a.runs} runs alternating; median t_avg (us)")
print(f"# counters of rank 0 with the library: {seen[0] if seen else '-'}")
print(f"{'# call':<12}{'bytes':>8}{'without':>10}{'with':>10}{'ratio':>8}")
for t in table:
    print(f"{t['call']:<12}{t['bytes']:>8}{t['without_us']:>10.2f}{t['with_us']:>10.2f}{t['ratio']:>8.2f}")
if a.json:
    with open(a.json, "w") as f:
        json.dump({"benchmark": "pmpi-imb", "ranks": a.ranks, "node_size": a.node_size, "runs": a.runs,
                   "mpi": target.family, "counters": seen, "rows": table}, f, indent=1)
    print(f"# wrote {a.json}")
