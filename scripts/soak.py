"""Soak the drift suite and the API fuzzer: run random sequences and programs for as long as
asked, at 2-4 ranks, on one node, virtual nodes and (MPICH) cliques, with the chaos hook on;
print what ran and what failed.

    python scripts/soak.py --minutes 30 [--suite fuzz|drift|both] [--ops 300] [--batch 20]
                           [--fuzz-args "--avoid vector-pending"] [--mpiexec PATH] [--json soak.json]

Each batch is one launch of tests/mpi/drift.py (``--batch`` sequences of ``--ops``
operations) or of tests/mpi/fuzz.py (``--batch`` programs of ``--ops`` steps) with a fresh
seed, alternating with ``--suite both``; a launch that does not finish within its timeout, or
a fuzzer watchdog report, counts as a hang.  For the fuzzer it counts programs, steps,
failures by kind (wrong values, disagreeing errors, hangs...) and the failures in one-sided
calls (global memory, coarrays), and keeps each failure's replay line.  Writes the JSON file.
"""

import argparse
import json
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DRIFT = os.path.join(HERE, "..", "tests", "mpi", "drift.py")
FUZZ = os.path.join(HERE, "..", "tests", "mpi", "fuzz.py")
CONFIGS = [(2, []), (3, []), (4, []), (3, ["--node-size", "1"]), (4, ["--node-size", "2"])]
#: fuzzer steps that are one-sided (global memory, coarrays)
ONESIDED = {
    "mem",
    "co",
    "put",
    "get",
    "atomic",
    "flush",
    "republish",
    "wait_reqs",
    "co_put",
    "co_get",
    "co_republish",
    "free_mem",
    "free_co",
    "misuse_gm",
    "misuse_req",
    "misuse_gmfreed",
    "misuse_gmctor",
    "misuse_sync",
    "misuse_co",
}


def launch(a, suite, n, extra, seed, openmpi):
    """Run one batch; returns (what it printed, whether it hung)."""
    env = dict(os.environ, HYBRIDMPI_CHAOS=f"{seed}:200", OPENBLAS_NUM_THREADS="1")
    env["HYBRIDMPI_TIMEOUT"] = "60" if suite == "drift" else "10"
    args = list(extra)
    if args == ["CLIQUES"]:
        env["MPIR_CVAR_NUM_CLIQUES"], args = "2", []
    cmd = [a.mpiexec, "-n", str(n)]
    if openmpi:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        cmd += ["--oversubscribe"]
    if suite == "drift":
        cmd += [
            sys.executable,
            "-m",
            "mpi4py",
            DRIFT,
            "--seed",
            str(seed),
            "--sequences",
            str(a.batch),
            "--ops",
            str(a.ops),
            *args,
        ]
    else:
        cmd += [
            sys.executable,
            "-m",
            "mpi4py",
            FUZZ,
            "--seed",
            str(seed),
            "--programs",
            str(a.batch),
            "--steps",
            str(a.ops),
            *args,
            *shlex.split(a.fuzz_args),
        ]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.launch_timeout)
        return p.stdout + p.stderr, p.returncode, False
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return out, None, True


