"""Every invalid call of the public API: the exception and message each gets, on every rank.

    python -m mpi4py errors_cases.py [--markdown docs/errors.md]

Each case runs on every rank; the call must raise the listed exception,
whose message contains the listed words, on every rank (a collective error
is never left to one rank).  With --markdown, rank 0 writes the table of
docs/errors.md from the messages actually raised (tests compare it with the
committed file at 2 ranks).
"""

import argparse
import copy
import sys

import numpy as np
from mpi4py import MPI

import hybridmpi
from hybridmpi import Coarray, FreedError, GhostPattern, GlobalMemory, Halo, HybridComm, PatternError
from hybridmpi.tools import mesh

comm = MPI.COMM_WORLD
R, P = comm.rank, comm.size
OTHER, SRC = (R + 1) % P, (R - 1) % P


def world():
    hc = HybridComm(comm)
    owned = np.arange(R * 10, R * 10 + 10)
    ghosts = np.array([OTHER * 10]) if P > 1 else np.zeros(0, np.int64)
    pat = GhostPattern.from_global(hc, owned, ghosts)
    return hc, owned, ghosts, pat


HC, OWNED, GHOSTS, PAT = world()
HALO = Halo(PAT, block=3)
X = np.zeros((PAT.size, 3))


def freed_hc():
    hc = HybridComm(comm)
    hc.free()
    return hc


def freed_halo():
    h = Halo(PAT)
    h.free()
    return h


def read_only():
    a = np.zeros((PAT.size, 3))
    a.flags.writeable = False
    return a


def begin_twice():
    x = X.copy()
    HALO.update_begin(x)
    try:
        HALO.update_begin(x)
    finally:
        HALO.update_end(x)


def end_other_array():
    x = X.copy()
    HALO.update_begin(x)
    try:
        HALO.update_end(X.copy())
    finally:
        HALO.update_end(x)


def tiny_mesh():
    return mesh.load(hybridmpi.tools.mesh.generate.SHIPPED / "cube-h0.1.vtu")


M = tiny_mesh()
MEM = GlobalMemory(HC, 4)
COUNTER = GlobalMemory(HC, 2, np.int64)
CO = Coarray(HC, (4, 4))
CO_INT = Coarray(HC, (4, 4), np.int64)


def co_int_put(index, values, rank=None):
    CO_INT[OTHER if rank is None else rank][index] = values


def freed_mem():
    m = GlobalMemory(HC, 4)
    m.free()
    return m


def wait_twice():
    req = MEM.Rget(np.empty(2), OTHER)
    req.wait()
    req.wait()


def waitall_twice():
    req = MEM.Rget(np.empty(2), OTHER)
    try:
        hybridmpi.waitall([req, req])
    finally:
        req.wait()


def co_put(index, values):
    CO[OTHER][index] = values

