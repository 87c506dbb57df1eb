"""Drift suite: random operation sequences, the same on every rank, with no resynchronizing
collective between operations; every rank checks its values after every operation.

    python -m mpi4py drift.py [--seed S] [--sequences N] [--ops M] [--node-size K]
                              [--max-delay-us D] [--fault]

Each sequence draws (from the seed alone, so every rank draws the same) a ring layout with
runs or scattered local numbering, three Halos (float64 block 1, float32 block 3, int64
block 1; method atomic, sometimes flat or neighbor for the third), their shared vectors,
global memory, a coarray, and M operations among: update, update_begin/end with work
between, reverse (add, min, max, insert) and reverse_begin/end on private arrays and shared
vectors; allreduce of scalars and of arrays whose sizes cross the recursive-doubling and
chunk thresholds; barriers of every method; Put + sync_images, Rput + wait + sync_images,
coarray sections + sync_images, fetch_add + sync_all.  Between operations each rank sleeps
or spins a random time of its own (up to D microseconds), and HYBRIDMPI_CHAOS (set by the
caller) adds delays inside the C core.  Values are integers stored in floats, so sums are
exact whatever the order, and every rank computes the expected values itself.

With --fault, one rank fails inside one call: it raises in the middle of a Halo call (after
the call started), passes an array of another dtype, another allreduce length or another
barrier method than its peers.  Every rank must raise (not hang, not return), and the
sequence reports how long the slowest rank took from the fault to its error.

Rank 0 prints one line per sequence and ``SUMMARY: N passed, M failed``; the exit code is
non-zero on any failure.
"""

import argparse
import functools
import os
import sys
import time
import traceback

import numpy as np
from mpi4py import MPI

import hybridmpi
import hybridmpi.tools.baselines  # noqa: F401  (the paper's baseline methods of the Halo)
from hybridmpi import Coarray, GhostPattern, GlobalMemory, Halo

comm = MPI.COMM_WORLD
R, P = comm.rank, comm.size

# allreduce lengths around the thresholds: 12 doubles = 96 bytes (recursive doubling), 2048
# doubles = 16 KiB (the direct allreduce up to 32 KiB over the node's ranks: 2048 at 2 ranks,
# 1024 at 4, 512 at 8; the reduce-scatter past it), 16384 doubles = half the slot (the
# reduce-scatter's chunk), 32768 doubles = one 256 KiB slot (the tree's chunk)
AR_LENGTHS = (1, 3, 12, 13, 100, 512, 513, 1024, 1025, 2048, 2049, 16384, 16385, 32768, 32769, 40000)


class Injected(Exception):
    """The fault that --fault raises on one rank in the middle of an operation."""


class World:
    """Everything one sequence draws: the same on every rank."""

    def __init__(self, rng, scattered):
        self.owned_n = [int(rng.integers(20, 400)) for _ in range(P)]
        self.start = np.concatenate(([0], np.cumsum(self.owned_n)))
        # each rank ghosts a random run of the next rank's points and a random run of the
        # previous rank's (a ring), from 0 to all of them
        self.ghosts = []
        for r in range(P):
            g = []
            for q in sorted({(r + 1) % P, (r - 1) % P} - {r}):
                n = self.owned_n[q]
                a = int(rng.integers(0, n))
                b = int(rng.integers(a, n + 1))
                g.append(np.arange(self.start[q] + a, self.start[q] + b))
            self.ghosts.append(np.concatenate(g + [np.zeros(0, np.int64)]).astype(np.int64))
        # local numbering: owned then ghosts, each in order or randomly permuted (scattered)
        self.gids = []
        for r in range(P):
            ids = np.concatenate((np.arange(self.start[r], self.start[r + 1]), self.ghosts[r]))
            if scattered:
                ids = ids[rng.permutation(ids.size)]
            self.gids.append(ids.astype(np.int64))
        self.owner = np.repeat(np.arange(P), self.owned_n)

    def mine(self):
        gids = self.gids[R]
        return gids, self.owner[gids] == R


def value(k, gid, rank=None, salt=0):
    """An integer-valued float that only (operation, point[, rank]) decide."""
    h = (np.asarray(gid, np.int64) * 2654435761 + k * 40503 + salt * 977
         + (0 if rank is None else (np.asarray(rank, np.int64) + 1) * 7919)) % 1000
    return h.astype(np.float64) - 500


