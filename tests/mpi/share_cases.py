"""hybridmpi.share and Shared: one read-only copy per node, the same bits on every rank.

Usage: python -m mpi4py share_cases.py [--node-size K] [--only ...]
"""

import ctypes
import gc
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _harness import agree, main

import hybridmpi
from hybridmpi import FreedError, HybridComm, Shared, share
from hybridmpi.globalmem import shared as shared_module

#: dtypes a user shares: numbers of every kind and byte order, strings, times, records
DTYPES = ["<f8", ">f4", "i1", "?", "<c8", "S5", "<U3", "M8[s]", "<u8",
          [("a", "<i4"), ("b", ">f8", (2,)), ("c", "S2")]]
SHAPES = [(), (0,), (7,), (3, 4), (2, 0, 3), (5, 2, 3)]


def make_hc(comm, cfg):
    return HybridComm(comm, node_size=cfg["node_size"])


def made(seed, dtype, shape):
    """The same array on every rank from ``seed``: random bytes (every bit pattern), except
    where numpy would read them as something else (bools 0/1, strings' padding)."""
    dt = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, int(np.prod(shape)) * dt.itemsize, dtype=np.uint8)
    a = raw.view(np.uint8).copy().view(dt).reshape(shape) if dt.itemsize else np.zeros(shape, dt)
    if dt.kind == "b":
        a = (raw[:a.size] & 1).astype(bool).reshape(shape)
    elif dt.kind == "U":
        a = rng.choice(np.array(["ab", "\u00e9", "xyz", ""], dtype=dt), size=shape)
    return a


def check_same(got, want, where):
    """Bits, dtype and shape equal; read-only, in a way numpy will not undo; C order."""
    assert got.dtype == want.dtype and got.shape == want.shape, (where, got.dtype, got.shape)
    assert got.tobytes() == np.ascontiguousarray(want).tobytes(), where
    assert not got.flags.writeable and got.flags.c_contiguous, where
    try:
        got.flags.writeable = True
    except ValueError:
        pass
    else:
        raise AssertionError(f"{where}: numpy made a shared array writeable")


def node_peers(hc):
    """Whether each rank shares this rank's node."""
    return [r in hc.node_ranks for r in range(hc.size)]


def case_every_dtype_and_shape(comm, rng, **cfg):
    """Every dtype and shape, from every root, reaches every rank with the root's bits, read-only
    (Fortran order and strided inputs come back in C order)."""
    with make_hc(comm, cfg) as hc:
        for i, dtype in enumerate(DTYPES):
            for j, shape in enumerate(SHAPES):
                root = (i + j) % hc.size
                want = made([i, j], dtype, shape)
                x = want
                if hc.rank == root and len(shape) == 2:
                    x = np.asfortranarray(want)
                elif hc.rank == root and len(shape) == 3 and shape[0] == 5:
                    x = np.repeat(want, 2, axis=0)[::2]     # a strided view
                got = share(x if hc.rank == root else None, root=root, comm=hc)
                check_same(got, want, f"dtype {dtype} shape {shape} root {root}")
                view = got.reshape(-1)[::2] if got.size else got
                assert not view.flags.writeable


def case_one_copy_per_node(comm, rng, **cfg):
    """The ranks of a node read one copy: a byte stored under it (behind numpy's back, by the
    node's leader) shows on every rank of that node, and each node has a copy of its own."""
    with make_hc(comm, cfg) as hc:
        s = Shared(np.zeros(4096, np.uint8) if hc.rank == 0 else None, comm=hc)
        a = s.value
        assert s.nbytes == 4096 and not a.flags.writeable
        if hc.is_leader:
            ctypes.memset(a.ctypes.data + 100, hc.node_id + 1, 1)
        comm.Barrier()
        ids, seen = comm.allgather(hc.node_id), comm.allgather(int(a[100]))
        assert seen == [i + 1 for i in ids], (seen, ids)
        assert not a[:100].any() and not a[101:].any()
        s.free()
        assert a[100] == hc.node_id + 1   # kept past free(), with its values


