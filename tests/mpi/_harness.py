"""Runs test cases on every rank and makes all ranks agree on the verdict.

Each case is a function ``case(comm, rng, **config)``; an exception on any
rank fails the case on every rank.  Rank 0 prints one line per case and a
final ``SUMMARY: N passed, M failed``; every rank exits non-zero on failure.
"""

import argparse
import sys
import time
import traceback

import numpy as np
from mpi4py import MPI


def run(cases, config, only=None):
    comm = MPI.COMM_WORLD
    failed = 0
    passed = 0
    for case in cases:
        name = case.__name__
        if only and name not in only:
            continue
        rng = np.random.default_rng([comm.rank, sum(map(ord, name))])
        t0 = time.perf_counter()
        try:
            case(comm, rng, **config)
            err = None
        except Exception:
            err = traceback.format_exc()
        errs = comm.allgather(err)
        bad = [(r, e) for r, e in enumerate(errs) if e]
        if comm.rank == 0:
            status = "FAILED" if bad else "ok"
            print(f"{name}: {status} ({time.perf_counter() - t0:.2f} s)", flush=True)
            for r, e in bad[:3]:
                print(f"--- rank {r}:\n{e}", flush=True)
        if bad:
            failed += 1
        else:
            passed += 1
    if comm.rank == 0:
        print(f"SUMMARY: {passed} passed, {failed} failed", flush=True)
    comm.Barrier()
    sys.exit(1 if failed else 0)


def agree(comm, value):
    """Assert that every rank holds the same value (compared by bytes for arrays)."""
    key = value.tobytes() if isinstance(value, np.ndarray) else value
    keys = comm.allgather(key)
    assert all(k == keys[0] for k in keys), f"ranks disagree: {keys[:8]}"


def main(cases, **options):
    """Parse ``--node-size``, ``--only`` and ``--NAME`` for each option (its default
    gives the type), then run the cases with them as the config."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--node-size", type=int, default=None)
    ap.add_argument("--only", default="")
    for name, default in options.items():
        ap.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
    config = vars(ap.parse_args())
    only = config.pop("only")
    run(cases, config, only=set(filter(None, only.split(","))) or None)