def expected_reverse(world, k, op, gids, owned):
    """What ``reverse(x, op)`` leaves in this rank's entries (local points ``gids``)."""
    out = np.where(owned, value(k, gids), value(k, gids, R))
    ghosted = {}
    for r in range(P):
        if r != R:
            for g in np.intersect1d(world.ghosts[r], gids[owned]):
                ghosted.setdefault(int(g), []).append(r)
    pos = {int(g): i for i, g in enumerate(gids)}
    for g, ranks in ghosted.items():
        vals = [float(value(k, g, r)) for r in sorted(ranks)]
        i = pos[g]
        if op == "add":
            out[i] = out[i] + sum(vals)
        elif op == "min":
            out[i] = min([out[i]] + vals)
        elif op == "max":
            out[i] = max([out[i]] + vals)
        else:
            out[i] = vals[-1]
    return out


def blocked(block, a):
    """Per-point values ``a`` as the rows of a Halo of ``block`` values per point."""
    return a if block == 1 else np.repeat(a[:, None], block, 1)


def pause(rng, max_us):
    """This rank's own drift: nothing, a yield, a spin or a sleep."""
    kind = rng.integers(0, 4)
    if kind == 1:
        os.sched_yield()
    elif kind == 2:
        t = time.perf_counter() + rng.uniform(0, max_us) * 1e-6
        while time.perf_counter() < t:
            pass
    elif kind == 3:
        time.sleep(rng.uniform(0, max_us) * 1e-6)


FAULTS = ("update", "update_split", "reverse_split", "allreduce", "barrier")
OPS = ("update", "update_split", "reverse", "reverse_split", "allreduce", "barrier", "put",
       "rput", "coarray", "fetch_add")
# consecutive calls on one Halo are where paths meet: most operations are ghost updates
WEIGHTS = (0.2, 0.2, 0.1, 0.1, 0.1, 0.05, 0.08, 0.07, 0.05, 0.05)


def sequence(seed, n_ops, node_size, max_us, fault):
    """One random sequence; returns the number of operations checked."""
    draw = np.random.default_rng([seed, 7])          # the same on every rank
    drift = np.random.default_rng([seed, 11, R])     # this rank's own delays
    scattered = bool(draw.integers(0, 2))
    world = World(draw, scattered)
    env = {}
    if draw.integers(0, 2):  # force the fast paths for these small patterns
        env = {"HYBRIDMPI_ZERO_COPY_BYTES": "0", "HYBRIDMPI_CMA_BYTES": "0"}
    os.environ.update(env)
    try:
        hc = hybridmpi.HybridComm(comm, node_size=node_size)
    finally:
        for k in env:
            del os.environ[k]
    fault_at = int(draw.integers(0, n_ops)) if fault else -1
    fault_rank = int(draw.integers(0, P)) if fault else -1
    try:
        return run_sequence(hc, draw, drift, world, scattered, n_ops, fault_at, fault_rank, max_us)
    except BaseException:
        global RAISED_AT
        RAISED_AT = time.time()  # before the collective free of the HybridComm
        raise
    finally:
        hc.free()


RAISED_AT = 0.0
FIRED = False  # whether this rank reached the sequence's faulty operation


