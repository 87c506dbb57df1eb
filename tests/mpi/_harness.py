"""Runs test cases on every rank and makes all ranks agree on the verdict.

Each case is a function ``case(comm, rng, **config)``; an exception on any
rank fails the case on every rank.  A case that cannot run here (too few ranks,
a missing feature) returns ``skip(reason)``: it counts as skipped, with its
reason, when every rank skipped it.  Rank 0 prints one line per case and a final
``SUMMARY: N passed, M failed, K skipped``; every rank exits non-zero on failure,
and also when no case ran or ``--only`` names a case the file does not have
(a misspelt name must not pass with nothing run).  The pytest side
(``tests/conftest.py``) fails a run with no case passed unless every case was
skipped; that run is reported as skipped, with the reasons.
"""

import argparse
import sys
import time
import traceback

import numpy as np
from mpi4py import MPI

import hybridmpi.tools.baselines  # noqa: F401  (the paper's baseline methods of the Halo)


class Skipped:
    """What a case returns when it cannot run here; ``reason`` says why."""

    def __init__(self, reason):
        self.reason = reason


def skip(reason):
    """``return skip("needs 2 or more ranks")``: the case did not run on this rank (the reason
    on one line)."""
    return Skipped(" ".join(str(reason).split()))


def run(cases, config, only=None):
    comm = MPI.COMM_WORLD
    names = [case.__name__ for case in cases]
    unknown = sorted(set(only or ()) - set(names))
    if unknown or only is not None and not only:
        if comm.rank == 0:
            print(f"ERROR: --only names cases this file does not have: {', '.join(unknown)}"
                  if unknown else "ERROR: --only names no case", flush=True)
        comm.Barrier()
        sys.exit(2)
    failed = passed = skipped = 0
    for case in cases:
        name = case.__name__
        if only and name not in only:
            continue
        rng = np.random.default_rng([comm.rank, sum(map(ord, name))])
        t0 = time.perf_counter()
        why = err = None
        try:
            result = case(comm, rng, **config)
            why = result.reason if isinstance(result, Skipped) else None
        except BaseException:   # SystemExit or KeyboardInterrupt on one rank too: the others
            err = traceback.format_exc()   # would wait in the verdict's allgather
        verdicts = comm.allgather((err, why))
        bad = [(r, e) for r, (e, _) in enumerate(verdicts) if e]
        reasons = {w for e, w in verdicts if w is not None}
        all_skipped = not bad and len(reasons) > 0 and all(w is not None for _, w in verdicts)
        if comm.rank == 0:
            status = ("FAILED" if bad else
                      f"skipped ({'; '.join(sorted(reasons))})" if all_skipped else "ok")
            print(f"{name}: {status} ({time.perf_counter() - t0:.2f} s)", flush=True)
            for r, e in bad[:3]:
                print(f"--- rank {r}:\n{e}", flush=True)
        if bad:
            failed += 1
        elif all_skipped:
            skipped += 1
        else:
            passed += 1
    if comm.rank == 0:
        print(f"SUMMARY: {passed} passed, {failed} failed, {skipped} skipped", flush=True)
        if not passed + skipped + failed:
            print("ERROR: no case ran", flush=True)
    comm.Barrier()
    sys.exit(1 if failed or not passed + skipped else 0)


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
    ap.add_argument("--only", default=None)
    for name, default in options.items():
        ap.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
    config = vars(ap.parse_args())
    program = sys.modules["__main__"].__dict__
    left_out = sorted(k for k, v in program.items() if k.startswith("case_") and callable(v)
                      and v not in cases)
    if left_out:   # a case written but never run holds nothing
        if MPI.COMM_WORLD.rank == 0:
            print(f"ERROR: cases defined but not in the program's list: {left_out}", flush=True)
        MPI.COMM_WORLD.Barrier()
        sys.exit(2)
    only = config.pop("only")
    run(cases, config, only=None if only is None else set(filter(None, only.split(","))))
