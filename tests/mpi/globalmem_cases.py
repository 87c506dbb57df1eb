"""GlobalMemory and Coarray: random puts and gets against a model, sync_images, atomics, sections.

Usage: python -m mpi4py globalmem_cases.py [--node-size K] [--memory-order seq_cst] [--only ...]
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _harness import agree, main, skip

import hybridmpi
from hybridmpi import Coarray, GlobalMemory, HybridComm, SyncTimeout

DTYPES = [np.float64, np.float32, np.int64, np.int32, np.complex128, np.uint8]


def make_hc(comm, cfg, **kw):
    return HybridComm(comm, node_size=cfg["node_size"], memory_order=cfg["memory_order"], **kw)


def fresh(rng, dtype, n):
    """Random values of a dtype (never zeros: every element is random)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "c":
        return (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dtype)
    if dtype.kind == "f":
        return rng.standard_normal(n).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -2**31), min(info.max, 2**31 - 1), n, endpoint=True).astype(dtype)


def case_local_view(comm, rng, **cfg):
    """local_view is a view of a peer's part exactly when it shares this rank's node."""
    with make_hc(comm, cfg) as hc, GlobalMemory(hc, 10 + hc.rank, np.int64) as mem:
        assert mem.counts == tuple(10 + r for r in range(hc.size))
        assert mem.local.shape == (10 + hc.rank,) and not mem.local.any()
        mem.local[:] = np.arange(mem.local.size) * 100 + hc.rank
        mem.sync_all()
        for r in range(hc.size):
            v = mem.local_view(r)
            if r in hc.node_ranks:
                assert v is not None and (v == np.arange(10 + r) * 100 + r).all()
            else:
                assert v is None


def case_random_put_get(comm, rng, **cfg):
    """Random puts and gets (ranks, offsets, lengths, dtypes, blocking or not) against a model."""
    with make_hc(comm, cfg) as hc:
        p, me = hc.size, hc.rank
        for rnd in range(12):
            common = np.random.default_rng(1000 + rnd)
            dtype = DTYPES[rnd % len(DTYPES)]
            counts = [int(c) for c in common.integers(p, 40 * p, p)]
            with GlobalMemory(hc, counts[me], dtype) as mem:
                # Each writer owns the elements i % p == writer of every part, in runs of
                # one: an op writes a run of its own elements [start, start + k) with
                # stride p, done as k single-element puts or one put when p == 1.
                ops, reqs = [], []
                for _ in range(10):
                    t = int(rng.integers(p))
                    mine = np.arange(me, counts[t], p)
                    if mine.size == 0:
                        continue
                    a = int(rng.integers(mine.size))
                    k = int(rng.integers(1, min(4, mine.size - a) + 1))
                    data = fresh(rng, dtype, k)
                    for j in range(k):
                        off = int(mine[a + j])
                        one = data[j:j + 1].copy()
                        how = int(rng.integers(3))
                        if how == 0:
                            mem.Put(one, t, off)
                        else:
                            reqs.append(mem.Rput(one, t, off))
                        ops.append((t, off, one))
                hybridmpi.waitall(reqs)
                if rng.integers(2):
                    mem.flush()
                mem.sync_all()
                model = [np.zeros(c, dtype) for c in counts]
                for writer_ops in comm.allgather(ops):
                    for t, off, one in writer_ops:
                        model[t][off] = one[0]
                assert np.array_equal(mem.local, model[me]), (mem.local, model[me])
                for _ in range(10):
                    t = int(rng.integers(p))
                    if counts[t] == 0:
                        continue
                    off = int(rng.integers(counts[t]))
                    n = int(rng.integers(0, counts[t] - off + 1))
                    out = fresh(rng, dtype, n)
                    if rng.integers(2):
                        mem.Get(out, t, off)
                    else:
                        mem.Rget(out, t, off).wait()
                    assert np.array_equal(out, model[t][off:off + n]), (t, off, n)
                # a contiguous put of a whole part, then read back by its owner
                mem.sync_all()
                t = (me + 1) % p
                data = fresh(rng, dtype, counts[t])
                mem.Put(data, t)
                mem.sync_all()
                expect = comm.sendrecv(data, dest=(me + 1) % p, source=(me - 1) % p)
                assert np.array_equal(mem.local, expect)


