"""Collective cases of GhostPattern and Halo, run under mpiexec by tests/test_halo.py.

Usage: python -m mpi4py halo_cases.py [--node-size K] [--iters N] [--only case1,case2]

Random patterns: random global numbering and ownership, random ghost sets,
some ranks without any.  Every result is checked against a reference built
with mpi4py (allgather of global ids and values), bit for bit.
"""

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _harness import agree, main, skip
from _ieee import nan_of, reference

import hybridmpi
from hybridmpi import FreedError, GhostPattern, Halo, PatternError, SyncTimeout
from hybridmpi.ghost.exchange import cma_pids
from hybridmpi.tools.baselines import METHODS as _METHODS

#: every Halo method (a new one in hybridmpi/ghost/transport/ is tested with no edit here)
METHODS = tuple(_METHODS)
#: the deep run (HYBRIDMPI_TEST_DEEP=1) checks every dtype on both patterns of a case
DEEP = os.environ.get("HYBRIDMPI_TEST_DEEP") == "1"
DTYPES = [np.float64, np.float32, np.int64, np.complex128]
OPS = ["add", "insert", "min", "max"]


class Layout:
    """A random distributed numbering, the same on every rank (shared seed)."""

    def __init__(self, comm, seed, sorted_ids=False, empty_prob=0.2):
        rng = np.random.default_rng(seed)
        p, r = comm.size, comm.rank
        n = int(rng.integers(20, 200)) * p
        gids = rng.permutation(n).astype(np.int64) * 3 + 7
        owner = rng.integers(0, p, n)
        self.owned_of, self.ghosts_of = [], []
        for q in range(p):
            own = gids[owner == q]
            own = np.sort(own) if sorted_ids else rng.permutation(own)
            others = gids[owner != q]
            k = 0
            if rng.random() >= empty_prob and others.size:
                k = int(rng.integers(1, min(others.size, 80) + 1))
            gh = rng.choice(others, size=k, replace=False)
            gh = np.sort(gh) if sorted_ids else gh
            self.owned_of.append(own)
            self.ghosts_of.append(gh.astype(np.int64))
        self.owned, self.ghosts = self.owned_of[r], self.ghosts_of[r]
        self.n_owned = self.owned.size
        self.gids = np.concatenate((self.owned, self.ghosts))


def rand(rng, dtype, shape):
    dtype = np.dtype(dtype)
    if dtype.kind == "i":
        return rng.integers(-10**9, 10**9, shape).astype(dtype)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def ref_forward(comm, lay, x):
    """Ghost values from their owners, through mpi4py."""
    table = comm.allgather((lay.owned, x[:lay.n_owned]))
    gid = np.concatenate([g for g, _ in table])
    val = np.concatenate([v for _, v in table])
    order = np.argsort(gid)
    out = x.copy()
    out[lay.n_owned:] = val[order[np.searchsorted(gid, lay.ghosts, sorter=order)]]
    return out


def ref_reverse(comm, lay, x, op):
    """Owners combine the ghost values of every other rank, in rank order."""
    table = comm.allgather((lay.ghosts, x[lay.n_owned:]))
    out = x.copy()
    pos = {g: i for i, g in enumerate(lay.owned.tolist())}
    for q, (g, v) in enumerate(table):
        if q == comm.rank:
            continue
        for gid, val in zip(g.tolist(), v):
            i = pos.get(gid)
            if i is None:
                continue
            if op == "add":
                out[i] = out[i] + val
            elif op == "insert":
                out[i] = val
            elif out.dtype.kind == "f":   # the collectives' rule, IEEE 754-2019's
                out[i] = reference(np.stack([out[i], val]), op)
            else:
                out[i] = (np.minimum if op == "min" else np.maximum)(out[i], val)
    return out


