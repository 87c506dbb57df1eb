"""hybridmpi.profile: rows for every object and op, exact bytes, imbalance charged to the rank
that was late, nothing recorded when off, collective misuse raising on every rank.

    python -m mpi4py profile_cases.py [--node-size N] [--only CASES]
"""

import time

import numpy as np
from _harness import agree, main, skip

import hybridmpi
from hybridmpi import Coarray, FreedError, GhostPattern, GlobalMemory, Halo, HybridComm
from hybridmpi._native.clib import lib

N = 300  # owned points per rank


def _ring(hc, n=N):
    """Each rank owns n points and ghosts all n of the next rank."""
    nxt = (hc.rank + 1) % hc.size
    ghosts = np.arange(nxt * n, (nxt + 1) * n) if hc.size > 1 else np.zeros(0, dtype=np.int64)
    return GhostPattern.from_global(hc, owned=np.arange(hc.rank * n, (hc.rank + 1) * n),
                                    ghosts=ghosts)


def _row(rows, obj, op):
    got = [r for r in rows if r["object"].startswith(obj) and r["op"] == op]
    assert len(got) == 1, (obj, op, rows)
    return got[0]


def _consistent(r):
    assert r["time_s"] >= r["wait_s"] - 1e-9 and r["wait_s"] >= r["imbalance_s"] >= 0, r
    assert abs(r["python_s"] + r["wait_s"] - r["time_s"]) < 1e-6, r
    assert abs(r["imbalance_s"] + r["transfer_s"] - r["wait_s"]) < 1e-9, r



def unwrapped(hc, *names):
    """No operation ``names`` of ``hc`` is recorded; what serves them is the C fast path it
    had (hybridmpi._native._calls.Coll of a HybridComm on one node) or the method."""
    calls = hc.context.calls
    return not set(names) & set(calls.recorded) and all(
        type(calls.fast(n)).__name__ in ("NoneType", "Coll") for n in names)

def case_rows_for_every_object_and_op(comm, rng, node_size=None):
    """One row per object and op used, with the exact calls and bytes."""
    with HybridComm(comm, node_size=node_size) as hc:
        pat = _ring(hc)
        h = Halo(pat, block=2)
        x = np.zeros((pat.size, 2))
        mem = GlobalMemory(hc, 8)
        before = Coarray(hc, (4, 3))   # made before the profile, recorded all the same
        with hybridmpi.profile(hc) as prof:
            co = Coarray(hc, 5)        # made inside it
            for _ in range(7):
                h.update(x)
            for _ in range(3):
                h.reverse(x)
            h.update_begin(x)
            h.update_end(x)
            h.reverse_begin(x, "max")
            h.reverse_end(x)
            hc.barrier()
            hc.allreduce(2.0)
            hc.Allreduce(np.ones(6), np.zeros(6))
            nxt, prv = (hc.rank + 1) % hc.size, (hc.rank - 1) % hc.size
            nbrs = sorted({nxt, prv})
            mem.Put(np.ones(3), nxt, 2)
            mem.Get(np.zeros(4), prv, 1)
            mem.sync_all()
            mem.sync_images(nbrs)
            co[nxt][1:4] = 1.0
            before[prv][2] = np.arange(3.0)
            got = co[prv][0:2]
            co.sync_images(nbrs)
        assert got.shape == (2,)
        rows = prof.rows()
        for r in rows:
            _consistent(r)
        label = _row(rows, "Halo", "update")["object"]
        assert label == f"Halo #{h.tag} (atomic)", label
        esz = 16
        both = (N + N) * esz if hc.size > 1 else 0   # sends N points, receives N
        for op, calls, nbytes in (("update", 7, both), ("reverse", 3, both),
                                  ("update_begin", 1, N * esz), ("update_end", 1, N * esz),
                                  ("reverse_begin", 1, N * esz), ("reverse_end", 1, N * esz)):
            r = _row(rows, "Halo", op)
            want = calls * nbytes if hc.size > 1 else 0
            assert (r["calls"], r["bytes"]) == (calls, want), (op, r, want)
        assert (_row(rows, "HybridComm", "allreduce")["bytes"],
                _row(rows, "HybridComm", "Allreduce")["bytes"]) == (8, 48)
        # sync_all's barrier is recorded in both rows (rows nest as the calls do)
        assert _row(rows, "HybridComm", "barrier")["calls"] == 2
        assert _row(rows, "GlobalMemory", "Put")["bytes"] == 24
        assert _row(rows, "GlobalMemory", "Get")["bytes"] == 32
        assert _row(rows, "GlobalMemory", "sync_images")["calls"] == 1
        assert _row(rows, "Coarray 2 (5,)", "put")["bytes"] == 24
        assert _row(rows, "Coarray 2 (5,)", "get")["bytes"] == 16
        assert _row(rows, "Coarray 1 (4, 3)", "put")["bytes"] == 24
        assert _row(rows, "Coarray 2 (5,)", "sync_images")["calls"] == 1
        agree(comm, sorted((r["object"], r["op"], r["calls"]) for r in rows
                           if not r["object"].startswith(("GlobalMemory", "Coarray"))
                           or r["op"].startswith("sync")))
        s = prof.summary()
        if hc.rank == 0:
            assert {(x["object"], x["op"]) for x in s} >= {(r["object"], r["op"]) for r in rows}
            assert all(x["ranks"] == hc.size for x in s if x["op"] == "barrier"), s
        else:
            assert s is None
        co.free()
        before.free()