def case_overlapping_nonblocking(comm, rng, **cfg):
    """Many outstanding Rget of one region and Rput of disjoint ones, completed in random order."""
    with make_hc(comm, cfg) as hc, GlobalMemory(hc, 64 * hc.size, np.float64) as mem:
        p, me = hc.size, hc.rank
        for _ in range(20):
            mem.local[:] = fresh(rng, np.float64, mem.local.size)
            mem.sync_all()
            snapshot = comm.allgather(mem.local.copy())
            t = int(rng.integers(p))
            outs = [np.empty(32) for _ in range(8)]
            reqs = [mem.Rget(o, t, 16) for o in outs]
            order = rng.permutation(len(reqs))
            for i in order:
                if rng.integers(2):
                    while not reqs[i].test():
                        pass
                else:
                    reqs[i].wait()
            for o in outs:
                assert np.array_equal(o, snapshot[t][16:48])
            mem.sync_all()
            # disjoint puts: writer me owns [me*64, me*64+64) of every part
            datas, reqs = [], []
            for t in range(p):
                d = fresh(rng, np.float64, 64)
                datas.append(d)
                reqs.append(mem.Rput(d, t, me * 64))
            for i in rng.permutation(len(reqs)):
                reqs[i].wait()
            mem.sync_all()
            got = comm.alltoall(datas)
            assert np.array_equal(mem.local, np.concatenate(got))


def case_producer_consumer(comm, rng, **cfg):
    """A ring through sync_images only: fresh data every round, a missing fence shows as a stale value."""
    with make_hc(comm, cfg) as hc, GlobalMemory(hc, 257, np.float64) as mem:
        p, me = hc.size, hc.rank
        nxt, prv = (me + 1) % p, (me - 1) % p
        for rnd in range(300):
            data = np.random.default_rng([me, rnd]).standard_normal(257)
            data[-1] = rnd  # the last element carries the round: a stale one shows
            if rnd % 2:
                mem.Rput(data, nxt).wait()
            else:
                mem.Put(data, nxt)
            mem.sync_images([nxt, prv] if p > 2 else [nxt])
            expect = np.random.default_rng([prv, rnd]).standard_normal(257)
            expect[-1] = rnd
            assert np.array_equal(mem.local, expect), (rnd, mem.local[-1])
            mem.sync_images([prv, nxt] if p > 2 else [prv])  # consumed: the producer may write again


def case_sync_images_subsets(comm, rng, **cfg):
    """Pairs synchronize without the others: even ranks with the next odd one, a random count."""
    with make_hc(comm, cfg) as hc, Coarray(hc, 3, np.int64) as a:
        p, me = hc.size, hc.rank
        partner = me ^ 1
        rounds = 50 + int(np.random.default_rng(7).integers(50))
        if partner < p:
            for rnd in range(rounds):
                a[partner][me % 2] = rnd * 10 + me
                a.sync_images(partner)
                assert a.local[partner % 2] == rnd * 10 + partner
                a.sync_images([partner])
        a.sync_all()
        a.sync_images([])


def case_fetch_add(comm, rng, **cfg):
    """fetch_add counters from every rank sum exactly; the old values are all different."""
    with make_hc(comm, cfg) as hc, GlobalMemory(hc, 4, np.int64) as mem:
        p, me = hc.size, hc.rank
        n = 300
        olds = [mem.fetch_add(0, 0, 1) for _ in range(n)]
        for _ in range(n):
            t = int(rng.integers(p))
            mem.fetch_add(t, 1, 3)
        mem.sync_all()
        total = hc.comm.allreduce(int(mem.local[1]))
        assert total == 3 * n * p, total
        if me == 0:
            assert mem.local[0] == n * p
        everyone = np.sort(np.concatenate(comm.allgather(np.array(olds))))
        assert np.array_equal(everyone, np.arange(n * p))
        # compare_swap: exactly one rank takes each slot
        wins = [mem.compare_swap(t, 2, 0, me + 1) == 0 for t in range(p)]
        mem.sync_all()
        assert mem.local[2] != 0
        taken = comm.allreduce(np.array(wins, dtype=np.int64))
        assert (taken == 1).all(), taken
        owner = comm.allgather(int(mem.local[2]))
        for t in range(p):
            assert wins[t] == (owner[t] == me + 1)