def same(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def hc_of(comm, cfg):
    return hybridmpi.HybridComm(comm, node_size=cfg["node_size"], memory_order=cfg["memory_order"])


def case_pattern_from_global(comm, rng, **cfg):
    with hc_of(comm, cfg) as hc:
        for seed in range(5):
            lay = Layout(comm, seed)
            pat = GhostPattern.from_global(hc, lay.owned, lay.ghosts)
            assert pat.size == lay.gids.size and pat.n_owned == lay.n_owned
            assert pat.n_ghosts == lay.ghosts.size
            # The receive lists cover the ghosts exactly once; the owners send
            # the same global ids, in the same order.
            got = np.sort(np.concatenate(list(pat.recv.values()) or [np.zeros(0, np.int64)]))
            assert np.array_equal(got, np.arange(lay.n_owned, pat.size))
            asked = {p: lay.gids[ids] for p, ids in pat.recv.items()}
            sent = comm.alltoall([lay.gids[pat.send[p]] if p in pat.send else None
                                  for p in range(comm.size)])
            for p in range(comm.size):
                if p in asked:
                    assert np.array_equal(sent[p], asked[p]), (p, sent[p], asked[p])
                else:
                    assert sent[p] is None
            assert set(pat.neighbors) == set(pat.send) | set(pat.recv)
            near = set(hc.node_ranks)
            assert set(pat.intranode) == {p for p in pat.neighbors if p in near}
            assert set(pat.internode) == set(pat.neighbors) - near
            # The explicit constructor accepts the same lists.
            again = GhostPattern(hc, send=dict(pat.send), recv=dict(pat.recv), size=pat.size)
            assert again.n_owned == pat.n_owned and again.neighbors == pat.neighbors


def check_halo(comm, hc, lay, pat, method, dtype, block, rng, iters, shared=False):
    shape = (pat.size,) if block == 1 else (pat.size, block)
    with Halo(pat, dtype=dtype, block=block, method=method) as h:
        vec = h.vector() if shared else None
        if shared:
            assert vec.shape == shape and vec.dtype == np.dtype(dtype) and not vec.any()

        def rand(rng, dtype, shape):
            values = globals()["rand"](rng, dtype, shape)
            if vec is None:
                return values
            vec[...] = values  # the shared vector, refilled in place
            return vec

        for _ in range(iters):
            x = rand(rng, dtype, shape)
            want = ref_forward(comm, lay, x)
            h.update(x)
            assert same(x, want), f"{method} {np.dtype(dtype)} block {block}: update differs"
            x = rand(rng, dtype, shape)
            want = ref_forward(comm, lay, x)
            h.update_begin(x)
            inner = x[:lay.n_owned].sum()  # work between begin and end
            h.update_end(x)
            assert same(x, want) and inner == x[:lay.n_owned].sum(), f"{method}: update_begin/end"
            for op in OPS:
                if op in ("min", "max") and np.dtype(dtype).kind == "c":
                    continue
                x = rand(rng, dtype, shape)
                want = ref_reverse(comm, lay, x, op)
                if op == "add":
                    h.reverse_begin(x, op)
                    h.reverse_end(x)
                else:
                    h.reverse(x, op)
                assert same(x, want), f"{method} {np.dtype(dtype)} block {block}: reverse {op}"


def _dtypes(half):
    """The dtypes a pattern of each half checks: every one in the deep run; in the quick
    selection half of them on the first pattern and the others on the second, so that each
    layout still checks every method, dtype and block once."""
    return DTYPES if DEEP else DTYPES[half::2]


def case_every_method_dtype_block(comm, rng, **cfg):
    with hc_of(comm, cfg) as hc:
        for half, (seed, sorted_ids) in enumerate(((11, False), (12, True))):
            lay = Layout(comm, seed, sorted_ids=sorted_ids)
            pat = GhostPattern.from_global(hc, lay.owned, lay.ghosts)
            for method in METHODS:
                for dtype in _dtypes(half):
                    for block in (1, 3):
                        check_halo(comm, hc, lay, pat, method, dtype, block, rng, 2)


def case_shared_vectors(comm, rng, **cfg):
    """Halo.vector(): zero-copy updates give the bits of the reference, every dtype, block,
    op and layout; shared and private arrays in turn on one Halo."""
    os.environ["HYBRIDMPI_ZERO_COPY_BYTES"] = "0"  # zero copy for these small patterns too
    try:
        shared_vectors(comm, rng, cfg)
    finally:
        del os.environ["HYBRIDMPI_ZERO_COPY_BYTES"]


def shared_vectors(comm, rng, cfg):
    with hc_of(comm, cfg) as hc:
        for half, (seed, sorted_ids) in enumerate(((21, False), (22, True))):
            lay = Layout(comm, seed, sorted_ids=sorted_ids)
            pat = GhostPattern.from_global(hc, lay.owned, lay.ghosts)
            for method in ("atomic", "flat"):
                for dtype in _dtypes(half):
                    for block in (1, 3):
                        check_halo(comm, hc, lay, pat, method, dtype, block, rng, 2, shared=True)
            with Halo(pat, block=3) as h:
                vs = [h.vector(), h.vector()]
                assert h.zero_copy
                for it in range(30):
                    x = vs[it % 2] if it % 3 else rand(rng, np.float64, (pat.size, 3))
                    x[...] = rand(rng, np.float64, (pat.size, 3))
                    want = ref_forward(comm, lay, x)
                    h.update_begin(x)
                    h.update_end(x)
                    assert same(x, want), it
                    # owned entries changed right after update_end never reach a ghost late
                    x[:lay.n_owned] = -1.0
                    comm.Barrier()
                    assert same(x[lay.n_owned:], want[lay.n_owned:]), it
                    x[...] = rand(rng, np.float64, (pat.size, 3))
                    want = ref_reverse(comm, lay, x, "add")
                    h.reverse(x, "add")
                    assert same(x, want), it


class RunLayout:
    """Each rank owns a block of 300 consecutive global ids and ghosts 150 consecutive ids of
    each ring neighbour: channels of long runs, as distribute() numbers meshes."""

    def __init__(self, comm):
        p, r = comm.size, comm.rank
        self.owned = np.arange(300 * r, 300 * (r + 1), dtype=np.int64)
        near = sorted({(r - 1) % p, (r + 1) % p} - {r})
        self.ghosts = np.concatenate([np.arange(300 * q + 100, 300 * q + 250) for q in near]
                                     + [np.zeros(0)]).astype(np.int64)
        self.n_owned = self.owned.size
        self.gids = np.concatenate((self.owned, self.ghosts))


def case_cross_memory_attach(comm, rng, **cfg):
    """Blocking updates of private arrays by process_vm_readv (forced for this small pattern)
    give the reference's bits, every dtype and block, mixed with packed begin/end calls, reverse
    calls and shared vectors on one Halo; HYBRIDMPI_CMA=0 turns it off."""
    # The environment is read when the HybridComm is made (the same on every rank).
    for env in ({"HYBRIDMPI_CMA_BYTES": "0"}, {"HYBRIDMPI_CMA_BYTES": "0", "HYBRIDMPI_CMA": "0"}):
        os.environ.update(env)
        try:
            hc = hc_of(comm, cfg)
        finally:
            for k in env:
                del os.environ[k]
        with hc:
            lay = RunLayout(comm)
            pat = GhostPattern.from_global(hc, lay.owned, lay.ghosts)
            for dtype in DTYPES:
                for block in (1, 3):
                    shape = (pat.size,) if block == 1 else (pat.size, block)
                    with Halo(pat, dtype=dtype, block=block) as h:
                        vec = h.vector()
                        for it in range(8):
                            x = rand(rng, dtype, shape)
                            if it % 4 == 3:
                                vec[...] = x
                                x = vec
                            want = ref_forward(comm, lay, x)
                            if it % 4 == 1:
                                h.update_begin(x)
                                h.update_end(x)
                            else:
                                h.update(x)
                            assert same(x, want), (dtype, block, it)
                            if it % 4 == 2:
                                y = rand(rng, dtype, shape)
                                want = ref_reverse(comm, lay, y, "add")
                                h.reverse(y)
                                assert same(y, want), (dtype, block, it)
                        # The first large Halo probed, collectively even where a virtual
                        # node has one rank (nothing above called the probe first); this
                        # call reads the cached answer.
                        probe = cma_pids(hc.context)
                        agree(comm, probe is not None)
                        expect = probe is not None and "HYBRIDMPI_CMA" not in env
                        assert (h._cma is not None) == expect, (env, h._cma, probe)


def case_cross_memory_attach_failure(comm, rng, **cfg):
    """A cross-memory read that fails (here: the reader's record of the owner's process is
    made wrong) raises RuntimeError on the reader and on the owner waiting for it, and the
    Halo is unusable after."""
    os.environ["HYBRIDMPI_CMA_BYTES"] = "0"
    try:
        hc = hc_of(comm, cfg)
    finally:
        del os.environ["HYBRIDMPI_CMA_BYTES"]
    with hc:
        if hc.size != 2 or hc.node_size != 2:
            return skip("needs 2 ranks on one node")
        if cma_pids(hc.context) is None:
            return skip("no cross-memory attach between these ranks (process_vm_readv refused)")
        lay = RunLayout(comm)
        pat = GhostPattern.from_global(hc, lay.owned, lay.ghosts)
        h = Halo(pat)
        assert h._cma is not None
        if hc.rank == 1:
            pulls = h._cma.dirs[0][0]
            pulls.chan[0].pid = 2**22 + 12345  # above pid_max: no such process
        x = rand(rng, np.float64, pat.size)
        try:
            h.update(x)
        except RuntimeError as e:
            # the reader names the failed read; the owner learns it from the reader's error bits
            assert ("cross-memory read between this rank and rank" in str(e)
                    or (isinstance(e, hybridmpi.PeerError) and e.peer == 1 - hc.rank)), e
            assert f"rank {1 - hc.rank}" in str(e), e
        else:
            raise AssertionError("the failed read was not reported")
        try:
            h.update(x)
        except RuntimeError as e:
            assert "unusable" in str(e), e
        else:
            raise AssertionError("the Halo stayed usable")
        h.free()


def case_mismatched_vectors(comm, rng, **cfg):
    """One rank passes a private array, its node peer the shared vector: both raise (the one
    that finds it first names the other; the other finds it too, or sees the first's error
    bits)."""
    os.environ["HYBRIDMPI_ZERO_COPY_BYTES"] = "0"
    try:
        hc = hc_of(comm, cfg)
    finally:
        del os.environ["HYBRIDMPI_ZERO_COPY_BYTES"]
    with hc:
        if hc.size != 2 or hc.node_size != 2:
            return skip("needs 2 ranks on one node")
        other = 1 - hc.rank
        pat = GhostPattern(hc, send={other: np.arange(4)}, recv={other: np.arange(4, 8)}, size=8)
        h = Halo(pat)
        v = h.vector()
        x = v if hc.rank == 0 else np.zeros(8)
        try:
            h.update(x)
        except ValueError as e:
            assert (f"rank {other} passed another vector" in str(e)
                    or f"rank {other} found that ranks passed" in str(e)), e
        else:
            raise AssertionError("mismatch not detected")
        h.free()


def case_neighbor_order(comm, rng, **cfg):
    """Two 'neighbor' Halos of one pattern share its graph communicator; begun in opposite
    orders on different ranks, their collectives would match each other: every rank raises
    (ValueError where a message of the other Halo arrived, PeerError elsewhere), none returns
    with the other Halo's values.  Same sizes (headers differ) and different sizes (MPI
    truncates)."""
    if comm.size < 2:
        return skip("needs 2 or more ranks")
    for dtype_b in (np.float64, np.float32):
        hc = hc_of(comm, cfg)
        r, p = hc.rank, hc.size
        pat = GhostPattern.from_global(hc, np.arange(r * 4, r * 4 + 4), [((r + 1) % p) * 4])
        a, b = Halo(pat, method="neighbor"), Halo(pat, method="neighbor", dtype=dtype_b)
        xa = np.full(5, float(r)); xb = np.full(5, float(r), dtype=dtype_b)  # noqa: E702
        first, second = ((a, xa), (b, xb)) if r % 2 == 0 else ((b, xb), (a, xa))
        err = None
        try:
            first[0].update_begin(first[1])
            second[0].update_begin(second[1])
            first[0].update_end(first[1])
            second[0].update_end(second[1])
        except (ValueError, hybridmpi.PeerError) as e:
            err = e
        errs = comm.allgather(None if err is None else (type(err).__name__, str(err)))
        assert all(errs), errs
        assert any("begin them in the same order on every rank" in m for _, m in errs), errs
        hc.free()


def case_one_rank_bad_arguments(comm, rng, **cfg):
    """One rank passes an invalid array, its peers valid ones, on a one-way pattern (rank 0
    sends, rank 1 only receives): the receiver of an invalid sender raises; a valid sender
    of an invalid receiver may return.  Then the next valid call either gives every rank the
    right values (nothing of the failed call was left behind) or raises on every rank."""
    if comm.size != 2:
        return skip("runs at 2 ranks only")
    for method in ("atomic", "flat", "neighbor"):
        for bad_rank in (0, 1):
            with hc_of(comm, cfg) as hc:
                r = hc.rank
                pat = GhostPattern(hc, send={1: [0, 1]} if r == 0 else {},
                                   recv={0: [2, 3]} if r == 1 else {}, size=4)
                h = Halo(pat, method=method)
                x = np.full(4, -1.0)
                x[:2] = 10 * r + np.arange(2)
                err = None
                try:
                    h.update(x if r != bad_rank else x.astype(np.float32))
                except (TypeError, ValueError, hybridmpi.PeerError) as e:
                    err = type(e).__name__
                errs = comm.allgather(err)
                assert errs[bad_rank] == "TypeError", (method, bad_rank, errs)
                if bad_rank == 0:
                    assert errs[1] in ("ValueError", "PeerError", "PeerArgumentError"), (method, errs)
                # then valid calls and a barrier: a receiver that returns has the new
                # values; a rank stops at its first error, and by the barrier either every
                # rank raised or none did (a one-way sender needs no peer until then)
                after = None
                for k in range(3):
                    x[:2] = 100 * (k + 1) + 10 * r + np.arange(2)
                    try:
                        h.update(x)
                    except (RuntimeError, ValueError) as e:
                        after = type(e).__name__
                        break
                    if r == 1:
                        assert list(x[2:]) == [100.0 * (k + 1), 100.0 * (k + 1) + 1], (method, x)
                if after is None:
                    try:
                        hc.barrier()
                    except (RuntimeError, ValueError) as e:
                        after = type(e).__name__
                afters = comm.allgather(after)
                assert all(a is None for a in afters) or all(afters), (method, bad_rank, afters)
                h.free()


def case_end_without_begin_on_one_rank(comm, rng, **cfg):
    """One rank calls update_end (or reverse_end) with nothing begun while its peers call the blocking
    update (and, with atomic, reverse), every method, a timeout of 1 s: the odd rank raises
    RuntimeError at once, on its own (a local error that changes nothing, so that a rank may go
    on with the right call: the fuzzer's misuse of one rank relies on it), and every peer that
    receives from it raises SyncTimeout or PeerError within the timeout and a few seconds, never
    waiting for ever (an outside review found the peers waiting; the timeout is what ends such a
    wait). Then every rank does it at once: each raises RuntimeError and the Halo stays usable,
    the next update giving the right values."""
    if comm.size != 3 or cfg["memory_order"] != "acq_rel":
        return skip("runs at 3 ranks in each layout only (its timeouts cost a second each)")
    lay = Layout(comm, 5, empty_prob=0.0)
    odd = comm.size - 1
    for method in METHODS:
        for d in ("update", "reverse") if method == "atomic" else ("update",):
            with hybridmpi.HybridComm(comm, node_size=cfg["node_size"], timeout=1.0) as hc:
                pat = GhostPattern.from_global(hc, lay.owned, lay.ghosts)
                # the ranks that receive from the odd one in this direction
                takes = comm.allgather(odd in (pat.recv if d == "update" else pat.send))
                h = Halo(pat, method=method)
                x = rand(rng, np.float64, pat.size)
                t0 = time.monotonic()
                err = None
                try:
                    if hc.rank == odd:
                        getattr(h, d + "_end")(x)
                    else:
                        getattr(h, d)(x)
                except (RuntimeError, ValueError) as e:
                    err = type(e).__name__
                got = comm.allgather((err, round(time.monotonic() - t0, 3)))
                errs = [g[0] for g in got]
                assert errs[odd] == "RuntimeError" and got[odd][1] < 1, (method, d, got)
                assert all(errs[r] in ("SyncTimeout", "PeerError")
                           for r in range(comm.size) if r != odd and takes[r]), (method, d, got)
                assert max(g[1] for g in got) < 1.0 + 8, (method, d, got)
                h.free()
        # every rank at once: all raise, the Halo stays usable
        with hc_of(comm, cfg) as hc:
            pat = GhostPattern.from_global(hc, lay.owned, lay.ghosts)
            h = Halo(pat, method=method)
            x = rand(rng, np.float64, pat.size)
            try:
                h.update_end(x)
            except RuntimeError as e:
                assert "without update_begin" in str(e), e
            else:
                raise AssertionError(f"{method}: update_end without begin returned")
            want = ref_forward(comm, lay, x)
            h.update(x)
            assert same(x, want), f"{method}: the update after every rank's bad end differs"
            h.free()


def case_consecutive_updates(comm, rng, iters, **cfg):
    """Many calls in a row, fresh data each time, two Halos interleaved."""
    with hc_of(comm, cfg) as hc:
        lay = Layout(comm, 21, sorted_ids=True, empty_prob=0.1)
        pat = GhostPattern.from_global(hc, lay.owned, lay.ghosts)
        for method in METHODS:
            n = iters if method in ("atomic", "flat") else max(iters // 5, 20)
            with Halo(pat, method=method) as h1, Halo(pat, method=method, block=3, dtype=np.float32) as h3:
                for i in range(n):
                    x = rand(rng, np.float64, pat.size)
                    want = ref_forward(comm, lay, x)
                    h1.update(x)
                    assert same(x, want), f"{method}: update {i} differs"
                    if i % 10 == 0:
                        y = rand(rng, np.float32, (pat.size, 3))
                        want = ref_reverse(comm, lay, y, "add")
                        h3.reverse(y)
                        assert same(y, want), f"{method}: reverse {i} differs"


def case_hot_path_edges(comm, rng, **cfg):
    """The hot path of the last array (a C object where the package has it) against every
    change a program can make between calls: the same array reshaped, made read-only, given
    another dtype in place, another array, a begin pending, a reverse op other than the one
    of the hot call (default op after "max"), an op string that is not the interned one; a
    reference to update/reverse kept past free().  Every rank makes the same calls."""
    with hc_of(comm, cfg) as hc:
        lay = Layout(comm, 41, sorted_ids=True, empty_prob=0.0)
        pat = GhostPattern.from_global(hc, lay.owned, lay.ghosts)
        for shared in (False, True):
            h = Halo(pat)
            x = h.vector() if shared else np.zeros(pat.size)
            for _ in range(3):   # heats: the next calls take the hot path
                x[:] = rand(rng, np.float64, pat.size)
                want = ref_forward(comm, lay, x)
                h.update(x)
                assert same(x, want)
            if hc.num_nodes == 1 and hc.size > 1 and (not shared or h.zero_copy):
                hot = h._internal.calls.fast("update")
                assert type(hot).__name__ == "Hot", hot
            others = [np.zeros(pat.size) for _ in range(5)]   # alternating arrays (more than
            for i in range(12):                                  # the C object holds at once)
                y = others[i % 3] if i < 9 else others[3 + i % 2]
                y[:] = rand(rng, np.float64, pat.size)
                want = ref_forward(comm, lay, y)
                h.update(y)
                assert same(y, want), i
            for op in ("max", "max", "add", "".join(["m", "ax"]), "add"):
                x[:] = rand(rng, np.float64, pat.size)
                want = ref_reverse(comm, lay, x, op)
                h.reverse(x, op) if op != "add" else h.reverse(x)
                assert same(x, want), op
            if not shared:
                x.shape = (pat.size, 1)   # in place: still valid (block 1 takes (size, 1))
                x[:, 0] = rand(rng, np.float64, pat.size)
                want = ref_forward(comm, lay, x[:, 0].copy())
                h.update(x)
                assert same(x[:, 0], want)
                x.shape = (pat.size,)
                h.update(x)
            x.flags.writeable = False
            try:
                h.update(x)
                raise AssertionError("update of a read-only array did not raise")
            except ValueError as e:
                assert "read-only" in str(e), e
            x.flags.writeable = True
            h.free()
            h = Halo(pat)
            y = np.zeros(pat.size)
            h.update(y)
            h.update(y)
            h.update_begin(y)
            try:
                h.update(y)
                raise AssertionError("update while a begin is pending did not raise")
            except RuntimeError as e:
                assert "pending" in str(e), e
            h.update_end(y)
            z = y.view(np.int64)   # another array object over the same memory
            try:
                h.update(z)
                raise AssertionError("update of an int64 view did not raise")
            except TypeError:
                pass
            upd, rev = h.update, h.reverse
            h.update(y)
            h.free()
            for call in (upd, rev):
                try:
                    call(y)
                    raise AssertionError("a kept update/reverse worked after free()")
                except FreedError:
                    pass


def case_waits_let_other_threads_run(comm, rng, **cfg):
    """A rank's other threads run while it waits in Halo.update (the C hot path too): rank 0's
    worker thread sends the message that the last rank needs before it calls update."""
    import threading

    from mpi4py import MPI

    if comm.size < 2:
        return skip("needs 2 or more ranks")
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        return skip(f"needs MPI_THREAD_MULTIPLE (the MPI gives level {MPI.Query_thread()})")
    last = comm.size - 1
    with hc_of(comm, cfg) as hc:
        lay = Layout(comm, 41, sorted_ids=True, empty_prob=0.0)
        pat = GhostPattern.from_global(hc, lay.owned, lay.ghosts)
        with Halo(pat) as h:
            x = np.zeros(pat.size)
            for i in range(4):  # the first calls heat the hot path, the later take it
                x[:] = rand(rng, np.float64, pat.size)
                want = ref_forward(comm, lay, x)
                if comm.rank == 0:
                    worker = threading.Thread(target=lambda i=i: (time.sleep(0.1),
                                                                  comm.send(i, dest=last, tag=7)))
                    worker.start()
                    h.update(x)
                    worker.join()
                else:
                    if comm.rank == last:
                        assert comm.recv(source=0, tag=7) == i
                    h.update(x)
                assert same(x, want), i


def case_methods_identical(comm, rng, **cfg):
    """Every method gives the same bits for reverse add (the order-sensitive op)."""
    with hc_of(comm, cfg) as hc:
        lay = Layout(comm, 31)
        pat = GhostPattern.from_global(hc, lay.owned, lay.ghosts)
        x0 = rand(rng, np.float64, (pat.size, 3)) * 10.0 ** rng.integers(-8, 8, (pat.size, 3))
        results = []
        for method in METHODS:
            x = x0.copy()
            with Halo(pat, block=3, method=method) as h:
                h.reverse(x, "add")
            results.append(x.tobytes())
        assert all(r == results[0] for r in results), "methods differ"
        agree(comm, True)


def planted(rng, dtype, shape):
    """Random values with NaNs (of other bits and sign too), -0.0 and +0.0 planted: what tells
    IEEE 754-2019's minimum and maximum from C's `<`."""
    x = rand(rng, dtype, shape)
    pick = rng.random(shape)
    x[pick < 0.15] = np.nan
    x[(pick >= 0.15) & (pick < 0.2)] = nan_of(dtype, rng, negative=True)
    x[(pick >= 0.2) & (pick < 0.45)] = -0.0
    x[(pick >= 0.45) & (pick < 0.7)] = 0.0
    return x


def case_reverse_min_max_one_rule(comm, rng, **cfg):
    """reverse(x, "min") and reverse(x, "max") of float64 and float32 combine by the collectives'
    rule (IEEE 754-2019's minimum and maximum: tests/mpi/_ieee.py): NaNs and zeros of both signs
    planted among the owned and ghost values give the reference's bits, every method, scattered
    ids and long runs, blocks of 1 and 3 (C's `<` dropped a NaN ghost value and kept the
    owner's zero)."""
    with hc_of(comm, cfg) as hc:
        for lay in (Layout(comm, 41), RunLayout(comm)):
            pat = GhostPattern.from_global(hc, lay.owned, lay.ghosts)
            for method in METHODS:
                for dtype in (np.float64, np.float32):
                    for block in (1, 3):
                        shape = (pat.size,) if block == 1 else (pat.size, block)
                        with Halo(pat, dtype=dtype, block=block, method=method) as h:
                            for op in ("min", "max"):
                                x = planted(rng, dtype, shape)
                                want = ref_reverse(comm, lay, x, op)
                                h.reverse(x, op)
                                assert same(x, want), (method, np.dtype(dtype), block, op)


def case_no_neighbors(comm, rng, **cfg):
    """Ranks with nothing to exchange, and patterns with no traffic at all."""
    with hc_of(comm, cfg) as hc:
        empty = GhostPattern(hc, send={}, recv={}, size=5)
        assert empty.neighbors == () and empty.n_owned == 5
        for method in METHODS:
            with Halo(empty, method=method) as h:
                x = rand(rng, np.float64, 5)
                y = x.copy()
                h.update(x)
                h.reverse(x)
                assert same(x, y)
        # Only rank 0 and the last rank talk (one ghost each way).
        p, r = comm.size, comm.rank
        send, recv = {}, {}
        if p > 1 and r in (0, p - 1):
            other = p - 1 - r
            send, recv = {other: [0]}, {other: [1]}
        pat = GhostPattern(hc, send=send, recv=recv, size=2)
        for method in METHODS:
            with Halo(pat, method=method) as h:
                x = np.array([float(r + 1), -1.0])
                h.update(x)
                want = float(p - r) if recv else -1.0
                assert x[1] == want, (method, x)


def expect(exc, fn, *words):
    try:
        fn()
    except exc as e:
        msg = str(e)
        for w in words:
            assert w in msg, f"{w!r} not in {msg!r}"
        return msg
    raise AssertionError(f"{fn} did not raise {exc.__name__}")


def case_bad_patterns(comm, rng, **cfg):
    p, r = comm.size, comm.rank
    with hc_of(comm, cfg) as hc:
        lay = Layout(comm, 41, empty_prob=0.0)
        own, gh = lay.owned, lay.ghosts
        bogus = np.int64(10**12)
        # A ghost owned by nobody (rank 0 asks for an id nobody has).
        expect(PatternError, lambda: GhostPattern.from_global(
            hc, own, np.append(gh, bogus) if r == 0 else gh), "rank 0", f"ghost id {bogus}", "no rank")
        # Duplicate ghost ids.
        if gh.size:
            dup = np.append(gh, gh[0]) if r == p - 1 else gh
            expect(PatternError, lambda: GhostPattern.from_global(hc, own, dup), "duplicate ghost id")
        # A ghost owned by the same rank.
        if own.size and r == 0:
            mine = np.append(gh, own[0])
        else:
            mine = gh
        if comm.allreduce(int(own.size and r == 0)):
            expect(PatternError, lambda: GhostPattern.from_global(hc, own, mine), "owned by the same rank 0")
        # An id owned by two ranks.
        if p > 1:
            both = np.append(own, lay.owned_of[0][:1]) if r == 1 and lay.owned_of[0].size else own
            if comm.allreduce(int(lay.owned_of[0].size > 0)):
                expect(PatternError, lambda: GhostPattern.from_global(hc, both, gh), "owned by rank")
        # Not integer ids.
        expect(PatternError, lambda: GhostPattern.from_global(hc, own.astype(float) if r == 0 else own, gh),
               "integer")
        # Explicit lists: index out of range, peer out of range, self as peer.
        expect(PatternError, lambda: GhostPattern(hc, send={}, recv={}, size=-1 if r == 0 else 3),
               "size must be")
        if p > 1:
            other = (r + 1) % p
            src = (r - 1) % p
            good = dict(send={other: [0, 1]}, recv={src: [2, 3]}, size=4)
            GhostPattern(hc, **good)
            expect(PatternError, lambda: GhostPattern(
                hc, send={other: [0, 7 if r == 0 else 1]}, recv={src: [2, 3]}, size=4),
                "local index 7 out of range", "rank 0")
            # Counts that disagree between two peers.
            expect(PatternError, lambda: GhostPattern(
                hc, send={other: [0] if r == 0 else [0, 1]}, recv={src: [2, 3]}, size=4),
                "expects 2 values from peer 0", "which sends it 1")
            expect(PatternError, lambda: GhostPattern(
                hc, send={other: [0, 1]}, recv={src: [2, 3]} if r else {src: [2, 2]}, size=4),
                "lists local id 2 twice")
            expect(PatternError, lambda: GhostPattern(
                hc, send={other: [0, 1] if r else [0, 2]}, recv={src: [2, 3]}, size=4),
                "is a ghost")
            expect(PatternError, lambda: GhostPattern(
                hc, send={other if r else p + 3: [0, 1]}, recv={src: [2, 3]}, size=4),
                f"peer {p + 3} out of range")
        expect(PatternError, lambda: GhostPattern(hc, send={r: [0]} if r == 0 else {}, recv={}, size=2),
               "itself")
        if p > 2:
            # A ghost that receives from two peers.
            a, b = (r + 1) % p, (r + 2) % p
            expect(PatternError, lambda: GhostPattern(
                hc, send={}, recv={a: [1], b: [1 if r == 0 else 2]}, size=3), "receives from peers")
        # After all those errors the communicator still works.
        pat = GhostPattern.from_global(hc, own, gh)
        check_halo(comm, hc, lay, pat, "atomic", np.float64, 1, rng, 2)


def check_bad_calls(comm, rng, lay, pat, method):
    h = Halo(pat, method=method, block=3)
    n = pat.size
    good = rand(rng, np.float64, (n, 3))
    before = good.copy()
    expect(TypeError, lambda: h.update([1.0] * n), "numpy array")
    expect(TypeError, lambda: h.update(good.astype(np.float32)), "dtype float32")
    expect(ValueError, lambda: h.update(np.zeros(n)), "shape")
    expect(ValueError, lambda: h.update(np.zeros((n + 1, 3))), "shape")
    expect(ValueError, lambda: h.update(np.zeros((n, 6))[:, ::2]), "contiguous")
    ro = good.copy()
    ro.flags.writeable = False
    expect(ValueError, lambda: h.update(ro), "read-only")
    expect(ValueError, lambda: h.reverse(good, op="mul"), "op must be")
    expect(RuntimeError, lambda: h.update_end(good), "without update_begin")
    expect(RuntimeError, lambda: h.reverse_end(good), "without reverse_begin")
    assert same(good, before), "a rejected call touched the data"
    x = good.copy()
    want = ref_forward(comm, lay, x)
    h.update_begin(x)
    expect(RuntimeError, lambda: h.update_begin(x), "pending")
    expect(RuntimeError, lambda: h.reverse(x), "pending")
    expect(RuntimeError, lambda: h.reverse_end(x), "without reverse_begin")
    expect(ValueError, lambda: h.update_end(x.copy()), "another array")
    h.update_end(x)
    assert same(x, want), "update after rejected calls differs"
    h.free()
    h.free()
    expect(FreedError, lambda: h.update(x), "after free")


def case_bad_halo_calls(comm, rng, **cfg):
    r = comm.rank
    with hc_of(comm, cfg) as hc:
        lay = Layout(comm, 51)
        pat = GhostPattern.from_global(hc, lay.owned, lay.ghosts)
        expect(TypeError, lambda: Halo("pattern"), "GhostPattern")
        expect(TypeError, lambda: Halo(pat, dtype=np.int8 if r == 0 else np.float64), "rank 0", "dtype")
        expect(ValueError, lambda: Halo(pat, block=0 if r == comm.size - 1 else 1), "block")
        # a point of 2**31 bytes or more: ValueError on every rank (was cffi's raw OverflowError)
        lone = GhostPattern(hc, send={}, recv={}, size=1)
        for p in (lone, pat):
            expect(ValueError, lambda p=p: Halo(p, block=2**28), "block 268435456 of float64", "2**31")
            expect(ValueError, lambda p=p: Halo(p, dtype=np.float32, block=2**29 if r == 0 else 2),
                   "block")
        Halo(lone, dtype=np.complex128, block=2**27 - 1).free()  # just under: accepted
        expect(ValueError, lambda: Halo(pat, method="carrier-pigeon"), "unknown method")
        if comm.size > 1:
            expect(ValueError, lambda: Halo(pat, method="flat" if r == 0 else "atomic"), "different")
        # every method: every rank's call is invalid alike, so each rank raises its own error
        # and the Halo stays usable (fence, pscw and lock end their synchronization as usual)
        for method in METHODS:
            check_bad_calls(comm, rng, lay, pat, method)
        hc2 = hc_of(comm, cfg)
        pat2 = GhostPattern.from_global(hc2, lay.owned, lay.ghosts)
        h2 = Halo(pat2)
        hc2.free()
        assert h2.closed
        expect(FreedError, lambda: h2.update(np.zeros(pat2.size)), "after free")
        expect(FreedError, lambda: Halo(pat2), "freed")
        expect(FreedError, lambda: GhostPattern.from_global(hc2, lay.owned, lay.ghosts), "freed")
        hc3 = hc_of(comm, cfg)
        c = Halo(GhostPattern.from_global(hc3, lay.owned, lay.ghosts), dtype=np.complex128)
        expect(TypeError, lambda: c.reverse(np.zeros(pat.size, np.complex128), "min"), "complex")
        hc3.free()


def case_timeout_names_peer(comm, rng, **cfg):
    """A rank that skips an update: its intranode neighbors get SyncTimeout naming it."""
    if comm.size < 2 or cfg["node_size"] == 1:
        return skip("needs 2 or more ranks and node peers")
    hc = hybridmpi.HybridComm(comm, node_size=cfg["node_size"], memory_order=cfg["memory_order"],
                              timeout=0.5)
    near = hc.node_ranks
    r = comm.rank
    send, recv = {}, {}
    if len(near) >= 2 and r in near[:2]:
        other = near[1] if r == near[0] else near[0]
        send, recv = {other: [0]}, {other: [1]}
    pat = GhostPattern(hc, send=send, recv=recv, size=2)
    h = Halo(pat)
    x = np.ones(2)
    if r == near[0] and len(near) >= 2:
        try:
            h.update(x)
        except SyncTimeout as e:
            assert e.peer == near[1] and e.counter == "READY" and e.epoch == 1, e
            assert f"rank {near[1]} did not publish call 1" in str(e), e
            expect(RuntimeError, lambda: h.update(x), "unusable")
        else:
            raise AssertionError("no SyncTimeout")
    hc.node_comm.Barrier()
    hc.free()


CASES = [case_pattern_from_global, case_every_method_dtype_block, case_shared_vectors,
         case_cross_memory_attach, case_cross_memory_attach_failure, case_mismatched_vectors,
         case_neighbor_order, case_one_rank_bad_arguments, case_end_without_begin_on_one_rank,
         case_consecutive_updates, case_hot_path_edges,
         case_methods_identical, case_reverse_min_max_one_rule, case_no_neighbors, case_bad_patterns,
         case_bad_halo_calls,
         case_timeout_names_peer, case_waits_let_other_threads_run]


if __name__ == "__main__":
    main(CASES, memory_order="acq_rel", iters=300)