# (area, call as shown in the docs, exception, words its message contains, call, ranks needed)
CASES = [
    ("HybridComm", 'HybridComm("world")', TypeError, "intracommunicator", lambda: HybridComm("world"), 1),
    ("HybridComm", "HybridComm(comm, node_size=0)", ValueError, "node_size must be",
     lambda: HybridComm(comm, node_size=0), 1),
    ("HybridComm", 'HybridComm(comm, memory_order="relaxed")', ValueError, "memory_order",
     lambda: HybridComm(comm, memory_order="relaxed"), 1),
    ("HybridComm", "HybridComm(comm, timeout=-1)", ValueError, "timeout",
     lambda: HybridComm(comm, timeout=-1), 1),
    ("HybridComm", "HybridComm(comm, radix=1)", ValueError, "radix", lambda: HybridComm(comm, radix=1), 1),
    ("HybridComm", "HybridComm(comm, node_size=2 on rank 0 only)", ValueError, "different node_size",
     lambda: HybridComm(comm, node_size=2 if R == 0 else None), 2),
    ("HybridComm", 'hc.barrier(method="butterfly")', ValueError, "barrier method",
     lambda: HC.barrier(method="butterfly"), 1),
    ("HybridComm", 'hc.allreduce("1.0")', TypeError, "unsupported type", lambda: HC.allreduce("1.0"), 1),
    ("HybridComm", 'hc.allreduce(1.0, op="avg")', ValueError, "unknown op",
     lambda: HC.allreduce(1.0, op="avg"), 1),
    ("HybridComm", 'hc.allreduce(1j, op="min")', TypeError, "complex", lambda: HC.allreduce(1j, op="min"), 1),
    ("HybridComm", "hc.allreduce(np.zeros(3, np.int8))", TypeError, "unsupported dtype",
     lambda: HC.allreduce(np.zeros(3, np.int8)), 1),
    ("HybridComm", "hc.Allreduce(x, read_only)", ValueError, "read-only",
     lambda: HC.Allreduce(np.ones(3), _ro(3)), 1),
    ("HybridComm", "hc.Allreduce(np.ones(3), np.empty(4))", ValueError, "differ",
     lambda: HC.Allreduce(np.ones(3), np.empty(4)), 1),
    ("HybridComm", "hc.allreduce(np.ones(rank + 1))  # lengths differ", ValueError,
     "passed different arguments", lambda: HC.allreduce(np.ones(R + 1)), 2),
    ("HybridComm", "hc.barrier() after hc.free()", FreedError, "after free", lambda: freed_hc().barrier(), 1),
    ("HybridComm", "copy.copy(hc)", TypeError, "cannot be copied", lambda: copy.copy(HC), 1),
    ("GhostPattern", "GhostPattern.from_global(None, owned, ghosts)", TypeError, "needs a HybridComm",
     lambda: GhostPattern.from_global(None, OWNED, GHOSTS), 1),
    ("GhostPattern", "from_global: rank 0 lists a ghost nobody owns", PatternError, "is owned by no rank",
     lambda: GhostPattern.from_global(HC, OWNED, np.append(GHOSTS, 10**9) if R == 0 else GHOSTS), 1),
    ("GhostPattern", "from_global: rank 0 lists its own point as a ghost", PatternError,
     "owned by the same rank", lambda: GhostPattern.from_global(
         HC, OWNED, np.append(GHOSTS, OWNED[0]) if R == 0 else GHOSTS), 1),
    ("GhostPattern", "from_global: a ghost listed twice", PatternError, "duplicate ghost id",
     lambda: GhostPattern.from_global(HC, OWNED, np.append(GHOSTS, GHOSTS[:1]) if R == 0 else GHOSTS), 2),
    ("GhostPattern", "from_global: rank 1 also owns rank 0's id 1", PatternError, "is owned by rank",
     lambda: GhostPattern.from_global(HC, np.append(OWNED, 1) if R == 1 else OWNED, GHOSTS), 2),
    ("GhostPattern", "from_global(hc, owned.astype(float), ghosts)", PatternError, "integer array",
     lambda: GhostPattern.from_global(HC, OWNED.astype(float), GHOSTS), 1),
    ("GhostPattern", "GhostPattern(hc, send={next: [0]} on rank 0, [0, 1] elsewhere, recv={prev: [2, 3]})",
     PatternError, "which sends it", lambda: GhostPattern(
         HC, send={OTHER: [0] if R == 0 else [0, 1]}, recv={SRC: [2, 3]}, size=4), 2),
    ("GhostPattern", "GhostPattern(hc, send={next: [0, 7]}, ..., size=4)", PatternError, "out of range",
     lambda: GhostPattern(HC, send={OTHER: [0, 7]}, recv={SRC: [2, 3]}, size=4), 2),
    ("GhostPattern", "GhostPattern(hc, send={rank: [0]}, recv={}, size=2)", PatternError, "itself",
     lambda: GhostPattern(HC, send={R: [0]}, recv={}, size=2), 1),
    ("GhostPattern", "GhostPattern(hc, send={next: [0, 2]}, recv={prev: [2, 3]}, size=4)", PatternError,
     "is a ghost", lambda: GhostPattern(HC, send={OTHER: [0, 2]}, recv={SRC: [2, 3]}, size=4), 2),
    ("Halo", "Halo(pattern, dtype=np.int8)", TypeError, "unsupported dtype",
     lambda: Halo(PAT, dtype=np.int8), 1),
    ("Halo", "Halo(pattern, block=0)", ValueError, "block must be", lambda: Halo(PAT, block=0), 1),
    ("Halo", 'Halo(pattern, method="carrier-pigeon")', ValueError, "unknown method",
     lambda: Halo(PAT, method="carrier-pigeon"), 1),
    ("Halo", 'Halo(pattern, method="flat" on rank 0, "atomic" elsewhere)', ValueError, "different",
     lambda: Halo(PAT, method="flat" if R == 0 else "atomic"), 2),
    ("Halo", "halo.update([0.0] * size)", TypeError, "numpy array", lambda: HALO.update([0.0] * PAT.size), 1),
    ("Halo", "halo.update(x.astype(np.float32))", TypeError, "dtype float32",
     lambda: HALO.update(X.astype(np.float32)), 1),
    ("Halo", "halo.update(np.zeros(size))  # block 3 expected", ValueError, "shape",
     lambda: HALO.update(np.zeros(PAT.size)), 1),
    ("Halo", "halo.update(np.zeros((size, 6))[:, ::2])", ValueError, "C-contiguous",
     lambda: HALO.update(np.zeros((PAT.size, 6))[:, ::2]), 1),
    ("Halo", "halo.update(read_only_array)", ValueError, "read-only", lambda: HALO.update(read_only()), 1),
    ("Halo", 'halo.reverse(x, op="mul")', ValueError, "op must be",
     lambda: HALO.reverse(X.copy(), op="mul"), 1),
    ("Halo", 'Halo(pattern, dtype=complex).reverse(z, op="min")', TypeError, "not defined for complex",
     lambda: Halo(PAT, dtype=np.complex128).reverse(np.zeros(PAT.size, complex), op="min"), 1),
    ("Halo", "halo.update_begin(x) twice", RuntimeError, "is pending", begin_twice, 1),
    ("Halo", "halo.update_end(x) without update_begin", RuntimeError, "without update_begin",
     lambda: HALO.update_end(X.copy()), 1),
    ("Halo", "halo.update_end(y) after update_begin(x)", ValueError, "another array", end_other_array, 1),
    ("Halo", "halo.update(x) after halo.free()", FreedError, "after free()",
     lambda: freed_halo().update(np.zeros(PAT.size)), 1),
    ("GlobalMemory", "GlobalMemory(None, 4)", TypeError, "needs a HybridComm",
     lambda: GlobalMemory(None, 4), 1),
    ("GlobalMemory", "GlobalMemory(hc, -1)", ValueError, "count must be >= 0",
     lambda: GlobalMemory(HC, -1), 1),
    ("GlobalMemory", "GlobalMemory(hc, 4, dtype=object)", TypeError, "numeric numpy dtype",
     lambda: GlobalMemory(HC, 4, dtype=object), 1),
    ("GlobalMemory", "GlobalMemory(hc, 4, dtype=np.int64 on rank 0, float64 elsewhere)", ValueError,
     "different dtypes", lambda: GlobalMemory(HC, 4, dtype=np.int64 if R == 0 else np.float64), 2),
    ("GlobalMemory", "mem.Put(np.ones(2), rank=size)", ValueError, "out of range",
     lambda: MEM.Put(np.ones(2), P), 1),
    ("GlobalMemory", "mem.Put(np.ones(3), next, offset=2)  # parts of 4", IndexError, "outside rank",
     lambda: MEM.Put(np.ones(3), OTHER, 2), 1),
    ("GlobalMemory", "mem.Put(np.ones(2, np.float32), next)", TypeError, "dtype float32",
     lambda: MEM.Put(np.ones(2, np.float32), OTHER), 1),
    ("GlobalMemory", "mem.Get(read_only_array, next)", ValueError, "read-only",
     lambda: MEM.Get(_ro(2), OTHER), 1),
    ("GlobalMemory", "mem.Get(np.empty(5), next)  # parts of 4", IndexError, "outside rank",
     lambda: MEM.Get(np.empty(5), OTHER), 1),
    ("GlobalMemory", "mem.fetch_add(next, 0, 1)  # float64 memory", TypeError, "need an int64",
     lambda: MEM.fetch_add(OTHER, 0, 1), 1),
    ("GlobalMemory", "counter.fetch_add(next, 2, 1)  # parts of 2", IndexError, "outside rank",
     lambda: COUNTER.fetch_add(OTHER, 2, 1), 1),
    ("GlobalMemory", "mem.Rget(out, next) waited twice", RuntimeError, "waited twice", wait_twice, 1),
    ("GlobalMemory", "hybridmpi.waitall([req, req])", RuntimeError, "listed twice", waitall_twice, 1),
    ("GlobalMemory", "mem.sync_images([size])", ValueError, "out of range",
     lambda: MEM.sync_images([P]), 1),
    ("GlobalMemory", "mem.sync_images([next, next])", ValueError, "twice",
     lambda: MEM.sync_images([OTHER, OTHER]), 2),
    ("GlobalMemory", "mem.Put(x, next) after mem.free()", FreedError, "after free()",
     lambda: freed_mem().Put(np.ones(1), OTHER), 1),
    ("Coarray", "Coarray(hc, (2, -1))", ValueError, "extents must be >= 0",
     lambda: Coarray(HC, (2, -1)), 1),
    ("Coarray", "Coarray(hc, (4,) on rank 0, (5,) elsewhere)", ValueError, "different shapes",
     lambda: Coarray(HC, (4,) if R == 0 else (5,)), 2),
    ("Coarray", "a[next][4, 0]  # shape (4, 4)", IndexError, "outside the shape",
     lambda: CO[OTHER][4, 0], 1),
    ("Coarray", "a[next][[0, 1]]", TypeError, "basic indexing", lambda: CO[OTHER][[0, 1]], 1),
    ("Coarray", "a[next][0:2] = np.ones(3)", ValueError, "do not fit",
     lambda: co_put(slice(0, 2), np.ones(3)), 1),
    ("Coarray", "a[size]", ValueError, "out of range", lambda: CO[P], 1),
    ("Coarray", "a[next][0, 0] = np.nan  # int64", ValueError, "cannot be stored as int64",
     lambda: co_int_put((0, 0), np.nan), 1),
    ("Coarray", "a[next][1, 1] = 2**70  # int64", OverflowError, "cannot be stored as int64",
     lambda: co_int_put((1, 1), 2**70), 1),
    ("Coarray", "a[me][1, 1] = 2**70  # int64", OverflowError, "cannot be stored as int64",
     lambda: co_int_put((1, 1), 2**70, R), 1),
    ("mesh", "mesh.cube(0)", ValueError, "h must be", lambda: mesh.cube(0), 1),
    ("mesh", "mesh.load('missing.vtu')", FileNotFoundError, "no such file",
     lambda: mesh.load("missing.vtu"), 1),
    ("mesh", "mesh.partition(m, 0)", ValueError, "nparts must be", lambda: mesh.partition(M, 0), 1),
    ("mesh", "mesh.partition(m, 4, node_size=3)", ValueError, "must be a positive int dividing",
     lambda: mesh.partition(M, 4, node_size=3), 1),
    ("mesh", "mesh.distribute(hc, m, part) with part naming rank `size`", ValueError, "communicator has",
     lambda: mesh.distribute(HC, M, np.full(len(M.points), P)), 1),
]


