"""Nothing silently wrong: the regression cases of the outside review, each run the way ranks
really run (one rank's bad argument while the others pass good ones, calls after an error,
free-running sequences), and each checked on every rank.

    mpiexec -n N python -m mpi4py silent_cases.py [--node-size K] [--halos 16000] [--only CASE,...]

``--halos`` is how many Halos the tag case makes before its second live one (0: skip it).

Every case ends with every rank agreeing (the harness gathers each rank's verdict).
"""

import time

import numpy as np
from _harness import agree, main, skip
from mpi4py import MPI

from hybridmpi import GhostPattern, Halo, HybridComm, PeerError
from hybridmpi.tools.baselines import METHODS

#: a bad argument must reach every rank well before the timeout (HYBRIDMPI_TIMEOUT=30 here)
PROMPT_S = 2.0


def ring(hc, n=6, block=1):
    """A pattern where each rank owns n points and ghosts two of each other rank's."""
    r, p = hc.rank, hc.size
    owned = np.arange(r * n, r * n + n)
    ghosts = np.array([q * n + k for q in range(p) if q != r for k in (1, n - 1)], dtype=np.int64)
    return GhostPattern.from_global(hc, owned, ghosts)


def fill(pat, hc, seed, block=1):
    """x with this rank's owned values from a seed shared by all ranks, ghosts NaN; and the
    vector every rank must see after a forward update."""
    n = pat.n_owned
    r, p = hc.rank, hc.size
    rng = np.random.default_rng(seed)
    allv = rng.standard_normal((p * 6, block))
    x = np.full((pat.size, block), np.nan)
    x[:n] = allv[r * 6:r * 6 + 6]
    want = x.copy()
    ghosts = np.array([q * 6 + k for q in range(p) if q != r for k in (1, 5)], dtype=np.int64)
    want[n:] = allv[ghosts]
    return x.reshape(pat.size) if block == 1 else x, want.reshape(pat.size) if block == 1 else want


def outcome(fn, *args, **kw):
    """(exception class name or None, seconds) of calling fn(*args, **kw)."""
    t0 = time.perf_counter()
    try:
        fn(*args, **kw)
        return None, time.perf_counter() - t0
    except Exception as e:   # noqa: BLE001 - the class is the verdict
        return type(e).__name__, time.perf_counter() - t0


def case_tags_never_collide_after_16000_halos(comm, rng, node_size, halos, **_):
    """A Halo made after 16,000 others (made and freed) never shares MPI tags with a live one:
    two Halos begun in different orders on different ranks still get their own ghosts."""
    with HybridComm(comm, node_size=node_size) as hc:
        pat = ring(hc)
        first = Halo(pat, method="flat")
        if halos == 0:
            return
        for _ in range(halos - 1):
            Halo(pat, method="flat").free()
        later = Halo(pat, method="flat")   # the 16,001st Halo made on this comm (by default)
        assert later.tag != first.tag
        xa, wa = fill(pat, hc, 1)
        xb, wb = fill(pat, hc, 2)
        pairs = [(first, xa), (later, xb)]
        order = pairs if hc.rank % 2 == 0 else pairs[::-1]
        for h, x in order:
            h.update_begin(x)
        for h, x in order[::-1]:
            h.update_end(x)
        assert np.array_equal(xa, wa) and np.array_equal(xb, wb), "ghosts swapped between Halos"
        first.free()
        later.free()


def case_bad_call_while_begin_pending(comm, rng, node_size, **_):
    """update(bad) while update_begin(x) is pending raises on every rank and leaves the pending
    call intact: update_end(x) then completes it with the right ghosts, on every method."""
    with HybridComm(comm, node_size=node_size) as hc:
        pat = ring(hc)
        for method in METHODS:
            h = Halo(pat, method=method)
            x, want = fill(pat, hc, 3)
            h.update_begin(x)
            for bad in (np.zeros(pat.size + 1), x[:-1], [1.0], np.zeros(pat.size, np.float32)):
                got, _ = outcome(h.update, bad)
                assert got in ("RuntimeError", "ValueError", "TypeError"), (method, got)
                got, _ = outcome(h.reverse_begin, bad)
                assert got is not None, (method, got)
            h.update_end(x)
            assert np.array_equal(x, want), method
            x2, want2 = fill(pat, hc, 4)
            h.update(x2)
            assert np.array_equal(x2, want2), method
            h.free()


