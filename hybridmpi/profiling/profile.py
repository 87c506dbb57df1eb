"""Where communication time goes: ``with hybridmpi.profile(hc) as prof:``.

Per object (Halo, HybridComm, GlobalMemory, Coarray) and operation, each rank records
its calls, the bytes it moved, the time in the call, the part spent in the C core and
in MPI waits (``wait``) and the rest (``python``: argument checks, dispatch).  The wait
is split into **imbalance** (the part before the last peer this call synchronizes with
had arrived) and **transfer** (the rest: copies, handshakes, messages).

How: while a profile is on, the C core stores the time of its first entry and of its
last return in each call (``hm_prof``, CLOCK_MONOTONIC), and so do the Python waits on
MPI requests.  A rank's *arrival* in a call is that first entry (when it published
its data or signal).  At the end of the profile (collective) each rank sends its
arrival times to the ranks that waited for them (a Halo's receivers, every rank of a
collective, the ranks named in ``sync_images``), on rank 0's clock: on one node the
clock is shared; across nodes each node's offset is measured by ping-pong with rank 0
(``MPI.Wtime``-style, the round trip of least delay).  A waiting call's imbalance is
``min(wait, max(0, latest peer arrival - own entry))``, charged to that peer.

Off, the profile costs one load and one branch per C call.  On, each profiled call
pays four clock reads and one record, in C (the operation's ``Op``; see ``bench profile``).
"""

from __future__ import annotations

import collections
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, TextIO

import numpy as np

from .._native.clib import ffi, lib
from .._native.marks import CLK as _CLK
from .._native.marks import now as _now
from ..comm._agree import agree
from ..comm._resource import leave_on_error
from ..errors import FreedError
from .waits import clock_offset

if TYPE_CHECKING:
    from ..comm.hybridcomm import HybridComm

#: calls per object and operation whose wait is split (later ones are timed, not split)
SPLIT_CALLS = 1_000_000
KEYS = ("object", "op", "calls", "bytes", "time_s", "python_s", "wait_s", "imbalance_s",
        "transfer_s", "late_peer")

_ACTIVE: list[profile] = []   # profiles that are on (the C clock runs while there is one)

# What each kind of object records: op -> (kind, direction).  Kinds: "whole" (arrives and
# waits), "begin" (arrives), "end" (waits), "coll" (collective over the HybridComm: every
# rank arrives and waits), "images" (sync_images), "one" (one-sided: no peer to wait for).
_HALO_OPS = {"update": ("whole", 0), "reverse": ("whole", 1), "update_begin": ("begin", 0),
             "update_end": ("end", 0), "reverse_begin": ("begin", 1), "reverse_end": ("end", 1)}
_COMM_OPS = {"barrier": ("coll", "c"), "allreduce": ("coll", "c"), "Allreduce": ("coll", "c")}
_MEM_OPS = {"Put": ("one", None), "Get": ("one", None), "Rput": ("one", None),
            "Rget": ("one", None), "fetch_add": ("one", None), "compare_swap": ("one", None),
            "flush": ("one", None), "sync_all": ("coll", "s"), "sync_images": ("images", None)}
_CO_OPS = {"_put": ("one", "put"), "_get": ("one", "get"), "Rput": ("one", None),
           "Rget": ("one", None), "sync_all": ("coll", "s"), "sync_images": ("images", None)}


def _nbytes(op, args, out, section_nbytes):
    """Bytes of the first array argument (put, get, reductions) or of what a get returned
    (``section_nbytes(index)``: a Coarray's, for its a[r][index] = values); 0 for what has no
    size (an argument whose ``nbytes`` raises: the call is still recorded)."""
    try:
        return _nbytes_of(op, args, out, section_nbytes)
    except Exception:  # noqa: BLE001 - a user's object; the profile never fails a call
        return 0


def _nbytes_of(op, args, out, section_nbytes):
    if op in ("flush", "barrier", "sync_all"):
        return 0
    if op == "get":
        return int(getattr(out, "nbytes", 0))
    if op == "put":   # Coarray a[r][index] = values: the section's bytes
        return int(section_nbytes(args[1]))
    for a in args:
        n = getattr(a, "nbytes", None)
        if n is not None:
            return int(n)
    return 8 if args and isinstance(args[0], (int, float, complex)) else 0


