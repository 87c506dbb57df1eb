"""Cross-rank API fuzzer: the same random program on every rank, checked against a numpy model.

    mpiexec -n N python -m mpi4py tests/mpi/fuzz.py [--seed S] [--programs M] [--steps K]
        [--methods atomic,flat,...] [--misuse 0|1] [--misuse-kinds K1,K2|-K3,...]
        [--node-size K] [--check-every C] [--max-delay-us D] [--timeout T] [--watchdog W]
        [--same-order fence,pscw] [--avoid vector-pending,op-none,...] [--strict 0|1]
        [--strict-local 0|1] [--replay] [--program FILE] [--keep SPEC] [--dump FILE]
        [--plant value|raise|hang:STEP] [--slow-misuse W] [--restart 0|1] [--list-kinds]

What it guarantees to check.  After every step of a program that the docs allow (and of any
misuse), each rank either holds exactly the values the model predicts, or raises; when one
rank raises, every rank involved raises the same exception class (a rank whose own arguments
were right may raise ``hybridmpi.PeerError`` instead; with ``--strict 0`` also the
``ValueError`` the guide documents for such ranks), within 2 s for bad arguments; never a hang;
and after an exception the objects are either usable and consistent on every rank, or every
later call on them raises on every rank.

Programs.  Program ``i`` of a run uses seed ``S + i``; every rank draws the same steps from
it (``numpy.random.default_rng``); only the per-rank delays and the data are per rank, and
the data are drawn from (seed, step, rank), so every rank computes every other rank's data
and the values it must see.  Steps: ghost patterns (``from_global`` or explicit lists, random
owners, orders and local numberings, empty ranks, long runs), Halos of every method, dtype
and block, ``Halo.vector()``, update / reverse (every op) / begin + end on kept, fresh, flat
and shared arrays, several Halos' begins and ends interleaved in a different order on each
rank (as the guide allows: ``neighbor`` Halos of one pattern begun in the same order),
frees in any order, GlobalMemory ``Put``/``Get``/``Rput``/``Rget``/``fetch_add``/
``compare_swap`` with ``sync_all``/``sync_images``/``waitall``/``flush``, Coarray sections,
barrier/allreduce/Allreduce, the profile (start, stop, rows checked against the calls made,
print, JSON), and misuse (bad offsets, lengths, shapes, dtypes, non-arrays, bad ops, freed
objects, begin twice, end without begin...) on every rank or on one rank while the others
pass good arguments.  ``--list-kinds`` lists the misuse kinds.  Also: allreduce of Python ints
at the int64 edges and beyond (``pyint``: every op, the exact Python result, an int); one
rank's own exception leaving a ``with`` block of the HybridComm, a Halo, a GlobalMemory, a
Coarray or the profile while the others are in barrier/allreduce/update/sync_all or in no call
(``with-raise``: its own exception there, ``PeerError`` within 2 s of it on the ranks that need
it, then a probe: barrier and allreduce raise on every rank); ranks in a constructor
(``Halo()``, ``GlobalMemory()``, ``Coarray()``, ``from_global``, the profile) against the
others in barrier/allreduce/update (``ctor-deadline``, on a side HybridComm of timeout
``SHORT_TIMEOUT``: ``SyncTimeout``/``PeerError`` on each side, within 2 s of the first; drawn
at ``--slow-misuse`` times the others' rate, 0.2 by default); a constructor argument that
cannot be pickled or whose repr/``__index__`` raises (``ctor-unsendable``: ``TypeError`` or
``ValueError`` everywhere, the comm stays usable); two objects freed in different orders
(``free-order``: two GlobalMemory or fence, pscw, lock Halos, whose frees are collective:
``RuntimeError`` everywhere, both stay usable); ``sync_images`` with invalid ranks on one
rank (``sync-images-bad``: the ranks naming it raise ``PeerArgumentError``, the comm stays
usable).  After a misuse that breaks (or may break) the comm, the program frees
everything and goes on with a new HybridComm (``--restart 0``: it ends there).

Checking.  Each rank checks its own values right after each call (no collective); the
outcomes (exception class, message, time, value errors) are gathered every C steps only
(``--check-every``, drawn per program by default), so ranks drift apart between checks;
each rank also sleeps, spins or yields 0-D us (``--max-delay-us``, default 500) before every
call, and ``HYBRIDMPI_CHAOS`` (set by the caller) adds delays inside the C core.  A wrong
value, a disagreement, an error later than 2 s, a SyncTimeout or a hang (a watchdog: no
progress for W seconds prints where each rank is and ends the job) is a failure: rank 0
prints the seed, the failing step, what each rank saw, the command that replays it and the
program's steps.  ``--keep 0-9,14`` runs only those steps (steps whose objects are missing
are skipped on every rank; scripts/fuzz_minimize.py shrinks a failing program with it),
``--dump FILE`` writes the program as JSON, ``--program FILE`` runs one.

Known bugs can be left out of the draws while they are open (never worked around in the
checks): ``--methods``, ``--misuse-kinds=-KIND,-KIND:MODE``, ``--avoid``.  ``--same-order``
(default ``fence,pscw``, as the guide requires) lists the methods whose Halos' calls keep one
order on every rank inside an interleaved group; ``--same-order none`` interleaves them all.
``--plant KIND:STEP`` fakes a failure on the last rank, to test the fuzzer itself.
Findings so far: tests/mpi/fuzz_findings.md; reproducers: tests/mpi/fuzz_repro_cases.py.

Rank 0 prints ``SUMMARY: N passed, M failed`` and a ``FUZZSTATS {json}`` line.

The code, by part: this file (the command line, the watchdog, a program's run and its calls),
``fuzz_gen.py`` (the generator: a program's steps), ``fuzz_steps.py`` (the valid steps and the
values they must give), ``fuzz_misuse.py`` (the misuse steps), ``fuzz_judge.py`` (the verdicts
on what every rank saw), ``fuzz_common.py`` (the tables, the pattern model, the data).
"""

