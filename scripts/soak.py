"""Soak the drift suite: run random sequences for as long as asked, at 2-4 ranks, on one node,
virtual nodes and (MPICH) cliques, with the chaos hook on; print sequences run and failures.

    python scripts/soak.py --minutes 30 [--ops 300] [--batch 20] [--mpiexec PATH]

Each batch is one launch of tests/mpi/drift.py with a fresh seed; a launch that does not
finish within its timeout counts as a hang.  Writes soak.json.
"""

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DRIFT = os.path.join(HERE, "..", "tests", "mpi", "drift.py")
CONFIGS = [(2, []), (3, []), (4, []), (3, ["--node-size", "1"]), (4, ["--node-size", "2"])]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--ops", type=int, default=300)
    ap.add_argument("--batch", type=int, default=20, help="sequences per launch")
    ap.add_argument("--mpiexec", default=shutil.which("mpiexec", path=os.path.dirname(sys.executable)
                                                      + os.pathsep + os.environ["PATH"]))
    ap.add_argument("--json", default="soak.json")
    a = ap.parse_args()
    out = subprocess.run([a.mpiexec, "--version"], capture_output=True, text=True).stdout
    openmpi = "Open MPI" in out or "OpenRTE" in out
    configs = CONFIGS + ([] if openmpi else [(3, ["CLIQUES"])])
    end = time.monotonic() + 60 * a.minutes
    totals = {"sequences": 0, "failed": 0, "hangs": 0, "launches": 0}
    failures = []
    while time.monotonic() < end:
        n, extra = random.choice(configs)
        seed = random.randrange(1, 2**31)
        env = dict(os.environ, HYBRIDMPI_CHAOS=f"{seed}:200", HYBRIDMPI_TIMEOUT="60",
                   OPENBLAS_NUM_THREADS="1")
        args = list(extra)
        if args == ["CLIQUES"]:
            env["MPIR_CVAR_NUM_CLIQUES"], args = "2", []
        cmd = [a.mpiexec, "-n", str(n)]
        if openmpi:
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
            cmd += ["--oversubscribe"]
        cmd += [sys.executable, "-m", "mpi4py", DRIFT, "--seed", str(seed), "--sequences",
                str(a.batch), "--ops", str(a.ops), *args]
        label = f"n={n} {' '.join(extra)} seed={seed}"
        totals["launches"] += 1
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            totals["hangs"] += 1
            failures.append({"config": label, "what": "hang"})
            print(f"{label}: HANG", flush=True)
            continue
        m = re.search(r"SUMMARY: (\d+) passed, (\d+) failed", p.stdout)
        if not m:
            totals["failed"] += a.batch
            failures.append({"config": label, "what": (p.stdout + p.stderr)[-2000:]})
            print(f"{label}: no summary (rc {p.returncode})", flush=True)
            continue
        ok, bad = int(m.group(1)), int(m.group(2))
        totals["sequences"] += ok + bad
        totals["failed"] += bad
        if bad:
            failures.append({"config": label, "what": p.stdout[-4000:]})
        print(f"{label}: {ok} passed, {bad} failed; total {totals}", flush=True)
    print(f"SOAK: {totals['sequences']} sequences x {a.ops} operations, {totals['failed']} failed, "
          f"{totals['hangs']} hangs, {totals['launches']} launches", flush=True)
    with open(a.json, "w") as f:
        json.dump({"totals": totals, "ops": a.ops, "failures": failures,
                   "mpi": "openmpi" if openmpi else "mpich"}, f, indent=1)
    return 1 if totals["failed"] or totals["hangs"] else 0


if __name__ == "__main__":
    sys.exit(main())
