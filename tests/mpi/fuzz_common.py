"""The fuzzer's shared parts: its tables (methods, dtypes, misuse kinds, exception classes),
the pattern model, the data every rank computes for every rank, and how a step prints
(tests/mpi/fuzz.py)."""

import numpy as np
from mpi4py import MPI

from hybridmpi.tools.baselines import METHODS as _METHODS

comm = MPI.COMM_WORLD
R, P = comm.rank, comm.size


#: every Halo method (a new one in hybridmpi/ghost/transport/ is tested with no edit here)
METHODS = tuple(_METHODS)
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