import argparse
import faulthandler
import json
import os
import sys
import threading
import time
import traceback
import warnings

import numpy as np
from fuzz_common import (
    KNOWN,
    METHODS,
    MISUSE,
    SHORT_TIMEOUT,
    P,
    R,
    Rec,
    SkipCall,
    classes,
    comm,
    isa,
    step_text,
)
from fuzz_gen import Gen
from fuzz_judge import Judge
from fuzz_misuse import Misuse
from fuzz_steps import Steps

import hybridmpi


class Pause:
    """This rank's own drift: nothing, a yield, a spin or a sleep of up to max_us."""

    def __init__(self, seed, max_us):
        self.rng = np.random.default_rng([seed, 11, R])
        self.max_us = max_us

    def __call__(self):
        if self.max_us <= 0:
            return
        kind = int(self.rng.integers(0, 4))
        if kind == 1:
            os.sched_yield()
        elif kind == 2:
            t = time.perf_counter() + self.rng.uniform(0, self.max_us) * 1e-6
            while time.perf_counter() < t:
                pass
        elif kind == 3:
            time.sleep(self.rng.uniform(0, self.max_us) * 1e-6)


class Watchdog:
    """Ends the job when this rank makes no progress for ``limit`` seconds, after printing
    where it is (program seed, step, what it was doing)."""

    def __init__(self, limit):
        self.limit = limit
        self.t = time.monotonic()
        self.where = "start"
        self.program = None
        self._stop = False
        if limit > 0:
            threading.Thread(target=self._run, daemon=True).start()

    def tick(self, where):
        self.t = time.monotonic()
        self.where = where

    def _run(self):
        while not self._stop:
            time.sleep(0.5)
            if time.monotonic() - self.t > self.limit:
                prog = self.program
                sys.stdout.write(f"FUZZ HANG rank {R}: no progress for {self.limit:g} s at {self.where}\n")
                if prog is not None and R == 0:
                    sys.stdout.write(prog.report_header("hang") + "\n" + prog.listing() + "\n")
                sys.stdout.flush()
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                sys.stderr.flush()
                time.sleep(3.0)  # let the other ranks print where they are
                os._exit(3)