def case_imbalance_charged_to_the_late_rank(comm, rng, node_size=None):
    """The last rank sleeps 5 ms before each update and barrier: the rank that receives from it
    shows about 5 ms of imbalance per update with late_peer the sleeper, and less transfer than
    that; in the barrier every other rank names it.  (Bounds wide enough for oversubscribed
    ranks on a loaded machine: the benchmark `bench profile` measures the precision.)"""
    with HybridComm(comm, node_size=node_size) as hc:
        if hc.size < 2:
            return skip("needs 2 or more ranks")
        pat = _ring(hc, 512)
        h = Halo(pat)
        x = np.zeros(pat.size)
        late = hc.size - 1
        waiter = late - 1   # receives from `late` (each rank ghosts the next one's points)
        h.update(x)
        hc.barrier()
        nap = 0.005
        with hybridmpi.profile(hc) as prof:
            for _ in range(20):
                if hc.rank == late:
                    time.sleep(nap)
                h.update(x)
            for _ in range(10):
                if hc.rank == late:
                    time.sleep(nap)
                hc.barrier()
        rows = prof.rows()
        up, bar = _row(rows, "Halo", "update"), _row(rows, "HybridComm", "barrier")
        if hc.rank == waiter:
            per = up["imbalance_s"] / up["calls"]
            assert 0.5 * nap < per < 4 * nap, up
            assert up["late_peer"] == late and up["transfer_s"] < up["imbalance_s"], up
        if hc.rank != late:
            assert bar["late_peer"] == late and bar["imbalance_s"] / bar["calls"] > 0.5 * nap, bar
        imbs = comm.allgather(bar["imbalance_s"])   # the sleeper waits least
        assert imbs[late] < 0.5 * min(v for r, v in enumerate(imbs) if r != late), imbs


def case_sync_images_pairs(comm, rng, node_size=None):
    """sync_images matches each rank's j-th call naming a peer with the peer's j-th call
    naming it: rank 0 sleeps 5 ms before each of its calls, its neighbours name it as late."""
    with HybridComm(comm, node_size=node_size) as hc:
        if hc.size < 2:
            return skip("needs 2 or more ranks")
        mem = GlobalMemory(hc, 4)
        nbrs = sorted({(hc.rank + 1) % hc.size, (hc.rank - 1) % hc.size} - {hc.rank})
        nap = 0.005
        with hybridmpi.profile(hc) as prof:
            for _ in range(8):
                if hc.rank == 0:
                    time.sleep(nap)
                mem.sync_images(nbrs)
        r = _row(prof.rows(), "GlobalMemory", "sync_images")
        _consistent(r)
        if 0 in nbrs:
            assert r["late_peer"] == 0 and r["imbalance_s"] / r["calls"] > 0.5 * nap, r
        imbs = comm.allgather(r["imbalance_s"])   # the sleeper waits least
        assert imbs[0] < 0.5 * min(v for q, v in enumerate(imbs) if q != 0), imbs
        mem.free()


