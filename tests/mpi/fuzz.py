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
"""

import argparse
import faulthandler
import io
import json
import os
import sys
import tempfile
import threading
import time
import traceback
import warnings

import numpy as np
from mpi4py import MPI

import hybridmpi

comm = MPI.COMM_WORLD
R, P = comm.rank, comm.size

METHODS = ("atomic", "flat", "neighbor", "fence", "pscw", "lock")
DTYPES = ("float64", "float32", "int64", "int32", "complex128")
ROPS = ("add", "insert", "min", "max")
KNOWN = {
    "TypeError",
    "ValueError",
    "IndexError",
    "RuntimeError",
    "PeerError",
    "SyncTimeout",
    "FreedError",
    "PatternError",
    "OwnError",
}
#: classes a rank with right arguments may raise once something failed (RuntimeError: "this
#: object is unusable after an earlier error"); ValueError too with --strict 0 (the guide's
#: "a peer whose arguments were valid ... raises ValueError")
GOOD_RAISE = {"PeerError", "RuntimeError"}
#: exceptions after which every later synchronizing call of that rank must raise
BREAKING = {"PeerError", "SyncTimeout", "RuntimeError"}
PROMPT_S = 2.0

# misuse kinds: name -> (category, modes, classes the bad rank may raise)
#   modes: "all" (every rank), "one" (one rank, the others pass good arguments), "extra" (one
#   rank makes an extra call, the others none)
MISUSE = {
    "halo-nonarray": ("hop", ("all", "one"), ("TypeError",)),
    "halo-dtype": ("hop", ("all", "one"), ("TypeError",)),
    "halo-shape": ("hop", ("all", "one"), ("ValueError",)),
    "halo-noncontig": ("hop", ("all", "one"), ("ValueError",)),
    "halo-readonly": ("hop", ("all", "one"), ("ValueError",)),
    "halo-op": ("hop", ("all", "one"), ("ValueError",)),
    "halo-cminmax": ("hop", ("all", "one"), ("TypeError",)),
    "halo-vector-mismatch": ("hop", ("one",), ("ValueError",)),
    "halo-begin-twice": ("state", ("all", "extra"), ("RuntimeError",)),
    "halo-end-without-begin": ("state", ("all", "extra"), ("RuntimeError",)),
    "halo-end-other-array": ("state", ("all", "extra"), ("ValueError",)),
    "halo-call-while-pending": ("state", ("all", "extra"), ("RuntimeError",)),
    "halo-freed": ("freed", ("all", "extra"), ("FreedError",)),
    "halo-ctor": ("ctor", ("all", "one"), ("TypeError", "ValueError")),
    "pattern-bad": ("pattern", ("all", "one"), ("PatternError",)),
    "gm-rank": ("gm", ("all", "one"), ("ValueError", "TypeError")),
    "gm-offset": ("gm", ("all", "one"), ("IndexError", "TypeError")),
    "gm-length": ("gm", ("all", "one"), ("IndexError",)),
    "gm-dtype": ("gm", ("all", "one"), ("TypeError",)),
    "gm-nonarray": ("gm", ("all", "one"), ("TypeError",)),
    "gm-noncontig": ("gm", ("all", "one"), ("ValueError",)),
    "gm-readonly": ("gm", ("all", "one"), ("ValueError",)),
    "gm-atomic": ("gm", ("all", "one"), ("TypeError", "IndexError", "ValueError")),
    "gm-flush": ("gm", ("all", "one"), ("ValueError", "TypeError")),
    "gm-wait-twice": ("req", ("all", "extra"), ("RuntimeError",)),
    "gm-freed": ("gmfreed", ("all", "extra"), ("FreedError",)),
    "gm-ctor": ("gmctor", ("all", "one"), ("TypeError", "ValueError")),
    "sync-images-bad": ("sync", ("all", "one"), ("ValueError", "TypeError")),
    "co-index": ("co", ("all", "one"), ("IndexError", "TypeError", "ValueError")),
    "coll-type": ("coll", ("all", "one"), ("TypeError",)),
    "coll-op": ("coll", ("all", "one"), ("ValueError", "TypeError")),
    "coll-len": ("coll", ("one",), ("ValueError",)),
    "coll-Allreduce": ("coll", ("all", "one"), ("ValueError", "TypeError")),
    "barrier-method": ("coll", ("all", "one"), ("ValueError",)),
    "profile-twice": ("prof", ("all",), ("RuntimeError",)),
    "neighbor-order": ("nbo", ("all",), ("ValueError",)),
    # one rank's own exception leaves a with block (HybridComm, Halo, GlobalMemory, Coarray,
    # profile) while the others are in a call: the comm breaks (a new HybridComm follows)
    "with-raise": ("withraise", ("one",), ("OwnError",)),
    # ranks in a constructor against the others in barrier/allreduce/update, on a side
    # HybridComm of a short timeout (each such draw waits SHORT_TIMEOUT s; --slow-misuse)
    "ctor-deadline": ("deadline", ("one",), ("SyncTimeout", "PeerError")),
    # a constructor argument that cannot be pickled or whose repr/__index__ raises
    "ctor-unsendable": ("unsend", ("all", "one"), ("TypeError", "ValueError")),
    # two objects freed in different orders on different ranks: RuntimeError everywhere
    "free-order": ("freeorder", ("all",), ("RuntimeError",)),
}
#: misuse kinds whose one-rank form leaves the comm possibly broken (the program then ends
#: soon, or frees everything and goes on with a new HybridComm); sync_images with invalid ranks
#: on one rank leaves it usable (the peers that named it raise PeerArgumentError)
TAINTING = {"hop", "coll", "nbo"}
#: misuse kinds that always break the comm: a probe follows, then the program ends or restarts
BREAKS = {"withraise"}
#: misuse kinds that wait for a deadline: drawn with --slow-misuse (rarely by default)
SLOW = {"ctor-deadline"}
#: the timeout of the side HybridComm of ctor-deadline draws
SHORT_TIMEOUT = 1.0


class OwnError(Exception):
    """A rank's own error inside a with block (misuse kind with-raise)."""


class BadRepr:
    """An argument whose repr and __index__ raise (misuse kind ctor-unsendable)."""

    def __repr__(self):
        raise AttributeError("this object's repr raises")

    def __index__(self):
        raise AttributeError("this object's __index__ raises")


def unsendable(kind):
    """An argument that cannot be pickled, or whose repr/__index__ raises."""
    if kind == "gen":  # not a valid shape, count, block or dtype either
        return (v for v in ("a", 3))
    if kind == "lambda":
        return lambda: 0
    return BadRepr()


#: Python ints at the int64 edges, for allreduce of Python ints (pyint steps)
PYINTS = (
    0,
    1,
    -1,
    3,
    -7,
    2**31,
    -(2**31),
    2**53 - 1,
    2**53,
    2**53 + 1,
    -(2**53) - 1,
    2**62,
    -(2**62),
    2**63 - 1,
    -(2**63),
    2**63,
    2**64 + 3,
    -(2**64) - 5,
    3**45,
    -(10**30),
)


def classes(exc):
    """An exception's class and its bases down to Exception, as "Name|Base|...": a subclass
    counts as each of its bases (PeerArgumentError is a PeerError and a ValueError)."""
    return "|".join(c.__name__ for c in type(exc).__mro__ if c not in (Exception, BaseException, object))


def isa(cls, names):
    """Whether a recorded class (``classes``) is, or derives from, one of ``names``."""
    return cls is not None and cls != "nocall" and bool(set(cls.split("|")) & set(names))


def first(cls):
    return cls.split("|")[0] if cls else cls


def _i(x):
    """A JSON-able Python int."""
    return int(x)


# ============================================================ patterns


