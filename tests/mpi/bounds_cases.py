"""The bounds adversary: offsets, ranks, counts and sizes that wrap a C bounds check or an int64.

Every bad call must raise (IndexError, ValueError or TypeError naming this rank, the target and
the offending value) before anything is touched: after each batch, the parts of the object and of
its neighbours in the arena (filled with random data, a GlobalMemory just before and one just
after) hold what they held, a Get's output buffer too, and the object still works (random puts
and gets by every path, numpy integers as ranks and offsets).  A bounds check written
``off + n > count`` in signed C passes ``off = 2**63 - 8, n = 8`` and writes 64 bytes before the
target's part: into the neighbour's last elements.

Usage: python -m mpi4py bounds_cases.py [--node-size K] [--only ...]
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _harness import main
from globalmem_cases import fresh

from hybridmpi import Coarray, GlobalMemory, HybridComm
from hybridmpi.comm.arena import MAX_BYTES

REGION = 128  # the arena's rounding: a neighbour of whole regions ends where the next part begins
DTYPES = [np.int64, np.float32, np.complex128, np.uint8]


def make_hc(comm, cfg):
    return HybridComm(comm, node_size=cfg["node_size"])


def bad_offsets(count):
    """(offset, elements, exception) for a target part of ``count`` elements."""
    u64, i64 = np.uint64, np.int64
    return [
        (2**63 - 1, 1, IndexError), (2**63 - 8, 8, IndexError), (2**63 - 1, 8, IndexError),
        (2**63 - 2, 3, IndexError), (2**63, 1, IndexError), (2**64 - 1, 1, IndexError),
        (2**64, 0, IndexError), (2**62, 1, IndexError), (2**61, 2, IndexError),
        (u64(2**64 - 1), 1, IndexError), (u64(2**63), 1, IndexError), (u64(2**63 - 8), 8, IndexError),
        (i64(2**63 - 1), 1, IndexError), (i64(2**63 - 8), 8, IndexError),
        (-1, 1, IndexError), (-8, 8, IndexError), (-2**63, 1, IndexError), (-2**64, 1, IndexError),
        (i64(-1), 1, IndexError), (i64(-2**63), 8, IndexError),
        (count + 1, 0, IndexError), (count, 1, IndexError), (max(count - 1, 0), 2, IndexError),
        (0, count + 1, IndexError), (u64(count), 1, IndexError),
        (True, 1, TypeError), (np.True_, 1, TypeError), (1.0, 1, TypeError),
        (np.float64(0), 1, TypeError), ("0", 1, TypeError), (None, 1, TypeError),
    ]


def bad_ranks(size):
    """(rank, exception) for a communicator of ``size`` ranks."""
    return [(size, ValueError), (-1, ValueError), (2**63 - 1, ValueError), (-2**63, ValueError),
            (2**64, ValueError), (np.uint64(2**64 - 1), ValueError), (np.int64(-1), ValueError),
            (True, TypeError), (np.True_, TypeError), (1.0, TypeError), ("0", TypeError)]


def shown(v):
    """How a message shows an offending int (numpy ints as Python's; nothing for the rest)."""
    return str(int(v)) if isinstance(v, (int, np.integer)) and not isinstance(v, bool) else ""


class Guarded:
    """A GlobalMemory (or Coarray) between two GlobalMemory neighbours in the arena, every part
    of all three random, and the checks that a bad call touched none of them.

    Failures are collected and raised together by :meth:`check`, on every rank, so that ranks
    never leave a collective sequence at different points."""

    def __init__(self, hc, rng, dtype, count=None, shape=None):
        self.hc, self.rng, self.dtype = hc, rng, np.dtype(dtype)
        self.errors = []
        per = REGION // self.dtype.itemsize
        self.before = GlobalMemory(hc, per * int(rng.integers(1, 4)), dtype)
        if shape is None:
            self.a = None
            self.mem = GlobalMemory(hc, count, dtype)
        else:
            self.a = Coarray(hc, shape, dtype)
            self.mem = self.a.mem
        self.after = GlobalMemory(hc, per * int(rng.integers(1, 4)), dtype)
        it = self.dtype.itemsize
        for r in range(hc.size):  # the test means something only if the parts touch
            end = self.before._disp[r] + self.before.counts[r] * it
            if self.mem.counts[r]:  # (an empty part has no place)
                assert self.mem._disp[r] == end, (r, self.mem._disp, self.before._disp)
                end += -(-self.mem.counts[r] * it // REGION) * REGION
            assert self.after._disp[r] == end, (r, self.after._disp, end)
        self.fill()

    def objects(self):
        return (self.before, self.mem, self.after)

    def fill(self):
        """Fresh random data in every part of the three; every rank learns the guarded object's."""
        self.mem.sync_all()  # no rank reads them any more
        for m in self.objects():
            m.local[...] = fresh(self.rng, self.dtype, m.local.size)
        self.mem.sync_all()
        self.saved = [m.local.copy() for m in self.objects()]
        self.parts = self.hc.comm.allgather(self.mem.local.copy())

    def fail(self, text):
        self.errors.append(f"rank {self.hc.rank}: {text}")

    def expect(self, exc, what, call, *args, names=(), who=None):
        """``call(*args)`` must raise ``exc`` naming rank ``who`` (default: this rank; the
        offending one of a collective call) and ``names`` in its message."""
        try:
            call(*args)
        except exc as e:
            text = str(e)
            who = self.hc.rank if who is None else who
            missing = [w for w in (f"rank {who}", *names) if w and w not in text]
            if missing:
                self.fail(f"{what}{args[1:]!r}: the {exc.__name__} does not name {missing}: {text}")
        except Exception as e:
            self.fail(f"{what}{args[1:]!r} raised {type(e).__name__} ({e}), not {exc.__name__}")
        else:
            self.fail(f"{what}{args[1:]!r} raised no {exc.__name__}")

    def check(self, where):
        """Every part of the three holds what it held (after every rank's calls); all ranks agree."""
        self.mem.sync_all()
        for name, m, old in zip(("before", "guarded", "after"), self.objects(), self.saved):
            if not np.array_equal(m.local, old):
                bad = np.flatnonzero(m.local.reshape(-1) != old.reshape(-1))
                self.fail(f"{where}: the {name} part of rank {self.hc.rank} changed at {bad[:8]}")
        everyone = self.hc.comm.allgather(self.errors)
        self.errors = []
        text = [e for errs in everyone for e in errs]
        assert not text, f"{len(text)} failures:\n" + "\n".join(text[:20])

    def works(self):
        """Random puts (Put, Rput; int, numpy int ranks and offsets) of the elements this rank owns
        (i % size == rank) in every part, then a Get or Rget of every whole part, against a model."""
        hc, mem, dt = self.hc, self.mem, self.dtype
        p, me = hc.size, hc.rank
        mine = [fresh(self.rng, dt, len(range(me, mem.counts[t], p))) for t in range(p)]
        reqs = []
        for t in range(p):
            for i, off in enumerate(range(me, mem.counts[t], p)):
                one = mine[t][i:i + 1]
                how = (i + t) % 4
                if how == 0:
                    mem.Put(one, t, off)
                elif how == 1:
                    mem.Put(one, np.int64(t), np.uint64(off))
                elif how == 2:
                    reqs.append(mem.Rput(one, np.int32(t), np.int64(off)))
                else:
                    mem.Put(one, t, np.uint8(off) if off < 256 else off)
        for r in reqs:
            r.wait()
        mem.sync_all()
        every = hc.comm.allgather(mine)
        for t in range(p):
            want = np.empty(mem.counts[t], dt)
            for w in range(p):
                want[w::p] = every[w][t]
            out = fresh(self.rng, dt, mem.counts[t])
            if t % 2:
                mem.Rget(out, t, np.uint64(0)).wait()
            else:
                mem.Get(out, t)
            if not np.array_equal(out, want):
                self.fail(f"works: rank {t}'s part reads {out[:4]}..., not {want[:4]}...")
        self.fill()

    def free(self):
        for m in (self.before, self.a if self.a is not None else self.mem, self.after):
            m.free()


def case_offsets(comm, rng, **cfg):
    """Put, Get, Rput and Rget at offsets that wrap an int64 sum, or a product by the item size,
    or are no ints at all, to every rank; valid edges (length 0 at the end, numpy ints) work."""
    with make_hc(comm, cfg) as hc:
        for dtype in DTYPES:
            g = Guarded(hc, rng, dtype, int(rng.integers(0, 24)))
            mem = g.mem
            for t in range(hc.size):
                c = mem.counts[t]
                for off, n, exc in bad_offsets(c):
                    names = (f"rank {t}'s part", shown(off)) if exc is IndexError else ()
                    data = fresh(rng, dtype, n)
                    g.expect(exc, "Put", mem.Put, data, t, off, names=names)
                    g.expect(exc, "Rput", mem.Rput, data, t, off, names=names)
                    for what, call in (("Get", mem.Get), ("Rget", mem.Rget)):
                        out = fresh(rng, dtype, n)
                        keep = out.copy()
                        g.expect(exc, what, call, out, t, off, names=names)
                        if not np.array_equal(out, keep):
                            g.fail(f"{what} at offset {off!r} of rank {t} wrote into its output")
                g.check(f"{np.dtype(dtype).name}, target {t}")
                # the edges that are valid
                mem.Put(fresh(rng, dtype, 0), t, c)
                mem.Get(np.empty(0, dtype), t, np.uint64(c))
                mem.Rget(np.empty(0, dtype), np.int64(t), c).wait()
                out = np.empty(c, dtype)
                mem.Get(out, t, np.int64(0))
                if not np.array_equal(out, g.parts[t]):
                    g.fail(f"Get of rank {t}'s whole part")
                if c:
                    mem.Get(out[:1], np.uint64(t), np.uint64(c - 1))
                    if out[0] != g.parts[t][-1]:
                        g.fail(f"Get of rank {t}'s last element")
                g.check(f"{np.dtype(dtype).name}, target {t}, valid edges")
            g.works()
            g.check(f"{np.dtype(dtype).name}, after works()")
            g.free()


def case_ranks(comm, rng, **cfg):
    """Every call that takes a rank, with ranks outside the communicator or of the wrong type."""
    with make_hc(comm, cfg) as hc:
        g = Guarded(hc, rng, np.int64, int(rng.integers(1, 24)))
        mem, data, out = g.mem, fresh(rng, np.int64, 1), np.empty(1, np.int64)
        for rank, exc in bad_ranks(hc.size):
            names = (shown(rank),)
            for what, call, args in (("Put", mem.Put, (data, rank)), ("Get", mem.Get, (out, rank)),
                                     ("Rput", mem.Rput, (data, rank, 0)), ("Rget", mem.Rget, (out, rank)),
                                     ("fetch_add", mem.fetch_add, (rank, 0, 1)),
                                     ("compare_swap", mem.compare_swap, (rank, 0, 0, 1)),
                                     ("local_view", mem.local_view, (rank,)), ("flush", mem.flush, (rank,))):
                g.expect(exc, what, call, *args, names=names)
        g.check("bad ranks")
        g.works()
        g.check("after works()")
        g.free()


def case_atomics(comm, rng, **cfg):
    """fetch_add and compare_swap at bad offsets, and with values outside an int64 or not ints;
    numpy ints work; then every rank adds to and swaps the elements it owns."""
    with make_hc(comm, cfg) as hc:
        g = Guarded(hc, rng, np.int64, int(rng.integers(1, 24)))
        mem, p, me = g.mem, hc.size, hc.rank
        for t in range(p):
            for off, _, exc in bad_offsets(mem.counts[t]):
                if exc is IndexError and isinstance(off, (int, np.integer)) and 0 <= off < mem.counts[t]:
                    continue  # a valid element (an entry about a longer range)
                names = (f"rank {t}'s part", shown(off)) if exc is IndexError else ()
                g.expect(exc, "fetch_add", mem.fetch_add, t, off, 1, names=names)
                g.expect(exc, "compare_swap", mem.compare_swap, t, off, 0, 1, names=names)
            for v, exc in ((2**63, ValueError), (-2**63 - 1, ValueError), (2**64 - 1, ValueError),
                           (np.uint64(2**64 - 1), ValueError), (True, TypeError), (1.5, TypeError),
                           (np.float64(1), TypeError), (None, TypeError)):
                names = (shown(v),)
                g.expect(exc, "fetch_add", mem.fetch_add, t, 0, v, names=names)
                g.expect(exc, "compare_swap", mem.compare_swap, t, 0, v, 1, names=names)
                g.expect(exc, "compare_swap", mem.compare_swap, t, 0, 1, v, names=names)
            g.check(f"atomics on rank {t}")
        # each rank adds to its own elements of every part, then swaps them back
        adds = [rng.integers(-2**40, 2**40, len(range(me, mem.counts[t], p))) for t in range(p)]
        for t in range(p):
            for i, off in enumerate(range(me, mem.counts[t], p)):
                old = mem.fetch_add(np.int64(t), np.uint64(off), np.int64(adds[t][i]))
                if old != g.parts[t][off]:
                    g.fail(f"fetch_add on rank {t} element {off} saw {old}, not {g.parts[t][off]}")
                if i % 2:
                    got = mem.compare_swap(t, np.int32(off), old + int(adds[t][i]), np.int64(old))
                    if got != old + adds[t][i]:
                        g.fail(f"compare_swap on rank {t} element {off} saw {got}")
                    adds[t][i] = 0
        mem.sync_all()
        every = comm.allgather(adds)
        want = g.parts[me].copy()
        for w in range(p):
            want[w::p] += every[w][me]
        if not np.array_equal(mem.local, want):
            g.fail("fetch_add and compare_swap: this rank's part is not the sum")
        g.saved[1] = mem.local.copy()
        g.check("after the atomics")
        g.fill()
        g.works()
        g.check("after works()")
        g.free()


def case_coarray(comm, rng, **cfg):
    """Coarray indices beyond an int64, past the shape, of the wrong type, and images out of
    range, for a[r][i], a[r][i] = v, Rput and Rget; huge slice bounds and numpy ints work."""
    with make_hc(comm, cfg) as hc:
        g = Guarded(hc, rng, np.float64, shape=(4, 5))
        a = g.a
        bad = [(2**63 - 1, IndexError), (2**63, IndexError), (2**64 - 1, IndexError),
               (np.uint64(2**64 - 1), IndexError), (np.int64(2**63 - 1), IndexError),
               (-2**63, IndexError), (np.int64(-2**63), IndexError), (4, IndexError), (-5, IndexError),
               ((0, 5), IndexError), ((0, 2**63 - 1), IndexError), ((3, 2**64), IndexError),
               ((0, 0, 0), IndexError), (1.0, TypeError), ((0, 1.0), TypeError), (True, TypeError),
               (np.True_, TypeError), ([0, 1], TypeError), (None, TypeError),
               (slice(0.5, 2), TypeError), (slice(None, None, 0), ValueError)]
        out = fresh(rng, np.float64, 5)
        for t in range(hc.size):
            for idx, exc in bad:
                g.expect(exc, "a[r][index]", lambda t, i: a[t][i], t, idx)
                g.expect(exc, "a[r][index] = v", a[t].__setitem__, idx, 1.0)
                g.expect(exc, "Coarray.Rput", a.Rput, t, idx, 1.0)
                keep = out.copy()
                g.expect(exc, "Coarray.Rget", a.Rget, t, idx, out)
                if not np.array_equal(out, keep):
                    g.fail(f"Coarray.Rget of {idx!r} wrote into its output")
            g.check(f"coarray indices on rank {t}")
        for rank, exc in bad_ranks(hc.size):
            g.expect(exc, "a[rank]", lambda r: a[r], rank, names=(shown(rank),))
            g.expect(exc, "Coarray.Rput", a.Rput, rank, 0, 1.0, names=(shown(rank),))
            g.expect(exc, "Coarray.Rget", a.Rget, rank, 0, out, names=(shown(rank),))
        g.check("coarray images")
        for t in range(hc.size):  # valid: huge slice bounds clamp, numpy ints index
            want = g.parts[t].reshape(4, 5)
            for idx in (slice(0, 2**70), slice(-2**63, None), slice(2**63 - 8, None),
                        (np.uint64(1), slice(None, 2**64)), (np.int64(-1), np.uint8(4)), np.int32(2)):
                got = a[np.int64(t)][idx]
                if not np.array_equal(got, want[idx]):
                    g.fail(f"a[{t}][{idx!r}] read {got}, not {want[idx]}")
        g.check("coarray valid indices")
        g.works()
        g.check("after works()")
        g.free()


def case_sizes(comm, rng, **cfg):
    """GlobalMemory counts, Coarray shapes and arena sizes that are negative, not ints, beyond an
    int64, or whose bytes wrap: raised on every rank, nothing allocated, nothing touched."""
    with make_hc(comm, cfg) as hc:
        g = Guarded(hc, rng, np.float64, int(rng.integers(1, 24)))
        arena = hc.arena

        def held():
            return sum(c.live for c in arena.chunks), arena.windows

        start = held()
        counts = [(-1, ValueError), (-2**63, ValueError), (2**63, ValueError), (2**64 - 1, ValueError),
                  (np.uint64(2**64 - 1), ValueError), (np.int64(-1), ValueError),
                  (2**61, ValueError),        # 2**64 bytes of float64: wraps to 0 in 64 bits
                  (2**59, MemoryError),       # 2**62 bytes: representable, but no node has them
                  (1.5, TypeError), (True, TypeError), (np.True_, TypeError), ("3", TypeError),
                  (None, TypeError)]
        for count, exc in counts:
            names = (shown(count),) if exc is not MemoryError else ()
            g.expect(exc, "GlobalMemory", GlobalMemory, hc, count, np.float64, names=names, who=0)
        # one rank alone passes a bad count: every rank raises
        g.expect(ValueError, "GlobalMemory", GlobalMemory, hc, -1 if hc.rank == 0 else 4, np.float64,
                 names=("-1",), who=0)
        shapes = [((-1,), ValueError), ((2**32, 2**32), ValueError), ((2**33 + 1, 2**31), ValueError),
                  ((2**63,), ValueError), ((np.uint64(2**64 - 1), 1), ValueError),
                  ((2**40,), MemoryError), ((True,), TypeError), ((1.5, 2), TypeError),
                  (1.5, TypeError)]
        for shape, exc in shapes:
            g.expect(exc, "Coarray", Coarray, hc, shape, np.float64, who=0)
        sizes = [(-1, ValueError), (-2**63, ValueError), (-129, ValueError), (2**63, ValueError),
                 (MAX_BYTES + 1, ValueError), (2**64 - 1, ValueError), (np.uint64(2**64 - 1), ValueError),
                 (np.int64(-1), ValueError), (1.5, TypeError), (True, TypeError), (np.True_, TypeError),
                 (None, TypeError)]
        for nbytes, exc in sizes:
            g.expect(exc, "arena.alloc", arena.alloc, nbytes, "the bounds test", names=(shown(nbytes),),
                     who=0)
        g.expect(ValueError, "arena.alloc", arena.alloc, -1 if hc.rank == hc.size - 1 else 256,
                 "the bounds test", names=("-1",), who=hc.size - 1)
        if held() != start:
            g.fail(f"the rejected allocations hold (blocks, windows) {held()}, not {start}")
        g.check("bad sizes")
        block = arena.alloc(np.int64(256), "the bounds test")
        block.free()
        with GlobalMemory(hc, np.uint64(3), np.float64) as m, Coarray(hc, (np.int64(2), 3)) as c:
            assert m.counts == (3,) * hc.size and c.local.shape == (2, 3)
        if held() != start:
            g.fail(f"after valid allocations (blocks, windows) are {held()}, not {start}")
        g.check("valid sizes")
        g.works()
        g.check("after works()")
        g.free()


CASES = [case_offsets, case_ranks, case_atomics, case_coarray, case_sizes]

if __name__ == "__main__":
    main(CASES)