class Program(Judge, Steps, Misuse):
    """Runs one program on this rank, checks values as it goes, and evaluates (rank 0)."""

    def __init__(self, seed, steps, cfg, wd):
        self.seed = seed
        self.steps = steps
        self.cfg = cfg
        self.wd = wd
        self.pause = Pause(seed, cfg.max_delay_us)
        self.recs = []  # this rank's records since the last check
        self.meta = {}  # key -> what the evaluator needs (same on every rank)
        self.order = []  # keys in program order
        self.hc = None
        # structural model, the same on every rank
        self.pats = {}  # pid -> PatModel
        self.shalo = {}  # hid -> dict(pid, dtype, block, method, nvec, pending, calls)
        self.smem = {}  # mid -> model
        self.sco = {}  # cid -> model
        self.dead = set()
        # actual objects on this rank
        self.opat = {}
        self.ohalo = {}  # hid -> dict(h, arrays)
        self.omem = {}
        self.oco = {}
        self.oreq = {}  # qid -> [(Request, out, expected, key)]
        self.prof = None
        self.pcount = {}  # (object label kind, op) -> successful calls while profiled
        self.images = {}  # sync_images call counts (per HybridComm, shared by memories)
        # evaluation state (rank 0)
        self.phase = "clean"
        self.broken = {}  # rank -> key at which it first raised a breaking exception
        self.broken_why = {}  # rank -> that exception
        self.broken_t = {}  # rank -> when it raised it (that rank's clock: a group's order differs)
        self.t0_at = {}  # (step key, rank) -> when that rank began that call (its own clock)
        self.begins = {}  # (hid, call no) -> key of the begin
        self.failure = None
        self.stats = {"steps": 0, "calls": 0, "raised": 0}
        self.raised_at = {}  # (key, rank) -> class, for the ends of one-rank bad begins
        self.graveyard = {}  # freed Halos (object and a private array) for use-after-free
        self.gm_graveyard = {}  # freed GlobalMemory objects
        #: arrays over shared memory kept past their object's free (or the comm's): written
        #: through after every step; the live objects' checks find any that aliases them
        self.stale = []
        self.stray = []  # objects that invalid constructor calls made anyway
        self.prof_on = False
        self.planted = False
        self.breaks = []  # (key, time) where a rank's own exception broke the comm (misuse_with)
        self.any_breaks = []  # (key, time) where any rank raised a breaking or misuse exception

    # ------------------------------------------------------------ recording

    def call(self, key, fn, check=None, vcat="halo", meta=None, pause=True, p=()):
        """Run fn(); record its outcome and, when it returned, check(result)."""
        if meta is not None:
            self.meta[key] = meta
            self.order.append(key)
        if pause:
            self.pause()
        self.wd.tick(f"program {self.seed} step {key[0]}.{key[1]} ({self.describe(key)})")
        if self.cfg.replay:
            sys.stderr.write(f"[rank {R}] {time.time():.6f} step {key[0]}.{key[1]}: {self.describe(key)}\n")
            sys.stderr.flush()
        t0 = time.time()
        plant = self.cfg.plant
        if plant and R == P - 1 and key[0] >= plant[1] and not self.planted:
            # a planted fault (--plant), to see that the fuzzer reports it
            if plant[0] == "hang":
                self.planted = True
                time.sleep(10 * self.cfg.watchdog)
            elif plant[0] == "raise" and (meta or self.meta.get(key, {})).get("local"):
                self.planted = True
                fn = self.planted_raise(fn)
            elif plant[0] == "value" and check is not None and vcat == "halo":
                self.planted = True
                check = self.corrupt(check)
        try:
            out = fn()
            cls, msg = None, ""
        except Exception as e:  # noqa: BLE001 - the class is the outcome
            out = None
            cls, msg = ("Skip" if isinstance(e, SkipCall) else classes(e)), str(e)[:400]
            if not isa(cls, KNOWN):
                msg += "\n" + traceback.format_exc()[-1500:]
        t1 = time.time()
        verr = None
        if check is not None:
            try:
                verr = check(out, cls)
            except Exception:  # noqa: BLE001 - a checker that fails is a finding too
                verr = "checker raised: " + traceback.format_exc()[-800:]
        if self.cfg.replay:
            sys.stderr.write(f"[rank {R}] {time.time():.6f}   -> {cls or 'ok'} {msg[:200]} {verr or ''}\n")
            sys.stderr.flush()
        self.recs.append(Rec(key, cls, msg, t0, t1, verr, vcat))
        self.stats["calls"] += 1
        if cls is None and self.prof is not None:
            for k in p:
                self.pcount[k] = self.pcount.get(k, 0) + 1
        return cls, out

    @staticmethod
    def planted_raise(fn):
        def raising():  # the call is made (no peer waits for it), then this rank raises
            fn()
            raise hybridmpi.PeerError("planted: a PeerError on one rank only (--plant raise)")

        return raising

    @staticmethod
    def corrupt(check):
        def planted(out, cls):
            return (check(out, cls) or "") + "planted: a wrong value (--plant value)"

        return planted

    def nocall(self, key, meta=None):
        if meta is not None:
            self.meta[key] = meta
            self.order.append(key)
        self.recs.append(Rec(key, "nocall", "", 0.0, 0.0, None, None))

    def describe(self, key):
        st = self.steps[key[0]]
        if st["op"] == "group":
            a = st["acts"][key[1]]
            return f"group: {a['call']} {a['hid']} {a.get('arr', '')} {a.get('rop', '')}"
        if st["op"] == "misuse_hop" and key[1] == 1:
            return f"misuse_hop end of {st['act']['hid']}"
        return step_text(st)

    # ------------------------------------------------------------ driver

    def run(self):
        keep = self.cfg.keep
        ce = 10
        for st in self.steps:
            i = st["i"]
            if keep is not None and i not in keep and st["op"] not in ("hc", "hc_free", "after_free"):
                continue
            if st["op"] == "hc":
                ce = self.cfg.check_every or st["check_every"]
            if not self.ready(st):
                continue
            getattr(self, "do_" + st["op"])(st)
            self.scribble(i)
            self.stats["steps"] += 1
            if (i + 1) % ce == 0:
                if self.check():
                    return False
        return not self.check(final=True)

    def keep_stale(self, arrays):
        """Keep ``arrays`` (over shared memory, their object about to be freed) past the free;
        the oldest go, so that their memory comes back while the program runs."""
        self.stale += [a for a in arrays if isinstance(a, np.ndarray) and a.size]
        del self.stale[:-12]

    def scribble(self, i):
        """Write through every stale array (this rank's own values): nothing live may change."""
        for j, a in enumerate(self.stale):
            a[...] = np.asarray((R + 1) * 1000 + (i * 7 + j) % 97).astype(a.dtype)

    def ready(self, st):
        """Whether a step's objects exist (in the model); when a step was left out (--keep),
        the steps that need it are skipped the same way on every rank."""
        op = st["op"]
        if op in ("hc", "hc_free", "after_free"):
            return True
        if self.hc is None:
            return False
        need = []
        if op in ("group", "misuse_nbo"):
            # every Halo idle, its vectors made (the ends follow their begins inside the step)
            return all(self.hop_ready(a) for a in st["acts"] if not a["call"].endswith("_end"))
        elif op == "hop":
            return self.hop_ready(st)
        elif op in ("halo", "misuse_ctor"):
            need.append(st["pid"])
        elif op in ("vector", "misuse_state"):
            need.append(st["hid"])
        elif op == "misuse_hop":
            a = st["act"]
            return self.hop_ready(a) and (
                st["mk"] != "halo-vector-mismatch" or self.shalo[a["hid"]]["nvec"] == 2
            )
        elif op in ("free_halo",):
            need.append(st["id"])
            if st["id"] in self.shalo and self.shalo[st["id"]]["pending"]:
                return False
        elif op in ("free_mem", "free_co"):
            need.append(st["id"])
        elif op in ("put", "get", "republish", "atomic", "flush", "misuse_gm", "misuse_req", "misuse_sync"):
            need.append(st["mid"])
        elif op in ("co_put", "co_get", "misuse_co", "co_republish"):
            need.append(st["cid"])
        elif op == "wait_reqs":
            return True
        elif op == "misuse_freed":
            return st["hid"] in self.dead
        elif op == "misuse_gmfreed":
            return st["mid"] in self.dead
        elif op == "prof_stop":
            return self.prof_on
        elif op == "prof_start":
            return not self.prof_on
        elif op == "misuse_prof":
            return self.prof_on
        elif op == "misuse_with":
            kind, oid = st["obj"]
            if kind == "prof" and not self.prof_on:
                return False
            if oid is not None and oid not in self.shalo and oid not in self.smem and oid not in self.sco:
                return False
            if st["call"] == "update" and not self.hop_ready(
                {"hid": st["hid"], "arr": "k0", "call": "update"}
            ):
                return False
            if st["call"] == "sync_all" and st["mid"] not in self.smem:
                return False
            return True
        elif op == "misuse_freeorder":
            for kind, oid in st["objs"]:
                if kind == "halo" and not self.hop_ready({"hid": oid, "arr": "k0", "call": "update"}):
                    return False
                if kind == "mem" and oid not in self.smem:
                    return False
            return True
        elif op == "misuse_unsend" and "pid" in st:
            need.append(st["pid"])
        for x in need:
            if x not in self.pats and x not in self.shalo and x not in self.smem and x not in self.sco:
                return False
        if op == "misuse_state":
            pend = self.shalo[st["hid"]]["pending"]
            return (pend is None) == (st["mk"] == "halo-end-without-begin")
        return True

    def hop_ready(self, a):
        s = self.shalo.get(a["hid"])
        if s is None:
            return False
        if a["arr"] in ("v0", "v1") and s["nvec"] < int(a["arr"][1]) + 1:
            return False
        if a["call"].endswith("_end"):
            p = s["pending"]
            return p is not None and p["call"] == a["call"].replace("end", "begin")
        return s["pending"] is None

    # ------------------------------------------------------------ checking (collective)