def case_coarray_sections(comm, rng, **cfg):
    """Sections with steps in every dimension (negative too), put and get, against numpy."""
    with make_hc(comm, cfg) as hc:
        p, me = hc.size, hc.rank
        nxt, prv = (me + 1) % p, (me - 1) % p
        for dtype in (np.float64, np.int32, np.complex128):
            with Coarray(hc, (5, 6, 7), dtype) as a:
                assert a.local.shape == (5, 6, 7) and not a.local.any()
                sections = [
                    (slice(None), slice(None), slice(None)),
                    (slice(1, 5, 2), slice(None, None, 3), slice(0, 7, 2)),
                    (slice(None, None, -2), 2, slice(6, 0, -3)),
                    (3, slice(1, 5), 4),
                    (Ellipsis, 0),
                    (slice(4, 1, -1), slice(5, None, -2)),
                    2,
                    (1, 2, 3),
                ]
                for rnd, sec in enumerate(sections):
                    model = np.random.default_rng([prv, rnd]).standard_normal((5, 6, 7)).astype(dtype)
                    start = np.random.default_rng([me, rnd]).standard_normal((5, 6, 7)).astype(dtype)
                    a.local[...] = model
                    a.sync_all()
                    vals = fresh(rng, dtype, start[sec].size).reshape(np.shape(start[sec]))
                    if rnd % 2:
                        a[nxt][sec] = vals
                    else:
                        a.Rput(nxt, sec, vals).wait()
                    a.sync_all()
                    mine = comm.sendrecv(vals, dest=nxt, source=prv)
                    expect = model.copy()
                    expect[sec] = mine
                    assert np.array_equal(a.local, expect), sec
                    before = comm.sendrecv(a.local.copy(), dest=nxt, source=prv)
                    got = a[prv][sec]
                    assert np.array_equal(got, before[sec]) and isinstance(got, np.ndarray)
                    after = comm.sendrecv(a.local.copy(), dest=prv, source=nxt)
                    assert np.array_equal(a[nxt][sec], after[sec])
                    a.sync_all()
                # broadcast a scalar into a section
                a[nxt][1:3, ::2, -1] = 7
                a.sync_all()
                assert (a.local[1:3, ::2, -1] == 7).all()


def case_sync_timeout(comm, rng, **cfg):
    """A rank that never calls sync_images: SyncTimeout naming it; the others go on."""
    if comm.size < 2:
        return skip("needs 2 or more ranks")
    with make_hc(comm, cfg, timeout=0.5) as hc, GlobalMemory(hc, 1) as mem:
        if hc.rank == 0:
            try:
                mem.sync_images([1])
            except SyncTimeout as e:
                assert e.peer == 1 and "rank 1" in str(e), e
            else:
                raise AssertionError("no SyncTimeout")
            try:
                mem.sync_images([1])
            except RuntimeError as e:
                assert "unusable" in str(e), e
            else:
                raise AssertionError("usable after a timeout")
        comm.Barrier()