class _Op:
    """One object's operation: its call records in a C log (hm_prof_log), and for
    sync_images the ranks each call named."""

    __slots__ = ("label", "op", "kind", "key", "obj", "log", "named")

    def __init__(self, label, op, kind, key, obj):
        self.label, self.op, self.kind, self.key, self.obj = label, op, kind, key, obj
        # the records are C memory (hm_prof_end grows them): freed with the op, whichever way
        # its profile ended (an exception in the block, a broken comm), or at release()
        self.log = ffi.gc(ffi.new("hm_prof_log *"), lib.hm_prof_free)
        self.log.limit = SPLIT_CALLS if kind in ("whole", "begin", "end", "one") else 2**40
        self.named = []

    def records(self):
        """(calls, 6) int64: Python entry, C entry, C return, Python return, seq, bytes."""
        n = int(self.log.n)
        if n == 0:
            return np.zeros((0, 6), dtype=np.int64)
        return np.frombuffer(ffi.buffer(self.log.rec, n * 48), dtype=np.int64).reshape(n, 6).copy()

    def release(self):
        """Free the records; a call recorded after the profile ended only adds to ``over``."""
        lib.hm_prof_free(self.log)
        self.log.limit = 0


class _Recorder(NamedTuple):
    """What the layers under the profile call of the profile that is on (their HybridComm's
    ``context.profile``): its bound methods, handed down, so that none reaches into it."""

    #: the profile
    owner: profile
    #: ``adopt(obj)``: record a Halo, GlobalMemory or Coarray made while it is on
    adopt: Callable[[Any], None]
    #: ``forget(obj)``: stop recording a Coarray's own GlobalMemory
    forget: Callable[[Any], None]


