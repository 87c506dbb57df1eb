"""What the calibration costs: ``HybridComm()``'s time with it and without it, in one run.

    mpiexec -n N python bench/calibration.py [--node-size K] [--reps 15] [--json FILE]

Alternating, ``--reps`` times, in one process per rank (the first HybridComm of the run, which
pays the library's and MPI's first-use costs, is made and freed before):

- ``calibrated``: no table anywhere (a fresh cache folder, the process's memory of earlier
  calibrations cleared): ``HybridComm()`` times both paths and writes the table;
- ``default``: ``HYBRIDMPI_TUNE=table`` and no table: the layout's default, nothing timed;
- ``table``: the table the calibration wrote, read by a fresh process would be (memory
  cleared): what every later run pays.

Each time is the slowest rank's, ``HybridComm()`` to its return; the table gives the medians
and the calibration's own time (``calibrate()``, inside ``calibrated``), and writes JSON.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("--node-size", type=int)
ap.add_argument("--reps", type=int, default=15)
ap.add_argument("--json")
args = ap.parse_args()

from mpi4py import MPI  # noqa: E402

import hybridmpi  # noqa: E402
from hybridmpi.comm import tuning  # noqa: E402

comm = MPI.COMM_WORLD
folder = comm.bcast(tempfile.mkdtemp(prefix="hm-calibration-") if comm.rank == 0 else None)
os.environ["HYBRIDMPI_TUNE_DIR"] = folder   # (the same on every rank: one machine)
hybridmpi.HybridComm(comm, node_size=args.node_size, collectives="core").free()
inner = []
real = tuning.calibrate


def timed_calibrate(*a):
    t0 = time.perf_counter()
    out = real(*a)
    inner.append(time.perf_counter() - t0)
    return out


tuning.calibrate = timed_calibrate


def made(mode, clear_files):
    os.environ["HYBRIDMPI_TUNE"] = mode
    tuning._CALIBRATED.clear()   # noqa: SLF001 - a fresh process's memory
    comm.Barrier()
    if clear_files and comm.rank == 0:
        for f in os.listdir(folder):
            os.unlink(os.path.join(folder, f))
    comm.Barrier()
    t0 = time.perf_counter()
    hc = hybridmpi.HybridComm(comm, node_size=args.node_size)
    dt = time.perf_counter() - t0
    path, why = hc.collective_path, hc.tuning
    hc.free()
    return comm.allreduce(dt, op=MPI.MAX) * 1e3, path, why


series = {"calibrated": [], "default": [], "table": []}
paths = {}
for _ in range(args.reps):
    for name, mode, clear_files in (("calibrated", "auto", True), ("default", "table", True),
                                    ("table", "auto", False)):
        if name == "table":   # the calibration's table, as the next process finds it
            made("auto", True)
        ms, path, why = made(mode, clear_files)
        series[name].append(ms)
        paths.setdefault(name, set()).add(path)
cal = comm.allreduce(statistics.median(inner) * 1e3, op=MPI.MAX)
med = {k: statistics.median(v) for k, v in series.items()}
if comm.rank == 0:
    nodes = f"virtual nodes of {args.node_size}" if args.node_size else "one node"
    layout = f"{comm.size} ranks, {nodes}"
    print(f"# HybridComm() in ms, {layout}; medians of {args.reps} (slowest rank's each)")
    print(f"{'# series':<12}{'median':>9}{'min':>9}{'max':>9}  path")
    for k, v in series.items():
        print(f"{k:<12}{med[k]:>9.2f}{min(v):>9.2f}{max(v):>9.2f}  {sorted(paths[k])}")
    print(f"# the calibration costs {med['calibrated'] - med['default']:.2f} ms more than the "
          f"default (calibrate() itself: {cal:.2f} ms); a cached table "
          f"{med['table'] - med['default']:+.2f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench": "calibration", "ranks": comm.size, "node_size": args.node_size,
                       "mpi": MPI.Get_library_version().splitlines()[0], "host": platform.node(),
                       "python": sys.version.split()[0], "reps": args.reps, "series_ms": series,
                       "medians_ms": med, "calibrate_ms": cal,
                       "paths": {k: sorted(v) for k, v in paths.items()}}, f, indent=1)
    for f in os.listdir(folder):
        os.unlink(os.path.join(folder, f))
    os.rmdir(folder)