def case_many_objects(comm, rng, **cfg):
    """Thousands of live global memories and coarrays: a handful of windows, all correct."""
    # thousands at 1-2 ranks; a quarter as many with more ranks (each object's agreements
    # take ranks / cores times as long oversubscribed: 8 ranks on 2 cores took 50 s) and under
    # the sanitizers (.ci/sanitize), whose allocations are slower
    k = 4 if os.environ.get("HYBRIDMPI_SANITIZE") == "1" or comm.size > 2 else 1
    # the quick selection (the README's command): a quarter again (the deep run has the counts)
    k *= 1 if os.environ.get("HYBRIDMPI_TEST_DEEP") == "1" else 4
    with make_hc(comm, cfg) as hc:
        mems = [GlobalMemory(hc, 1 + i % 5, np.int64) for i in range(2000 // k)]
        arrays = [Coarray(hc, (2, 2), np.float32) for _ in range(200 // k)]
        assert hc.arena.windows <= 4 * (1 + (hc.num_nodes > 1)), hc.arena.windows
        t = (hc.rank + 1) % hc.size
        for i, m in enumerate(mems):
            m.Put(np.array([i * 1000 + hc.rank]), t)
        mems[0].sync_all()
        src = (hc.rank - 1) % hc.size
        assert all(m.local[0] == i * 1000 + src for i, m in enumerate(mems))
        for m in mems[::2]:
            m.free()
        fresh_ones = [GlobalMemory(hc, 3, np.int64) for _ in range(500 // k)]
        assert all(not m.local.any() for m in fresh_ones)
        agree(comm, hc.arena.windows)
    assert all(m.closed for m in mems + fresh_ones) and all(a.closed for a in arrays)


def case_put_get_every_path(comm, rng, **cfg):
    """Put and Get of every dtype by every path (C on this node, MPI across nodes, the Python
    checks): values against the target's part; every bad call raises what the methods say,
    also through a reference to Put or Get kept past free()."""
    from hybridmpi import FreedError

    with make_hc(comm, cfg) as hc:
        for dt in DTYPES:
            mem = GlobalMemory(hc, 16, dt)
            t = (hc.rank + 1) % hc.size
            mine = fresh(rng, dt, 16)
            mem.Put(mine[:1], t)                       # one element at offset 0
            mem.Put(mine[1:9], t, 1)                   # eight at 1
            mem.Put(mine[9:12].reshape(3, 1), t, offset=9)   # 2-D and a keyword: the checks
            mem.Put(mine[12:16], np.int64(t), np.int32(12))  # numpy ints
            mem.sync_all()
            src = (hc.rank - 1) % hc.size
            theirs = comm.sendrecv(mine, t, source=src)
            # (a copy: the message must not hold a view of memory freed with the comm)
            assert np.array_equal(mem.local, theirs), (dt, mem.local.copy(), theirs)
            out = np.zeros(16, dt)
            mem.Get(out[:1], t)
            mem.Get(out[1:16], t, 1)
            assert np.array_equal(out, mine), (dt, out, mine)   # t's part holds what this rank put
            z4 = np.zeros(4, dt)
            ro = np.zeros(4, dt)
            ro.flags.writeable = False
            bad = [(TypeError, mem.Put, (mine.astype(np.int16), t)),
                   (TypeError, mem.Put, (list(mine), t)),
                   (ValueError, mem.Put, (mine[:4], hc.size)),
                   (ValueError, mem.Put, (mine[:4], -1)),
                   (IndexError, mem.Put, (mine[:4], t, 13)),
                   (IndexError, mem.Put, (mine[:1], t, -1)),
                   (ValueError, mem.Put, (mine[::2], t)),
                   (ValueError, mem.Get, (z4[::2], t)),
                   (IndexError, mem.Get, (np.zeros(17, dt), t)),
                   (ValueError, mem.Get, (ro, t))]
            for exc, call, args in bad:
                try:
                    call(*args)
                except exc:
                    pass
                else:
                    raise AssertionError(f"{dt}: no {exc.__name__} from {call}{args[1:]}")
            put, get = mem.Put, mem.Get
            mem.sync_all()
            mem.free()
            for call, args in ((put, (mine[:1], t)), (get, (out[:4], t))):
                try:
                    call(*args)
                except FreedError:
                    pass
                else:
                    raise AssertionError(f"{dt}: a kept Put/Get worked after free()")


def case_objects_on_a_freed_comm(comm, rng, **cfg):
    """GlobalMemory and Coarray on a freed HybridComm: FreedError on every rank, nothing made."""
    from hybridmpi import FreedError

    hc = make_hc(comm, cfg)
    hc.free()
    for make in (lambda: GlobalMemory(hc, 4), lambda: Coarray(hc, (2, 2))):
        try:
            make()
        except FreedError as e:
            assert "freed HybridComm" in str(e), e
        else:
            raise AssertionError("an object made on a freed HybridComm")



def case_waitall_same_request_twice(comm, rng, **cfg):
    """waitall([r, r]) raises RuntimeError, as waiting a request twice does (it returned), on
    every rank that calls it, before anything is waited: r can be waited after."""
    with make_hc(comm, cfg) as hc, GlobalMemory(hc, 4) as mem:
        mem.local[:] = fresh(rng, np.float64, 4)
        mem.sync_all()
        nxt = (comm.rank + 1) % comm.size
        want = comm.sendrecv(mem.local.copy(), dest=(comm.rank - 1) % comm.size, source=nxt)
        out = fresh(rng, np.float64, 4)
        put = mem.Rput(mem.local[:1].copy(), comm.rank, 0)  # the value it holds: gets read it
        req = mem.Rget(out, nxt)
        for reqs in ([req, req], [put, req, put]):
            try:
                hybridmpi.waitall(reqs)
            except RuntimeError as e:
                assert "listed twice" in str(e) and f"rank {comm.rank}" in str(e), e
            else:
                raise AssertionError(f"waitall of {len(reqs)} requests, one listed twice, returned")
        hybridmpi.waitall([req, put])  # neither was waited by the calls that raised
        assert np.array_equal(out, want), (out, want)
        mem.sync_all()


CASES = [case_local_view, case_put_get_every_path, case_random_put_get, case_overlapping_nonblocking,
         case_producer_consumer, case_sync_images_subsets, case_fetch_add, case_coarray_sections,
         case_sync_timeout,
         case_many_objects, case_objects_on_a_freed_comm, case_waitall_same_request_twice]

if __name__ == "__main__":
    main(CASES, memory_order="acq_rel")