def _one_rank_bad(hc, pat, method, op, kind, block=1):
    """Rank size-1 passes a bad array (``kind``: too short, None, a list) to ``op``, the others
    good ones: returns this
    rank's (exception, seconds) and whether each of its ghost entries holds either its old
    value or the owner's new one (never anything else)."""
    h = Halo(pat, method=method, block=block)
    x, want = fill(pat, hc, 5, block)
    if op.startswith("reverse"):
        want = x.copy()   # reverse: only the owned entries may change, checked below
    before = x.copy()
    bad = hc.rank == hc.size - 1
    arg = x if not bad else {"short": x[:-1], "none": None, "list": x.tolist()}[kind]

    def call():
        if op == "update":
            h.update(arg)
        elif op == "reverse":
            h.reverse(arg)
        elif op == "update_split":
            h.update_begin(arg)
            h.update_end(arg)
        else:
            h.reverse_begin(arg)
            h.reverse_end(arg)
    got = outcome(call)
    n = pat.n_owned
    if op.startswith("update"):   # each ghost: its owner's new value, or untouched
        ok = bool(np.all((x[n:] == want[n:]) | np.isnan(x[n:])))
    else:
        ok = np.array_equal(x[n:], before[n:], equal_nan=True)
    return got, ok


def case_one_rank_bad_argument_every_method(comm, rng, node_size, **_):
    """One rank's bad argument, the others' good: every rank raises at once (ValueError, or
    PeerError on a rank whose arguments were right), no ghost holds anything but the old or
    the new values, and afterwards every call on the comm raises on every rank."""
    for method in METHODS:
        for op, kind in [(op, k) for op in ("update", "reverse", "update_split", "reverse_split")
                         for k in ("short", "none", "list")]:
            hc = HybridComm(comm, node_size=node_size)
            pat = ring(hc)
            (exc, secs), ok = _one_rank_bad(hc, pat, method, op, kind)
            views = comm.allgather((exc, secs, ok))
            assert all(v[2] for v in views), (method, op, "ghosts neither old nor new", views)
            excs = [v[0] for v in views]
            assert excs[-1] == ("ValueError" if kind == "short" else "TypeError"), (method, op, views)
            assert all(e in (excs[-1], "PeerError", "PeerArgumentError") for e in excs), \
                (method, op, views)
            assert max(v[1] for v in views) < PROMPT_S, (method, op, "slow", views)
            # every later call raises on every rank, none hangs
            got, secs = outcome(Halo, pat, method=method)
            agree(comm, got)
            assert got == "RuntimeError", (method, op, got)
            got, _ = outcome(hc.barrier)
            agree(comm, got is not None)
            hc.free()
            comm.Barrier()


def case_array_resized_in_place(comm, rng, node_size, **_):
    """An array resized in place (same object, new memory) after it was updated: the next update
    and reverse use its new memory, never the freed one."""
    with HybridComm(comm, node_size=node_size) as hc:
        pat = ring(hc)
        for method in ("atomic", "flat"):
            with Halo(pat, method=method) as h:
                x = fill(pat, hc, 14)[0].copy()   # owns its data: resizable
                h.update(x)
                x.resize((1 << 20,), refcheck=False)   # moves the data
                x.resize((pat.size,), refcheck=False)
                x[:], want2 = fill(pat, hc, 15)
                h.update(x)
                assert np.array_equal(x, want2), method


def case_neighbor_opposite_orders_then_consistent(comm, rng, node_size, **_):
    """Two 'neighbor' Halos begun in opposite orders raise ValueError everywhere; afterwards
    every rank agrees: a new Halo on the pattern raises RuntimeError on every rank (never
    PeerError on one and success on the others), and the comm is freed cleanly."""
    if comm.size < 2:
        return skip("needs 2 or more ranks")
    with HybridComm(comm, node_size=node_size) as hc:
        pat = ring(hc)
        a, b = Halo(pat, method="neighbor"), Halo(pat, method="neighbor")
        xa, _ = fill(pat, hc, 6)
        xb, _ = fill(pat, hc, 7)
        order = [(a, xa), (b, xb)] if hc.rank == 0 else [(b, xb), (a, xa)]
        for h, x in order:
            h.update_begin(x)
        excs = []
        for h, x in order:
            excs.append(outcome(lambda h=h, x=x: h.update_end(x))[0])
        assert "ValueError" in excs, excs
        for _ in range(3):
            got, secs = outcome(lambda: Halo(pat, method="neighbor").update(fill(pat, hc, 8)[0]))
            agree(comm, got)
            assert got == "RuntimeError" and secs < PROMPT_S, (got, secs)


def case_calls_after_comm_broke_raise_everywhere(comm, rng, node_size, **_):
    """After an exception broke the comm (caught by user code), every later call of another
    Halo on it raises on every rank instead of storing a plain epoch over the error bits."""
    if comm.size < 2:
        return skip("needs 2 or more ranks")
    for method in ("atomic", "flat", "fence", "lock"):
        with HybridComm(comm, node_size=node_size) as hc:
            pat = ring(hc)
            other = Halo(pat, method=method)
            x, want = fill(pat, hc, 9)
            other.update(x)
            h = Halo(pat, method=method)
            arg = x[:-1] if hc.rank == 0 else x.copy()
            first, _ = outcome(h.update, arg)
            assert first in ("ValueError", "PeerError", "PeerArgumentError"), first
            for call in (other.update, other.reverse, other.update_begin):
                got, secs = outcome(call, x)
                agree(comm, got)
                assert got == "RuntimeError" and secs < PROMPT_S, (method, got, secs)