def case_nothing_recorded_when_off(comm, rng, node_size=None):
    """Outside a profile no method is wrapped and the C clock is off; calls after the block
    change nothing; objects freed inside keep their rows."""
    with HybridComm(comm, node_size=node_size) as hc:
        pat = _ring(hc)
        h = Halo(pat)
        x = np.zeros(pat.size)
        assert lib.hm_prof[2] == 0 and not h._internal.calls.recorded and unwrapped(hc, "barrier")
        with hybridmpi.profile(hc) as prof:
            assert lib.hm_prof[2] == 1 and "update" in h._internal.calls.recorded
            h.update(x)
            gone = Halo(pat)
            gone.update(x)
            gone.free()
        assert lib.hm_prof[2] == 0 and not h._internal.calls.recorded and unwrapped(hc, "barrier")
        rows = prof.rows()
        for _ in range(5):
            h.update(x)
            hc.barrier()
        assert prof.rows() == rows
        assert _row(rows, "Halo #%d" % h.tag, "update")["calls"] == 1
        assert _row(rows, "Halo #%d" % gone.tag, "update")["calls"] == 1
        assert not any(r["op"] == "barrier" for r in rows), rows


def case_misuse_raises_on_every_rank(comm, rng, node_size=None):
    """A second profile of one comm, a profile used twice, rows() too early or after an
    exception, a freed comm or not a comm: clear errors on every rank, nothing left on."""
    with HybridComm(comm, node_size=node_size) as hc:
        with hybridmpi.profile(hc) as prof:
            try:
                with hybridmpi.profile(hc):
                    pass
                raise AssertionError("nested profile of one comm did not raise")
            except RuntimeError as e:
                assert "already on" in str(e), e
            try:
                prof.rows()
                raise AssertionError("rows() inside the block did not raise")
            except RuntimeError as e:
                assert "has not ended" in str(e), e
            hc.barrier()
        assert _row(prof.rows(), "HybridComm", "barrier")["calls"] == 1
        try:
            with prof:
                pass
            raise AssertionError("a used profile did not raise")
        except RuntimeError as e:
            assert "already used" in str(e), e
        failed = hybridmpi.profile(hc)
        try:
            with failed:
                hc.barrier()
                raise KeyError("inside")
        except KeyError:
            pass
        except hybridmpi.PeerError:   # a peer's own KeyError broke the comm before this rank
            pass                      # left the barrier (a rank's own error leaves no agreement)
        assert lib.hm_prof[2] == 0 and unwrapped(hc, "barrier")
        try:
            failed.rows()
            raise AssertionError("rows() after an exception did not raise")
        except RuntimeError as e:
            assert "exception" in str(e), e
    try:
        hybridmpi.profile(hc).__enter__()
        raise AssertionError("profile of a freed comm did not raise")
    except FreedError:
        pass
    try:
        hybridmpi.profile(comm)
        raise AssertionError("profile of an mpi4py comm did not raise")
    except TypeError as e:
        assert "HybridComm" in str(e), e