def case_structures(comm, rng, **cfg):
    """A mesh-like dict of lists and tuples, int and str keys, empty containers: the same
    structure (dicts in order, tuples as tuples) of the root's arrays on every rank."""
    with make_hc(comm, cfg) as hc:
        pts, cells = made(1, "<f8", (40, 3)), made(2, "<i8", (30, 4))
        want = {"points": pts, 7: [cells, (pts[:0], {"tags": made(3, "i4", (30,))})], "none": [],
                "empty": {}}
        root = hc.size - 1
        got = share(want if hc.rank == root else None, root=root, comm=hc)
        assert list(got) == ["points", 7, "none", "empty"] and got["none"] == [] and got["empty"] == {}
        assert isinstance(got[7], list) and isinstance(got[7][1], tuple)
        check_same(got["points"], pts, "points")
        check_same(got[7][0], cells, "cells")
        check_same(got[7][1][0], pts[:0], "empty")
        check_same(got[7][1][1]["tags"], want[7][1][1]["tags"], "tags")
        bare = share([] if hc.rank == 0 else None, comm=hc)   # nothing to share: no bytes at all
        assert bare == []


def case_fill_on_root_and_on_nodes(comm, rng, **cfg):
    """fill= runs on the root alone (then the leaders' broadcast) or on one rank of each node
    (nothing between nodes); every rank gets the values, read-only; the mpi4py communicator
    and COMM_WORLD (None) take the drop-ins' HybridComm."""
    with make_hc(comm, cfg) as hc:
        for fill_on, c in (("root", hc), ("node", hc), ("root", comm), ("node", None)):
            calls = []

            def fill(out, calls=calls):
                calls.append(1)
                out["u"][...] = np.arange(24).reshape(2, 12)
                out["v"][...] = 2.5
            root = hc.size - 1
            got = share(shape={"u": (2, 12), "v": (5,)}, dtype={"u": "<i2", "v": ">f8"}, fill=fill,
                        fill_on=fill_on, root=root, comm=c)
            check_same(got["u"], np.arange(24, dtype="<i2").reshape(2, 12), f"u {fill_on}")
            check_same(got["v"], np.full(5, 2.5, dtype=">f8"), f"v {fill_on}")
            who = comm.allgather(len(calls))
            ref = hc if c is hc else hybridmpi.hybrid(c)
            leaders = comm.allgather(ref.is_leader)
            want = [int(r == root) for r in range(hc.size)] if fill_on == "root" else \
                [int(x) for x in leaders]
            assert who == want, (fill_on, who, want)




def raises_everywhere(comm, cls, words, call):
    """``call()`` raises ``cls`` on every rank, its message holding ``words``."""
    try:
        call()
    except cls as e:
        assert words in str(e), (words, str(e))
        got = cls.__name__
    except Exception as e:  # noqa: BLE001 - reported below, on every rank
        got = f"{type(e).__name__}: {e}"
    else:
        got = "no exception"
    everyone = comm.allgather(got)
    assert everyone == [cls.__name__] * comm.size, (words, everyone)


def shm_files():
    """The /dev/shm files this process maps (other jobs on the machine make their own)."""
    with open("/proc/self/maps") as f:
        return sorted({line.split()[-1] for line in f if "/dev/shm/" in line})