def run_sequence(hc, draw, drift, world, scattered, n_ops, fault_at, fault_rank, max_us):
    if True:
        # from_global numbers the owned points first, in the order given, then the ghosts:
        # x[i] is global point gids[i] (owned and ghosts permuted when scattered)
        gids, owned = world.mine()
        pat = GhostPattern.from_global(hc, gids[owned], gids[~owned])
        gids = np.concatenate((gids[owned], gids[~owned]))
        owned = world.owner[gids] == R
        third = str(draw.choice(["atomic", "atomic", "flat", "neighbor"]))
        halos = [Halo(pat), Halo(pat, dtype=np.float32, block=3), Halo(pat, dtype=np.int64, method=third)]
        vectors = [[h.vector(), h.vector()] for h in halos]
        # private arrays kept from call to call (the Halos' hot path), next to fresh ones
        kept = [np.empty((pat.size,) if h.block == 1 else (pat.size, h.block), h.dtype) for h in halos]
        mem = GlobalMemory(hc, 8)
        counter = GlobalMemory(hc, 1, np.int64)
        co = Coarray(hc, (2, 4))
        nxt, prv = (R + 1) % P, (R - 1) % P
        adds = 0
        # puts into a neighbour alternate between two slots by their count, not by k: the
        # neighbour may still be checking the last one, but not the one before (each put is
        # followed by sync_images with it), while two puts whose k have one parity may follow
        # each other with nothing that waits for that neighbour in between
        n_mem = n_co = 0
        for k in range(n_ops):
            op = OPS[int(draw.choice(len(OPS), p=WEIGHTS))]
            hi = int(draw.choice([0, 0, 1, 2]))
            use_vec = int(draw.integers(0, 4))  # 0, 1: a shared vector; 2: a new private array;
            #                                      3: a kept private array
            rop = str(draw.choice(["add", "min", "max", "insert"]))
            nlen = int(draw.choice(AR_LENGTHS))
            bmethod = str(draw.choice(["dissemination", "tree", "linear"]))
            arop = str(draw.choice(["sum", "min", "max"]))
            pause(drift, max_us)
            h = halos[hi]
            shape = (pat.size,) if h.block == 1 else (pat.size, h.block)
            x = (vectors[hi][use_vec] if use_vec < 2 else kept[hi] if use_vec == 3
                 else np.empty(shape, h.dtype))
            blk = functools.partial(blocked, h.block)
            # the fault goes into the first operation from fault_at that can fail (the same
            # decision on every rank)
            inject = False
            if 0 <= fault_at <= k and op in FAULTS:
                inject, fault_at = R == fault_rank, -1
                global FIRED
                FIRED = True
            if op in ("update", "update_split"):
                x[...] = blk(np.where(owned, value(k, gids), -1e6)).astype(h.dtype)
                if op == "update":
                    if inject:
                        _inject(h)
                    h.update(x)
                else:
                    if inject:
                        _inject(h)
                    h.update_begin(x)
                    pause(drift, max_us)
                    h.update_end(x)
                want = blk(value(k, gids)).astype(h.dtype)
                assert np.array_equal(x, want), (k, op, hi, use_vec, "forward", _diff(x, want, gids))
            elif op in ("reverse", "reverse_split"):
                x[...] = blk(np.where(owned, value(k, gids), value(k, gids, R))).astype(h.dtype)
                if op == "reverse":
                    if inject:
                        _inject(h)
                    h.reverse(x, rop)
                else:
                    if inject:
                        x = x.astype(np.float16)  # an invalid argument on this rank only
                    h.reverse_begin(x, rop)
                    pause(drift, max_us)
                    h.reverse_end(x)
                want = blk(expected_reverse(world, k, rop, gids, owned)).astype(h.dtype)
                assert np.array_equal(x, want), (k, op, hi, use_vec, rop, "reverse")
            elif op == "allreduce":
                if inject:  # an argument that differs on this rank only
                    nlen = int(draw.choice([n for n in AR_LENGTHS if n != nlen]))
                if nlen == 1 and draw.integers(0, 2):
                    got = hc.allreduce(float(value(k, 0, R)), arop)
                    vals = [float(value(k, 0, r)) for r in range(P)]
                    want = sum(vals) if arop == "sum" else (min(vals) if arop == "min" else max(vals))
                    assert got == want, (k, op, got, want)
                else:
                    a = value(k, np.arange(nlen), R)
                    got = hc.allreduce(a, arop)
                    allv = np.array([value(k, np.arange(nlen), r) for r in range(P)])
                    want = {"sum": allv.sum(0), "min": allv.min(0), "max": allv.max(0)}[arop]
                    assert np.array_equal(got, want), (k, op, nlen)
            elif op == "barrier":
                if inject:  # another barrier method on this rank only
                    bmethod = "linear" if bmethod != "linear" else "tree"
                hc.barrier(method=bmethod)
            elif op in ("put", "rput"):
                slot = 4 * (n_mem % 2)
                n_mem += 1
                data = value(k, np.arange(4), R)
                if op == "put":
                    mem.Put(data, nxt, slot)
                else:
                    mem.Rput(data, nxt, slot).wait()
                mem.sync_images(sorted({nxt, prv}))
                assert np.array_equal(mem.local[slot:slot + 4], value(k, np.arange(4), prv)), (k, op)
            elif op == "coarray":
                row = n_co % 2
                n_co += 1
                co[nxt][row, 1:3] = value(k, np.arange(2), R)
                co.sync_images(sorted({nxt, prv}))
                assert np.array_equal(co.local[row, 1:3], value(k, np.arange(2), prv)), (k, op)
            elif op == "fetch_add":
                old = counter.fetch_add(k % P, 0, 1)
                adds += 1
                assert 0 <= old < P * n_ops, (k, op, old)
                counter.sync_all()
        # the counters hold every rank's adds (one collective at the very end)
        hc.barrier()
        total = comm.allreduce(int(counter.local[0]))
        assert total == comm.allreduce(adds), (total, adds)
        for h in halos:
            h.free()
    return n_ops