def case_one_rank_raises_in_the_block(comm, rng, node_size=None):
    """One rank raises inside the profile's block (its own error) while the others leave it
    normally: every rank raises at the end of the block, none waits; then, inside a with
    HybridComm block that the error leaves, the peers raise PeerError or RuntimeError."""
    bad = comm.size - 1
    for inside_comm_block in (False, True):
        hc = HybridComm(comm, node_size=node_size)
        got = None
        try:
            if inside_comm_block:
                with hc:
                    with hybridmpi.profile(hc):
                        hc.barrier()
                        if comm.rank == bad:
                            raise KeyError("the block's own error")
            else:
                with hybridmpi.profile(hc):
                    hc.barrier()
                    if comm.rank == bad:
                        raise KeyError("the block's own error")
        except KeyError:
            got = "own"
        except (RuntimeError, hybridmpi.PeerError) as e:
            got = type(e).__name__
            assert comm.size > 1 and comm.rank != bad, e
        if comm.size == 1 or comm.rank == bad:
            assert got == "own", got
        else:
            assert got in ("RuntimeError", "PeerError"), got
        assert lib.hm_prof[2] == 0 and unwrapped(hc, "barrier")
        if not inside_comm_block:
            hc.free()


def case_print_and_json(comm, rng, node_size=None, json_path=""):
    """print() on rank 0 names every row; to_json() writes every rank's rows."""
    import io
    import json
    import os
    import tempfile

    with HybridComm(comm, node_size=node_size) as hc:
        with hybridmpi.profile(hc) as prof:
            hc.barrier()
            hc.allreduce(1)
        buf = io.StringIO()
        prof.print(file=buf)
        path = comm.bcast(tempfile.mkdtemp() if comm.rank == 0 else None)
        prof.to_json(os.path.join(path, "p.json"))
        comm.Barrier()
        if comm.rank == 0:
            text = buf.getvalue()
            assert "HybridComm" in text and "allreduce" in text and "barrier" in text, text
            with open(os.path.join(path, "p.json")) as f:
                data = json.load(f)
            assert len(data["ranks"]) == comm.size and data["summary"], data
        else:
            assert buf.getvalue() == ""


def case_free_inside_the_block(comm, rng, node_size=None):
    """free() of the profiled HybridComm inside the profile's block frees it (a `with hc`
    nested in `with profile(hc)` too); every later call, through a reference kept from
    before too, raises FreedError on every rank."""
    for nested in (False, True):
        hc = HybridComm(comm, node_size=node_size)
        kept = hc.barrier
        with hybridmpi.profile(hc):
            hc.barrier()
            if nested:
                with hc:
                    hc.allreduce(1.0)
            else:
                hc.free()
            assert hc.closed
        for call in (kept, hc.barrier, lambda hc=hc: hc.allreduce(1.0)):
            try:
                call()
            except FreedError:
                pass
            else:
                raise AssertionError("a call after free() inside a profile accepted")
        assert lib.hm_prof[2] == 0



def case_kept_fast_path_after_free_in_the_block(comm, rng, node_size=None):
    """A reference to GlobalMemory.Put or Get kept from before a profile (its C fast path,
    which the profile sets aside) raises FreedError once the memory is freed inside the
    block, and never writes into the memory a new GlobalMemory then holds."""
    with HybridComm(comm, node_size=node_size) as hc:
        m = GlobalMemory(hc, 3)
        kept_put, kept_get = m.Put, m.Get
        with hybridmpi.profile(hc):
            m.free()
            fresh = GlobalMemory(hc, 3)   # may get the freed block
            for call in (lambda: kept_put(np.full(1, 42.0), hc.rank),
                         lambda: kept_get(np.zeros(1), hc.rank)):
                try:
                    call()
                except FreedError:
                    pass
                else:
                    raise AssertionError("a kept fast path reached freed memory")
            assert not fresh.local.any(), fresh.local
            fresh.free()


if __name__ == "__main__":
    main([case_rows_for_every_object_and_op, case_imbalance_charged_to_the_late_rank,
          case_sync_images_pairs, case_nothing_recorded_when_off, case_misuse_raises_on_every_rank,
          case_one_rank_raises_in_the_block, case_print_and_json, case_free_inside_the_block,
          case_kept_fast_path_after_free_in_the_block])