def write(a, totals, failures, openmpi):
    """The JSON file (written after every launch, so that an interrupted soak keeps its figures)."""
    with open(a.json, "w") as f:
        json.dump({"totals": totals, "ops": a.ops, "batch": a.batch, "fuzz_args": a.fuzz_args,
                   "failures": failures, "mpi": "openmpi" if openmpi else "mpich"}, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--suite", choices=("drift", "fuzz", "both"), default="drift")
    ap.add_argument("--ops", type=int, default=300, help="operations per sequence / steps per program")
    ap.add_argument("--batch", type=int, default=20, help="sequences or programs per launch")
    ap.add_argument("--fuzz-args", default="", help="more options for tests/mpi/fuzz.py")
    ap.add_argument("--launch-timeout", type=int, default=600)
    ap.add_argument(
        "--mpiexec",
        default=shutil.which(
            "mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
        ),
    )
    ap.add_argument("--json", default="soak.json")
    a = ap.parse_args()
    out = subprocess.run([a.mpiexec, "--version"], capture_output=True, text=True).stdout
    openmpi = "Open MPI" in out or "OpenRTE" in out
    configs = CONFIGS + ([] if openmpi else [(3, ["CLIQUES"])])
    suites = ["drift", "fuzz"] if a.suite == "both" else [a.suite]
    end = time.monotonic() + 60 * a.minutes
    totals = {s: {"launches": 0, "hangs": 0, "failed": 0} for s in suites}
    for s in suites:
        totals[s].update(
            {"sequences": 0}
            if s == "drift"
            else {"programs": 0, "steps": 0, "calls": 0, "wrong_values": 0, "onesided": 0, "kinds": {}}
        )
    failures = []
    reported = 0
    turn = 0
    while time.monotonic() < end:
        write(a, totals, failures, openmpi)
        for f in failures[reported:]:
            print(f"  FAILURE {f.get('kind', '')}: {f.get('why', f.get('where', ''))}\n"
                  f"    replay: {f.get('replay')}", flush=True)
        reported = len(failures)
        suite = suites[turn % len(suites)]
        turn += 1
        n, extra = random.choice(configs)
        seed = random.randrange(1, 2**31 - 10000)
        label = f"{suite} n={n} {' '.join(extra)} seed={seed}"
        t = totals[suite]
        t["launches"] += 1
        text, rc, hung = launch(a, suite, n, extra, seed, openmpi)
        if suite == "fuzz":
            m = re.search(r"^FUZZSTATS (.*)$", text, re.M)
            hang = hung or "FUZZ HANG" in text
            if m:
                st = json.loads(m.group(1))
                t["programs"] += st["programs"]
                t["steps"] += st["steps"]
                t["calls"] += st["calls"]
                t["failed"] += st["failed"]
                for f in st["failures"]:
                    t["kinds"][f["kind"]] = t["kinds"].get(f["kind"], 0) + 1
                    t["wrong_values"] += f["kind"] == "wrong-value"
                    t["onesided"] += f.get("op") in ONESIDED
                    rep = re.search(rf"FUZZ FAILURE.*seed {f['seed']},.*\n  replay: (.*)", text)
                    failures.append({"config": label, **f, "replay": rep.group(1) if rep else None})
            if hang:
                t["hangs"] += 1
                t["failed"] += 1
                where = re.findall(r"FUZZ HANG rank \d+: .*", text)
                rep = re.search(r"FUZZ FAILURE \(hang\).*\n  replay: (.*)", text)
                failures.append(
                    {
                        "config": label,
                        "kind": "hang",
                        "where": where[:4],
                        "replay": rep.group(1) if rep else None,
                    }
                )
            elif not m:
                t["failed"] += 1
                failures.append({"config": label, "kind": "no summary", "rc": rc, "what": text[-2000:]})
            print(f"{label}: {'HANG; ' if hang else ''}{t}", flush=True)
            continue
        if hung:
            t["hangs"] += 1
            failures.append({"config": label, "what": "hang"})
            print(f"{label}: HANG", flush=True)
            continue
        m = re.search(r"SUMMARY: (\d+) passed, (\d+) failed", text)
        if not m:
            t["failed"] += a.batch
            failures.append({"config": label, "what": text[-2000:]})
            print(f"{label}: no summary (rc {rc})", flush=True)
            continue
        ok, bad = int(m.group(1)), int(m.group(2))
        t["sequences"] += ok + bad
        t["failed"] += bad
        if bad:
            failures.append({"config": label, "what": text[-4000:]})
        print(f"{label}: {ok} passed, {bad} failed; total {t}", flush=True)
    for s in suites:
        t = totals[s]
        if s == "drift":
            print(
                f"SOAK drift: {t['sequences']} sequences x {a.ops} operations, {t['failed']} failed, "
                f"{t['hangs']} hangs, {t['launches']} launches",
                flush=True,
            )
        else:
            print(
                f"SOAK fuzz: {t['programs']} programs, {t['steps']} steps, {t['failed']} failed "
                f"({t['wrong_values']} wrong values, {t['hangs']} hangs, {t['onesided']} in one-sided "
                f"calls; by kind {t['kinds']}), {t['launches']} launches",
                flush=True,
            )
    write(a, totals, failures, openmpi)
    return 1 if any(t["failed"] or t["hangs"] for t in totals.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