class profile:
    """Record where communication time goes on ``hc`` (collective on enter and exit).

    ::

        with hybridmpi.profile(hc) as prof:
            for step in range(n):
                halo.update(u)
                ...
        prof.print()                 # rank 0: min/mean/max over ranks per object and op
        rows = prof.rows()           # this rank's rows (dicts)
        prof.to_json("profile.json") # rank 0 writes every rank's rows

    Every Halo, GlobalMemory and Coarray of ``hc`` (those made inside the block too)
    and ``hc``'s own collectives are recorded.  Rows nest as the calls do:
    ``sync_all`` includes its barrier.  Env ``HYBRIDMPI_PROFILE=1`` profiles each
    HybridComm from its creation to its free (or the end of the run) and prints
    there; ``HYBRIDMPI_PROFILE=path.json`` also writes the JSON.  Every rank raises
    the same errors.

    Raises:
        TypeError: ``hc`` is not a HybridComm.
        FreedError: ``hc`` was freed.
        RuntimeError: a profile of ``hc`` is already on; ``rows()`` before the
            profile ended or after it ended with an exception.
    """

    def __init__(self, hc: HybridComm) -> None:
        from ..comm.hybridcomm import HybridComm

        if not isinstance(hc, HybridComm):
            raise TypeError(f"hybridmpi: profile needs a HybridComm, got {type(hc).__name__}")
        self.hc = hc
        self._ops: list[_Op] = []
        self._recorded: list[Any] = []   # the objects recorded (through their Calls tables)
        self._epochs: list[tuple[Any, list[int]]] = []    # (Halo, its epochs when recording began)
        self._counts: collections.Counter[str] = collections.Counter()   # labels given per kind of object
        self._rows: list[dict[str, Any]] = []
        self._all: list[Any] | None = None
        self._state = "new"
        self.elapsed_s = None

    # ------------------------------------------------------------ life

    def __enter__(self):
        hc = self.hc
        if hc.closed:
            raise FreedError(f"hybridmpi: rank {hc.rank}: profile of a freed HybridComm")
        problem = None
        if self._state != "new":
            problem = "this profile object was already used; make a new one"
        elif hc.context.profile is not None:
            problem = "a profile of this HybridComm is already on"
        # a bounded agreement over the comm's own communicator: it never matches a user's
        # collective call, and a peer that broke (its notice) or is in another call makes it
        # raise PeerError or SyncTimeout instead of waiting
        agree(hc.comm, problem and (RuntimeError, f"rank {hc.rank}: {problem}"), "profile")
        self._offset = clock_offset(hc)
        self._state = "on"
        hc.context.profile = _Recorder(self, self._adopt, self._forget)
        self._adopt(hc)
        for child in list(hc.context.children.values()):
            self._adopt(child)
        _ACTIVE.append(self)
        _CLK[2] = 1
        hc.comm.Barrier()
        self._t0 = _now()
        return self

    def __exit__(self, exc_type, exc, tb):
        self._stop()
        hc = self.hc
        self._state = "failed"
        if hc.context.broken() is not None or hc.closed:
            return False   # this rank's comm broke: its peers raise in their own exit
        if exc is not None:
            # this rank's own exception breaks the comm (peers waiting on it raise, as for a
            # failure outside a block): no collective call that a peer may never join; one
            # raised on every rank together leaves every rank here, without rows
            leave_on_error(hc.context, exc)
            return False
        # a bounded agreement that every rank left normally: a peer whose exception broke the
        # comm makes it raise PeerError (its notice) instead of waiting in the exchange below
        agree(hc.comm, None, "profile")
        self._finish()
        return False

    def abandon(self) -> None:
        """End recording without the collective end (called by HybridComm.free when the comm
        is freed inside the block, and when a profiled comm broke): ``rows()`` then raises."""
        self._stop()
        self._state = "failed"

    def _stop(self):
        self.elapsed_s = (_now() - self._t0) * 1e-9
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        if not _ACTIVE:
            _CLK[2] = 0
        for obj in self._recorded:
            _seam(obj).calls.unrecord()
        self._recorded = []
        ctx = self.hc.context
        if ctx.profile is not None and ctx.profile.owner is self:
            ctx.profile = None

    # ------------------------------------------------------------ recording

    def _adopt(self, obj):
        """Record the operations of ``obj`` (HybridComm, Halo, GlobalMemory, Coarray: what
        its class is recorded as, ``RECORDED_AS``), through its operations' table."""
        what = getattr(obj, "RECORDED_AS", None)
        if what == "Halo":
            ops, label = _HALO_OPS, f"Halo #{obj.tag} ({obj.method})"
            self._epochs.append((obj, list(obj._internal.epochs)))
        elif what == "HybridComm":   # the path its collectives take: the C core or MPI's own
            ops, label = _COMM_OPS, f"HybridComm ({getattr(obj, 'collective_path', 'core')} path)"
        elif what in ("Coarray", "GlobalMemory"):
            self._counts[what] += 1
            n = self._counts[what]
            ops, label = (_CO_OPS, f"Coarray {n} {obj.shape}") if what == "Coarray" else \
                (_MEM_OPS, f"GlobalMemory {n}")
        else:
            return
        calls = _seam(obj).calls
        for name, (kind, key) in ops.items():
            # Coarray's a[r][index] put and get are its operations _put and _get
            rec = _Op(label, key if name.startswith("_") else name, kind, key, obj)
            self._ops.append(rec)
            calls.record(name, int(ffi.cast("uintptr_t", rec.log)), _finish(rec, obj), rec.log)
        self._recorded.append(obj)

    def _forget(self, obj):
        """Stop recording ``obj`` (a Coarray's own GlobalMemory), before any call of it."""
        if any(o is obj for o in self._recorded):
            _seam(obj).calls.unrecord()
        self._recorded = [o for o in self._recorded if o is not obj]
        self._ops = [rec for rec in self._ops if rec.obj is not obj]
        self._counts["GlobalMemory"] -= 1

    # ------------------------------------------------------------ the split (collective)

    def _finish(self):
        """Split each call's wait into imbalance and transfer (collective): every rank sends its
        arrival times to the ranks that waited for them, then makes its rows; rank 0 gathers all."""
        hc = self.hc
        off = self._offset
        recs = [(op, op.records()) for op in self._ops]
        arrival = {id(op): np.where(r[:, 1] > 0, r[:, 1], r[:, 0]) + off for op, r in recs}
        self._number_halo_calls(recs)
        out, waits = self._plan_exchange(recs, arrival)
        inbox = hc.comm.alltoall([{g: (np.concatenate([a for a, _ in v]), np.concatenate([b for _, b in v]))
                                   for g, v in o.items()} for o in out])
        rows = []
        for op, r in recs:
            row = self._row(op, r, waits.get(id(op), ()), inbox, off)
            if row is None:
                continue
            rows.append(row)
            op.release()
        self._rows = rows
        self._all = hc.comm.gather(rows, root=0)
        self._state = "done"

    def _number_halo_calls(self, recs):
        """Number each Halo's calls (column 4 of their records), per direction: by their epoch
        (the epoch at the start of the profile, then one per whole call or begin, in order);
        an end has its begin's."""
        for halo, epochs in self._epochs:
            for d in (0, 1):
                mine = [(op, r) for op, r in recs if op.obj is halo and op.kind != "coll"
                        and op.key == d and op.kind in ("whole", "begin")]
                if mine:
                    t0 = np.concatenate([r[:, 0] for _, r in mine])
                    seq = np.empty(t0.size, dtype=np.int64)
                    seq[np.argsort(t0, kind="stable")] = epochs[d] + 1 + np.arange(t0.size)
                    i = 0
                    for _, r in mine:
                        r[:, 4] = seq[i:i + len(r)]
                        i += len(r)
                begins = [r for op, r in recs if op.obj is halo and op.kind == "begin" and op.key == d]
                ends = [r for op, r in recs if op.obj is halo and op.kind == "end" and op.key == d]
                if begins and ends:
                    n = min(len(begins[0]), len(ends[0]))
                    ends[0][:n, 4] = begins[0][:n, 4]

    def _plan_exchange(self, recs, arrival):
        """(out, waits): ``out[dest][group]``, the [(seqs, arrivals)] this rank sends to ``dest``;
        ``waits[id(op)]``, the [(peer, group, seqs)] whose arrivals each call of ``op`` waited for."""
        rank, size = self.hc.rank, self.hc.size
        out = [dict() for _ in range(size)]   # dest -> group -> [(seqs, arrivals)]
        waits = {}   # id(op) -> [(peer, group, seqs)]: the arrivals each call waited for

        def publish(dests, group, seq, times):
            for p in dests:
                if p != rank:
                    out[p].setdefault(group, []).append((seq, times))

        everyone = [p for p in range(size) if p != rank]
        # collectives: the calls of one group (every collective of the comm; every sync_all)
        # are numbered in the order this rank entered them, the same on every rank
        groups = collections.defaultdict(list)
        for op, r in recs:
            if op.kind == "coll":
                groups[op.key].append((op, r))
        for group, items in groups.items():
            t0 = np.concatenate([r[:, 0] for _, r in items])
            seq = np.empty(t0.size, dtype=np.int64)
            seq[np.argsort(t0, kind="stable")] = np.arange(t0.size)
            i = 0
            for op, r in items:
                mine = seq[i:i + len(r)]
                i += len(r)
                publish(everyone, group, mine, arrival[id(op)])
                waits[id(op)] = [(p, group, mine) for p in everyone]
        img = _image_calls(recs)
        for op, r in recs:
            if op.kind == "images":
                ws = []
                for p, pairs in img[id(op)].items():
                    idx = np.array([i for i, _ in pairs], dtype=np.int64)
                    seq = np.array([j for _, j in pairs], dtype=np.int64)
                    publish([p], "i", seq, arrival[id(op)][idx])
                    full = np.full(len(r), -1, dtype=np.int64)
                    full[idx] = seq
                    ws.append((p, "i", full))
                waits[id(op)] = ws
            elif op.kind in ("whole", "begin", "end"):
                halo, d = op.obj, op.key
                group = ("h", halo.tag, d)
                if op.kind != "end":
                    publish(halo.pattern.send if d == 0 else halo.pattern.recv, group, r[:, 4],
                            arrival[id(op)])
                if op.kind != "begin":
                    srcs = halo.pattern.recv if d == 0 else halo.pattern.send
                    waits[id(op)] = [(p, group, r[:, 4]) for p in srcs if p != rank]
        return out, waits

    @staticmethod
    def _row(op, r, waits, inbox, off):
        """The row of ``op`` (records ``r``), its waits split by the arrivals in ``inbox`` of
        the peers in ``waits``; None when it has no calls."""
        log = op.log
        over = [int(v) for v in log.over]
        if len(r) == 0 and not over[0]:
            return None
        a, b = r[:, 1], r[:, 2]
        wait = np.where((a > 0) & (b >= a), b - a, 0)
        latest = np.full(len(r), np.iinfo(np.int64).min, dtype=np.int64)
        late = np.full(len(r), -1, dtype=np.int64)
        for p, group, seq in waits:
            got = inbox[p].get(group)
            if got is None or seq.size == 0:
                continue
            order = np.argsort(got[0], kind="stable")
            S, T = got[0][order], got[1][order]
            if S.size == 0:
                continue
            idx = np.minimum(np.searchsorted(S, seq), S.size - 1)
            t = np.where((S[idx] == seq) & (seq >= 0), T[idx], np.iinfo(np.int64).min)
            newer = t > latest
            latest = np.where(newer, t, latest)
            late = np.where(newer, p, late)
        known = (a > 0) & (late >= 0)
        imb = np.where(known, np.clip(np.where(known, latest, 0) - (a + off), 0, wait), 0)
        was_late = late[imb > 0]
        total = (int((r[:, 3] - r[:, 0]).sum()) + over[2]) * 1e-9
        w = (int(wait.sum()) + over[3]) * 1e-9
        i = int(imb.sum()) * 1e-9
        return {"object": op.label, "op": op.op, "calls": len(r) + over[0],
                "bytes": int(r[:, 5].sum()) + over[1], "time_s": total,
                "python_s": max(total - w, 0.0), "wait_s": w, "imbalance_s": i,
                "transfer_s": w - i,
                "late_peer": int(np.bincount(was_late).argmax()) if was_late.size else None,
                "split_calls": len(r)}

    # ------------------------------------------------------------ results

    def rows(self) -> list[dict[str, Any]]:
        """This rank's rows: dicts with keys ``object``, ``op``, ``calls``, ``bytes`` (this rank
        sent and received; Put and Get: moved), ``time_s`` (in the calls), ``python_s``,
        ``wait_s`` (in the C core and MPI waits), ``imbalance_s``, ``transfer_s`` and
        ``late_peer`` (the peer that arrived last most often, None when none was late)."""
        if self._state != "done":
            why = ("ended with an exception" if self._state == "failed"
                   else "has not ended yet (rows are ready after the with block)")
            raise RuntimeError(f"hybridmpi: rank {self.hc.rank}: profile.rows(): the profile {why}")
        return [dict(r) for r in self._rows]

    def summary(self) -> list[dict[str, Any]] | None:
        """On rank 0: per object and op, min/mean/max over the ranks that made the call (dicts);
        elsewhere None."""
        self.rows()
        if self._all is None:
            return None
        groups: dict[tuple[str, str], list[Any]] = {}
        for r, rows in enumerate(self._all):
            for row in rows:
                groups.setdefault((row["object"], row["op"]), []).append((r, row))
        out = []
        for (obj, op), got in groups.items():
            s = {"object": obj, "op": op, "ranks": len(got),
                 "calls": max(row["calls"] for _, row in got),
                 "bytes": sum(row["bytes"] for _, row in got)}
            for k in ("time_s", "python_s", "wait_s", "imbalance_s", "transfer_s"):
                v = np.array([row[k] for _, row in got])
                s[k] = {"min": float(v.min()), "mean": float(v.mean()), "max": float(v.max())}
            late = collections.Counter(row["late_peer"] for _, row in got if row["late_peer"] is not None)
            s["late_peer"] = late.most_common(1)[0][0] if late else None
            out.append(s)
        return out

    def print(self, file: TextIO | None = None) -> None:
        """Rank 0 prints the summary table (as PETSc's ``-log_view``: totals over the profile,
        min/mean/max over ranks, per call in microseconds); other ranks print nothing."""
        summary = self.summary()
        if summary is None:
            return
        file = file or sys.stdout
        print(f"hybridmpi profile: {self.hc.size} ranks, {self.elapsed_s:.3f} s "
              "(per call, microseconds, mean over ranks [min-max])", file=file)
        head = (f"{'object':<26} {'op':<14} {'calls':>8} {'kB/call':>8} {'time':>18} "
                f"{'python':>8} {'imbalance':>18} {'transfer':>18} {'late':>5}")
        print(head, file=file)
        print("-" * len(head), file=file)
        for s in summary:
            n = max(s["calls"], 1)

            def us(k, spread=True, s=s, n=n):
                v = s[k]
                mean = v["mean"] / n * 1e6
                if not spread:
                    return f"{mean:8.2f}"
                return f"{mean:8.2f} [{v['min'] / n * 1e6:.1f}-{v['max'] / n * 1e6:.1f}]".rjust(18)
            kb = s["bytes"] / max(s["ranks"], 1) / n / 1e3
            late = "" if s["late_peer"] is None else str(s["late_peer"])
            print(f"{s['object'][:26]:<26} {s['op']:<14} {s['calls']:>8} {kb:8.2f} {us('time_s')} "
                  f"{us('python_s', False)} {us('imbalance_s')} {us('transfer_s')} {late:>5}",
                  file=file)
        file.flush()

    def to_json(self, path: str) -> None:
        """Rank 0 writes ``{"ranks": [rows of each rank], "summary": [...]}`` to ``path``;
        other ranks write nothing."""
        summary = self.summary()
        if summary is None:
            return
        with open(path, "w") as f:
            json.dump({"size": self.hc.size, "elapsed_s": self.elapsed_s, "ranks": self._all,
                       "summary": summary}, f, indent=1)