def pattern_spec(rng, nranks):
    """A random ghost pattern described by global ids: owned and ghost ids per rank, the kind
    (``global``: from_global; ``explicit``: send/recv lists over a random local numbering)."""
    big = rng.random() < 0.12
    if big:  # long runs: cross-memory attach and zero copy take them
        n_owned = [_i(rng.integers(64, 200)) for _ in range(nranks)]
    else:
        n_owned = [_i(rng.choice([0, 1, 2, 3, 5, 8, 13, 21])) for _ in range(nranks)]
    total = sum(n_owned)
    base = _i(rng.choice([0, 0, 1000, 2**40]))
    ids = np.arange(total) if big or rng.random() < 0.4 else rng.permutation(total)
    ids = ids + base
    starts = np.concatenate(([0], np.cumsum(n_owned)))
    owned = [ids[starts[r] : starts[r + 1]] for r in range(nranks)]
    if not big and rng.random() < 0.5:
        owned = [o[rng.permutation(o.size)] for o in owned]
    density = float(rng.choice([0.0, 0.3, 0.7, 1.0])) if not big else 1.0
    ghosts = []
    for r in range(nranks):
        parts = []
        for q in rng.permutation(nranks):
            if q == r or owned[q].size == 0 or rng.random() >= max(density, 0.15):
                continue
            o = owned[q]
            if big:
                a = _i(rng.integers(0, o.size // 3))
                b = _i(rng.integers(a + min(64, o.size - a), o.size + 1))
                parts.append(np.sort(o)[a:b])
            else:
                k = _i(rng.integers(0, o.size + 1))
                parts.append(o[rng.permutation(o.size)[:k]])
        g = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        if not big and rng.random() < 0.5:
            g = g[rng.permutation(g.size)]
        ghosts.append(g)
    kind = "explicit" if rng.random() < 0.3 else "global"
    spec = {
        "owned": [[_i(v) for v in o] for o in owned],
        "ghosts": [[_i(v) for v in g] for g in ghosts],
        "kind": kind,
        "perm": None,
    }
    if kind == "explicit":
        spec["perm"] = []
        for r in range(nranks):
            n = len(owned[r]) + len(ghosts[r]) + _i(rng.integers(0, 3))
            spec["perm"].append([_i(v) for v in (rng.permutation(n) if rng.random() < 0.7 else np.arange(n))])
    return spec


class PatModel:
    """Everything about one pattern, for every rank: local numbering, who sends what."""

    def __init__(self, spec, nranks):
        self.spec = spec
        self.nr = nranks
        owned = [np.array(o, np.int64) for o in spec["owned"]]
        ghosts = [np.array(g, np.int64) for g in spec["ghosts"]]
        self.size, self.local_owned, self.local_ghost = [], [], []
        for r in range(nranks):
            no, ng = owned[r].size, ghosts[r].size
            if spec["perm"] is None:
                lo, lg, size = np.arange(no), no + np.arange(ng), no + ng
            else:
                perm = np.array(spec["perm"][r], np.int64)
                lo, lg, size = perm[:no], perm[no : no + ng], perm.size
            self.size.append(int(size))
            self.local_owned.append(lo)
            self.local_ghost.append(lg)
        where = {}
        for q in range(nranks):
            for k, g in enumerate(owned[q]):
                where[int(g)] = (q, int(self.local_owned[q][k]))
        self.owner_of = where
        # forward: per rank r, per owner q: (my ghost local ids, q's local ids), in my ghost order
        self.fwd = []
        self.rev = [dict() for _ in range(nranks)]  # per owner q: {ghoster r: (q's ids, r's ids)}
        for r in range(nranks):
            by = {}
            for k, g in enumerate(ghosts[r]):
                q, j = where[int(g)]
                by.setdefault(q, ([], []))
                by[q][0].append(int(self.local_ghost[r][k]))
                by[q][1].append(j)
            self.fwd.append({q: (np.array(a, np.int64), np.array(b, np.int64)) for q, (a, b) in by.items()})
            for q, (mine, theirs) in self.fwd[r].items():
                self.rev[q][r] = (theirs, mine)
        # readers: direction 0 (update): the ranks that receive from r; 1 (reverse) likewise
        self.readers = [[set() for _ in range(nranks)], [set() for _ in range(nranks)]]
        for r in range(nranks):
            for q in self.fwd[r]:
                self.readers[0][q].add(r)
                self.readers[1][r].add(q)
        self.neighbors = [set(self.fwd[r]) | set(self.rev[r]) for r in range(nranks)]

    def explicit_lists(self, r):
        """send and recv of rank r for GhostPattern(hc, send=, recv=, size=)."""
        recv = {q: a for q, (a, _) in self.fwd[r].items()}
        send = {q: theirs for q, (theirs, _) in self.rev[r].items()}
        return send, recv

    def forward(self, r, xs):
        out = xs[r].copy()
        for q, (mine, theirs) in self.fwd[r].items():
            out[mine] = xs[q][theirs]
        return out

    def reverse(self, r, xs, op):
        out = xs[r].copy()
        for q in sorted(self.rev[r]):
            mine, theirs = self.rev[r][q]
            v = xs[q][theirs]
            if op == "add":
                out[mine] = out[mine] + v
            elif op == "insert":
                out[mine] = v
            elif op == "min":
                out[mine] = np.minimum(out[mine], v)
            else:
                out[mine] = np.maximum(out[mine], v)
        return out


# ============================================================ generator


class Gen:
    """Draws one program (a list of JSON-able steps) from a seed; the same on every rank."""

    def __init__(self, seed, nranks, cfg):
        self.rng = np.random.default_rng([seed, 1])
        self.P = nranks
        self.cfg = cfg
        self.steps = []
        self.pats = {}  # pid -> PatModel
        self.halos = {}  # hid -> dict(pid, dtype, block, method, nvec, pending)
        self.dead_halos = []
        self.mems = {}  # mid -> dict(kind, dtype, counts)
        self.dead_mems = []
        self.cos = {}  # cid -> shape
        self.reqs = []  # deferred Rgets: (qid, mid)
        self.prof = False
        self.n = 0
        self.one_used = False
        self.end_at = None

    def new_id(self, prefix):
        self.n += 1
        return f"{prefix}{self.n}"

    def add(self, step):
        step["i"] = len(self.steps)
        self.steps.append(step)

    def choice(self, seq):
        seq = list(seq)
        return seq[int(self.rng.integers(0, len(seq)))]

    # ------------------------------------------------------------ program

    def program(self, n_steps):
        self.start_hc()
        while len(self.steps) < n_steps:
            if self.end_at is not None and len(self.steps) >= self.end_at:
                # the comm may be broken: free everything; go on with a new HybridComm
                if not self.cfg.restart or n_steps - len(self.steps) < 15:
                    break
                self.finish()
                self.start_hc(restart=True)
                continue
            self.gen_step()
        self.finish()
        return self.steps

    def start_hc(self, restart=False):
        rng = self.rng
        step = {
            "op": "hc",
            "memory_order": self.choice(["acq_rel"] * 4 + ["seq_cst"]),
            "allreduce": self.choice(["recursive_doubling", "recursive_doubling", "tree"]),
            "radix": self.choice([2, 3, 4, 4]),
            "env": self.choice(["default", "zc0", "cma0", "both0", "both0"]),
            "check_every": self.cfg.check_every or self.choice([1, 2, 5, 10, 25, 50]),
        }
        if restart:  # a new HybridComm after the last one was freed (broken or not)
            step["restart"] = True
            self.pats = {}
            self.dead_halos, self.dead_mems, self.reqs = [], [], []
            self.prof = False
            self.one_used = False
            self.end_at = None
        self.add(step)
        self.gen_pattern()
        for _ in range(_i(rng.integers(1, 4))):
            self.gen_halo()
        self.gen_mem()

    def gen_step(self):
        rng = self.rng
        live = [h for h, s in self.halos.items()]
        w = {
            "hop": 30,
            "group": 10,
            "pending": 6,
            "halo": 4,
            "pattern": 1.5,
            "vector": 2,
            "free_halo": 2.5,
            "coll": 8,
            "put": 8,
            "get": 5,
            "atomic": 4,
            "co": 5,
            "republish": 2,
            "mem": 1,
            "free_mem": 1,
            "prof": 1.5,
            "wait_reqs": 2,
            "flush": 1,
            "pyint": 2,
            "misuse": 12 if self.cfg.misuse else 0,
        }
        if not live:
            w["hop"] = w["group"] = w["pending"] = w["vector"] = w["free_halo"] = 0
            w["halo"] = 20
        if not self.mems:
            w["put"] = w["get"] = w["atomic"] = w["republish"] = w["free_mem"] = 0
            w["mem"] = 5
        names = list(w)
        p = np.array([w[k] for k in names], float)
        kind = names[int(rng.choice(len(names), p=p / p.sum()))]
        getattr(self, "gen_" + kind)()

    def finish(self):
        """End every pending call, wait, stop the profile, free everything in a random order."""
        for hid, s in list(self.halos.items()):
            if s["pending"]:
                self.add_end(hid)
        if self.reqs:
            self.gen_wait_reqs()
        if self.prof:
            self.add({"op": "prof_stop"})
            self.prof = False
        objs = (
            [("free_halo", h) for h in self.halos]
            + [("free_mem", m) for m in self.mems]
            + [("free_co", c) for c in self.cos]
        )
        for k in self.rng.permutation(len(objs)):
            op, oid = objs[int(k)]
            self.add({"op": op, "id": oid})
        self.halos, self.mems, self.cos = {}, {}, {}
        self.add({"op": "hc_free"})
        self.add({"op": "after_free"})

    # ------------------------------------------------------------ ghost updates

    def gen_pattern(self):
        pid = self.new_id("p")
        spec = pattern_spec(self.rng, self.P)
        self.pats[pid] = PatModel(spec, self.P)
        self.add({"op": "pattern", "pid": pid, "spec": spec})

    def gen_halo(self):
        if len(self.halos) >= 8:
            return self.gen_free_halo()
        if not self.pats or self.rng.random() < 0.1:
            self.gen_pattern()
        hid = self.new_id("h")
        pid = self.choice(self.pats)
        s = {
            "pid": pid,
            "dtype": self.choice(DTYPES),
            "block": self.choice([1, 1, 2, 3]),
            "method": self.choice(self.cfg.methods),
            "nvec": 0,
            "pending": None,
        }
        self.halos[hid] = s
        self.add(
            {
                "op": "halo",
                "hid": hid,
                "pid": pid,
                "dtype": s["dtype"],
                "block": s["block"],
                "method": s["method"],
            }
        )

    def gen_vector(self):
        hid = self.choice(self.halos)
        s = self.halos[hid]
        if s["nvec"] >= 2 or (s["pending"] and "vector-pending" in self.cfg.avoid):
            return self.gen_hop()
        s["nvec"] += 1
        self.add({"op": "vector", "hid": hid})

    def arr_name(self, s):
        vec = {0: [], 1: ["v0", "v0"], 2: ["v0", "v0", "v1"]}[s["nvec"]]
        return self.choice(["k0", "k0", "k1", "ka", "f"] + vec)

    def rop(self, s):
        ops = ROPS if s["dtype"] != "complex128" else ("add", "insert")
        return self.choice(ops)

    def hop_action(self, hid, call):
        s = self.halos[hid]
        a = {"op": "hop", "hid": hid, "call": call, "arr": self.arr_name(s)}
        if call.startswith("reverse"):
            a["rop"] = self.rop(s)
        return a

    def idle_halos(self):
        return [h for h, s in self.halos.items() if not s["pending"]]

    def gen_hop(self):
        idle = self.idle_halos()
        if not idle:
            return self.gen_pending()
        hid = self.choice(idle)
        call = self.choice(["update", "update", "reverse", "split_update", "split_reverse"])
        if call.startswith("split"):
            d = call[6:]
            b = self.hop_action(hid, d + "_begin")
            self.add(b)
            self.add({"op": "hop", "hid": hid, "call": d + "_end", "arr": b["arr"]})
        else:
            self.add(self.hop_action(hid, call))

    def gen_pending(self):
        """Begin a call that stays pending over the next steps, or end one."""
        pend = [h for h, s in self.halos.items() if s["pending"]]
        idle = self.idle_halos()
        if pend and (not idle or self.rng.random() < 0.5):
            return self.add_end(self.choice(pend))
        if idle:
            hid = self.choice(idle)
            a = self.hop_action(hid, self.choice(["update_begin", "reverse_begin"]))
            self.halos[hid]["pending"] = a
            self.add(a)

    def add_end(self, hid):
        b = self.halos[hid]["pending"]
        self.halos[hid]["pending"] = None
        self.add({"op": "hop", "hid": hid, "call": b["call"].replace("begin", "end"), "arr": b["arr"]})

    def gen_group(self):
        """Several Halos' calls, begun and ended in a different order on each rank."""
        idle = self.idle_halos()
        if len(idle) < 2:
            return self.gen_hop()
        k = _i(self.rng.integers(2, min(4, len(idle)) + 1))
        chosen = [idle[int(j)] for j in self.rng.permutation(len(idle))[:k]]
        acts = []
        for hid in chosen:
            call = self.choice(["split_update", "split_reverse", "split_update", "update", "reverse"])
            if call.startswith("split"):
                d = call[6:]
                b = self.hop_action(hid, d + "_begin")
                acts.append(b)
                acts.append({"op": "hop", "hid": hid, "call": d + "_end", "arr": b["arr"]})
            else:
                acts.append(self.hop_action(hid, call))
        orders = self.orders(acts)
        self.add({"op": "group", "acts": acts, "orders": orders})

    def orders(self, acts):
        """Per rank, an order of ``acts`` that the guide allows and that cannot deadlock if
        begins never wait for peers and an end waits for every peer's begin (actions of
        methods in --same-order are in one global order and wait for every rank; the end of an
        ``atomic`` call on a shared vector waits for every peer's end: zero copy's owner waits
        for its readers' DONE)."""
        n = len(acts)
        same = set(self.cfg.same_order)
        pred = [set() for _ in range(n)]
        for j, a in enumerate(acts):
            if a["call"].endswith("_end"):
                pred[j].add(next(i for i in range(j) if acts[i]["hid"] == a["hid"]))
        chains = {}
        for j, a in enumerate(acts):
            s = self.halos[a["hid"]]
            if s["method"] in same:
                chains.setdefault("same", []).append(j)
            elif s["method"] == "neighbor" and not a["call"].endswith("_end"):
                chains.setdefault("nb-" + s["pid"], []).append(j)
        for chain in chains.values():
            for x, y in zip(chain, chain[1:]):
                pred[y].add(x)
        collective = [self.halos[a["hid"]]["method"] in same
                      or (self.halos[a["hid"]]["method"] == "atomic" and a["call"].endswith("_end")
                          and a["arr"] in ("v0", "v1"))
                      for a in acts]
        if "order" in self.cfg.avoid:
            return [self.topo(pred)] * self.P
        for _ in range(30):
            orders = [self.topo(pred) for _ in range(self.P)]
            if self.deadlock_free(acts, orders, collective):
                return orders
        return [list(range(n))] * self.P

    def topo(self, pred):
        done, order = set(), []
        while len(order) < len(pred):
            ready = [j for j in range(len(pred)) if j not in done and pred[j] <= done]
            j = self.choice(ready)
            done.add(j)
            order.append(j)
        return order

    def deadlock_free(self, acts, orders, collective):
        pos = [0] * self.P
        began = {}
        arrived = {}
        moved = True
        while moved:
            moved = False
            for r in range(self.P):
                while pos[r] < len(acts):
                    j = orders[r][pos[r]]
                    a = acts[j]
                    if collective[j]:
                        arrived.setdefault(j, set()).add(r)
                        if not a["call"].endswith("_end"):
                            began.setdefault(a["hid"], set()).add(r)
                        if len(arrived[j]) < self.P:
                            break
                    elif a["call"].endswith("_begin"):
                        began.setdefault(a["hid"], set()).add(r)
                    else:
                        if not a["call"].endswith("_end"):
                            began.setdefault(a["hid"], set()).add(r)
                        if len(began.get(a["hid"], ())) < self.P:
                            break
                    pos[r] += 1
                    moved = True
        return all(p == len(acts) for p in pos)

    def pending_first(self):
        """With --avoid free-pending: end a pending call before anything is freed."""
        pend = [h for h, s in self.halos.items() if s["pending"]]
        if pend and "free-pending" in self.cfg.avoid:
            self.add_end(self.choice(pend))
            return True
        return False

    def gen_free_halo(self):
        if self.pending_first():
            return
        idle = self.idle_halos()
        if not idle:
            return self.gen_pending()
        hid = self.choice(idle)
        del self.halos[hid]
        self.dead_halos.append(hid)
        self.add({"op": "free_halo", "id": hid})
        if self.rng.random() < 0.2:
            self.add({"op": "free_halo", "id": hid})  # free() is idempotent

    # ------------------------------------------------------------ global memory

    def gen_mem(self):
        if len(self.mems) >= 3:
            return self.gen_free_mem()
        mid = self.new_id("m")
        dtype = self.choice(
            ["float64", "float64", "int64", "int64", "int32", "complex128", "float32", "uint8", "int16"]
        )
        W = self.choice([1, 2, 4, 7])
        pad = [_i(self.rng.integers(0, 4)) for _ in range(self.P)]
        self.mems[mid] = {"dtype": dtype, "W": W, "pad": pad, "epoch": 0}
        self.add({"op": "mem", "mid": mid, "dtype": dtype, "W": W, "pad": pad})
        if self.rng.random() < 0.4 and len(self.cos) < 2:
            cid = self.new_id("c")
            shape = [self.P + 1, 2, self.choice([1, 3, 6])]
            self.cos[cid] = {"shape": shape, "dtype": self.choice(["float64", "int32", "complex128"])}
            self.add({"op": "co", "cid": cid, "shape": shape, "dtype": self.cos[cid]["dtype"]})

    def gen_free_mem(self):
        if self.pending_first():
            return
        if self.reqs:
            return self.gen_wait_reqs()
        if self.cos and self.rng.random() < 0.4:
            cid = self.choice(self.cos)
            del self.cos[cid]
            return self.add({"op": "free_co", "id": cid})
        if not self.mems:
            return self.gen_mem()
        mid = self.choice(self.mems)
        del self.mems[mid]
        self.dead_mems.append(mid)
        self.add({"op": "free_mem", "id": mid})

    def targets(self):
        """Per rank: its target (or None: no put this round), drawn for a one-sided round."""
        t = []
        for _ in range(self.P):
            if self.rng.random() < 0.2:
                t.append(None)
            else:
                t.append(_i(self.rng.integers(0, self.P)))
        return t

    def sync_kind(self):
        return self.choice(["all", "images", "images"])

    def gen_put(self):
        if self.cos and self.rng.random() < 0.3:
            return self.gen_co()
        mid = self.choice(self.mems)
        m = self.mems[mid]
        ops = []
        for t in self.targets():
            if t is None:
                ops.append(None)
                continue
            a = _i(self.rng.integers(0, m["W"] + 1))
            b = _i(self.rng.integers(a, m["W"] + 1))
            ops.append(
                {
                    "t": t,
                    "a": a,
                    "b": b,
                    "how": self.choice(["Put", "Put", "Rput", "Rput-wait", "Rput-waitall", "Put2d"]),
                }
            )
        self.add({"op": "put", "mid": mid, "ops": ops, "sync": self.sync_kind()})

    def gen_get(self):
        if self.reqs and self.rng.random() < 0.3:
            return self.gen_wait_reqs()
        mid = self.choice(self.mems)
        m = self.mems[mid]
        ops = []
        for _ in range(self.P):
            t = _i(self.rng.integers(0, self.P))
            a = _i(self.rng.integers(0, m["W"] + 1))
            b = _i(self.rng.integers(a, m["W"] + 1))
            ops.append(
                {
                    "t": t,
                    "a": a,
                    "b": b,
                    "how": self.choice(["Get", "Get", "Rget", "Rget-test", "Rget-defer"]),
                }
            )
        step = {"op": "get", "mid": mid, "ops": ops}
        if any(o["how"] == "Rget-defer" for o in ops):
            qid = self.new_id("q")
            step["qid"] = qid
            self.reqs.append((qid, mid))
        self.add(step)

    def gen_wait_reqs(self):
        if not self.reqs:
            return
        self.add(
            {"op": "wait_reqs", "qids": [q for q, _ in self.reqs], "how": self.choice(["each", "waitall"])}
        )
        self.reqs = []

    def gen_republish(self):
        if self.reqs:
            return self.gen_wait_reqs()
        if self.cos and self.rng.random() < 0.4:
            return self.add({"op": "co_republish", "cid": self.choice(self.cos)})
        mid = self.choice(self.mems)
        self.add({"op": "republish", "mid": mid})

    def gen_atomic(self):
        ints = [m for m, s in self.mems.items() if s["dtype"] == "int64"]
        if not ints:
            return self.gen_put()
        mid = self.choice(ints)
        ops = []
        for t in self.targets():
            if t is None:
                ops.append(None)
                continue
            ops.append(
                {
                    "t": t,
                    "how": self.choice(["fadd", "fadd", "cas-hit", "cas-miss", "fadd-shared"]),
                    "v": _i(self.rng.integers(-50, 50)),
                }
            )
        self.add({"op": "atomic", "mid": mid, "ops": ops})

    def section(self, W):
        """A random basic index of the last axis of width W."""
        kind = self.choice(["all", "slice", "slice", "int", "ellipsis"])
        if kind == "all":
            return ["all"]
        if kind == "int":
            return ["int", _i(self.rng.integers(-W, W))]
        if kind == "ellipsis":
            return ["ellipsis"]
        step = self.choice([1, 1, 2, 3, -1, -2])
        a = _i(self.rng.integers(-W - 1, W + 2))
        b = _i(self.rng.integers(-W - 1, W + 2))
        return ["slice", a, b, step]

    def gen_co(self):
        if not self.cos:
            return self.gen_mem()
        cid = self.choice(self.cos)
        c = self.cos[cid]
        W = c["shape"][2]
        if self.rng.random() < 0.35:
            ops = [
                {
                    "t": _i(self.rng.integers(0, self.P)),
                    "sec": self.section(W),
                    "how": self.choice(["get", "get", "Rget"]),
                }
                for _ in range(self.P)
            ]
            return self.add({"op": "co_get", "cid": cid, "ops": ops})
        ops = []
        for t in self.targets():
            if t is None:
                ops.append(None)
                continue
            ops.append({"t": t, "sec": self.section(W), "how": self.choice(["set", "set", "scalar", "Rput"])})
        self.add({"op": "co_put", "cid": cid, "ops": ops, "sync": self.sync_kind()})

    def gen_flush(self):
        if not self.mems:
            return self.gen_mem()
        mid = self.choice(self.mems)
        self.add({"op": "flush", "mid": mid, "rank": self.choice([None, _i(self.rng.integers(0, self.P))])})

    # ------------------------------------------------------------ collectives, profile

    def gen_coll(self):
        kind = self.choice(["barrier", "allreduce", "allreduce", "Allreduce"])
        step = {"op": kind}
        if kind == "barrier":
            step["method"] = self.choice(["dissemination", "tree", "linear", None])
        else:
            dtype = self.choice(DTYPES)
            ops = ("sum", "prod", "min", "max") if dtype != "complex128" else ("sum", "prod")
            step.update(
                dtype=dtype,
                red=self.choice(ops),
                n=self.choice(
                    [0, 1, 1, 3, 12, 13, 100, 1000] + ([33000] if self.rng.random() < 0.05 else [])
                ),
            )
            if kind == "Allreduce":
                step["inplace"] = bool(self.rng.random() < 0.3)
                step["mpiop"] = bool(self.rng.random() < 0.5)
                if step["n"] == 0:
                    step["n"] = 1
        self.add(step)

    def gen_prof(self):
        if self.prof:
            self.prof = False
            self.add({"op": "prof_stop"})
        else:
            self.prof = True
            self.add({"op": "prof_start"})

    # ------------------------------------------------------------ misuse

    def gen_misuse(self):
        kinds = [k for k in MISUSE if k in self.cfg.kinds]
        if not kinds:
            return self.gen_hop()
        name = self.choice(kinds)
        if name in SLOW and self.rng.random() >= self.cfg.slow_misuse:
            return self.gen_hop()
        cat, modes, classes = MISUSE[name]
        modes = [m for m in modes if (m != "one" or not self.one_used) and (name, m) not in self.cfg.no_modes]
        if not modes:
            return self.gen_hop()
        mode = self.choice(modes)
        bad = "all" if mode == "all" else _i(self.rng.integers(0, self.P))
        step = getattr(self, "mis_" + cat)(name, mode, bad)
        if step is None:
            return self.gen_hop()
        step.update(mk=name, mode=mode, bad=bad)
        step.setdefault("exp", list(classes))
        if mode == "one":
            self.one_used = True
            if cat in TAINTING:
                self.end_at = len(self.steps) + 1 + _i(self.rng.integers(0, 9))
        self.add(step)
        if cat in BREAKS:
            # every later call raises on every rank: a probe, then the end (or a new comm)
            self.add({"op": "probe_broken"})
            self.end_at = len(self.steps)
        post = getattr(self, "post_" + cat, None)
        if post is not None:
            post(step)

    def mis_hop(self, name, mode, bad):
        cands = self.idle_halos()
        if name == "halo-cminmax":
            cands = [h for h in cands if self.halos[h]["dtype"] == "complex128"]
        if name == "halo-vector-mismatch":
            cands = [h for h in cands if self.halos[h]["nvec"] == 2]
        if not cands:
            return None
        hid = self.choice(cands)
        s = self.halos[hid]
        pm = self.pats[s["pid"]]
        if name == "halo-noncontig":  # a strided view of <= 1 point is contiguous
            ranks = range(self.P) if bad == "all" else [bad]
            if any(pm.size[r] * (s["block"] if True else 1) < 2 for r in ranks):
                return None
        if name in ("halo-op", "halo-cminmax"):
            call = self.choice(["reverse", "reverse_begin"])
        elif name == "halo-vector-mismatch":
            call = self.choice(["update", "reverse", "update_begin"])
        else:
            call = self.choice(["update", "reverse", "update_begin", "reverse_begin"])
        a = self.hop_action(hid, call)
        if name == "halo-vector-mismatch":
            a["arr"] = "v0"
        step = {"op": "misuse_hop", "act": a, "param": _i(self.rng.integers(0, 1 << 30))}
        if call.endswith("_begin") and mode == "one":
            step["end"] = {"op": "hop", "hid": hid, "call": call.replace("begin", "end"), "arr": a["arr"]}
        return step

    def mis_state(self, name, mode, bad):
        pend = [h for h, s in self.halos.items() if s["pending"]]
        idle = self.idle_halos()
        if name == "halo-end-without-begin":
            if not idle:
                return None
            hid = self.choice(idle)
            call = self.choice(["update_end", "reverse_end"])
            return {"op": "misuse_state", "hid": hid, "call": call, "arr": self.arr_name(self.halos[hid])}
        if not pend:
            return None
        hid = self.choice(pend)
        p = self.halos[hid]["pending"]
        if name == "halo-begin-twice":
            call = self.choice(["update_begin", "reverse_begin"])
            arr = p["arr"] if self.rng.random() < 0.5 else self.arr_name(self.halos[hid])
        elif name == "halo-end-other-array":
            call = p["call"].replace("begin", "end")
            others = [x for x in ("k0", "k1", "ka", "f") if x != p["arr"]]
            arr = self.choice(others)
        else:
            call = self.choice(["update", "reverse"])
            arr = self.arr_name(self.halos[hid])
        return {"op": "misuse_state", "hid": hid, "call": call, "arr": arr, "rop": self.rop(self.halos[hid])}

    def mis_freed(self, name, mode, bad):
        if not self.dead_halos:
            return None
        return {
            "op": "misuse_freed",
            "hid": self.choice(self.dead_halos),
            "call": self.choice(["update", "reverse", "update_begin", "vector"]),
        }

    def mis_ctor(self, name, mode, bad):
        if not self.pats:
            return None
        what = self.choice(
            ["dtype", "block", "method", "diff"] if mode == "one" else ["dtype", "block", "method"]
        )
        val = {
            "dtype": self.choice(["int8", "U3", "nonsense", "bool"]),
            "block": self.choice([0, -1, 1.5, True, "2"]),
            "method": self.choice(["carrier-pigeon", 3, "ATOMIC"]),
            "diff": self.choice(["dtype", "block", "method"]),
        }[what]
        exp = {
            "dtype": ["TypeError"],
            "block": ["ValueError"],
            "method": ["ValueError"],
            "diff": ["ValueError"],
        }[what]
        return {
            "op": "misuse_ctor",
            "pid": self.choice(self.pats),
            "what": what,
            "val": val,
            "dtype": self.choice(DTYPES),
            "block": self.choice([1, 2]),
            "method": self.choice(self.cfg.methods),
            "exp": exp,
        }

    def mis_pattern(self, name, mode, bad):
        spec = pattern_spec(self.rng, self.P)
        how = self.choice(
            ["nobody", "dup", "own", "range"] if spec["kind"] == "explicit" else ["nobody", "dup", "own"]
        )
        ranks = range(self.P) if bad == "all" else [bad]
        for r in ranks:  # a duplicate or an own id needs ids to repeat
            if (
                how == "dup"
                and not spec["ghosts"][r]
                and not any(spec["owned"][q] for q in range(self.P) if q != r)
            ):
                return None
            if how == "own" and not spec["owned"][r]:
                return None
        return {"op": "misuse_pattern", "spec": spec, "how": how}

    def mis_gm(self, name, mode, bad):
        mids = list(self.mems)
        if name == "gm-atomic" and self.rng.random() < 0.5:
            mids = [m for m in mids if self.mems[m]["dtype"] == "int64"] or mids
        if not mids:
            return None
        mid = self.choice(mids)
        return {
            "op": "misuse_gm",
            "mid": mid,
            "param": _i(self.rng.integers(0, 1 << 30)),
            "t": _i(self.rng.integers(0, self.P)),
            "how": self.choice(["Put", "Get", "Rput", "Rget"]),
        }

    def mis_req(self, name, mode, bad):
        if not self.mems:
            return None
        return {
            "op": "misuse_req",
            "mid": self.choice(self.mems),
            "t": _i(self.rng.integers(0, self.P)),
            "how": self.choice(["Rput", "Rget"]),
            "twice": self.choice(["wait", "waitall"]),
        }

    def mis_gmfreed(self, name, mode, bad):
        if not self.dead_mems:
            return None
        return {
            "op": "misuse_gmfreed",
            "mid": self.choice(self.dead_mems),
            "how": self.choice(["Put", "Get", "sync_all", "fetch_add", "local_view"]),
        }

    def mis_gmctor(self, name, mode, bad):
        what = self.choice(["count", "dtype", "diff"] if mode == "one" else ["count", "dtype"])
        val = {
            "count": self.choice([-1, 1.5, "4", True]),
            "dtype": self.choice(["object", "U2", "nonsense"]),
            "diff": "float32",
        }[what]
        exp = {"count": ["ValueError", "TypeError"], "dtype": ["TypeError"], "diff": ["ValueError"]}[what]
        return {"op": "misuse_gmctor", "what": what, "val": val, "exp": exp}

    def mis_sync(self, name, mode, bad):
        if not self.mems:
            return None
        return {
            "op": "misuse_sync",
            "mid": self.choice(self.mems),
            "how": self.choice(["range", "dup", "type", "neg"]),
        }

    def mis_co(self, name, mode, bad):
        if not self.cos:
            return None
        return {
            "op": "misuse_co",
            "cid": self.choice(self.cos),
            "t": _i(self.rng.integers(0, self.P)),
            "how": self.choice(["oob", "advanced", "shape", "rank", "step0", "float", "rget-out"]),
        }

    def mis_coll(self, name, mode, bad):
        step = {
            "op": "misuse_coll",
            "param": _i(self.rng.integers(0, 1 << 30)),
            "n": self.choice([1, 3, 13, 100]),
            "dtype": self.choice(["float64", "int64"]),
        }
        if name == "barrier-method":
            step["exp"] = ["ValueError"]
        return step

    def mis_nbo(self, name, mode, bad):
        """Two 'neighbor' Halos of one pattern begun in opposite orders on even and odd ranks
        (the guide: ValueError instead of mixed data), then ended."""
        by = {}
        for h in self.idle_halos():
            s = self.halos[h]
            if s["method"] == "neighbor":
                by.setdefault(s["pid"], []).append(h)
        pairs = [v for v in by.values() if len(v) >= 2]
        if not pairs or self.P < 2:
            return None
        h1, h2 = self.choice(pairs)[:2]
        acts = []
        for hid in (h1, h2):
            b = self.hop_action(hid, self.choice(["update_begin", "reverse_begin"]))
            acts += [b, {"op": "hop", "hid": hid, "call": b["call"].replace("begin", "end"), "arr": b["arr"]}]
        orders = [[0, 2, 1, 3] if r % 2 == 0 else [2, 0, 3, 1] for r in range(self.P)]
        return {"op": "misuse_nbo", "acts": acts, "orders": orders}

    def mis_withraise(self, name, mode, bad):
        """Rank ``bad`` leaves a with block of one object on its own exception while the
        others are in a call (or in none: they meet the broken comm in the probe)."""
        if self.P < 2:
            return None
        objs = (
            [["hc", None]]
            + [["halo", h] for h in self.halos]
            + [["mem", m] for m in self.mems]
            + [["co", c] for c in self.cos]
            + ([["prof", None]] if self.prof else [])
        )
        obj = self.choice(objs)
        calls = ["barrier", "allreduce", "none"]
        if self.mems:
            calls.append("sync_all")
        # fence and pscw wait inside MPI, where no failure is seen (the guide: baselines)
        upd = [h for h in self.idle_halos() if self.halos[h]["method"] not in ("fence", "pscw")]
        if upd:
            calls += ["update", "update"]
        call = self.choice(calls)
        step = {"op": "misuse_with", "obj": obj, "call": call, "delay_ms": _i(self.rng.integers(0, 60))}
        if call == "update":
            step["hid"] = self.choice(upd)
            step["arr"] = self.choice(["k0", "k1", "ka", "f"])
        elif call == "sync_all":
            step["mid"] = self.choice(self.mems)
        return step

    def mis_deadline(self, name, mode, bad):
        """Ranks in a constructor, the others in barrier/allreduce/update, on a side
        HybridComm with a short timeout."""
        if self.P < 2:
            return None
        ctor = {bad} | {r for r in range(self.P) if r != bad and self.rng.random() < 0.3}
        if len(ctor) == self.P:
            ctor.discard((bad + 1) % self.P)
        methods = [m for m in self.cfg.methods if m not in ("fence", "pscw")] or ["atomic"]
        return {
            "op": "misuse_deadline",
            "ctor": sorted(ctor),
            "make": self.choice(["Halo", "GlobalMemory", "Coarray", "from_global", "profile"]),
            "call": self.choice(["barrier", "allreduce", "update"]),
            "method": self.choice(methods),
        }

    def mis_unsend(self, name, mode, bad):
        whats = ["gm-dtype", "gm-count", "co-shape", "co-dtype"]
        if self.pats:
            whats += ["halo-dtype", "halo-block"]
        what = self.choice(whats)
        step = {
            "op": "misuse_unsend",
            "what": what,
            "val": self.choice(["gen", "lambda", "badrepr"]),
            "method": self.choice(self.cfg.methods),
        }
        if what.startswith("halo"):
            step["pid"] = self.choice(self.pats)
        return step

    def mis_freeorder(self, name, mode, bad):
        """Two objects, each rank frees one of them first (not all the same one)."""
        if "free-pending" in self.cfg.avoid and any(s["pending"] for s in self.halos.values()):
            return None
        # Halos with a window of their own (fence, pscw, lock) free it collectively, so their
        # order is checked; the others' free is local (any order, as the guide allows)
        cands = [["halo", h] for h in self.idle_halos()
                 if self.halos[h].get("method") in ("fence", "pscw", "lock")]
        if not self.reqs:
            cands += [["mem", m] for m in self.mems]
        if len(cands) < 2:
            return None
        k = self.rng.permutation(len(cands))[:2]
        objs = [cands[int(k[0])], cands[int(k[1])]]
        which = [_i(self.rng.integers(0, 2)) for _ in range(self.P)]
        if len(set(which)) == 1:
            j = _i(self.rng.integers(0, self.P))
            which[j] = 1 - which[j]
        return {"op": "misuse_freeorder", "objs": objs, "which": which}

    def post_freeorder(self, step):
        """Both objects stay usable: use each; then, half of the time, free them in one order."""
        for kind, oid in step["objs"]:
            if kind == "halo":
                self.add(self.hop_action(oid, self.choice(["update", "reverse"])))
            else:
                self.add({"op": "republish", "mid": oid})
        if self.rng.random() < 0.5:
            for kind, oid in step["objs"]:
                if kind == "halo":
                    del self.halos[oid]
                    self.dead_halos.append(oid)
                    self.add({"op": "free_halo", "id": oid})
                else:
                    del self.mems[oid]
                    self.dead_mems.append(oid)
                    self.add({"op": "free_mem", "id": oid})

    def gen_pyint(self):
        """allreduce of Python ints at the int64 edges and beyond (exact, any op)."""
        vals = []
        style = self.choice(["edge", "mixed", "mixed", "zeros"])
        for _ in range(self.P):
            if style == "zeros" and self.rng.random() < 0.7:
                vals.append(0)
            elif style == "edge" or self.rng.random() < 0.5:
                vals.append(self.choice(PYINTS))
            else:
                vals.append(_i(self.rng.integers(-50, 51)))
        self.add({"op": "pyint", "vals": vals, "red": self.choice(["sum", "prod", "min", "max"])})

    def mis_prof(self, name, mode, bad):
        if not self.prof:
            return None
        return {"op": "misuse_prof"}


# ============================================================ interpreter


def data(seed, key, r, shape, dtype, tag=0, small=False):
    """The values rank ``r`` puts into the call ``key``: the same wherever computed."""
    rng = np.random.default_rng([seed, 7, key[0], key[1], r, tag])
    dt = np.dtype(dtype)
    if small or dt.kind in "iu":
        hi = {"u": 200, "i": 1000}.get(dt.kind, 1000) if not small else 9
        lo = 0 if dt.kind == "u" else -hi
        v = rng.integers(lo, hi, size=shape)
        if dt.kind == "c":
            v = v + 1j * rng.integers(lo, hi, size=shape)
        return v.astype(dt)
    if dt.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    return rng.standard_normal(shape).astype(dt)


def same_bits(a, b):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def diff(got, want, n=3):
    g = np.asarray(got).reshape(len(got), -1) if np.ndim(got) else np.asarray(got).reshape(1, 1)
    w = np.asarray(want).reshape(g.shape)
    bad = np.flatnonzero(
        (g.view(np.uint8).reshape(g.shape[0], -1) != w.view(np.uint8).reshape(g.shape[0], -1)).any(1)
    )
    return f"{bad.size} of {g.shape[0]} entries differ, e.g. " + ", ".join(
        f"[{int(i)}] got {g[i].tolist()} want {w[i].tolist()}" for i in bad[:n]
    )


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


class Rec:
    """One rank's outcome of one call: exception class (None: returned; "nocall"), message,
    entry and exit times, a value error (None: right, or not checked) and its category."""

    __slots__ = ("key", "cls", "msg", "t0", "t1", "verr", "vcat")

    def __init__(self, key, cls, msg, t0, t1, verr, vcat):
        self.key, self.cls, self.msg, self.t0, self.t1, self.verr, self.vcat = (
            key,
            cls,
            msg,
            t0,
            t1,
            verr,
            vcat,
        )

    def tup(self):
        return (self.key, self.cls, self.msg, self.t0, self.t1, self.verr, self.vcat)


class Program:
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
        self.begins = {}  # (hid, call no) -> key of the begin
        self.failure = None
        self.stats = {"steps": 0, "calls": 0, "raised": 0}
        self.raised_at = {}  # (key, rank) -> class, for the ends of one-rank bad begins
        self.graveyard = {}  # freed Halos (object and a private array) for use-after-free
        self.gm_graveyard = {}  # freed GlobalMemory objects
        self.stray = []  # objects that invalid constructor calls made anyway
        self.prof_on = False
        self.planted = False
        self.breaks = []  # (key, time) where a rank's own exception broke the comm (misuse_with)

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
            self.stats["steps"] += 1
            if (i + 1) % ce == 0:
                if self.check():
                    return False
        return not self.check(final=True)

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

    def check(self, final=False):
        """Gather every rank's records, evaluate on rank 0; True when the program failed."""
        self.wd.tick(f"program {self.seed}: check after step {self.order[-1][0] if self.order else -1}")
        faulthandler.dump_traceback_later(self.cfg.watchdog + 30, exit=True)
        mine = [r.tup() for r in self.recs]
        self.recs = []
        allrecs = comm.gather(mine, root=0)
        verdict = None
        if R == 0:
            verdict = self.evaluate(allrecs)
        verdict = comm.bcast(verdict, root=0)
        self.wd.tick(f"program {self.seed}: after the check")
        if verdict is not None:
            self.failure = verdict
            if R == 0:
                self.print_failure(verdict)
            return True
        return False

    def evaluate(self, allrecs):
        by = {}
        for r, recs in enumerate(allrecs):
            for t in recs:
                by.setdefault(tuple(t[0]), {})[r] = Rec(*t)
        keys = [k for k in self.order if k in by]
        self.order = [k for k in self.order if k not in by]
        for key in keys:
            m = self.meta[key]
            if m.get("withraise"):
                x = by[key].get(m["bad"])
                if x is not None and x.cls not in (None, "nocall"):
                    self.breaks.append((key, x.t0))
        for n, key in enumerate(keys):
            recs = by[key]
            f = self.judge(key, recs)
            if f is not None:
                # a rank that ran ahead may have failed later in the batch, and its error
                # reached the others here: name the later calls that raised, to find the cause
                later = []
                for k in keys[n + 1 :]:
                    for r, x in sorted(by[k].items()):
                        if x.cls not in (None, "nocall") and all(r != q for q, _ in later):
                            later.append(
                                (
                                    r,
                                    f"step {k[0]}.{k[1]} ({self.describe(k)}): {first(x.cls)}: "
                                    f"{x.msg.splitlines()[0][:200] if x.msg else ''}",
                                )
                            )
                f["later"] = later
                return f
        return None

    def judge(self, key, recs):
        """The verdict on one call from every rank's record (None: fine)."""
        m = self.meta[key]
        cfg = self.cfg
        good_raise = set(GOOD_RAISE) | ({"ValueError"} if not cfg.strict else set())
        part = {r: x for r, x in recs.items() if x.cls != "nocall"}
        raised = {r: x for r, x in part.items() if x.cls is not None}

        def fail(kind, why):
            return {
                "kind": kind,
                "key": list(key),
                "why": why,
                "what": self.describe(key),
                "ranks": {r: (x.cls, x.msg, round(x.t1 - x.t0, 4), x.verr) for r, x in sorted(recs.items())},
            }

        def c(x):
            return first(x.cls)

        if m.get("reset"):  # a new HybridComm: nothing of the last one counts
            self.phase, self.broken, self.broken_why = "clean", {}, {}
            self.breaks = [b for b in self.breaks if b[0] > key]
        if m.get("deadline"):
            return self.judge_deadline(m, part, raised, fail)
        # anything, any time
        for r, x in part.items():
            if x.cls is not None and not isa(x.cls, KNOWN):
                return fail("crash", f"rank {r} raised {c(x)}, not one of the library's exceptions")
            if isa(x.cls, {"SyncTimeout"}):
                return fail("hang", f"rank {r} timed out (a wait that never ended)")
            if x.cls is not None and x.t1 - x.t0 > PROMPT_S and x.cls != "Skip" and not m.get("withraise"):
                return fail("slow", f"rank {r} raised {c(x)} after {x.t1 - x.t0:.2f} s (> {PROMPT_S} s)")
            if x.verr is not None:
                if x.vcat == "onesided" and self.phase != "clean":
                    continue
                return fail("wrong-value", f"rank {r}: {x.verr}")
        if m.get("probe"):
            # after a break: every call raises on every rank
            for r, x in part.items():
                if x.cls is None:
                    return fail("sticky", f"rank {r}'s call returned although the comm broke before")
                if not isa(x.cls, GOOD_RAISE | {"FreedError"}):
                    return fail(
                        "class", f"rank {r} raised {c(x)} on a broken comm (expected PeerError, RuntimeError)"
                    )
            if not m.get("side"):
                self.taint(key, raised, set())
            return self.note(key, raised)
        if m.get("lenient"):  # the free of a broken side comm: returns or raises, never waits
            for r, x in raised.items():
                if not isa(x.cls, GOOD_RAISE | {"FreedError", "Skip"}):
                    return fail("class", f"rank {r} raised {c(x)} freeing a broken comm")
            return self.note(key, raised)
        if m.get("withraise"):
            return self.judge_with(key, m, part, raised, fail)
        bad = m.get("bad")
        badset = set(range(P)) if bad == "all" else ({bad} if isinstance(bad, int) else set())
        exp = set(m.get("exp") or ())
        peer_ok = {"PeerError"} | ({"ValueError"} if not cfg.strict else set())
        if m.get("refmust") is not None:
            # the end of a begin that was invalid on one rank: its readers raise at the begin
            # or here, of the bad rank's class or PeerError
            ref = tuple(m["ref"])
            jcls = self.raised_at.get((ref, m["refbad"]))
            for r in m["refmust"]:
                if r in part and part[r].cls is None and not self.raised_at.get((ref, r)):
                    return fail(
                        "disagree",
                        f"rank {r} completed the call although rank {m['refbad']} passed "
                        f"invalid arguments to its begin (and raised {jcls})",
                    )
            rexp = set(MISUSE[m["refmk"]][2])
            jname = (sorted(set(jcls.split("|")) & rexp) or [first(jcls)])[0] if jcls else None
            allowed = (
                peer_ok | ({jname} if jname else set()) | (good_raise if self.phase != "clean" else set())
            )
            for r, x in raised.items():
                if not isa(x.cls, allowed):
                    return fail(
                        "class",
                        f"rank {r} (right arguments) raised {c(x)} at the end of a call "
                        f"whose begin was invalid on rank {m['refbad']} (which raised {jcls}); "
                        f"expected {sorted(allowed)}",
                    )
            self.taint(key, raised, set())
            return self.note(key, raised)
        if self.phase == "clean":
            if not m.get("misuse"):
                bt = min((t for k, t in self.breaks if k > key), default=None)
                if (
                    raised
                    and bt is not None
                    and all(isa(x.cls, {"PeerError", "RuntimeError"}) and x.t1 >= bt for x in raised.values())
                ):
                    # a call before the break in program order, still running when a faster
                    # rank's own exception broke the comm (misuse_with)
                    self.taint(key, raised, set())
                    return self.note(key, raised)
                if raised:
                    r, x = next(iter(raised.items()))
                    return fail("raised", f"rank {r} raised {c(x)} in a valid call")
                return self.note(key, raised)
            mode = m["mode"]
            if mode == "nbo":
                # any rank may find the other Halo's message (ValueError) or a peer's error; no
                # rank returns wrong values (checked above); afterwards: consistent or raising
                for r, x in raised.items():
                    # RuntimeError: the Halo is unusable after this group's first error
                    if not isa(x.cls, {"ValueError", "PeerError", "RuntimeError"}):
                        return fail(
                            "class",
                            f"rank {r} raised {c(x)} for Halos begun in another order "
                            "(expected ValueError or PeerError)",
                        )
                if raised:
                    self.taint(key, raised, set())
                return self.note(key, raised)
            if m.get("may_succeed") and not raised:
                return self.note(key, raised)
            for r in badset:
                x = part.get(r)
                if x is None:
                    continue
                if x.cls is None:
                    return fail("accepted", f"rank {r}'s invalid call ({m['mk']}) returned normally")
                if not isa(x.cls, exp):
                    return fail(
                        "class", f"rank {r}'s invalid call ({m['mk']}) raised {c(x)}, expected {sorted(exp)}"
                    )
            if mode == "one":
                # "the same class": the class the misuse must raise, which the bad rank raised
                jx = part.get(bad)
                jcls = (sorted(set(jx.cls.split("|")) & exp) or [first(jx.cls)])[0] if jx and jx.cls else None
                allowed = peer_ok | ({jcls} if jcls else set())
                for r, x in raised.items():
                    if r not in badset and not isa(x.cls, allowed):
                        return fail(
                            "class",
                            f"rank {r} (right arguments) raised {c(x)} while rank {bad} "
                            f"raised {jcls}; expected {sorted(allowed)}",
                        )
                for r in m.get("must", ()):
                    if r in part and part[r].cls is None:
                        return fail(
                            "disagree",
                            f"rank {r} returned normally although rank {bad}'s "
                            f"invalid call ({m['mk']}) reached it (rank {bad} raised {jcls})",
                        )
                    pc = m.get("peer_cls")
                    if pc and r in raised and r not in badset and not isa(raised[r].cls, {pc, "Skip"}):
                        return fail(
                            "class",
                            f"rank {r} raised {c(raised[r])} while rank {bad} raised {jcls}; expected {pc}",
                        )
                if (any(r not in badset for r in raised) or m.get("taints")) and not m.get("agreed"):
                    self.taint(key, raised, badset)
            return self.note(key, raised)
        # tainted: every call returns right values (checked above) or raises; a rank that
        # raised a breaking exception raises in every later call; a rank that needs a
        # broken rank's part raises; errors only of the allowed classes
        for r, x in raised.items():
            ok = good_raise | (exp if r in badset else set()) | {"Skip"}
            if not isa(x.cls, ok):
                return fail("class", f"rank {r} raised {c(x)} after an earlier error (allowed: {sorted(ok)})")
        if m.get("sync") and raised and not m.get("free"):   # (a free on a broken comm is local)
            # either usable and consistent (every rank returned, with right values) or every
            # call raises: a rank whose objects broke earlier does not return while others raise,
            # and a rank does not return without the part of a rank that broke earlier and raised
            deps = m.get("deps")
            for r, x in part.items():
                if m.get("images") and not deps.get(r) and not self.cfg.strict_local:
                    continue  # a call that names no peer (sync_images([])) is a local call
                if x.cls is None and r in self.broken and self.broken[r] < key:
                    return fail(
                        "sticky",
                        f"rank {r}'s call returned normally after it raised at step "
                        f"{self.broken[r][0]}.{self.broken[r][1]} ({self.broken_why[r]}), while rank "
                        f"{next(iter(raised))} raised in it",
                    )
            deps = m.get("deps")
            since = tuple(m.get("since", key))
            for s_, x in part.items():
                if x.cls is not None:
                    continue
                ds = range(P) if deps is None else deps.get(s_, ())
                for r in ds:
                    if r != s_ and r in raised and r in self.broken and self.broken[r] < since:
                        return fail(
                            "disagree",
                            f"rank {s_} returned normally although rank {r}, whose part "
                            f"it needs, had failed at step {self.broken[r][0]} ({self.broken_why[r]}) "
                            "and raised",
                        )
        elif m.get("local") and self.cfg.strict_local:
            for r, x in part.items():
                if x.cls is None and r in self.broken and self.broken[r] < key:
                    return fail(
                        "sticky-local",
                        f"rank {r}'s local call returned normally after its "
                        f"HybridComm broke at step {self.broken[r][0]}",
                    )
        self.taint(key, raised, badset)
        return self.note(key, raised)

    def judge_with(self, key, m, part, raised, fail):
        """Rank ``bad``'s own exception left a with block: it raises it; the others PeerError
        within 2 s of it (or return right values when they needed nothing of it); the comm is
        broken from then on."""
        bad = m["bad"]
        b = part.get(bad)
        if b is not None and b.cls != "Skip":
            if b.cls is None or not isa(b.cls, {"OwnError"}):
                return fail(
                    "class", f"rank {bad}'s own exception in a with block became {b.cls or 'a return'}"
                )
        tb = b.t0 if b is not None else None
        for r, x in raised.items():
            if r == bad:
                continue
            if not isa(x.cls, {"PeerError", "Skip"}):
                return fail(
                    "class",
                    f"rank {r} raised {first(x.cls)} while rank {bad}'s own exception left a with block "
                    "(expected PeerError)",
                )
            if tb is not None and x.t1 - max(tb, x.t0) > PROMPT_S:
                return fail(
                    "slow", f"rank {r} raised {x.t1 - max(tb, x.t0):.2f} s after rank {bad}'s exception"
                )
        for r in m.get("must", ()):
            if r in part and part[r].cls is None:
                return fail(
                    "disagree",
                    f"rank {r} returned although its call needs rank {bad}, whose own exception left "
                    "a with block",
                )
        self.phase = "tainted"
        if b is not None and b.cls not in (None, "Skip"):
            self.broken[bad] = key
            self.broken_why[bad] = "its own exception left a with block"
        self.taint(key, {r: x for r, x in raised.items() if r != bad}, set())
        return self.note(key, raised)

    def judge_deadline(self, m, part, raised, fail):
        """Ranks in a constructor against ranks in a call: every rank that needs the others
        raises SyncTimeout or PeerError, each within 2 s of the first (a side comm: the
        program's own comm is untouched)."""
        for r, x in part.items():
            if x.cls is not None and not isa(x.cls, KNOWN):
                return fail("crash", f"rank {r} raised {first(x.cls)}, not one of the library's exceptions")
            if x.verr is not None:
                return fail("wrong-value", f"rank {r}: {x.verr}")
        t_first = min((x.t1 for x in raised.values()), default=None)
        for r, x in raised.items():
            ok = {"SyncTimeout", "PeerError", "Skip"}
            if x.t0 >= t_first:  # came after the first rank raised: its comm may know already
                ok.add("RuntimeError")
            if not isa(x.cls, ok):
                return fail("class", f"rank {r} raised {first(x.cls)}, expected {sorted(ok)}")
            if x.t1 - t_first > PROMPT_S:
                return fail(
                    "slow", f"rank {r} raised {x.t1 - t_first:.2f} s after the first rank (> {PROMPT_S} s)"
                )
        for r in m["must"]:
            if r in part and part[r].cls is None:
                side = "a constructor" if r in m["ctor"] else "its call"
                return fail(
                    "disagree",
                    f"rank {r} returned from {side} although ranks {m['ctor']} were in a constructor "
                    f"and the others in {m['call']}",
                )
        return None

    def note(self, key, raised):
        for r, x in raised.items():
            self.raised_at[(key, r)] = x.cls
        return None

    def taint(self, key, raised, badset):
        self.phase = "tainted"
        for r, x in raised.items():
            if r in badset and isa(x.cls, self.meta[key].get("exp") or ()):
                continue
            if isa(x.cls, BREAKING) and r not in self.broken:
                self.broken[r] = key
                self.broken_why[r] = f"{first(x.cls)}: {x.msg.splitlines()[0][:160] if x.msg else ''}"

    # ------------------------------------------------------------ reporting

    def report_header(self, kind):
        c = self.cfg
        env = " ".join(
            f"{k}={os.environ[k]}"
            for k in ("HYBRIDMPI_CHAOS", "MPIR_CVAR_NUM_CLIQUES", "HYBRIDMPI_TIMEOUT")
            if k in os.environ
        )
        opts = [f"--seed {self.seed}", "--programs 1", f"--steps {c.steps}"]
        if c.node_size:
            opts.append(f"--node-size {c.node_size}")
        opts.append(f"--methods {','.join(c.methods)}")
        opts.append(f"--misuse {int(c.misuse)}")
        if c.kinds_arg:
            opts.append(f"--misuse-kinds={c.kinds_arg}")
        opts.append(f"--same-order {','.join(c.same_order) or 'none'}")
        if c.avoid:
            opts.append(f"--avoid {','.join(sorted(c.avoid))}")
        if c.check_every:
            opts.append(f"--check-every {c.check_every}")
        if c.slow_misuse != 0.2:
            opts.append(f"--slow-misuse {c.slow_misuse:g}")
        if not c.restart:
            opts.append("--restart 0")
        if not c.strict:
            opts.append("--strict 0")
        if c.keep_arg:
            opts.append(f"--keep {c.keep_arg}")
        if c.program:
            opts.append(f"--program {c.program}")
        return (
            f"FUZZ FAILURE ({kind}) program seed {self.seed}, {P} ranks\n"
            f"  replay: {env + ' ' if env else ''}mpiexec -n {P} python -m mpi4py tests/mpi/fuzz.py "
            f"{' '.join(opts)} --replay"
        )

    def listing(self, upto=None):
        lines = ["  steps:"]
        for st in self.steps:
            if upto is not None and st["i"] > upto:
                lines.append(f"    ... ({len(self.steps) - upto - 1} more)")
                break
            if (
                self.cfg.keep is not None
                and st["i"] not in self.cfg.keep
                and st["op"] not in ("hc", "hc_free", "after_free")
            ):
                continue
            lines.append(f"    {st['i']:4d}: {step_text(st)}")
        return "\n".join(lines)

    def print_failure(self, f):
        print(self.report_header(f["kind"]), flush=True)
        print(f"  at step {f['key'][0]}.{f['key'][1]}: {f['what']}\n  why: {f['why']}", flush=True)
        for r, (cls, msg, dt, verr) in f["ranks"].items():
            line = f"    rank {r}: {cls or 'returned'}"
            if cls not in (None, "nocall"):
                line = f"    rank {r}: {cls.replace('|', ' < ')}"
                line += f" after {dt:.4f} s: {msg.splitlines()[0][:300] if msg else ''}"
                if not isa(cls, KNOWN) and msg:
                    line += "\n" + "\n".join("        " + x for x in msg.splitlines()[1:])
            if verr:
                line += f"; value: {verr[:600]}"
            print(line, flush=True)
        for r, what in f.get("later", []):
            print(f"  later on rank {r}: {what}", flush=True)
        print(self.listing(upto=f["key"][0] + 3), flush=True)

    # ============================================================ steps

    def do_hc(self, st):
        env = {
            "default": {},
            "zc0": {"HYBRIDMPI_ZERO_COPY_BYTES": "0"},
            "cma0": {"HYBRIDMPI_CMA_BYTES": "0"},
            "both0": {"HYBRIDMPI_ZERO_COPY_BYTES": "0", "HYBRIDMPI_CMA_BYTES": "0"},
        }[st["env"]]
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        key = (st["i"], 0)
        try:
            cls, hc = self.call(
                key,
                lambda: hybridmpi.HybridComm(
                    comm,
                    node_size=self.cfg.node_size,
                    memory_order=st["memory_order"],
                    timeout=self.cfg.timeout,
                    radix=st["radix"],
                    allreduce=st["allreduce"],
                ),
                meta={"sync": True, "reset": bool(st.get("restart"))},
                pause=False,
            )
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self.hc = hc
        self.prof_on = False
        self.prof = None
        self.pcount = {}

    def do_hc_free(self, st):
        # calls still pending (steps left out with --keep): ended first, in Halo order
        for j, (hid, s) in enumerate(sorted(self.shalo.items())):
            if s["pending"] is not None:
                self.do_hop(
                    {
                        "op": "hop",
                        "hid": hid,
                        "call": s["pending"]["call"].replace("begin", "end"),
                        "arr": "?",
                    },
                    key=(st["i"], 100 + j),
                )
        key = (st["i"], 0)
        if self.hc is None:
            return self.nocall(key, {"sync": True})
        self.call(key, self.hc.free, meta={"sync": False, "free": True})

    def do_after_free(self, st):
        """Every object of the freed HybridComm raises FreedError (or, if it broke, RuntimeError)."""
        if self.hc is None:
            return
        probes = [("barrier", lambda: self.hc.barrier()), ("allreduce", lambda: self.hc.allreduce(1.0))]
        for g in list(self.graveyard.values())[-1:]:
            probes.append(("Halo.update", lambda h=g["h"], x=g["x"]: h.update(x)))
        for pat in list(self.opat.values())[-1:]:
            probes.append(("Halo()", lambda pat=pat: hybridmpi.Halo(pat)))
        for mm in list(self.gm_graveyard.values())[-1:]:
            if mm is not None:
                probes.append(("GlobalMemory.Get", lambda mm=mm: mm.Get(np.empty(1, mm.dtype), R)))
        probes.append(("GlobalMemory()", lambda: hybridmpi.GlobalMemory(self.hc, 4)))
        probes.append(
            (
                "GhostPattern.from_global",
                lambda: hybridmpi.GhostPattern.from_global(self.hc, np.arange(1) + R, np.zeros(0, np.int64)),
            )
        )
        probes.append(("profile", lambda: hybridmpi.profile(self.hc).__enter__()))
        for j, (name, fn) in enumerate(probes):
            key = (st["i"], j)
            exp = ["FreedError"]
            self.call(
                key,
                fn,
                meta={
                    "misuse": True,
                    "mode": "all",
                    "bad": "all",
                    "mk": "after-free " + name,
                    "exp": exp,
                    "sync": False,
                },
            )

    # ------------------------------------------------------------ patterns and Halos

    def do_pattern(self, st):
        pid = st["pid"]
        pm = PatModel(st["spec"], P)
        self.pats[pid] = pm
        key = (st["i"], 0)

        def make():
            return self.make_pattern(pm, st["spec"])

        def check(pat, cls):
            if cls:
                return None
            if pat.size != pm.size[R]:
                return f"pattern size {pat.size}, model {pm.size[R]}"
            for q, (mine, _) in pm.fwd[R].items():
                if not np.array_equal(pat.recv.get(q), mine):
                    return f"recv[{q}] = {pat.recv.get(q)}, model {mine}"
            for q, (theirs, _) in pm.rev[R].items():
                if not np.array_equal(pat.send.get(q), theirs):
                    return f"send[{q}] = {pat.send.get(q)}, model {theirs}"
            if set(pat.send) != set(pm.rev[R]) or set(pat.recv) != set(pm.fwd[R]):
                return f"peers send {sorted(pat.send)} recv {sorted(pat.recv)}"
            return None

        cls, pat = self.call(key, make, check, vcat="pattern", meta={"sync": True})
        if pat is not None:
            self.opat[pid] = pat

    def make_pattern(self, pm, spec):
        if spec["kind"] == "global":
            return hybridmpi.GhostPattern.from_global(
                self.hc, np.array(spec["owned"][R], np.int64), np.array(spec["ghosts"][R], np.int64)
            )
        send, recv = pm.explicit_lists(R)
        return hybridmpi.GhostPattern(self.hc, send=send, recv=recv, size=pm.size[R])

    def do_halo(self, st):
        hid = st["hid"]
        self.shalo[hid] = {
            "pid": st["pid"],
            "dtype": st["dtype"],
            "block": st["block"],
            "method": st["method"],
            "nvec": 0,
            "pending": None,
            "calls": [0, 0],
        }
        key = (st["i"], 0)
        pat = self.opat.get(st["pid"])
        if pat is None:
            return self.call(key, lambda: self.skip(), meta={"sync": True})
        cls, h = self.call(
            key,
            lambda: hybridmpi.Halo(pat, dtype=np.dtype(st["dtype"]), block=st["block"], method=st["method"]),
            meta={"sync": True},
        )
        if h is not None:
            pm = self.pats[st["pid"]]
            n, b = pm.size[R], st["block"]
            shape = (n,) if b == 1 else (n, b)
            alt = (n, 1) if b == 1 else (n * b,)
            dt = np.dtype(st["dtype"])
            self.ohalo[hid] = {
                "h": h,
                "arrays": {"k0": np.zeros(shape, dt), "k1": np.zeros(shape, dt), "ka": np.zeros(alt, dt)},
                "shape": shape,
                "alt": alt,
            }

    def skip(self):
        raise SkipCall("an object this call needs was not made on this rank")

    def do_vector(self, st):
        hid = st["hid"]
        s = self.shalo[hid]
        name = f"v{s['nvec']}"
        s["nvec"] += 1
        key = (st["i"], 0)
        o = self.ohalo.get(hid)
        if o is None:
            return self.call(key, self.skip, meta={"sync": True})
        pm = self.pats[s["pid"]]

        def check(v, cls):
            if cls:
                return None
            if v.shape != o["shape"] or v.dtype != np.dtype(s["dtype"]) or np.any(v != 0):
                return (
                    f"vector() of shape {v.shape} dtype {v.dtype}, zeroed: {not np.any(v != 0)}; "
                    f"want {o['shape']}"
                )
            return None

        cls, v = self.call(key, o["h"].vector, check, meta={"sync": True})
        if v is not None:
            o["arrays"][name] = v
        del pm

    def halo_meta(self, hid, call, key, extra=None):
        s = self.shalo[hid]
        pm = self.pats[s["pid"]]
        d = 0 if call.startswith("update") else 1
        # who needs whose part: a rank needs the ranks it receives from in direction d
        deps = {r: {q for q in range(P) if r in pm.readers[d][q]} for r in range(P)}
        if call.endswith("_begin"):  # a begin publishes and needs nobody's part
            deps = {r: set() for r in range(P)}
        m = {"sync": True, "deps": deps, "halo": hid}
        if call.endswith("_end"):
            m["since"] = s["pending"]["key"] if s["pending"] else key
        if extra:
            m.update(extra)
        return m

    def fill_all(self, s, pm, key, tag=0):
        """Every rank's array for call ``key`` as (size, block) of the Halo's dtype."""
        return [data(self.seed, key, r, (pm.size[r], s["block"]), s["dtype"], tag) for r in range(P)]

    def expected(self, s, pm, call, xs, rop):
        if call.startswith("update"):
            return pm.forward(R, xs)
        return pm.reverse(R, xs, rop)

    def get_array(self, o, name, fresh_shape=None):
        """The named array of a Halo on this rank; None for a vector whose vector() raised here
        (after an error: the call is then skipped on this rank)."""
        if name == "f":
            a = np.empty(o["shape"], o["arrays"]["k0"].dtype)
            o["arrays"]["f"] = a
            return a
        return o["arrays"].get(name)

    def do_hop(self, st, key=None, order_meta=None):
        key = key or (st["i"], 0)
        hid, call = st["hid"], st["call"]
        s = self.shalo[hid]
        pm = self.pats[s["pid"]]
        o = self.ohalo.get(hid)
        meta = self.halo_meta(hid, call, key, order_meta)
        if call.endswith("_end"):
            pend = s["pending"]
            s["pending"] = None
            if o is None or pend["x"] is None:
                return self.call(key, self.skip, meta=meta)
            x = pend["x"]
            before = pend["before"]
            want = self.expected(s, pm, call, pend["xs"], pend.get("rop"))

            def check(_, cls):
                return self.check_halo(x, before, want, cls)

            self.call(key, lambda: getattr(o["h"], call)(x), check, meta=meta, p=[("Halo", call)])
            return
        xs = self.fill_all(s, pm, key)
        x = self.get_array(o, st["arr"]) if o is not None else None
        if x is None:
            if call.endswith("_begin"):
                s["pending"] = {
                    "call": call,
                    "key": key,
                    "xs": xs,
                    "rop": st.get("rop"),
                    "x": None,
                    "before": None,
                }
            return self.call(key, self.skip, meta=meta)
        x.reshape(pm.size[R], s["block"])[...] = xs[R]
        before = x.copy()
        rop = st.get("rop")
        if call.endswith("_begin"):
            s["pending"] = {"call": call, "key": key, "xs": xs, "rop": rop, "x": x, "before": before}
            fn = (
                (lambda: o["h"].update_begin(x))
                if call == "update_begin"
                else (lambda: o["h"].reverse_begin(x, rop))
            )

            def check(_, cls):
                return self.check_untouched(x, before, "begin")

            self.call(key, fn, check, meta=meta, p=[("Halo", call)])
            return
        want = self.expected(s, pm, call, xs, rop)
        fn = (lambda: o["h"].update(x)) if call == "update" else (lambda: o["h"].reverse(x, rop))

        def check(_, cls):
            return self.check_halo(x, before, want, cls)

        self.call(key, fn, check, meta=meta, p=[("Halo", call)])

    def check_halo(self, x, before, want, cls):
        if want.size == 0:
            return None
        got = x.reshape(want.shape)
        if cls is None:
            return None if same_bits(got, want) else diff(got, want)
        b = before.reshape(want.shape)
        gb = got.reshape(len(got), -1).view(np.uint8)
        ok = (gb == b.reshape(len(b), -1).view(np.uint8)).all(1) | (
            gb == want.reshape(len(want), -1).view(np.uint8)
        ).all(1)
        if not ok.all():
            i = int(np.flatnonzero(~ok)[0])
            return (
                f"after the error entry [{i}] is {got[i].tolist()}: neither the old {b[i].tolist()} "
                f"nor the new {want[i].tolist()}"
            )
        return None

    def check_untouched(self, x, before, what):
        if not same_bits(x, before):
            return f"{what} changed the array: " + diff(
                x.reshape(len(before), -1), before.reshape(len(before), -1)
            )
        return None

    def do_group(self, st):
        acts = st["acts"]
        order = st["orders"][R]
        # metas for every action first, in program order (the same on every rank)
        for j in order:
            a = acts[j]
            self.do_hop(a, key=(st["i"], j))

    def do_free_halo(self, st):
        hid = st["id"]
        key = (st["i"], 0)
        if hid in self.dead:
            o = self.graveyard.get(hid)
            return self.call(key, (o["h"].free if o else self.skip), meta={"sync": False, "free": True})
        self.dead.add(hid)
        self.shalo.pop(hid, None)
        o = self.ohalo.pop(hid, None)
        if o is None:
            return self.call(key, self.skip, meta={"sync": False, "free": True})
        # keep a private array and the object for use-after-free probes; shared vectors go
        self.graveyard[hid] = {"h": o["h"], "x": o["arrays"]["k0"]}
        self.call(key, o["h"].free, meta={"sync": False, "free": True})

    # ------------------------------------------------------------ global memory

    def mem_layout(self, m, r):
        """(count, slot offset of (origin q, parity p), static offset of buffer e, atomic words)."""
        W = m["W"]
        slots = P * 2 * W
        static = slots
        atomics = static + 2 * W
        n_atomic = (2 * P + 2) if m["dtype"] == "int64" else 0
        return atomics + n_atomic + m["pad"][r], atomics

    def do_mem(self, st):
        mid = st["mid"]
        dt = np.dtype(st["dtype"])
        m = {"dtype": st["dtype"], "W": st["W"], "pad": st["pad"], "epoch": 0, "puts": {}, "adds": {}}
        m["counts"] = [self.mem_layout(m, r)[0] for r in range(P)]
        m["atom"] = self.mem_layout(m, 0)[1]
        m["parts"] = [np.zeros(c, dt) for c in m["counts"]]
        self.smem[mid] = m
        key = (st["i"], 0)

        def check(mem, cls):
            if cls:
                return None
            # (its part was zeroed, but a faster peer may already have put into it)
            if tuple(mem.counts) != tuple(m["counts"]) or mem.local.size != m["counts"][R]:
                return f"GlobalMemory counts {mem.counts}, local size {mem.local.size}"
            return None

        cls, mem = self.call(
            key,
            lambda: hybridmpi.GlobalMemory(self.hc, m["counts"][R], dt),
            check,
            vcat="onesided",
            meta={"sync": True},
        )
        if mem is not None:
            self.omem[mid] = mem

    def slot(self, m, q, p):
        return (2 * q + p) * m["W"]

    def static_off(self, m, e):
        return P * 2 * m["W"] + (e % 2) * m["W"]

    def sync_lists(self, targets):
        lists = []
        for r in range(P):
            s = set()
            t = targets[r]
            if t is not None and t != r:
                s.add(t)
            s |= {q for q in range(P) if targets[q] == r and q != r}
            lists.append(sorted(s))
        return lists

    def do_put(self, st):
        mid = st["mid"]
        m = self.smem[mid]
        mem = self.omem.get(mid)
        ops = st["ops"]
        dt = np.dtype(m["dtype"])
        key = (st["i"], 0)
        wrote = []  # (origin q, target t, parity)
        for q, o in enumerate(ops):
            if o is None:
                continue
            n = m["puts"].get((q, o["t"]), 0)
            m["puts"][(q, o["t"])] = n + 1
            par = n % 2
            vals = data(self.seed, key, q, (o["b"] - o["a"],), dt)
            off = self.slot(m, q, par) + o["a"]
            m["parts"][o["t"]][off : off + vals.size] = vals
            wrote.append((q, o["t"], par))
        o = ops[R]
        req = None
        if o is not None:
            par = (m["puts"][(R, o["t"])] - 1) % 2
            vals = data(self.seed, key, R, (o["b"] - o["a"],), dt)
            off = self.slot(m, R, par) + o["a"]
            how = o["how"]
            if how == "Put2d" and vals.size % 2 == 0 and vals.size:
                vals = vals.reshape(-1, 2)
                how = "Put"
            elif how == "Put2d":
                how = "Put"

            def fn():
                nonlocal req
                if mem is None:
                    self.skip()
                if how == "Put":
                    mem.Put(vals, o["t"], off)
                else:
                    req = mem.Rput(vals, o["t"], off)
                    if how == "Rput-wait":
                        req.wait()
                    elif how == "Rput-waitall":
                        hybridmpi.waitall([req])

            self.call(
                key,
                fn,
                vcat="onesided",
                meta={"sync": False, "local": True},
                p=[("GlobalMemory", "Put" if how == "Put" else "Rput")],
            )
        else:
            self.nocall(key, {"sync": False, "local": True})
        self.sync_and_check(
            st, mid, m, mem, [None if x is None else x["t"] for x in ops], wrote, (st["i"], 1)
        )

    def sync_and_check(self, st, mid, m, mem, targets, wrote, key):
        """The round's synchronization, then this rank's slots written in it, against the model."""
        lists = self.sync_lists(targets)
        mine = [(q, par) for q, t, par in wrote if t == R]

        def check(_, cls):
            if cls or mem is None:
                return None
            for q, par in mine:
                a = self.slot(m, q, par)
                got = mem.local[a : a + m["W"]]
                want = m["parts"][R][a : a + m["W"]]
                if not same_bits(got, want):
                    return f"slot of origin {q} (parity {par}) after sync: " + diff(got, want)
            return None

        if st["sync"] == "all":
            meta = {"sync": True, "deps": None}
            fn = (lambda: mem.sync_all()) if mem is not None else self.skip
            pk = [("GlobalMemory", "sync_all"), ("HybridComm", "barrier")]
        else:
            meta = {"sync": True, "images": True, "deps": {r: set(lists[r]) for r in range(P)}}
            fn = (lambda: mem.sync_images(lists[R])) if mem is not None else self.skip
            pk = [("GlobalMemory", "sync_images")]
        self.call(key, fn, check, vcat="onesided", meta=meta, p=pk)

    def do_get(self, st):
        mid = st["mid"]
        m = self.smem[mid]
        mem = self.omem.get(mid)
        o = st["ops"][R]
        key = (st["i"], 0)
        dt = np.dtype(m["dtype"])
        off = self.static_off(m, m["epoch"]) + o["a"]
        want = m["parts"][o["t"]][off : off + o["b"] - o["a"]].copy()
        out = np.full(want.shape, 77, dt)
        deferred = []

        def fn():
            if mem is None:
                self.skip()
            how = o["how"]
            if how == "Get":
                mem.Get(out, o["t"], off)
            else:
                req = mem.Rget(out, o["t"], off)
                if how == "Rget":
                    req.wait()
                elif how == "Rget-test":
                    t_end = time.monotonic() + 5
                    while not req.test():
                        if time.monotonic() > t_end:
                            raise RuntimeError("Request.test() never became true")
                    req.wait()
                else:
                    deferred.append(req)

        def check(_, cls):
            if cls or deferred:
                return None
            return None if same_bits(out, want) else "Get: " + diff(out, want)

        self.call(
            key,
            fn,
            check,
            vcat="onesided",
            meta={"sync": False, "local": True},
            p=[("GlobalMemory", "Get" if o["how"] == "Get" else "Rget")],
        )
        if st.get("qid"):
            self.oreq[st["qid"]] = [(deferred[0] if deferred else None, out, want, key)]

    def do_wait_reqs(self, st):
        key = (st["i"], 0)
        items = []
        for q in st["qids"]:
            items += self.oreq.pop(q, [])
        reqs = [it[0] for it in items if it[0] is not None]

        def fn():
            if st["how"] == "waitall":
                hybridmpi.waitall(reqs)
            else:
                for r in reqs:
                    r.wait()

        def check(_, cls):
            if cls:
                return None
            for req, out, want, k in items:
                if req is not None and not same_bits(out, want):
                    return f"Rget of step {k[0]} after wait: " + diff(out, want)
            return None

        self.call(key, fn, check, vcat="onesided", meta={"sync": False, "local": True})

    def do_republish(self, st):
        """Each rank writes its own next static buffer, then sync_all: a new epoch for gets."""
        mid = st["mid"]
        m = self.smem[mid]
        mem = self.omem.get(mid)
        m["epoch"] += 1
        dt = np.dtype(m["dtype"])
        key = (st["i"], 0)
        for r in range(P):
            off = self.static_off(m, m["epoch"])
            m["parts"][r][off : off + m["W"]] = data(self.seed, key, r, (m["W"],), dt)
        if mem is not None:
            off = self.static_off(m, m["epoch"])
            mem.local[off : off + m["W"]] = m["parts"][R][off : off + m["W"]]
        self.call(
            key,
            (lambda: mem.sync_all()) if mem is not None else self.skip,
            vcat="onesided",
            meta={"sync": True, "deps": None},
            p=[("GlobalMemory", "sync_all"), ("HybridComm", "barrier")],
        )

    def do_atomic(self, st):
        mid = st["mid"]
        m = self.smem[mid]
        mem = self.omem.get(mid)
        key = (st["i"], 0)
        base = m["atom"]
        expect_old = None
        shared_before = {}
        shared_adds = {}
        written = []
        for q, o in enumerate(st["ops"]):
            if o is None:
                continue
            t = o["t"]
            if o["how"] == "fadd-shared":
                n = m["adds"].get(("s", t), 0)
                w = base + 2 * P + n % 2
                shared_before.setdefault(t, (w, int(m["parts"][t][w])))
                shared_adds.setdefault(t, []).append(o["v"])
                old = None
            else:
                n = m["adds"].get((q, t), 0)
                m["adds"][(q, t)] = n + 1
                w = base + 2 * q + n % 2
                old = int(m["parts"][t][w])
                if o["how"] == "fadd":
                    m["parts"][t][w] = old + o["v"]
                elif o["how"] == "cas-hit":
                    m["parts"][t][w] = o["v"]
                written.append((t, w))
            if q == R:
                expect_old = (o["how"], w, old)
        for t, vals in shared_adds.items():
            n = m["adds"].get(("s", t), 0)
            m["adds"][("s", t)] = n + 1
            w, before = shared_before[t]
            m["parts"][t][w] = before + sum(vals)
            written.append((t, w))
        o = st["ops"][R]
        if o is not None:
            how, w, old = expect_old

            def fn():
                if mem is None:
                    self.skip()
                if how in ("fadd", "fadd-shared"):
                    return mem.fetch_add(o["t"], w - 0, o["v"])
                if how == "cas-hit":
                    return mem.compare_swap(o["t"], w, old, o["v"])
                return mem.compare_swap(o["t"], w, old + 1, o["v"])

            def check(got, cls):
                if cls:
                    return None
                if how == "fadd-shared":
                    w0, before = shared_before[o["t"]]
                    vals = shared_adds[o["t"]]
                    lo = before + sum(v for v in vals if v < 0)
                    hi = before + sum(v for v in vals if v > 0)
                    return None if lo <= got <= hi else f"fetch_add returned {got}, outside [{lo}, {hi}]"
                return None if got == old else f"{how} returned {got}, the model's old value is {old}"

            self.call(
                key,
                fn,
                check,
                vcat="onesided",
                meta={"sync": False, "local": True},
                p=[("GlobalMemory", "fetch_add" if how.startswith("fadd") else "compare_swap")],
            )
        else:
            self.nocall(key, {"sync": False, "local": True})
        mine = [w for t, w in written if t == R]

        def check(_, cls):
            if cls or mem is None:
                return None
            for w in mine:
                if int(mem.local[w]) != int(m["parts"][R][w]):
                    return (
                        f"atomic word {w} is {int(mem.local[w])} after sync_all, "
                        f"model {int(m['parts'][R][w])}"
                    )
            return None

        self.call(
            (st["i"], 1),
            (lambda: mem.sync_all()) if mem is not None else self.skip,
            check,
            vcat="onesided",
            meta={"sync": True, "deps": None},
            p=[("GlobalMemory", "sync_all"), ("HybridComm", "barrier")],
        )

    def do_flush(self, st):
        mem = self.omem.get(st["mid"])
        key = (st["i"], 0)
        self.call(
            key,
            (lambda: mem.flush(st["rank"])) if mem is not None else self.skip,
            vcat="onesided",
            meta={"sync": False, "local": True},
            p=[("GlobalMemory", "flush")],
        )

    def do_free_mem(self, st):
        mid = st["id"]
        key = (st["i"], 0)
        self.dead.add(mid)
        self.smem.pop(mid, None)
        mem = self.omem.pop(mid, None)
        self.gm_graveyard[mid] = mem
        self.call(key, mem.free if mem is not None else self.skip, meta={"sync": False, "free": True})

    # ------------------------------------------------------------ coarrays

    def do_co(self, st):
        cid = st["cid"]
        shape = tuple(st["shape"])
        dt = np.dtype(st["dtype"])
        self.sco[cid] = {
            "shape": shape,
            "dtype": st["dtype"],
            "parts": [np.zeros(shape, dt) for _ in range(P)],
            "puts": {},
            "epoch": 0,
        }
        key = (st["i"], 0)
        cls, co = self.call(
            key, lambda: hybridmpi.Coarray(self.hc, shape, dt), vcat="onesided", meta={"sync": True}
        )
        if co is not None:
            self.oco[cid] = co

    @staticmethod
    def sec_index(sec):
        k = sec[0]
        if k == "all":
            return slice(None)
        if k == "int":
            return sec[1]
        if k == "ellipsis":
            return Ellipsis
        return slice(sec[1], sec[2], sec[3])

    def do_co_put(self, st):
        cid = st["cid"]
        c = self.sco[cid]
        co = self.oco.get(cid)
        dt = np.dtype(c["dtype"])
        key = (st["i"], 0)
        wrote = []
        mine = None
        for q, o in enumerate(st["ops"]):
            if o is None:
                continue
            n = c["puts"].get((q, o["t"]), 0)
            c["puts"][(q, o["t"])] = n + 1
            par = n % 2
            idx = (q, par, self.sec_index(o["sec"]))
            shape = c["parts"][o["t"]][idx].shape
            if o["how"] == "scalar":
                vals = data(self.seed, key, q, (), dt, small=True)[()]
            else:
                vals = data(self.seed, key, q, shape, dt, small=True)
            c["parts"][o["t"]][idx] = vals
            wrote.append((q, o["t"], par))
            if q == R:
                mine = (o, idx, vals)
        if mine is not None:
            o, idx, vals = mine

            def fn():
                if co is None:
                    self.skip()
                if o["how"] == "Rput":
                    co.Rput(o["t"], idx, vals).wait()
                else:
                    co[o["t"]][idx] = vals

            self.call(
                key,
                fn,
                vcat="onesided",
                meta={"sync": False, "local": True},
                p=[("Coarray", "put")] + ([("Coarray", "Rput")] if o["how"] == "Rput" else []),
            )
        else:
            self.nocall(key, {"sync": False, "local": True})
        targets = [None if o is None else o["t"] for o in st["ops"]]
        lists = self.sync_lists(targets)
        here = [(q, par) for q, t, par in wrote if t == R]

        def check(_, cls):
            if cls or co is None:
                return None
            for q, par in here:
                got, want = co.local[q, par], c["parts"][R][q, par]
                if not same_bits(got, want):
                    return f"coarray row ({q}, {par}) after sync: " + diff(got, want)
            return None

        if st["sync"] == "all":
            meta, fn = {"sync": True, "deps": None}, (lambda: co.sync_all()) if co is not None else self.skip
            pk = [("Coarray", "sync_all"), ("HybridComm", "barrier")]
        else:
            meta = {"sync": True, "images": True, "deps": {r: set(lists[r]) for r in range(P)}}
            fn = (lambda: co.sync_images(lists[R])) if co is not None else self.skip
            pk = [("Coarray", "sync_images")]
        self.call((st["i"], 1), fn, check, vcat="onesided", meta=meta, p=pk)

    def do_co_republish(self, st):
        """Each rank writes its next static row (row P, by epoch parity), then sync_all."""
        cid = st["cid"]
        c = self.sco[cid]
        co = self.oco.get(cid)
        c["epoch"] += 1
        key = (st["i"], 0)
        row = (P, c["epoch"] % 2)
        for r in range(P):
            c["parts"][r][row] = data(self.seed, key, r, c["shape"][2:], np.dtype(c["dtype"]), small=True)
        if co is not None:
            co.local[row] = c["parts"][R][row]
        self.call(
            key,
            (lambda: co.sync_all()) if co is not None else self.skip,
            vcat="onesided",
            meta={"sync": True, "deps": None},
            p=[("Coarray", "sync_all"), ("HybridComm", "barrier")],
        )

    def do_co_get(self, st):
        """Gets of the static rows (row P, by epoch parity), which only their owner writes."""
        cid = st["cid"]
        c = self.sco[cid]
        co = self.oco.get(cid)
        o = st["ops"][R]
        key = (st["i"], 0)
        idx = (P, c["epoch"] % 2, self.sec_index(o["sec"]))
        want = np.array(c["parts"][o["t"]][idx])
        holder = {}

        def fn():
            if co is None:
                self.skip()
            if o["how"] == "Rget":
                out = np.empty(want.shape, np.dtype(c["dtype"]))
                co.Rget(o["t"], idx, out).wait()
                holder["got"] = out
            else:
                holder["got"] = co[o["t"]][idx]

        def check(_, cls):
            if cls:
                return None
            got = np.asarray(holder["got"])
            return None if same_bits(got, want) else "coarray get: " + diff(got.reshape(-1), want.reshape(-1))

        self.call(
            key,
            fn,
            check,
            vcat="onesided",
            meta={"sync": False, "local": True},
            p=[("Coarray", "Rget" if o["how"] == "Rget" else "get")],
        )

    def do_free_co(self, st):
        cid = st["id"]
        key = (st["i"], 0)
        self.sco.pop(cid, None)
        co = self.oco.pop(cid, None)
        self.call(key, co.free if co is not None else self.skip, meta={"sync": False, "free": True})

    # ------------------------------------------------------------ collectives

    def reduce(self, vals, op):
        acc = np.array(vals[0])
        for v in vals[1:]:
            acc = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}[op](acc, v)
        return acc

    def do_barrier(self, st):
        key = (st["i"], 0)
        fn = (
            (lambda: self.hc.barrier())
            if st["method"] is None
            else (lambda: self.hc.barrier(method=st["method"]))
        )
        self.call(key, fn, meta={"sync": True, "deps": None}, p=[("HybridComm", "barrier")])

    def do_allreduce(self, st):
        key = (st["i"], 0)
        dt = np.dtype(st["dtype"])
        vals = [self.prep(st, key, r) for r in range(P)]
        want = self.reduce(vals, st["red"])
        scalar = st["n"] == 0
        mine = vals[R][()] if scalar else vals[R]
        if scalar and int(key[0]) % 2:  # a Python number half of the time
            mine = mine.item()

        def check(got, cls):
            if cls:
                return None
            g = np.asarray(got)
            if scalar:
                if not np.isscalar(got) and np.ndim(got) != 0:
                    return f"allreduce of a scalar returned {type(got).__name__}"
                return None if g.astype(dt) == want.astype(dt) else f"allreduce {got!r}, want {want!r}"
            return (
                None if same_bits(g.astype(dt), want.astype(dt)) else "allreduce: " + diff(g, want.astype(dt))
            )

        self.call(
            key,
            lambda: self.hc.allreduce(mine, op=st["red"]),
            check,
            vcat="coll",
            meta={"sync": True, "deps": None},
            p=[("HybridComm", "allreduce")],
        )

    def prep(self, st, key, r):
        dt = np.dtype(st["dtype"])
        if st["n"] == 0:
            v = data(self.seed, key, r, (), dt, small=True)
        else:
            v = data(self.seed, key, r, (st["n"],), dt, small=True)
        if st["red"] == "prod":  # 1 or 2: products stay exact whatever the order
            v = ((v.real if dt.kind == "c" else v) % 2 + 1).astype(dt)
        return v

    def do_Allreduce(self, st):
        key = (st["i"], 0)
        dt = np.dtype(st["dtype"])
        vals = [self.prep(st, key, r) for r in range(P)]
        want = self.reduce(vals, st["red"]).astype(dt)
        send = vals[R].copy()
        recv = np.full(st["n"], 5, dt)
        op = (
            {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}[st["red"]]
            if st["mpiop"]
            else st["red"]
        )

        def fn():
            if st["inplace"]:
                self.hc.Allreduce(MPI.IN_PLACE, send, op=op)
            else:
                self.hc.Allreduce(send, recv, op=op)

        def check(_, cls):
            if cls:
                return None
            got = send if st["inplace"] else recv
            return None if same_bits(got, want) else "Allreduce: " + diff(got, want)

        self.call(
            key, fn, check, vcat="coll", meta={"sync": True, "deps": None}, p=[("HybridComm", "Allreduce")]
        )

    # ------------------------------------------------------------ profile

    def do_prof_start(self, st):
        key = (st["i"], 0)
        self.prof_on = True
        self.pcount = {}
        prof = hybridmpi.profile(self.hc)
        cls, _ = self.call(key, prof.__enter__, meta={"sync": True, "deps": None})
        self.prof = prof if cls is None else None

    def do_prof_stop(self, st):
        key = (st["i"], 0)
        self.prof_on = False
        prof = self.prof
        self.prof = None
        counts = self.pcount
        self.pcount = {}

        def fn():
            if prof is None:
                self.skip()
            prof.__exit__(None, None, None)
            rows = prof.rows()
            buf = io.StringIO()
            prof.print(file=buf)
            with tempfile.TemporaryDirectory() as d:
                prof.to_json(os.path.join(d, "p.json"))
            return rows

        def check(rows, cls):
            if cls or rows is None:
                return None
            got = {}
            for row in rows:
                obj = row["object"].split(" ")[0]
                got[(obj, row["op"])] = got.get((obj, row["op"]), 0) + row["calls"]
            for k in sorted(set(counts) | set(got)):
                if got.get(k, 0) != counts.get(k, 0):
                    return (
                        f"profile counted {got.get(k, 0)} calls of {k}, this rank made {counts.get(k, 0)} "
                        f"(all rows: {sorted(got.items())}; calls made: {sorted(counts.items())})"
                    )
            return None

        self.call(key, fn, check, vcat="profile", meta={"sync": True, "deps": None})

    # ============================================================ misuse

    def misuse_meta(self, st, extra=None):
        m = {"misuse": True, "mode": st["mode"], "bad": st["bad"], "mk": st["mk"], "exp": st["exp"]}
        if extra:
            m.update(extra)
        return m

    def i_am_bad(self, st):
        return st["bad"] == "all" or st["bad"] == R

    def do_misuse_hop(self, st):
        a = st["act"]
        hid, call = a["hid"], a["call"]
        s = self.shalo[hid]
        pm = self.pats[s["pid"]]
        o = self.ohalo.get(hid)
        key = (st["i"], 0)
        d = 0 if call.startswith("update") else 1
        meta = self.halo_meta(hid, call, key, self.misuse_meta(st))
        bad = st["bad"]
        if st["mode"] == "one" and not call.endswith("_begin"):
            # its readers must raise; the bad rank's own HybridComm breaks when a good peer sends
            # to it (the guide: the Halo stays usable when every rank's arguments were invalid)
            meta["must"] = sorted(pm.readers[d][bad])
            meta["taints"] = True
        if st["mk"] == "halo-vector-mismatch":
            meta["may_succeed"] = True
        xs = self.fill_all(s, pm, key)
        x = self.get_array(o, a["arr"]) if o is not None else None
        if x is None:
            return self.call(key, self.skip, meta=meta)
        x.reshape(pm.size[R], s["block"])[...] = xs[R]
        before = x.copy()
        rop = a.get("rop")
        want = self.expected(s, pm, call, xs, rop)
        h = o["h"]
        if self.i_am_bad(st):
            arg, rop2, restore = self.bad_halo_arg(st, x, o, s)
        else:
            arg, rop2, restore = x, rop, None
        fnname = call
        if call.endswith("_begin") and st["mode"] == "one" and not self.i_am_bad(st):
            # the good ranks' begin stays pending until the end action below
            pass

        def fn():
            try:
                if fnname in ("update", "update_begin"):
                    getattr(h, fnname)(arg)
                else:
                    getattr(h, fnname)(arg, rop2)
            finally:
                if restore:
                    restore()

        def check(_, cls):
            if call.endswith("_begin"):
                return self.check_untouched(x, before, "a begin")
            if self.i_am_bad(st) and st["mk"] == "halo-vector-mismatch":
                v1 = arg
                if cls is None:
                    return self.check_untouched(x, before, "a call on the other vector") or self.check_halo(
                        v1, before, want, None
                    )
                return self.check_halo(v1, before, want, cls)
            if self.i_am_bad(st) and cls:
                return self.check_untouched(x, before, "an invalid call")
            return self.check_halo(x, before, want, cls)

        vcat = "untouched" if self.i_am_bad(st) else "partial"
        pk = [("Halo", call)]  # counted only when it returns
        cls, _ = self.call(key, fn, check, vcat=vcat, meta=meta, p=pk)
        if call.endswith("_begin") and st["mode"] == "one":
            # the good ranks end it; the bad rank made no pending call
            end = st["end"]
            ekey = (st["i"], 1)
            emeta = self.halo_meta(hid, end["call"], ekey)
            emeta.update(
                {
                    "since": key,
                    "ref": list(key),
                    "refbad": bad,
                    "refmk": st["mk"],
                    "refmust": sorted(pm.readers[d][bad]),
                }
            )
            if R == bad:
                return self.nocall(ekey, emeta)
            want = self.expected(s, pm, end["call"], xs, rop)

            def echeck(_, cls):
                return self.check_halo(x, before, want, cls)

            self.call(
                ekey,
                lambda: getattr(h, end["call"])(x),
                echeck,
                vcat="partial",
                meta=emeta,
                p=[("Halo", end["call"])],
            )

    def bad_halo_arg(self, st, x, o, s):
        """This rank's invalid argument for misuse kind st['mk']: (array, op, restore)."""
        mk = st["mk"]
        a = st["act"]
        rop = a.get("rop")
        rng = np.random.default_rng([st["param"], R])
        dt = x.dtype
        if mk == "halo-nonarray":
            return x.tolist(), rop, None
        if mk == "halo-dtype":
            other = [d for d in DTYPES if np.dtype(d) != dt]
            nd = np.dtype(other[int(rng.integers(0, len(other)))])
            if nd.itemsize == dt.itemsize and rng.random() < 0.5:
                return x.view(nd), rop, None
            return x.astype(nd), rop, None
        if mk == "halo-shape":  # shapes that are none of (n,), (n, 1) [block 1], (n, b), (n * b,)
            n, b = o["shape"][0], s["block"]
            shapes = (
                ([(n + 1,), (n + 2, 1), (n, 2)] + ([(n - 1,)] if n else []))
                if b == 1
                else [(n, b + 1), (n * b + 1,), (n + 1, b), (n, b, 1)]
            )
            shape = shapes[int(rng.integers(0, len(shapes)))]
            y = np.zeros(shape, dt)
            k = min(y.size, x.size)
            y.reshape(-1)[:k] = x.reshape(-1)[:k]
            return y, rop, None
        if mk == "halo-noncontig":
            wide = (
                np.zeros((x.shape[0], 2) + x.shape[1:], dt)
                if x.ndim == 1
                else np.zeros((x.shape[0], 2 * x.shape[1]), dt)
            )
            v = wide[:, 0] if x.ndim == 1 else wide[:, ::2]
            v[...] = x
            return v, rop, None
        if mk == "halo-readonly":
            x.flags.writeable = False

            def restore():
                x.flags.writeable = True

            return x, rop, restore
        if mk == "halo-op":
            ops = [None, "mul", 3, "ADD", "sum", ""]
            if "op-none" in self.cfg.avoid:
                ops = ops[1:]
            return x, ops[int(rng.integers(0, len(ops)))], None
        if mk == "halo-cminmax":
            return x, ["min", "max"][int(rng.integers(0, 2))], None
        if mk == "halo-vector-mismatch":  # the same values, in the other vector
            v1 = o["arrays"]["v1"]
            v1[...] = x
            return v1, rop, None
        raise AssertionError(mk)

    def do_misuse_state(self, st):
        hid = st["hid"]
        s = self.shalo[hid]
        o = self.ohalo.get(hid)
        key = (st["i"], 0)
        meta = self.misuse_meta(st, {"sync": False})
        if not self.i_am_bad(st):
            return self.nocall(key, meta)
        if o is None:
            return self.call(key, self.skip, meta=meta)
        pend = s["pending"]
        arr = st["arr"]
        if arr == "f":
            x = np.empty(o["shape"], o["arrays"]["k0"].dtype)
        else:
            x = o["arrays"].get(arr, o["arrays"]["k0"])
        if st["mk"] == "halo-end-other-array" and pend is not None and x is pend["x"]:
            x = x.copy()
        before = x.copy()
        h = o["h"]
        call = st["call"]

        def fn():
            if call in ("reverse", "reverse_begin"):
                getattr(h, call)(x, st.get("rop") or "add")
            else:
                getattr(h, call)(x)

        def check(_, cls):
            return self.check_untouched(x, before, "an invalid call") if cls else None

        self.call(key, fn, check, vcat="untouched", meta=meta)

    def do_misuse_freed(self, st):
        key = (st["i"], 0)
        meta = self.misuse_meta(st, {"sync": False})
        if not self.i_am_bad(st):
            return self.nocall(key, meta)
        g = self.graveyard.get(st["hid"])
        if g is None:
            return self.call(key, self.skip, meta=meta)
        h, x = g["h"], g["x"]
        call = st["call"]
        fn = {
            "update": lambda: h.update(x),
            "reverse": lambda: h.reverse(x),
            "update_begin": lambda: h.update_begin(x),
            "vector": lambda: h.vector(),
        }[call]
        self.call(key, fn, meta=meta)

    def do_misuse_ctor(self, st):
        key = (st["i"], 0)
        meta = self.misuse_meta(st, {"sync": True, "deps": None, "agreed": True})
        meta["must"] = list(range(P))
        pat = self.opat.get(st["pid"])
        kw = {"dtype": np.dtype(st["dtype"]), "block": st["block"], "method": st["method"]}
        if self.i_am_bad(st):
            w, v = st["what"], st["val"]
            if w == "diff":
                if v == "dtype":
                    kw["dtype"] = np.dtype("float32" if st["dtype"] != "float32" else "float64")
                elif v == "block":
                    kw["block"] = st["block"] + 1
                else:
                    kw["method"] = next(x for x in METHODS if x != st["method"])
            elif w == "dtype":
                kw["dtype"] = v
            else:
                kw[w] = v
        cls, h = self.call(
            key, (lambda: hybridmpi.Halo(pat, **kw)) if pat is not None else self.skip, meta=meta
        )
        if h is not None:  # it must not exist; free it so that nothing leaks (collective on those ranks)
            self.stray.append(h)

    def do_misuse_pattern(self, st):
        key = (st["i"], 0)
        meta = self.misuse_meta(st, {"sync": True, "deps": None, "agreed": True})
        meta["must"] = list(range(P))
        spec = json.loads(json.dumps(st["spec"]))
        pm = PatModel(spec, P)
        if self.i_am_bad(st):
            owned, ghosts = spec["owned"][R], spec["ghosts"][R]
            how = st["how"]
            if how == "nobody":
                everything = [g for o in spec["owned"] for g in o]
                ghosts.append((max(everything) if everything else 0) + 12345)
            elif how == "dup":
                others = [g for q in range(P) if q != R for g in spec["owned"][q]]
                ghosts.append(ghosts[0] if ghosts else others[0])
                if not spec["ghosts"][R][:-1] and others:
                    ghosts.append(others[0])
            elif how == "own":
                ghosts.append(owned[0])
            if spec["kind"] == "explicit" and how in ("nobody", "dup", "own", "range"):
                send, recv = pm.explicit_lists(R)
                size = pm.size[R]
                if how == "range":
                    send = dict(send)
                    q = next((q for q in range(P) if q != R), None)
                    recv = dict(recv)
                    recv[q] = np.concatenate((recv.get(q, np.zeros(0, np.int64)), [size + 3]))
                elif how == "own":
                    q = next(q for q in range(P) if q != R)
                    recv = dict(recv)
                    recv[R] = np.array([0])
                else:
                    q = next(q for q in range(P) if q != R)
                    recv = dict(recv)
                    recv[q] = np.concatenate((recv.get(q, np.zeros(0, np.int64)), [size]))

                def fn():
                    return hybridmpi.GhostPattern(self.hc, send=send, recv=recv, size=size)
            else:

                def fn():
                    return hybridmpi.GhostPattern.from_global(
                        self.hc, np.array(owned, np.int64), np.array(ghosts, np.int64)
                    )
        else:

            def fn():
                return self.make_pattern(pm, spec)

        self.call(key, fn, vcat="pattern", meta=meta)

    def do_misuse_gm(self, st):
        """A bad Put/Get/Rput/Rget/atomic/flush on the bad ranks; the others a valid Get."""
        mid = st["mid"]
        m = self.smem[mid]
        mem = self.omem.get(mid)
        key = (st["i"], 0)
        meta = self.misuse_meta(st, {"sync": False, "local": True})
        dt = np.dtype(m["dtype"])
        t = st["t"]
        rng = np.random.default_rng([st["param"], R])
        off0 = self.static_off(m, m["epoch"])
        want = m["parts"][t][off0 : off0 + m["W"]].copy()
        if mem is None:
            return self.call(key, self.skip, meta=meta)
        if not self.i_am_bad(st):
            out = np.empty(m["W"], dt)

            def check(_, cls):
                return None if cls or same_bits(out, want) else "Get next to a bad call: " + diff(out, want)

            return self.call(
                key,
                lambda: mem.Get(out, t, off0),
                check,
                vcat="onesided",
                meta=meta,
                p=[("GlobalMemory", "Get")],
            )
        mk = st["mk"]
        how = st["how"]
        count = m["counts"][t]
        vals = np.arange(2, dtype=dt)
        rank, off = t, 0
        arr = vals
        get = how in ("Get", "Rget")
        if get:
            arr = np.empty(2, dt)
        if mk == "gm-rank":
            rank = [-1, P, P + 7, 2**63, 2**64 + 1, -(2**63), 1.0, True, np.int64(P), "0", None][
                int(rng.integers(0, 11))
            ]
        elif mk == "gm-offset":
            n = arr.size
            off = [
                -1,
                count - n + 1,
                count,
                2**31,
                2**62,
                2**63 - 1,
                2**63,
                2**64 - 1,
                2**64 + 5,
                -(2**63),
                np.int64(2**63 - 1),
                np.uint64(2**64 - 1),
                np.int64(-1),
                1.5,
                "3",
            ][int(rng.integers(0, 15))]
        elif mk == "gm-length":
            n = count + 1 + int(rng.integers(0, 3))
            arr = np.empty(n, dt) if get else np.ones(n, dt)
            off = int(rng.integers(0, 2))
        elif mk == "gm-dtype":
            other = [
                d
                for d in ("float64", "int64", "int32", "float32", "complex128", "uint8")
                if np.dtype(d) != dt
            ]
            arr = arr.astype(other[int(rng.integers(0, len(other)))])
        elif mk == "gm-nonarray":
            arr = [1, 2] if rng.random() < 0.5 else bytearray(16)
        elif mk == "gm-noncontig":
            wide = np.zeros(4, dt)
            arr = wide[::2]
        elif mk == "gm-readonly":
            arr = np.empty(2, dt)
            arr.flags.writeable = False
            how = "Get" if rng.random() < 0.5 else "Rget"
        elif mk == "gm-atomic":
            what = int(rng.integers(0, 5))
            if dt != np.int64:
                how = "fadd"
            elif what == 0:
                how, off = "fadd", [count, -1, 2**63 - 1, 2**63][int(rng.integers(0, 4))]
            elif what == 1:
                how, off = "fadd-value", m["atom"]
            elif what == 2:
                how, off = "cas-value", m["atom"]
            elif what == 3:
                how, rank = "fadd", [P, -1][int(rng.integers(0, 2))]
            else:
                how, off = "cas", count + 2
        elif mk == "gm-flush":
            how = "flush"
            rank = [P, -1, 1.5, "x"][int(rng.integers(0, 4))]

        def fn():
            if how == "Put":
                mem.Put(arr, rank, off)
            elif how == "Get":
                mem.Get(arr, rank, off)
            elif how == "Rput":
                mem.Rput(arr, rank, off).wait()
            elif how == "Rget":
                mem.Rget(arr, rank, off).wait()
            elif how == "fadd":
                mem.fetch_add(rank, off, 1)
            elif how == "fadd-value":
                mem.fetch_add(rank, off, [2**63, -(2**63) - 1, 1.5][int(rng.integers(0, 3))])
            elif how == "cas-value":
                mem.compare_swap(rank, off, 2**64, 1)
            elif how == "cas":
                mem.compare_swap(rank, off, 0, 1)
            elif how == "flush":
                mem.flush(rank)

        self.call(key, fn, meta=meta)

    def do_misuse_req(self, st):
        mid = st["mid"]
        m = self.smem[mid]
        mem = self.omem.get(mid)
        key = (st["i"], 0)
        meta = self.misuse_meta(st, {"sync": False, "local": True})
        if not self.i_am_bad(st):
            return self.nocall(key, meta)
        if mem is None:
            return self.call(key, self.skip, meta=meta)
        dt = np.dtype(m["dtype"])
        off = self.static_off(m, m["epoch"])
        out = np.empty(1, dt)

        def fn():
            if st["how"] == "Rget":
                req = mem.Rget(out, st["t"], off)
            else:  # into this rank's own static buffer, the value it already holds
                out[0] = m["parts"][R][off]
                req = mem.Rput(out, R, off)
            if self.prof is not None:  # the profile records the Rput/Rget, not the waits
                k = ("GlobalMemory", st["how"])
                self.pcount[k] = self.pcount.get(k, 0) + 1
            req.wait()
            if st["twice"] == "wait":
                req.wait()
            else:
                hybridmpi.waitall([req])

        self.call(key, fn, meta=meta)

    def do_misuse_gmfreed(self, st):
        key = (st["i"], 0)
        meta = self.misuse_meta(st, {"sync": False, "local": True})
        if not self.i_am_bad(st):
            return self.nocall(key, meta)
        mem = self.gm_graveyard.get(st["mid"])
        if mem is None:
            return self.call(key, self.skip, meta=meta)
        how = st["how"]
        fn = {
            "Put": lambda: mem.Put(np.zeros(1, mem.dtype), R, 0),
            "Get": lambda: mem.Get(np.zeros(1, mem.dtype), R, 0),
            "sync_all": lambda: mem.sync_all(),
            "fetch_add": lambda: mem.fetch_add(R, 0, 1),
            "local_view": lambda: mem.local_view(R),
        }[how]
        self.call(key, fn, meta=meta)

    def do_misuse_gmctor(self, st):
        key = (st["i"], 0)
        meta = self.misuse_meta(st, {"sync": True, "deps": None, "agreed": True})
        meta["must"] = list(range(P))
        count, dtype = 4, np.float64
        if self.i_am_bad(st):
            if st["what"] == "count":
                count = st["val"]
            elif st["what"] == "dtype":
                dtype = {"object": object, "U2": "U2", "nonsense": "nonsense"}[st["val"]]
            else:
                dtype = np.float32
        cls, mem = self.call(key, lambda: hybridmpi.GlobalMemory(self.hc, count, dtype), meta=meta)
        if mem is not None:
            self.stray.append(mem)

    def do_misuse_sync(self, st):
        mid = st["mid"]
        mem = self.omem.get(mid)
        key = (st["i"], 0)
        meta = self.misuse_meta(st, {"sync": True})
        bad = st["bad"]
        peer = (R + 1) % P
        if st["mode"] == "one":
            # the others name the bad rank, as a right program would
            meta["deps"] = {r: ({bad} if r != bad else set()) for r in range(P)}
            meta["must"] = [r for r in range(P) if r != bad]
            good = [bad] if R != bad else []
            # the counts stay matched: the comm stays usable, the namers raise PeerArgumentError
            meta["agreed"] = True
            meta["peer_cls"] = "PeerArgumentError"
        else:
            good = []
        if mem is None:
            return self.call(key, self.skip, meta=meta)
        if self.i_am_bad(st):
            arg = {"range": [P], "dup": [peer, peer], "type": "ab", "neg": [-1]}[st["how"]]
            if st["how"] == "dup" and P == 1:
                arg = [P]
        else:
            arg = good
        self.call(key, lambda: mem.sync_images(arg), meta=meta)

    def do_misuse_co(self, st):
        cid = st["cid"]
        c = self.sco[cid]
        co = self.oco.get(cid)
        key = (st["i"], 0)
        meta = self.misuse_meta(st, {"sync": False, "local": True})
        t = st["t"]
        idx_ok = (P, c["epoch"] % 2, slice(None))
        want = np.array(c["parts"][t][idx_ok])
        if co is None:
            return self.call(key, self.skip, meta=meta)
        if not self.i_am_bad(st):
            holder = {}

            def check(_, cls):
                return (
                    None
                    if cls or same_bits(holder["got"], want)
                    else "coarray get next to a bad call: " + diff(holder["got"], want)
                )

            def fn():
                holder["got"] = co[t][idx_ok]

            return self.call(key, fn, check, vcat="onesided", meta=meta, p=[("Coarray", "get")])
        how = st["how"]
        shape = c["shape"]

        def fn():
            if how == "oob":
                return co[t][shape[0], 0, 0]
            if how == "advanced":
                return co[t][[0, 1]]
            if how == "shape":
                co[t][R, 0, :] = np.ones(shape[2] + 1)
            elif how == "rank":
                return co[P][0, 0, 0]
            elif how == "step0":
                return co[t][0, 0, ::0]
            elif how == "float":
                return co[t][0.5]
            else:
                co.Rget(t, (P, 0), np.empty(shape[2] + 2, co.dtype)).wait()

        self.call(key, fn, meta=meta)

    def do_misuse_coll(self, st):
        key = (st["i"], 0)
        meta = self.misuse_meta(st, {"sync": True, "deps": None})
        if st["mode"] == "one":
            meta["must"] = list(range(P))
            meta["taints"] = True
        mk = st["mk"]
        rng = np.random.default_rng([st["param"], 0])
        dt = np.dtype(st["dtype"])
        n = st["n"]
        good = np.ones(n, dt) * (R + 1)
        if mk == "barrier-method":
            method = "tree"
            if self.i_am_bad(st):
                method = ["butterfly", None, 3, "Tree"][int(rng.integers(0, 4))]
                if method is None:
                    method = "linear"  # another valid method on this rank
                    if st["bad"] == "all":
                        method = "butterfly"
            return self.call(key, lambda: self.hc.barrier(method=method), meta=meta)
        if mk == "coll-Allreduce":
            send, recv = good.copy(), np.empty(n, dt)
            if self.i_am_bad(st):
                k = int(rng.integers(0, 3))
                if k == 0:
                    recv.flags.writeable = False
                elif k == 1:
                    recv = np.empty(n + 1, dt)
                else:
                    recv = recv.astype(np.float32 if dt != np.float32 else np.float64)
            return self.call(key, lambda: self.hc.Allreduce(send, recv, op=MPI.SUM), meta=meta)
        x, op = good, "sum"
        if self.i_am_bad(st):
            if mk == "coll-type":
                x = ["1.0", [1.0, 2.0], None, np.zeros(n, np.int8), {"a": 1}][int(rng.integers(0, 5))]
            elif mk == "coll-op":
                k = int(rng.integers(0, 3))
                if k == 0:
                    op = "avg"
                elif k == 1:
                    op = None
                else:
                    x, op = np.ones(n, np.complex128), "min"
                    if st["bad"] != "all":
                        x, op = good, "avg"
            elif mk == "coll-len":
                x = np.ones(n + 1, dt)

        def check(got, cls):
            if cls:
                return None
            return None

        self.call(key, lambda: self.hc.allreduce(x, op=op), check, meta=meta)

    def do_misuse_nbo(self, st):
        acts = st["acts"]
        for j in st["orders"][R]:
            a = acts[j]
            key = (st["i"], j)
            extra = {"misuse": True, "mode": "nbo", "bad": "all", "mk": st["mk"], "exp": st["exp"]}
            self.do_hop(a, key=key, order_meta=extra)

    def do_misuse_prof(self, st):
        key = (st["i"], 0)
        meta = self.misuse_meta(st, {"sync": True, "deps": None})
        meta["must"] = list(range(P))
        # its agreement travels on the comm's own communicator: no allreduce is recorded
        self.call(key, lambda: hybridmpi.profile(self.hc).__enter__(), meta=meta)

    def do_misuse_with(self, st):
        """Rank ``bad`` raises its own OwnError inside a with block; the others make a call."""
        key = (st["i"], 0)
        bad, call = st["bad"], st["call"]
        kind, oid = st["obj"]
        meta = self.misuse_meta(st, {"sync": True, "withraise": True})
        if call == "update":
            hm = self.halo_meta(st["hid"], "update", key)
            deps = hm["deps"]
        elif call == "none":
            deps = {r: set() for r in range(P)}
        else:
            deps = {r: set(range(P)) - {r} for r in range(P)}
        meta["deps"] = deps
        meta["must"] = [r for r in range(P) if r != bad and bad in deps[r]]
        if R == bad:
            if kind == "prof":
                prof = self.prof
                self.prof = None
                obj = None
            else:
                obj = {
                    "hc": lambda: self.hc,
                    "halo": lambda: (self.ohalo.get(oid) or {}).get("h"),
                    "mem": lambda: self.omem.get(oid),
                    "co": lambda: self.oco.get(oid),
                }[kind]()
            delay = st["delay_ms"] * 1e-3

            def fn():
                if kind == "prof":
                    if prof is None:
                        self.skip()
                    time.sleep(delay)
                    try:
                        raise OwnError(f"rank {R}'s own error inside a profile block")
                    except OwnError as e:
                        prof.__exit__(OwnError, e, e.__traceback__)
                        raise
                if obj is None:
                    self.skip()
                with obj:
                    time.sleep(delay)
                    raise OwnError(f"rank {R}'s own error inside a {kind} block")

            return self.call(key, fn, meta=meta)
        if call == "none":
            return self.nocall(key, meta)
        if call == "barrier":
            return self.call(key, lambda: self.hc.barrier(), meta=meta, p=[("HybridComm", "barrier")])
        if call == "allreduce":

            def check(got, cls):
                return None if cls or got == float(P) else f"allreduce(1.0) returned {got!r}, want {float(P)}"

            return self.call(
                key,
                lambda: self.hc.allreduce(1.0),
                check,
                vcat="coll",
                meta=meta,
                p=[("HybridComm", "allreduce")],
            )
        if call == "sync_all":
            mem = self.omem.get(st["mid"])
            return self.call(
                key,
                (lambda: mem.sync_all()) if mem is not None else self.skip,
                meta=meta,
                p=[("GlobalMemory", "sync_all"), ("HybridComm", "barrier")],
            )
        hid = st["hid"]
        s = self.shalo[hid]
        pm = self.pats[s["pid"]]
        o = self.ohalo.get(hid)
        xs = self.fill_all(s, pm, key)
        if o is None:
            return self.call(key, self.skip, meta=meta)
        x = self.get_array(o, st["arr"])
        x.reshape(pm.size[R], s["block"])[...] = xs[R]
        before = x.copy()
        want = pm.forward(R, xs)

        def hcheck(_, cls):
            return self.check_halo(x, before, want, cls)

        self.call(key, lambda: o["h"].update(x), hcheck, vcat="partial", meta=meta, p=[("Halo", "update")])

    def do_probe_broken(self, st):
        """After a rank's own exception broke the comm: a barrier and an allreduce raise on
        every rank."""
        meta = {"sync": True, "deps": None, "probe": True}
        self.call((st["i"], 0), lambda: self.hc.barrier(), meta=dict(meta))
        self.call((st["i"], 1), lambda: self.hc.allreduce(1.0), meta=dict(meta))

    def do_misuse_deadline(self, st):
        """On a side HybridComm (timeout SHORT_TIMEOUT): ranks st['ctor'] make an object, the
        others call barrier/allreduce/update; then the side comm is broken and freed."""
        i = st["i"]
        ctor = set(st["ctor"])
        comm.Barrier()  # no drift into the side comm's short deadline (not a library call)
        _, side = self.call(
            (i, 0),
            lambda: hybridmpi.HybridComm(comm, node_size=self.cfg.node_size, timeout=SHORT_TIMEOUT),
            meta={"sync": True},
            pause=False,
        )
        n = 4
        ghost_of = (R + 1) % P

        def ring():
            return hybridmpi.GhostPattern.from_global(
                side, np.arange(R * n, R * n + n), np.array([ghost_of * n], np.int64)
            )

        _, pat = self.call((i, 1), ring if side is not None else self.skip, meta={"sync": True}, pause=False)
        _, h = self.call(
            (i, 2),
            (lambda: hybridmpi.Halo(pat, method=st["method"])) if pat is not None else self.skip,
            meta={"sync": True},
            pause=False,
        )
        deps = {r: ({(r + 1) % P} if st["call"] == "update" else set(range(P)) - {r}) for r in range(P)}
        must = [r for r in range(P) if r in ctor or deps[r] & ctor]
        meta = self.misuse_meta(
            st, {"sync": True, "deadline": True, "ctor": sorted(ctor), "call": st["call"], "must": must}
        )
        x = np.concatenate((np.arange(R * n, R * n + n, dtype=np.float64), [-1.0]))
        want = x.copy()
        want[n] = ghost_of * n
        before = x.copy()
        if R in ctor:
            make = st["make"]
            fn = {
                "Halo": lambda: hybridmpi.Halo(pat),
                "GlobalMemory": lambda: hybridmpi.GlobalMemory(side, 4),
                "Coarray": lambda: hybridmpi.Coarray(side, (2, 3)),
                "from_global": ring,
                "profile": lambda: hybridmpi.profile(side).__enter__(),
            }[make]
            check = None
        else:
            fn = {
                "barrier": lambda: side.barrier(),
                "allreduce": lambda: side.allreduce(1.0),
                "update": lambda: h.update(x),
            }[st["call"]]

            def check(_, cls):
                return self.check_halo(x, before, want, cls) if st["call"] == "update" else None

        if h is None:
            fn = self.skip
        self.call((i, 3), fn, check, meta=meta, pause=False)
        self.call(
            (i, 4),
            (lambda: side.barrier()) if side is not None else self.skip,
            meta={"sync": True, "deps": None, "probe": True, "side": True},
            pause=False,
        )
        self.call(
            (i, 5),
            side.free if side is not None else self.skip,
            meta={"sync": False, "lenient": True},
            pause=False,
        )

    def do_misuse_unsend(self, st):
        """A constructor argument that cannot travel (pickled or shown) on the bad ranks."""
        key = (st["i"], 0)
        meta = self.misuse_meta(st, {"sync": True, "deps": None, "agreed": True})
        meta["must"] = list(range(P))
        what = st["what"]
        bad = self.i_am_bad(st)
        v = unsendable(st["val"]) if bad else None
        if what.startswith("halo"):
            pat = self.opat.get(st["pid"])
            kw = {"dtype": np.float64, "block": 1, "method": st["method"]}
            if bad:
                kw[what[5:]] = v

            def fn():
                if pat is None:
                    self.skip()
                return hybridmpi.Halo(pat, **kw)
        elif what == "gm-dtype":

            def fn():
                return hybridmpi.GlobalMemory(self.hc, 4, v if bad else np.float64)
        elif what == "gm-count":

            def fn():
                return hybridmpi.GlobalMemory(self.hc, v if bad else 4, np.float64)
        elif what == "co-dtype":

            def fn():
                return hybridmpi.Coarray(self.hc, (2, 3), v if bad else np.float64)
        else:  # co-shape: a generator as the shape, or a bad extent in it
            shape = (2, 3)
            if bad:
                shape = v if st["val"] == "gen" else (2, v)

            def fn():
                return hybridmpi.Coarray(self.hc, shape, np.float64)

        cls, obj = self.call(key, fn, meta=meta)
        if obj is not None:
            self.stray.append(obj)

    def do_misuse_freeorder(self, st):
        """Each rank frees one of two objects first: RuntimeError on every rank, nothing freed."""
        key = (st["i"], 0)
        meta = self.misuse_meta(st, {"sync": True, "deps": None, "agreed": True})
        meta["must"] = list(range(P))
        meta["free"] = True
        kind, oid = st["objs"][st["which"][R]]
        obj = (self.ohalo.get(oid) or {}).get("h") if kind == "halo" else self.omem.get(oid)
        self.call(key, obj.free if obj is not None else self.skip, meta=meta)
        if obj is not None and obj.closed:   # a broken comm's free is local: gone on this rank
            if kind == "halo":
                o = self.ohalo.pop(oid)
                self.graveyard[oid] = {"h": o["h"], "x": o["arrays"]["k0"]}
            else:
                self.gm_graveyard[oid] = self.omem.pop(oid)

    def do_pyint(self, st):
        """allreduce of Python ints: the exact Python result, as a Python int."""
        key = (st["i"], 0)
        vals, red = st["vals"], st["red"]
        want = vals[0]
        for v in vals[1:]:
            want = {"sum": lambda a, b: a + b, "prod": lambda a, b: a * b, "min": min, "max": max}[red](
                want, v
            )

        def check(got, cls):
            if cls:
                return None
            if type(got) is not int or got != want:
                return (
                    f"allreduce({vals[R]}, {red!r}) of {vals} returned {got!r} "
                    f"({type(got).__name__}), want {want}"
                )
            return None

        self.call(
            key,
            lambda: self.hc.allreduce(vals[R], op=red),
            check,
            vcat="coll",
            meta={"sync": True, "deps": None},
            p=[("HybridComm", "allreduce")],
        )

    def cleanup(self):
        """After a failure: free what is left (the watchdog ends the job if that hangs)."""
        try:
            if self.hc is not None and not self.hc.closed:
                self.hc.free()
        except Exception:  # noqa: BLE001 - the failure was reported already
            pass


class SkipCall(RuntimeError):
    pass


KNOWN.add("Skip")


def step_text(st):
    """One line for a step."""
    op = st["op"]
    skip = {"i", "op", "spec", "orders", "acts", "ops", "exp"}
    args = " ".join(f"{k}={v}" for k, v in st.items() if k not in skip)
    if op == "pattern":
        sp = st["spec"]
        args += (
            f" kind={sp['kind']} owned={[len(o) for o in sp['owned']]} "
            f"ghosts={[len(g) for g in sp['ghosts']]}"
        )
    if op == "group":
        acts = st["acts"]
        args += " " + "; ".join(
            f"r{r}: "
            + ", ".join(
                f"{acts[j]['call']}({acts[j]['hid']},{acts[j]['arr']}"
                f"{',' + acts[j]['rop'] if 'rop' in acts[j] else ''})"
                for j in order
            )
            for r, order in enumerate(st["orders"])
        )
    if "ops" in st:
        args += " ops=" + ", ".join(f"r{r}:{o}" for r, o in enumerate(st["ops"]))
    return f"{op} {args}"


# ============================================================ main


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