def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--programs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--misuse", type=int, default=1)
    ap.add_argument(
        "--misuse-kinds",
        default="",
        help="comma list of kinds to draw (all by default); a leading '-' on each name "
        "excludes it instead; -KIND:MODE excludes one mode (all, one, extra) of a kind; "
        "write --misuse-kinds=-KIND when the list starts with '-'",
    )
    ap.add_argument("--node-size", type=int, default=None)
    ap.add_argument("--check-every", type=int, default=0, help="steps between checks (0: drawn per program)")
    ap.add_argument("--max-delay-us", type=float, default=500.0)
    ap.add_argument("--timeout", type=float, default=float(os.environ.get("HYBRIDMPI_TIMEOUT", 10)))
    ap.add_argument("--watchdog", type=float, default=30.0)
    ap.add_argument(
        "--same-order",
        default="fence,pscw",
        help="methods whose Halos' calls keep one order on every rank inside an interleaved "
        "group (default fence,pscw, as the guide requires: MPI_Win_fence and post/start/wait "
        "cannot time out); 'none': every method interleaved",
    )
    ap.add_argument(
        "--strict",
        type=int,
        default=1,
        help="1: a rank with right arguments may raise "
        "only PeerError (or RuntimeError once its objects are unusable); 0: also ValueError",
    )
    ap.add_argument(
        "--strict-local",
        type=int,
        default=0,
        help="1: local one-sided calls must raise too once the rank's HybridComm broke",
    )
    ap.add_argument("--replay", action="store_true", help="log every call of every rank to stderr")
    ap.add_argument("--program", default=None, help="run the program in this JSON file")
    ap.add_argument("--dump", default=None, help="write the (first) program's steps to this JSON file")
    ap.add_argument("--keep", default=None, help="run only these steps, e.g. 0-9,14 (others skipped)")
    ap.add_argument("--stop-on-failure", type=int, default=0)
    ap.add_argument(
        "--avoid",
        default="",
        help="draws to leave out while a known bug is open: "
        "vector-pending (Halo.vector() while that Halo has a begin pending), "
        "free-pending (free objects while another Halo of the same HybridComm has a "
        "begin pending), order (every rank begins and ends interleaved Halos in one order), "
        "op-none (no None among the invalid reverse ops)",
    )
    ap.add_argument("--list-kinds", action="store_true")
    ap.add_argument(
        "--slow-misuse",
        type=float,
        default=0.2,
        help="how often the misuse kinds that wait for a deadline (ctor-deadline: about "
        f"{SHORT_TIMEOUT:g} s each) are drawn, relative to the others: 0 never, 1 as often",
    )
    ap.add_argument(
        "--restart",
        type=int,
        default=1,
        help="1: after a misuse that may break the comm, free everything and go on with a new "
        "HybridComm (0: the program ends there)",
    )
    ap.add_argument(
        "--plant",
        default=None,
        help="KIND:STEP (value, raise, hang): the last rank fakes "
        "a failure from that step on, to test the fuzzer itself",
    )
    a = ap.parse_args(argv)
    a.methods = [m for m in a.methods.split(",") if m]
    for m in a.methods:
        if m not in METHODS:
            ap.error(f"unknown method {m}")
    a.kinds_arg = a.misuse_kinds
    names = [k for k in a.misuse_kinds.split(",") if k]
    a.no_modes = {tuple(k.lstrip("-").split(":")) for k in names if ":" in k}  # -KIND:MODE
    names = [k for k in names if ":" not in k]
    if names and all(k.startswith("-") for k in names):
        a.kinds = set(MISUSE) - {k[1:] for k in names}
    elif names:
        a.kinds = set(names)
    else:
        a.kinds = set(MISUSE)
    for k in a.kinds | {k.lstrip("-") for k in names} | {k for k, _ in a.no_modes}:
        if k not in MISUSE:
            ap.error(f"unknown misuse kind {k}; --list-kinds lists them")
    a.same_order = [m for m in a.same_order.split(",") if m and m != "none"]
    a.avoid = set(x for x in a.avoid.split(",") if x)
    a.keep_arg = a.keep
    if a.keep:
        keep = set()
        for part in a.keep.split(","):
            lo, _, hi = part.partition("-")
            keep.update(range(int(lo), int(hi or lo) + 1))
        a.keep = keep
    a.misuse = bool(a.misuse)
    if a.plant:
        kind, _, at = a.plant.partition(":")
        a.plant = (kind, int(at or 0))
    a.strict = bool(a.strict)
    return a