def _ro(n):
    a = np.empty(n)
    a.flags.writeable = False
    return a


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--markdown", default="")
    a = ap.parse_args()
    failed = passed = 0
    rows = []
    for i, (area, shown, exc, words, call, need) in enumerate(CASES, 1):
        if P < need:
            continue
        try:
            call()
            got = (False, "no exception")
        except exc as e:   # the words, and the library's prefix (naming the rank where it has one)
            got = (words in str(e) and str(e).startswith("hybridmpi"), str(e))
        except Exception as e:  # noqa: BLE001 - the wrong kind is a failure to report
            got = (False, f"{type(e).__name__}: {e}")
        views = comm.allgather(got)
        ok = all(v[0] for v in views)
        if R == 0:
            if not ok:
                bad = [(r, v[1]) for r, v in enumerate(views) if not v[0]]
                print(f"case {i} {shown}: FAILED on ranks {bad[:3]}", flush=True)
            rows.append((i, area, shown, exc.__name__, views[0][1]))
        failed += not ok
        passed += ok
    if R == 0:
        print(f"SUMMARY: {passed} passed, {failed} failed", flush=True)
        if a.markdown:
            write_markdown(a.markdown, rows)
    HALO.free()
    CO_INT.free()
    CO.free()
    MEM.free()
    COUNTER.free()
    HC.free()
    return 1 if failed else 0


def write_markdown(path, rows):
    lines = ["# Invalid calls and what they raise", "",
             "Generated by `mpiexec -n 2 python -m mpi4py tests/mpi/errors_cases.py "
             "--markdown docs/errors.md`;",
             "`tests/test_errors.py` runs every case at 2 and 4 ranks (each must raise on every rank,",
             "before anything is touched) and checks that this file is up to date. Messages as rank 0",
             "of 2 sees them; `PatternError` is a `ValueError`, `SyncTimeout` and `FreedError` are",
             "`RuntimeError`s.", "",
             "When only one rank passes a bad argument, every rank still raises within a poll or two:",
             "that rank the exception below, the others the same class or `PeerError`",
             "(`PeerArgumentError` is a `PeerError` and a `ValueError`); `tests/test_onerank.py`",
             "checks it for every constructor and collective (see",
             "[reliability](guide/reliability.md)).", "",
             "| # | API | call | exception | message |", "| --- | --- | --- | --- | --- |"]
    for i, area, shown, exc, msg in rows:
        cell = msg.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {i} | {area} | `{shown}` | `{exc}` | {cell} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
