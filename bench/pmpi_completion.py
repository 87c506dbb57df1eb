"""The completion calls' cost on a program's own requests, with and without the PMPI library
(docs/guide/pmpi.md, "Requests"): ``bench/pmpi/completion.c`` at 2 ranks, built with the MPI's
wrapper, run ``--runs`` times each way, alternating.

    python bench/pmpi_completion.py [--runs 5] [--mpicc mpicc] [--mpiexec mpiexec]
                                    [--library SO] [--json FILE]

Rows: ``MPI_Wait(MPI_REQUEST_NULL)`` in ns, no call of the library pending; a ping-pong of 8 B
and 64 KiB through ``MPI_Wait`` (half a round trip, µs); ``MPI_Testall``, ``Testany`` and
``Testsome`` over 10,000 of the program's pending receives while one neighbourhood call is
pending (the library's with it, MPI's own without), µs per call.  Each run gives a median of 15
blocks; the table gives the median over runs, ``with - without`` for the ns row and ``with /
without`` for the others.  Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROWS = ("wait_null", "pingpong_8", "pingpong_65536", "testall", "testany", "testsome")
LABELS = {"wait_null": "MPI_Wait(NULL), ns", "pingpong_8": "ping-pong 8 B, us",
          "pingpong_65536": "ping-pong 64 KiB, us", "testall": "Testall x 10,000, us",
          "testany": "Testany x 10,000, us", "testsome": "Testsome x 10,000, us"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--mpicc", default=shutil.which("mpicc") or "mpicc")
    ap.add_argument("--mpiexec", default=shutil.which("mpiexec") or "mpiexec")
    ap.add_argument("--library", help="the PMPI library (default: hybridmpi pmpi path)")
    ap.add_argument("--json", default="hybridmpi-results/bench-pmpi-completion.json")
    a = ap.parse_args()
    lib = a.library or subprocess.run([sys.executable, "-m", "hybridmpi", "pmpi", "path"], check=True,
                                      capture_output=True, text=True).stdout.split()[-1]
    prog = Path(tempfile.mkdtemp()) / "completion"
    subprocess.run([a.mpicc, "-O2", str(HERE / "pmpi" / "completion.c"), "-o", str(prog)], check=True)
    openmpi = "Open MPI" in subprocess.run([a.mpiexec, "--version"], capture_output=True, text=True).stdout
    runs: dict[str, list[dict[str, float]]] = {"without": [], "with": []}
    for i in range(a.runs):
        for mode in ("without", "with"):
            env = dict(os.environ, MPIEXEC_TIMEOUT="300")
            cmd = [a.mpiexec, "-n", "2"]
            if openmpi:
                env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
                cmd += ["--timeout", "300"] + (["-x", f"LD_PRELOAD={lib}"] if mode == "with" else [])
            elif mode == "with":
                cmd += ["-genv", "LD_PRELOAD", lib]
            out = subprocess.run(cmd + [str(prog)], env=env, check=True, capture_output=True,
                                 text=True).stdout
            lines = (line.split() for line in out.splitlines() if line)
            runs[mode].append({k: float(v) for k, v in lines})
            print(f"# run {i + 1}/{a.runs} {mode}: {runs[mode][-1]}", file=sys.stderr)
    print("# the completion calls on the program's own requests, 2 ranks; medians of "
          f"{a.runs} runs each way")
    print(f"# {'what':<26}{'without':>10}{'with':>10}{'ratio':>9}")
    table = {}
    for row in ROWS:
        wo = statistics.median(r[row] for r in runs["without"])
        w = statistics.median(r[row] for r in runs["with"])
        cmp_ = f"{w - wo:+.2f} ns" if row == "wait_null" else f"{w / wo:.3f}"
        table[row] = {"without": wo, "with": w, "difference" if row == "wait_null" else "ratio":
                      w - wo if row == "wait_null" else w / wo}
        print(f"  {LABELS[row]:<26}{wo:>10.3f}{w:>10.3f}{cmp_:>9}")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"kind": "pmpi-completion", "ranks": 2, "runs": runs,
                                            "table": table}, indent=1))


if __name__ == "__main__":
    main()