def case_bad_input_same_error_everywhere(comm, rng, **cfg):
    """Every bad input, on one rank or on all, raises the same class on every rank before any
    memory is taken, and the comm goes on: the next share works and nothing is left over."""
    with make_hc(comm, cfg) as hc:
        me, p = hc.rank, hc.size
        last = p - 1
        loop = []
        loop.append(loop)
        good = np.arange(5.0)

        def bad_fill(out):
            raise KeyError("no such table")
        cases = [
            (TypeError, "passed None", lambda: share(None, comm=hc)),
            (TypeError, "Python objects", lambda: share(np.array([1, "a"], dtype=object) if me == 0 else None,
                                                         comm=hc)),
            (TypeError, "Python objects", lambda: share(np.zeros(2, [("a", "O")]) if me == 0 else None,
                                                         comm=hc)),
            (TypeError, "is a float", lambda: share([1.0, 2.0] if me == 0 else None, comm=hc)),
            (TypeError, "a dict key", lambda: share({(1, 2): good} if me == 0 else None, comm=hc)),
            (ValueError, "nested deeper", lambda: share(loop if me == 0 else None, comm=hc)),
            (ValueError, "out of range", lambda: share(good, root=p, comm=hc)),
            (ValueError, "out of range", lambda: share(good if me == 0 else None,
                                                        root=-1 if me == last else 0, comm=hc)),
            (TypeError, "root must be an int", lambda: share(good, root=0.0 if me == last else 0, comm=hc)),
            (ValueError, "different roots", lambda: share(good, root=me, comm=hc)) if p > 1 else None,
            (ValueError, "different shapes", lambda: share(shape=(3 + (me == last and p > 1),), fill=bad_fill,
                                                            comm=hc)) if p > 1 else None,
            (ValueError, "negative dimension", lambda: share(shape=(4, -1 if me == last else 1),
                                                              fill=bad_fill, comm=hc)),
            (TypeError, "fill must be callable", lambda: share(shape=(4,), fill=7 if me == last else bad_fill,
                                                               comm=hc)),
            (ValueError, "fill_on", lambda: share(shape=(4,), fill=bad_fill, fill_on="everywhere", comm=hc)),
            (TypeError, "two forms", lambda: share(good, shape=(4,), fill=bad_fill, comm=hc)),
            (KeyError, "no such table", lambda: share(shape=(4,), fill=bad_fill, root=last, comm=hc)),
            (KeyError, "no such table", lambda: share(shape=(4,), fill=bad_fill, fill_on="node", comm=hc)),
            # 2**65 bytes, and 1 TiB, seen through a zero stride: refused before anything is taken
            (ValueError, "more than", lambda: share(np.broadcast_to(np.zeros(1, np.uint8), (2**31, 2**31 + 1))
                                                    if me == 0 else None, comm=hc)),
            (MemoryError, "MiB free", lambda: share(np.broadcast_to(np.zeros(1, np.uint8), (2**40,))
                                                    if me == last else None, root=last, comm=hc)),
        ]
        before = shm_files()
        for item in filter(None, cases):
            blocks = hc.arena.blocks
            raises_everywhere(comm, *item)
            if item[0] is KeyError:   # fill ran in the memory taken for it, given back
                assert sum(c.live for c in hc.arena.chunks) == 0, item[1]
            else:                     # refused before any memory was taken
                assert hc.arena.blocks == blocks, item[1]
        os.environ["HYBRIDMPI_SHM_LIMIT"] = str(2**20)
        try:
            raises_everywhere(comm, MemoryError, "MiB free",
                              lambda: share(np.zeros(2**18) if me == 0 else None, comm=hc))
        finally:
            del os.environ["HYBRIDMPI_SHM_LIMIT"]
        got = share(good if me == last else None, root=last, comm=hc)   # the comm goes on
        check_same(got, good, "after the errors")
        assert shm_files() == before or len(shm_files()) <= len(before), (before, shm_files())


#: share/free cycles of the soak below, on one node and across nodes (where each of a cycle's
#: agreements crosses the MPI's network path: 50 ms a cycle at 4 ranks on 2 cores); the deep run's
#: 10,000 on one node
DEEP = os.environ.get("HYBRIDMPI_TEST_DEEP") == "1"
CYCLES = (10000, 1000) if DEEP else (400, 60)


