"""Shrink a failing fuzzer program (tests/mpi/fuzz.py) to the fewest steps that still fail the
same way, by delta debugging over ``--keep``.

    python scripts/fuzz_minimize.py -n 2 [--env K=V ...] [--tries 2] -- --seed 7 --steps 100 [fuzz options]

The fuzzer options after ``--`` are those of the failing run (its replay line), without
``--programs``/``--replay``.  The first run writes the program to a JSON file; each later run
keeps a subset of its steps (``--program FILE --keep ...``; steps whose objects were left out
are skipped on every rank) and counts as failing when it prints a failure of the same kind at
a step of the same operation.  Prints the smallest subset found and the replay command.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
FUZZ = os.path.join(HERE, "..", "tests", "mpi", "fuzz.py")
ALWAYS = ("hc", "hc_free", "after_free")


def signature(out):
    """(kind, operation) of the first failure in a fuzzer's output, or None."""
    m = re.search(r"FUZZ FAILURE \((\S+)\).*?\n.*?\n  at step (\d+)\.\d+: (\S+)", out, re.S)
    if m:
        return m.group(1), m.group(3)
    if "FUZZ HANG" in out:
        return "hang", None
    if "FUZZ INTERNAL ERROR" in out:
        return "internal", None
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=2)
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--tries", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=90)
    ap.add_argument(
        "--mpiexec",
        default=shutil.which(
            "mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
        ),
    )
    ap.add_argument("fuzz", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    fuzz = [x for x in a.fuzz if x != "--"]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", MPIEXEC_TIMEOUT=str(a.timeout))
    env.setdefault("HYBRIDMPI_TIMEOUT", "10")
    for kv in a.env:
        k, _, v = kv.partition("=")
        env[k] = v
    work = tempfile.mkdtemp(prefix="fuzzmin-")
    prog = os.path.join(work, "program.json")

    def run(extra):
        cmd = [
            a.mpiexec,
            "-n",
            str(a.n),
            sys.executable,
            "-m",
            "mpi4py",
            FUZZ,
            "--programs",
            "1",
            "--watchdog",
            "12",
            *fuzz,
            *extra,
        ]
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout + 30)
            return p.stdout + p.stderr
        except subprocess.TimeoutExpired as e:
            return (e.stdout or b"").decode() + "FUZZ HANG (launcher timeout)"

    out = run(["--dump", prog])
    want = signature(out)
    if want is None:
        print("the program does not fail:\n" + out[-3000:])
        return 1
    print(f"failure: {want}", flush=True)
    steps = json.load(open(prog))
    fixed = [s["i"] for s in steps if s["op"] in ALWAYS]
    m = re.search(r"at step (\d+)\.", out)
    last = int(m.group(1)) if m else len(steps) - 1
    cand = [s["i"] for s in steps if s["op"] not in ALWAYS and s["i"] <= last]

    def fails(keep):
        spec = ",".join(map(str, sorted(set(keep) | set(fixed))))
        for _ in range(a.tries):
            got = signature(run(["--program", prog, "--keep", spec]))
            if got == want or (want[0] == "hang" and got and got[0] == "hang"):
                return True
        return False

    n = 2
    while len(cand) >= 2:
        chunk = max(1, len(cand) // n)
        parts = [cand[i : i + chunk] for i in range(0, len(cand), chunk)]
        reduced = False
        for part in parts:
            rest = [x for x in cand if x not in part]
            if rest and fails(rest):
                cand, n, reduced = rest, max(n - 1, 2), True
                print(f"  {len(cand)} steps still fail", flush=True)
                break
        if not reduced:
            if n >= len(cand):
                break
            n = min(len(cand), 2 * n)
    keep = ",".join(map(str, sorted(set(cand) | set(fixed))))
    final = run(["--program", prog, "--keep", keep])
    print(final[:6000])
    envs = " ".join(kv for kv in a.env)
    print(
        f"minimal: {len(cand)} steps; program {prog}\n  {envs} mpiexec -n {a.n} python -m mpi4py "
        f"tests/mpi/fuzz.py --programs 1 {' '.join(fuzz)} --program {prog} --keep {keep} --replay"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