def main():
    warnings.simplefilter("ignore", getattr(np, "exceptions", np).ComplexWarning)  # misuse casts complex
    cfg = parse()
    if cfg.list_kinds:
        if R == 0:
            for k, (cat, modes, classes) in MISUSE.items():
                print(f"{k:26s} {cat:8s} {'/'.join(modes):10s} {'/'.join(classes)}")
        return 0
    wd = Watchdog(cfg.watchdog)
    stats = {"programs": 0, "passed": 0, "failed": 0, "steps": 0, "calls": 0, "kinds": {}, "failures": []}
    t0 = time.perf_counter()
    for k in range(cfg.programs):
        seed = cfg.seed + k
        if cfg.program:
            with open(cfg.program) as f:
                steps = json.load(f)
        else:
            steps = Gen(seed, P, cfg).program(cfg.steps)
        if cfg.dump and k == 0 and R == 0:
            with open(cfg.dump, "w") as f:
                json.dump(steps, f)
        prog = Program(seed, steps, cfg, wd)
        wd.program = prog
        faulthandler.dump_traceback_later(cfg.watchdog + 20, exit=True)
        try:
            ok = prog.run()
        except Exception:  # noqa: BLE001 - a bug of the fuzzer itself: report and go on
            ok = False
            tb = traceback.format_exc()
            sys.stdout.write(f"FUZZ INTERNAL ERROR rank {R} program {seed}:\n{tb}\n")
            sys.stdout.flush()
            comm.Abort(4)
        faulthandler.cancel_dump_traceback_later()
        if not ok:
            prog.cleanup()
        stats["programs"] += 1
        stats["steps"] += prog.stats["steps"]
        stats["calls"] += prog.stats["calls"]
        if ok:
            stats["passed"] += 1
        else:
            stats["failed"] += 1
            f = prog.failure or {"kind": "?"}
            stats["kinds"][f["kind"]] = stats["kinds"].get(f["kind"], 0) + 1
            stats["failures"].append(
                {
                    "seed": seed,
                    "kind": f["kind"],
                    "op": (f.get("what") or "?").split(" ")[0],
                    "what": f.get("what"),
                    "why": f.get("why"),
                }
            )
            if cfg.stop_on_failure:
                break
        wd.tick("between programs")
        comm.Barrier()
    wd._stop = True
    if R == 0:
        print(
            f"SUMMARY: {stats['passed']} passed, {stats['failed']} failed ({stats['programs']} programs, "
            f"{stats['steps']} steps, {stats['calls']} calls on rank 0, {time.perf_counter() - t0:.1f} s)",
            flush=True,
        )
        print("FUZZSTATS " + json.dumps(stats), flush=True)
    comm.Barrier()
    return 1 if stats["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