def case_lifetime_and_cycles(comm, rng, **cfg):
    """Arrays keep their values past free() and the comm's free and never see a later object's
    bytes; CYCLES share/free cycles leave the windows, /dev/shm and RSS where they were."""
    kept = []
    with make_hc(comm, cfg) as hc:
        for k in range(3):
            with Shared(np.full(5000, k, np.int64) if hc.rank == 0 else None, comm=hc) as s:
                kept.append(s.value)
        later = share(np.full(5000, 99, np.int64) if hc.rank == 0 else None, comm=hc)
        for k, a in enumerate(kept):
            assert (a == k).all(), k
        s = Shared(np.arange(100.0) if hc.rank == 0 else None, comm=hc)
        cycles = CYCLES[hc.num_nodes > 1]
        for _ in range(cycles // 4):   # warm: the arena's chunk and MPI's caches
            Shared(np.arange(100.0) if hc.rank == 0 else None, comm=hc).free()
        gc.collect()
        windows, files = hc.arena.windows, len(shm_files())
        rss = rss_kib()
        for i in range(cycles):
            t = Shared(np.full(1000, i, np.int32) if hc.rank == 0 else None, comm=hc)
            assert t.value[-1] == i
            t.free()
        gc.collect()
        grown = rss_kib() - rss
        assert hc.arena.windows == windows and len(shm_files()) == files, (hc.arena.windows, windows)
        assert grown < 4096, f"RSS grew by {grown} KiB over {cycles} cycles"
        raises_everywhere(comm, FreedError, "after free()", lambda: t.value)
        raises_everywhere(comm, FreedError, "after free()", lambda: t.update(None))
        t.free()   # idempotent
        kept.append(s.value)
    assert (later == 99).all() and (kept[-1] == np.arange(100.0)).all()   # past the comm's free
    raises_everywhere(comm, FreedError, "freed HybridComm", lambda: share(np.zeros(1), comm=hc))


def rss_kib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))


