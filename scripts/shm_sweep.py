"""Allocations in a nearly full /dev/shm: MemoryError on every rank, never a signal, never a hang.

Runs itself in a private mount namespace (``unshare -m``, as root) with a small tmpfs on
/dev/shm, so only its own processes see it.  For every spare room (0 to --max KiB of free
space left in /dev/shm after MPI started, in --step KiB steps) and every kind of allocation,
one ``mpiexec`` job fills /dev/shm to that spare room and makes the object:

- ``hybridcomm``: ``HybridComm(comm)``;
- ``globalmem``: ``GlobalMemory(hc, 512)`` (4 KiB per rank) on a HybridComm made before;
- ``halo-atomic``, ``halo-fence``: ``Halo`` of a ring pattern of 256 points per neighbour
  (its arena block; its own window);
- ``vector``: ``Halo.vector()`` (512 float64) on a Halo made before.

Sizes are small, so that the spare room where they start to fit lies inside the sweep (a
HybridComm needs about 0.5 MiB at 2 ranks: MemoryError all along).

Each job ends ``ok`` (it fitted), ``MemoryError`` (every rank raised it), or a failure: a
signal, a hang (past --timeout), or ranks that disagree.  Prints a table, writes JSON.

Usage (as root): python scripts/shm_sweep.py [-n 2] [--max 64] [--step 4] [--json FILE]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys

KINDS = ("hybridcomm", "globalmem", "halo-atomic", "halo-fence", "vector")
FILLER = "/dev/shm/hybridmpi-sweep-filler"


def child(kind, spare):
    """One job: fill /dev/shm to ``spare`` bytes, make the object, print the verdict on rank 0."""
    import numpy as np
    from mpi4py import MPI

    import hybridmpi
    import hybridmpi.tools.baselines  # noqa: F401  (the paper's baseline methods of the Halo)

    comm = MPI.COMM_WORLD
    hc = halo = None
    if kind != "hybridcomm":
        hc = hybridmpi.HybridComm(comm)
        n, r, p = 256, hc.rank, hc.size
        pat = hybridmpi.GhostPattern(hc, send={(r + 1) % p: np.arange(n)},
                                     recv={(r - 1) % p: np.arange(n, 2 * n)}, size=2 * n)
        if kind == "vector":
            halo = hybridmpi.Halo(pat, method="atomic")
    comm.Barrier()
    if comm.rank == 0:
        st = os.statvfs("/dev/shm")
        fill = st.f_bavail * st.f_frsize - spare
        with open(FILLER, "wb") as f:
            if fill > 0:
                os.posix_fallocate(f.fileno(), 0, fill)
    comm.Barrier()
    made = None
    try:
        if kind == "hybridcomm":
            made = hybridmpi.HybridComm(comm)
        elif kind == "globalmem":
            made = hybridmpi.GlobalMemory(hc, 512)
        elif kind.startswith("halo"):
            made = hybridmpi.Halo(pat, method=kind.split("-")[1])
        else:
            halo.vector()
        outcome = "ok"
    except MemoryError:
        outcome = "MemoryError"
    except Exception as e:  # any other error is a finding, reported as such
        outcome = f"{type(e).__name__}: {e}"[:120]
    outcomes = comm.allgather(outcome)
    comm.Barrier()
    if comm.rank == 0:
        os.unlink(FILLER)
    comm.Barrier()
    for obj in (made, halo, hc):
        if obj is not None:
            obj.free()
    if comm.rank == 0:
        verdict = outcomes[0] if len(set(outcomes)) == 1 else f"ranks differ: {outcomes}"
        print("VERDICT " + json.dumps(verdict), flush=True)


def run_job(args, kind, spare):
    env = dict(os.environ, MPIEXEC_TIMEOUT=str(args.timeout), HYBRIDMPI_TIMEOUT="20",
               PYTHONUNBUFFERED="1")
    cmd = [args.mpiexec, "-n", str(args.ranks), sys.executable, os.path.abspath(__file__),
           "--child", kind, str(spare)]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout + 15)
    except subprocess.TimeoutExpired:
        return "HANG"
    for line in p.stdout.splitlines():
        if line.startswith("VERDICT "):
            verdict = json.loads(line[8:])
            return verdict if p.returncode == 0 else f"{verdict} (rc {p.returncode})"
    tail = (p.stdout + p.stderr).strip().splitlines()[-3:]
    signal = "SIGBUS" if "signal 7" in p.stdout + p.stderr or "Bus error" in p.stderr else "signal"
    return f"CRASH rc={p.returncode} {signal}: {' | '.join(tail)[:160]}"


def sweep(args):
    spares = list(range(0, args.max + 1, args.step))
    results = {k: {} for k in args.kinds}
    print(f"# /dev/shm sweep: private tmpfs of {args.size}, {args.ranks} ranks; outcome per spare KiB")
    print(f"# {'spare KiB':>9} " + " ".join(f"{k:>14}" for k in args.kinds))
    for s in spares:
        row = []
        for k in args.kinds:
            v = run_job(args, k, s * 1024)
            results[k][s] = v
            row.append("ok" if v == "ok" else "MemoryError" if v == "MemoryError" else "FAIL")
        print(f"  {s:>9} " + " ".join(f"{c:>14}" for c in row), flush=True)
    bad = {k: {s: v for s, v in r.items() if v not in ("ok", "MemoryError")}
           for k, r in results.items()}
    bad = {k: v for k, v in bad.items() if v}
    for k, v in bad.items():
        for s, why in v.items():
            print(f"# FAIL {k} at {s} KiB: {why}")
    out = {"ranks": args.ranks, "tmpfs": args.size, "spare_kib": spares, "results": results,
           "failures": bad}
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    print(f"# {'no failure' if not bad else f'{sum(map(len, bad.values()))} failure(s)'}; "
          f"JSON in {args.json}")
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--ranks", type=int, default=2)
    ap.add_argument("--max", type=int, default=64, help="largest spare room, KiB")
    ap.add_argument("--step", type=int, default=4, help="KiB")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--size", default="32m", help="the private tmpfs's size")
    ap.add_argument("--timeout", type=int, default=40, help="seconds per job")
    ap.add_argument("--json", default="shm-sweep.json")
    ap.add_argument("--mpiexec", default=shutil.which("mpiexec", path=os.path.dirname(sys.executable)
                                                      + os.pathsep + os.environ["PATH"]))
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
        return 0
    args.kinds = [k for k in args.kinds.split(",") if k]
    if not args.inside:  # again, in a mount namespace of its own with a small /dev/shm
        script = (f"mount -t tmpfs -o size={args.size} tmpfs /dev/shm && exec \"$@\"")
        cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh",
               sys.executable, os.path.abspath(__file__), "--inside", *sys.argv[1:]]
        return subprocess.run(cmd).returncode
    return sweep(args)


if __name__ == "__main__":
    sys.exit(main())