def _image_calls(recs):
    """sync_images: the j-th call naming rank p meets p's j-th call naming this rank.
    Returns id(op) -> p -> [(the call's index in op's records, j)]."""
    calls = sorted(((r[i, 0], op, i) for op, r in recs if op.kind == "images"
                    for i in range(len(r))), key=lambda c: c[0])
    named = collections.Counter()
    img = collections.defaultdict(lambda: collections.defaultdict(list))  # op -> p -> [(i, seq)]
    for _, op, i in calls:
        for p in op.named[i]:   # as the call checked them (globalmem's Sync.named)
            img[id(op)][p].append((i, named[p]))
            named[p] += 1
    return img


def _seam(obj):
    """What the profile may use of a recorded object: a HybridComm's context, the others'
    ``_internal``."""
    return obj.context if obj.RECORDED_AS == "HybridComm" else obj._internal


def _finish(rec, obj):
    """What a recorded call of ``rec`` gives its record: None (the bytes in the log: a Halo's
    calls move a fixed number, set here), or ``finish(out, *args, **kw)``, which returns the
    bytes (None: the log's)."""
    log = rec.log
    kind, op = rec.kind, rec.op
    if kind in ("whole", "begin", "end"):
        d = rec.key
        p = obj.pattern
        sent = sum(ids.size for ids in (p.send if d == 0 else p.recv).values()) * obj.esz
        got = sum(ids.size for ids in (p.recv if d == 0 else p.send).values()) * obj.esz
        log.nbytes = {"whole": sent + got, "begin": sent, "end": got}[kind]
        return None
    if kind == "images":
        named = rec.named

        sync = _seam(obj).sync

        def images(out, *args, **kw):
            named.append(sync.named)
        return images
    section_nbytes = obj._internal.section_nbytes if op == "put" else None

    def moved(out, *args, **kw):
        return _nbytes(op, args, out, section_nbytes)
    return moved