def case_missing_names_only_absent_ranks(comm, rng, node_size, **_):
    """SyncTimeout.missing never lists a rank that entered the call (the rank that timed out
    above all) and lists the rank that stayed away: the last rank comes 2.5 s late to an
    update with a 1 s timeout, with the methods that wait on counters (fence waits in
    MPI_Win_fence, which has no timeout)."""
    if comm.size < 2 or node_size is not None:
        return skip("needs 2 or more ranks on real nodes")
    with HybridComm(comm) as probe:
        if probe.num_nodes > 1:   # cliques: the late rank is on another node, not a node peer
            return skip("the late rank would be on another node (cliques)")
    for method in ("atomic", "lock"):
        hc = HybridComm(comm, timeout=1.0)
        pat = ring(hc)
        h = Halo(pat, method=method)
        x, _ = fill(pat, hc, 10)
        h.update(x)
        late = hc.size - 1
        if hc.rank == late:
            time.sleep(2.5)
        missing = None
        try:
            h.update(x)
        except Exception as e:   # noqa: BLE001 - every rank raises, checked below
            missing = getattr(e, "missing", None)
        assert missing is None or hc.rank not in missing, (method, missing)
        if hc.rank != late and missing is not None:
            assert late in missing, (method, missing)
        comm.Barrier()
        hc.free()
        comm.Barrier()


def case_collective_kinds_free_running(comm, rng, node_size, **_):
    """Free-running barriers, allreduces and Allreduces in a drawn order (the same on every
    rank) with per-rank delays: never a false 'different collective calls' (the signature's
    seqlock), always the right sums."""
    order = np.random.default_rng(11).integers(0, 3, 6000)
    with HybridComm(comm, node_size=node_size) as hc:
        buf = np.zeros(3)
        for i, k in enumerate(order):
            if rng.random() < 0.02:
                time.sleep(rng.random() * 2e-4)
            if k == 0:
                hc.barrier()
            elif k == 1:
                assert hc.allreduce(float(hc.rank + i)) == sum(r + i for r in range(hc.size))
            else:
                hc.Allreduce(np.full(3, float(i)), buf)
                assert buf[0] == i * hc.size


def case_one_rank_bad_barrier_same_algorithm(comm, rng, node_size, **_):
    """One rank's barrier with a bad method while the others call a valid one, whichever
    algorithm they use (dissemination, the one the invalid call runs, included): every rank
    raises, never a silent return on the valid ranks; when every rank is invalid, the comm
    stays usable."""
    if comm.size < 2:
        return skip("needs 2 or more ranks")
    for method in ("dissemination", "tree", "linear"):
        for _ in range(5):
            hc = HybridComm(comm, node_size=node_size)
            bad = hc.rank == hc.size - 1
            if rng.random() < 0.5:
                time.sleep(rng.random() * 1e-3)
            got, secs = outcome(hc.barrier, method="butterfly" if bad else method)
            views = comm.allgather((got, secs))
            assert views[-1][0] == "ValueError", (method, views)
            assert all(v[0] in ("ValueError", "PeerError", "PeerArgumentError") for v in views), \
                (method, views)
            assert max(v[1] for v in views) < PROMPT_S, (method, views)
            hc.free()
    with HybridComm(comm, node_size=node_size) as hc:
        got, _ = outcome(hc.barrier, method="butterfly")
        agree(comm, got)
        assert got == "ValueError"
        for method in ("dissemination", "tree", "linear"):
            hc.barrier(method=method)


def case_program_goes_on_after_errors(comm, rng, node_size, **_):
    """PeerError is the only other class a good rank may see; after freeing a broken comm a
    new one works on every rank."""
    hc = HybridComm(comm, node_size=node_size)
    pat = ring(hc)
    h = Halo(pat, method="atomic")
    x, _ = fill(pat, hc, 12)
    got, _ = outcome(lambda: h.update(x[:-1] if hc.rank == 0 else x))
    assert got in ("ValueError", "PeerError", "PeerArgumentError") or comm.size == 1
    hc.free()
    with HybridComm(comm, node_size=node_size) as hc2:
        pat2 = ring(hc2)
        with Halo(pat2) as h2:
            x2, want = fill(pat2, hc2, 13)
            h2.update(x2)
            assert np.array_equal(x2, want)
    assert PeerError is not None


CASES = [case_tags_never_collide_after_16000_halos, case_bad_call_while_begin_pending,
         case_one_rank_bad_argument_every_method, case_array_resized_in_place,
         case_neighbor_opposite_orders_then_consistent,
         case_calls_after_comm_broke_raise_everywhere, case_missing_names_only_absent_ranks,
         case_collective_kinds_free_running, case_one_rank_bad_barrier_same_algorithm,
         case_program_goes_on_after_errors]

if __name__ == "__main__":
    MPI.COMM_WORLD.Barrier()
    main(CASES, halos=16000)
