"""Soak the PMPI library's neighbourhood collectives with the fuzzer's legal class: launches of
``tests/pmpi/ngh_matrix.py legal`` (free-running sequences of up to 40 calls outstanding around
a blocking Sendrecv, derived types freed once posted and handles reused, counts near the staging
limit, 400 kB edges, any completion order; each sequence checked bit for bit against the MPI
standard) and of ``tests/pmpi/ngh_legal.c straddle`` (counts that differ on an edge on each side
of the staging limit and of a busy slot: every call must complete on every rank), with fresh
seeds, at 2-4 ranks, on one node and virtual nodes, under the library.

    python scripts/pmpi_soak.py [--programs 1000] [--iter 4] [--mpiexec PATH] [--json FILE]

A program is one sequence of the legal case (12 x ``--iter`` per launch) or one call of the
straddle case (12 per launch).  Counts wrong ones (a sequence whose values differ from the
standard's, or a straddle call that did not complete), hangs (a launch past its timeout) and
signals (a launch that ended by one); keeps each failure's seed and command.
"""

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
NGH = os.path.join(HERE, "..", "tests", "pmpi", "ngh_matrix.py")
LEGAL_C = os.path.join(HERE, "..", "tests", "pmpi", "ngh_legal.c")
CONFIGS = [(2, None), (3, None), (4, None), (3, 1), (4, 2)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--programs", type=int, default=1000)
    ap.add_argument("--iter", type=float, default=4, help="NGH_MATRIX_ITER of each legal launch")
    ap.add_argument("--mpiexec", default=shutil.which("mpiexec") or "mpiexec")
    ap.add_argument("--mpicc", default=shutil.which("mpicc") or "mpicc")
    ap.add_argument("--json", default="hybridmpi-results/pmpi-soak.json")
    a = ap.parse_args()
    lib = subprocess.run([sys.executable, "-m", "hybridmpi", "pmpi", "path"], check=True, capture_output=True,
                         text=True).stdout.split()[-1]
    prog = os.path.join(tempfile.mkdtemp(), "ngh_legal")
    subprocess.run([a.mpicc, "-O1", LEGAL_C, "-o", prog, "-lpthread"], check=True)
    openmpi = "Open MPI" in subprocess.run([a.mpiexec, "--version"], capture_output=True, text=True).stdout
    totals = {"programs": 0, "launches": 0, "wrong": 0, "hangs": 0, "signals": 0, "failures": []}
    t0, launch = time.monotonic(), 0
    while totals["programs"] < a.programs:
        ranks, node = CONFIGS[launch % len(CONFIGS)]
        straddle = launch % 4 == 3
        if straddle:
            ranks, node = 2, None
        seed = random.randrange(1 << 30)
        env = dict(os.environ, NGH_MATRIX_SEED=str(seed), NGH_MATRIX_ITER=str(a.iter),
                   HYBRIDMPI_PMPI_TIMEOUT="30")
        if node:
            env["HYBRIDMPI_PMPI_NODE_SIZE"] = str(node)
        cmd = [a.mpiexec, "-n", str(ranks)]
        if openmpi:
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
            cmd += ["--oversubscribe", "--timeout", "200", "-x", f"LD_PRELOAD={lib}"]
            cmd += [x for k in env if k.startswith(("HYBRIDMPI_", "NGH_")) for x in ("-x", k)]
        else:
            env["MPIEXEC_TIMEOUT"] = "200"
            cmd += ["-genv", "LD_PRELOAD", lib]
        cmd += [prog, "straddle"] if straddle else [sys.executable, NGH, "legal"]
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=230)
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired:
            rc, out, err = None, "", "hung"
        launch += 1
        totals["launches"] += 1
        n = 12 if straddle else int(12 * a.iter)
        totals["programs"] += n
        what = f"seed {seed}, {ranks} ranks, node size {node}: {' '.join(cmd[-2:])}"
        if rc is None or "TIMED OUT" in err or "timed out" in err:
            totals["hangs"] += 1
            totals["failures"].append(f"hang: {what}")
        elif rc < 0 or re.search(r"signal \d+|Segmentation|Aborted", err):
            totals["signals"] += 1
            totals["failures"].append(f"signal (rc {rc}): {what}\n{err[-2000:]}")
        elif straddle:
            said = re.findall(r"ngh_legal straddle: rank (\d): call (\d+): (\w+)", err)
            if rc != 0 or len(said) != 24:
                totals["wrong"] += 12
                totals["failures"].append(f"straddle incomplete (rc {rc}, {len(said)} of 24): {what}\n"
                                          f"{err[-2000:]}")
        elif rc != 0 or "ngh_matrix legal ok" not in out:
            bad = len(set(re.findall(r"legal sequence (\d+)", err))) or n
            totals["wrong"] += bad
            totals["failures"].append(f"wrong (rc {rc}): {what}\n{err[-2000:]}")
        print(f"# {totals['programs']} programs, {launch} launches, {totals['wrong']} wrong, "
              f"{totals['hangs']} hangs, {totals['signals']} signals ({time.monotonic() - t0:.0f} s)",
              file=sys.stderr, flush=True)
    totals["seconds"] = round(time.monotonic() - t0, 1)
    totals["mpi"] = "Open MPI" if openmpi else "MPICH"
    print(json.dumps({k: v for k, v in totals.items() if k != "failures"}))
    for f in totals["failures"]:
        print(f, file=sys.stderr)
    if a.json:
        os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(totals, f, indent=1)
    return 1 if totals["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