def case_update_free_running(comm, rng, **cfg):
    """update() with ranks arriving at random times: a rank that has not called yet reads the
    old values whole, and every rank reads the new values whole once its call returns; a
    refused update (another shape) and a fill that raises leave the old values."""
    with make_hc(comm, cfg) as hc:
        n, root = 3000, hc.size - 1
        with Shared(np.zeros(n) if hc.rank == root else None, root=root, comm=hc) as s:
            a = s.value
            for k in range(1, 25):
                time.sleep(rng.uniform(0, 0.004))
                assert (a == k - 1).all(), f"round {k}: a mix before the call"
                if k % 3:
                    s.update(np.full(n, float(k)) if hc.rank == root else None)
                else:
                    s.update(fill=lambda out, k=k: out.fill(k))
                assert (a == k).all(), f"round {k}: a mix after the call"
            raises_everywhere(comm, ValueError, "differ from the shared",
                              lambda: s.update(np.zeros(n + 1) if hc.rank == root else None))

            def half(out):
                out[: n // 2] = -1.0
                raise OSError("the file went away")
            raises_everywhere(comm, OSError, "went away", lambda: s.update(fill=half))
            assert (a == 24).all()
            s.update(np.full(n, 5.0) if hc.rank == root else None)
            assert (a == 5).all()
        agree(comm, float(a.sum()))


def case_large_in_pieces(comm, rng, **cfg):
    """The leaders' broadcast in pieces (a piece of 4,099 bytes here) delivers every byte of an
    array of an odd size, from a root that is not a leader where there is one."""
    old = shared_module.PIECE_BYTES
    shared_module.PIECE_BYTES = 4099
    try:
        with make_hc(comm, cfg) as hc:
            want = made(9, "u1", (100_003,))
            root = hc.size - 1
            check_same(share(want if hc.rank == root else None, root=root, comm=hc), want, "pieces")
            got = share(shape=(3, 33_335), dtype="<f4", fill=lambda o: o.__setitem__(..., 1.5), root=root,
                        comm=hc)
            check_same(got, np.full((3, 33_335), 1.5, "<f4"), "pieces, fill")
    finally:
        shared_module.PIECE_BYTES = old


class ReaderError(Exception):
    """A user's exception class (not Python's own)."""


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no str")

    __repr__ = __str__


def case_outside_review_findings(comm, rng, **cfg):
    """What an outside review of share found (F1-F8), each the same outcome on every rank:
    a fill's exception that cannot be printed, or whose class is the user's; a record or
    subarray dtype and an unsized string in the fill form; a malformed HYBRIDMPI_SHM_LIMIT on
    one rank; the pages under arrays kept past free() of a large share given back."""
    with make_hc(comm, cfg) as hc:
        me, last = hc.rank, hc.size - 1

        def unprintable(out):
            raise Unprintable()

        def reader(out):
            raise ReaderError("table.h5 is corrupt")
        raises_everywhere(comm, RuntimeError, "Unprintable",
                          lambda: share(shape=(3,), fill=unprintable, root=last, comm=hc))
        raises_everywhere(comm, RuntimeError, "ReaderError",
                          lambda: share(shape=(3,), fill=reader, root=last, comm=hc))
        got = share(shape=(4,), dtype=("<f8", (3,)), fill=lambda o: o.__setitem__(..., 2.0), comm=hc)
        check_same(got, np.full((4, 3), 2.0), "a subarray dtype")
        rec = np.dtype([("a", "<f8"), ("b", "<i4")])
        got = share(shape=(5,), dtype=[("a", "<f8"), ("b", "<i4")],
                    fill=lambda o: o.__setitem__(..., (1.5, 3)), comm=hc)
        assert got.dtype == rec and (got["b"] == 3).all() and (got["a"] == 1.5).all()
        raises_everywhere(comm, TypeError, "has no size", lambda: share(shape=(2,), dtype="S", fill=print,
                                                                        comm=hc))
        os.environ["HYBRIDMPI_SHM_LIMIT"] = "lots" if me == last else str(2**40)
        try:   # (8 MB: a chunk of its own, whose room is checked)
            raises_everywhere(comm, ValueError, "HYBRIDMPI_SHM_LIMIT='lots'",
                              lambda: share(np.zeros(2**20) if me == 0 else None, comm=hc))
        finally:
            del os.environ["HYBRIDMPI_SHM_LIMIT"]
        grown = []   # RSS over windows of large shares kept past free(): a leak grows in each
        windows, each = (4, 25) if hc.num_nodes == 1 else (3, 15)
        for _ in range(windows):
            rss = rss_kib()
            for _ in range(each):
                s = Shared(np.zeros(600_000) if me == 0 else None, comm=hc)   # 4.8 MB: a chunk of its own
                keep = s.value
                s.free()
                del keep
            gc.collect()
            grown.append(rss_kib() - rss)
        # (pages given back one by one through libc's munmap: 190 KiB a share, 2.8 MB a window
        # of 15; the first window also warms the MPI's caches)
        assert min(grown) < 2000, f"RSS grew by {grown} KiB in windows of {each} large shares kept past free"


def case_interrupted_fill(comm, rng, **cfg):
    """A fill interrupted on the root (KeyboardInterrupt) raises it there and PeerError on every
    other rank, which waited for the values: nobody hangs; the comm is unusable, as documented."""
    hc = make_hc(comm, cfg)

    def interrupted(out):
        raise KeyboardInterrupt
    try:
        share(shape=(3,), fill=interrupted, root=hc.size - 1, comm=hc)
    except KeyboardInterrupt:
        got = "KeyboardInterrupt"
    except hybridmpi.PeerError:
        got = "PeerError"
    else:
        got = "nothing"
    everyone = comm.allgather(got)
    assert everyone == ["PeerError"] * (hc.size - 1) + ["KeyboardInterrupt"], everyone
    hc.free()


def case_many_live(comm, rng, **cfg):
    """Thousands of shares alive at once (the deep run: the 10,001st), each with its values;
    each allocation's agreement no longer names the live ones (an outside review's finding)."""
    with make_hc(comm, cfg) as hc:
        n = 10_001 if DEEP else 1_500 if hc.num_nodes == 1 else 200   # (across nodes: 20 ms a share)
        live = [share(np.array([i, -i]) if hc.rank == 0 else None, comm=hc) for i in range(n)]
        assert all(a[0] == i and a[1] == -i for i, a in enumerate(live))


CASES = [case_every_dtype_and_shape, case_one_copy_per_node, case_structures,
         case_fill_on_root_and_on_nodes, case_bad_input_same_error_everywhere,
         case_lifetime_and_cycles, case_update_free_running, case_large_in_pieces,
         case_outside_review_findings, case_interrupted_fill, case_many_live]

if __name__ == "__main__":
    main(CASES)