def _diff(x, want, gids):
    """Where ``x`` differs from ``want``: (local index, global point, got, wanted), a few."""
    bad = np.flatnonzero((x != want).reshape(len(gids), -1).any(1))
    return [(int(i), int(gids[i]), x[i].tolist(), want[i].tolist()) for i in bad[:4]], bad.size


class _Boom:
    """Stands for a zero-copy or cross-memory-attach path that fails in the middle."""

    def __getattr__(self, name):
        def boom(*a, **kw):
            raise Injected(f"injected fault on rank {R} inside a Halo call")
        return boom


def _inject(halo):
    """Make this rank raise in the middle of the Halo's next call (after it started), on
    whichever path it takes (packed, zero copy, cross-memory attach)."""
    t = halo._transport
    for name in ("run", "begin"):
        setattr(t, name, _Boom().run)
    halo._zero_copy = lambda *a: _Boom()
    if halo._cma:
        halo._cma = _Boom()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sequences", type=int, default=10)
    ap.add_argument("--ops", type=int, default=100)
    ap.add_argument("--node-size", type=int, default=None)
    ap.add_argument("--max-delay-us", type=float, default=300.0)
    ap.add_argument("--fault", action="store_true")
    ap.add_argument("--only", type=int, default=None, help="run only sequence number ONLY")
    a = ap.parse_args()
    failed = passed = ops = 0
    worst = 0.0
    t0 = time.perf_counter()
    for i in range(a.sequences):
        if a.only is not None and i != a.only:
            continue
        seed = a.seed * 100003 + i
        global FIRED
        FIRED = False
        try:
            ops += sequence(seed, a.ops, a.node_size, a.max_delay_us, a.fault)
            err = None
        except Injected as e:
            err = f"INJECTED {e}"
        except Exception:
            err = traceback.format_exc()
        raised_at = RAISED_AT  # one machine: one clock
        errs = comm.allgather(err)
        # a rank that failed (as it must) before reaching the faulty operation never drew it
        fired = comm.allreduce(FIRED, op=MPI.LOR)
        times = comm.allgather(raised_at)
        if a.fault and fired:
            # every rank must have raised: the injected rank its fault, the others an error
            spread = max(times) - min(times)
            ok = all(errs) and spread < 2.0
            worst = max(worst, spread)
            if R == 0 and not ok:
                print(f"sequence {seed}: a rank returned normally after the fault: {errs}", flush=True)
            if not ok:
                failed += 1
            else:
                passed += 1
            if R == 0:
                kinds = sorted({(e.splitlines()[-1].split(":")[0] if e else "ok") for e in errs})
                print(f"sequence {seed}: fault -> {kinds}, every rank raised within "
                      f"{spread:.3f} s", flush=True)
            # a broken HybridComm was freed by the context manager; nothing else is pending
            continue
        bad = [(r, e) for r, e in enumerate(errs) if e]
        if bad:
            failed += 1
            if R == 0:
                print(f"sequence {seed}: FAILED", flush=True)
                for r, e in bad:
                    print(f"--- rank {r}:\n{e}", flush=True)
        else:
            passed += 1
    if R == 0:
        slowest = f", slowest error {worst:.3f} s after the first" if a.fault else ""
        print(f"SUMMARY: {passed} passed, {failed} failed ({ops} operations on rank 0, "
              f"{time.perf_counter() - t0:.1f} s{slowest})", flush=True)
    comm.Barrier()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
