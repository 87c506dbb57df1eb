"""Minimal reproducers of the failures the API fuzzer (tests/mpi/fuzz.py) found, each written
as the guarantee it breaks, so that each passes once its bug is fixed.

    mpiexec -n N python -m mpi4py fuzz_repro_cases.py [--node-size K] [--only CASE,...]

Run with HYBRIDMPI_TIMEOUT=10: a case that would wait for a peer forever ends with SyncTimeout
(a failure) instead.  Each case's docstring gives the fuzzer command that found it.
"""

import os
import threading
import time

import numpy as np
from _harness import agree, main, skip
from mpi4py import MPI

from hybridmpi import GhostPattern, GlobalMemory, Halo, HybridComm, PeerError
from hybridmpi.tools.baselines import METHODS as _METHODS

PROMPT_S = 2.0
#: every Halo method (a new one in hybridmpi/ghost/transport/ is tested with no edit here)
METHODS = tuple(_METHODS)


def ring(hc, n=6):
    """Each rank owns n points and ghosts points 1 and n-1 of every other rank."""
    r, p = hc.rank, hc.size
    owned = np.arange(r * n, r * n + n)
    ghosts = np.array([q * n + k for q in range(p) if q != r for k in (1, n - 1)], dtype=np.int64)
    return GhostPattern.from_global(hc, owned, ghosts), owned, ghosts


def filled(pat, owned, ghosts, k):
    """x with the owned values of call k (ghosts NaN), and what a forward update must leave."""
    x = np.full(pat.size, np.nan)
    n = len(owned)
    x[:n] = owned * 10.0 + k
    want = x.copy()
    want[n:] = ghosts * 10.0 + k
    return x, want


def outcome(fn):
    """(exception class name or None, seconds)."""
    t0 = time.perf_counter()
    try:
        fn()
        return None, time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - the class is the verdict
        return type(e).__name__, time.perf_counter() - t0


def with_deadline(comm, seconds, fn):
    """Run fn(); if this rank is still in it after ``seconds``, abort the job with a message
    (a hang inside MPI, where no timeout applies)."""
    done = threading.Event()

    def watch():
        if not done.wait(seconds):
            print(f"rank {comm.rank}: still inside the call after {seconds} s: HANG", flush=True)
            comm.Abort(3)

    threading.Thread(target=watch, daemon=True).start()
    try:
        return fn()
    finally:
        done.set()


def case_vector_while_begin_pending(comm, rng, node_size):
    """Halo.vector() (collective, allowed at any time) while this Halo's update_begin is
    pending: update_end must complete the update.  Found: update_end raises AttributeError
    ('list' object has no attribute 'end') on every rank, every method -- the pending call
    holds the Halo's (empty, falsy) list of vectors as its zero-copy object, and vector()
    appends to that list.  Fuzzer: --seed 7 --steps 100 --misuse 0 (2 ranks), minimized to
    Halo(fence); update_begin(x); vector(); update_end(x)."""
    with HybridComm(comm, node_size=node_size) as hc:
        pat, owned, ghosts = ring(hc)
        for method in METHODS:
            h = Halo(pat, method=method)
            x, want = filled(pat, owned, ghosts, 1)
            h.update_begin(x)
            h.vector()
            got, _ = outcome(lambda h=h, x=x: h.update_end(x))
            agree(comm, got)
            assert got is None, (method, got)
            assert np.array_equal(x, want), method
            h.free()


def case_reverse_op_none_is_invalid(comm, rng, node_size):
    """reverse(x, op=None) and reverse_begin(x, None) are invalid ops: ValueError on every rank,
    nothing moved.  Found: op None skips the check (Halo._arg treats None as 'no op given')
    and the call goes ahead on the ranks that passed None while ranks that passed another
    invalid op raise, so the ranks fall out of step (SyncTimeout at the next call).
    Fuzzer: misuse kind halo-op, mode all (campaign seed 729941588)."""
    with HybridComm(comm, node_size=node_size) as hc:
        pat, owned, ghosts = ring(hc)
        for method in ("atomic", "flat"):
            h = Halo(pat, method=method)
            x, _ = filled(pat, owned, ghosts, 2)
            before = x.copy()
            got, _ = outcome(lambda h=h, x=x: h.reverse(x, None))
            agree(comm, got)
            assert got == "ValueError", (method, got)
            assert np.array_equal(x, before, equal_nan=True), method
            got, _ = outcome(lambda h=h, x=x: h.reverse_begin(x, None))
            agree(comm, got)
            assert got == "ValueError", (method, got)
            h.free()


def case_one_rank_bad_argument_peers_raise_its_class_or_peererror(comm, rng, node_size):
    """One rank passes a list (TypeError), the others good arrays: every rank that reads from
    it raises TypeError or PeerError (the guarantee: the same class, or PeerError on a rank
    whose own arguments were right).  Found: the readers raise a plain ValueError ('rank r
    passed invalid arguments to this call') that is not a PeerError."""
    if comm.size < 2:
        return skip("needs 2 or more ranks")
    for method in METHODS:
        with HybridComm(comm, node_size=node_size) as hc:
            pat, owned, ghosts = ring(hc)
            h = Halo(pat, method=method)
            x, _ = filled(pat, owned, ghosts, 3)
            arg = x.tolist() if hc.rank == 0 else x
            got, secs = with_deadline(comm, 30, lambda h=h, arg=arg: outcome(lambda: h.update(arg)))
            views = comm.allgather((got, secs))
            assert views[0][0] == "TypeError", (method, views)
            for r, (cls, s) in enumerate(views[1:], 1):
                assert cls in ("TypeError", "PeerError", "PeerArgumentError"), (method, r, views)
                assert s < PROMPT_S, (method, r, views)
            h.free()


def case_sync_images_bad_argument_on_one_rank(comm, rng, node_size):
    """Rank 0 passes an out-of-range rank to sync_images, the others name rank 0 as a right
    program would: every rank raises within 2 s.  Found: rank 0 raises ValueError ('nothing is
    signalled') and the others wait for its signal until the timeout (SyncTimeout after 10 s)."""
    if comm.size < 2:
        return skip("needs 2 or more ranks")
    from hybridmpi import GlobalMemory

    with HybridComm(comm, node_size=node_size) as hc:
        mem = GlobalMemory(hc, 4)
        arg = [hc.size] if hc.rank == 0 else [0]
        got, secs = outcome(lambda: mem.sync_images(arg))
        views = comm.allgather((got, secs))
        assert views[0][0] == "ValueError", views
        for r, (cls, s) in enumerate(views[1:], 1):
            assert cls in ("ValueError", "PeerError", "PeerArgumentError") and s < PROMPT_S, (r, views)


def case_free_after_break_with_pscw_begin_pending(comm, rng, node_size):
    """A pscw (or fence) Halo's update_begin is pending when the HybridComm breaks (one rank
    calls another barrier method); update_end raises; then free() must return on every rank.
    Found: free() hangs in MPI_Win_free on one rank (the pscw exposure epoch of the failed
    call is still open) while the other rank goes on.  Fuzzer seed 113 (2 ranks, --steps 100)."""
    if comm.size < 2:
        return skip("needs 2 or more ranks")
    for method in ("pscw", "fence"):
        hc = HybridComm(comm, node_size=node_size)
        pat, owned, ghosts = ring(hc)
        h = Halo(pat, method=method)
        x, _ = filled(pat, owned, ghosts, 4)
        h.update_begin(x)
        got, _ = outcome(lambda hc=hc: hc.barrier(method="linear" if hc.rank == 0 else "tree"))
        assert got is not None, "different barrier methods must raise"
        outcome(lambda h=h, x=x: h.update_end(x))
        with_deadline(comm, 20, h.free)
        with_deadline(comm, 20, hc.free)


def case_lock_peers_raise_promptly_after_a_break(comm, rng, node_size):
    """Method lock: one rank passes a bad array (its HybridComm breaks); in the next update
    every rank raises within 2 s.  Found: the ranks waiting for the broken rank's READY counter
    (read with MPI_Fetch_and_op) never see its error bits and wait until the timeout
    (SyncTimeout after 10 s).  Fuzzer: misuse halo-dtype, mode one, method lock, 3 ranks."""
    if comm.size < 2:
        return skip("needs 2 or more ranks")
    with HybridComm(comm, node_size=node_size) as hc:
        pat, owned, ghosts = ring(hc)
        h = Halo(pat, method="lock")
        x, _ = filled(pat, owned, ghosts, 5)
        arg = x.astype(np.float32) if hc.rank == 1 else x
        outcome(lambda: h.update(arg))
        got, secs = outcome(lambda: h.update(x))
        views = comm.allgather((got, secs))
        for r, (cls, s) in enumerate(views):
            assert cls is not None and cls != "SyncTimeout" and s < PROMPT_S, (r, views)


def case_valid_barrier_next_to_an_invalid_one(comm, rng, node_size):
    """Every rank calls barrier() (valid) then barrier(method="butterfly") (invalid on every
    rank, so every rank raises ValueError and the comm stays usable): the valid barrier never
    raises, however the ranks drift.  Found (with HYBRIDMPI_CHAOS): a rank still in the valid
    barrier raises PeerArgumentError when a faster rank has entered the invalid call, and the
    comm breaks.  Fuzzer: campaign seed 107833 (2 ranks), HYBRIDMPI_CHAOS=107833:200."""
    with HybridComm(comm, node_size=node_size) as hc:
        for i in range(300):
            if hc.rank == i % hc.size:
                time.sleep(rng.uniform(0, 200e-6))
            got, _ = outcome(hc.barrier)
            assert got is None, (i, got)
            got, _ = outcome(lambda: hc.barrier(method="butterfly"))
            assert got == "ValueError", (i, got)


def case_one_rank_bad_collective_argument_leaves_every_rank_alike(comm, rng, node_size):
    """One rank passes op='avg' to allreduce, the others 'sum': every rank raises (ValueError /
    PeerArgumentError); afterwards the objects are usable on every rank or raise on every
    rank.  Found: only the bad rank's HybridComm breaks; the others raised PeerArgumentError but
    their objects stay usable, so the next call (here the end of an update begun before)
    returns on the good ranks and raises RuntimeError ('unusable') on the bad one.  Fuzzer:
    misuse kinds coll-op / coll-type / coll-Allreduce, mode one (campaign seeds 998562,
    397814, 716752, 717055)."""
    if comm.size < 2:
        return skip("needs 2 or more ranks")
    with HybridComm(comm, node_size=node_size) as hc:
        pat, owned, ghosts = ring(hc)
        h = Halo(pat, method="atomic")
        x, want = filled(pat, owned, ghosts, 6)
        h.update_begin(x)
        got, _ = outcome(lambda: hc.allreduce(1.0, op="avg" if hc.rank == 1 else "sum"))
        assert got is not None, got
        got, secs = with_deadline(comm, 30, lambda: outcome(lambda: h.update_end(x)))
        views = comm.allgather((got, secs))
        assert len({v[0] is None for v in views}) == 1, ("some ranks returned, some raised", views)
        assert all(v[1] < PROMPT_S for v in views), views
        got, secs = with_deadline(comm, 30, lambda: outcome(hc.barrier))
        views = comm.allgather((got, secs))
        assert len({v[0] is None for v in views}) == 1, ("barrier: some returned, some raised", views)


def case_peers_across_nodes_raise_promptly_after_a_break(comm, rng, node_size):
    """Across (virtual) nodes (run with --node-size 1): rank 0 owns nothing and ghosts two
    points of rank 1; rank 0 passes a read-only array to a flat Halo's reverse (invalid), the
    others valid ones: rank 1, which reads from rank 0, raises PeerArgumentError and its comm
    breaks; rank 0's own comm stays intact (nobody sends to it).  Then every rank calls
    allreduce with op='avg' (invalid on every rank): every rank must raise within 2 s.
    Found: rank 1 raises at once (RuntimeError, unusable), rank 0 waits for it in the leaders'
    allreduce until SyncTimeout after 10 s -- a rank whose comm broke on a PeerError sends no
    failure notice (notify=False), so a rank whose comm is intact on another node is never told.
    Minimized by scripts/fuzz_minimize.py from HYBRIDMPI_CHAOS=8734:200 fuzz.py --seed 8741
    --steps 100 --node-size 1 --same-order fence,pscw (2 ranks) to these 4 steps."""
    if comm.size < 2:
        return skip("needs 2 or more ranks")
    with HybridComm(comm, node_size=node_size) as hc:
        owned = np.zeros(0, np.int64) if hc.rank == 0 else np.arange(2 * hc.rank, 2 * hc.rank + 2)
        ghosts = np.array([2, 3], np.int64) if hc.rank == 0 else np.zeros(0, np.int64)
        pat = GhostPattern.from_global(hc, owned, ghosts)
        h = Halo(pat, method="flat", block=3)
        x = np.ones((pat.size, 3))
        if hc.rank == 0:
            x.flags.writeable = False
        outcome(lambda: h.reverse(x, "min"))
        got, secs = outcome(lambda: hc.allreduce(1.0, op="avg"))
        views = comm.allgather((got, secs))
        for r, (cls, s) in enumerate(views):
            assert cls not in (None, "SyncTimeout") and s < PROMPT_S, (r, views)


def case_pscw_first_update_after_creation(comm, rng, node_size):
    """A new pscw Halo's first update gives the owners' values, however the ranks drift (run
    with HYBRIDMPI_CHAOS).  Seen once (3 ranks, one node, HYBRIDMPI_CHAOS=642560:200, program
    seed 642566 step 6): every rank returned and rank 2's four ghosts were 0.0 -- the zeros of
    a sender's buffer read before it was packed (MPI_Win_start need not wait for the post when
    the data is then read with loads); not reproduced in 40 later runs."""
    with HybridComm(comm, node_size=node_size) as hc:
        pat, owned, ghosts = ring(hc)
        for i in range(100):
            h = Halo(pat, method="pscw", dtype=np.float32, block=2)
            x = np.empty((pat.size, 2), np.float32)
            n = len(owned)
            x[:n] = (owned * 10.0 + i)[:, None]
            x[n:] = -1.0
            if hc.rank == i % hc.size:
                time.sleep(rng.uniform(0, 300e-6))
            h.update(x)
            assert np.array_equal(x[n:], np.repeat((ghosts * 10.0 + i)[:, None], 2, 1).astype(np.float32)), i
            h.free()


def case_fence_and_pscw_halos_interleaved_in_different_orders(comm, rng, node_size):
    """The guide once said 'calls on different Halos may interleave differently on different
    ranks' (every method); it now asks fence and pscw Halos for one order on every rank.  Two
    fence Halos begun in opposite orders on even and odd ranks, or a pscw Halo ended before a
    flat one's begin on even ranks but after its end on odd ones, cannot complete: every rank
    must raise (SyncTimeout, or PeerError once a peer timed out) within the timeout and a
    little, never wait for ever (or every rank complete, where no node is shared).  Found:
    both deadlocked inside MPI (a fence begin is MPI_Win_fence, collective over the node; a
    pscw end waits in MPI_Win_wait for the peer's end), where no timeout applies; now each rank
    waits on its peers' gate words first, under the deadline.  Fuzzer: campaign seeds 549629
    (pscw + flat), 482131 (fence), 3 ranks."""
    if comm.size < 2:
        return skip("needs 2 or more ranks")
    for kind in ("pscw", "fence"):
        with HybridComm(comm, node_size=node_size, timeout=1.0) as hc:
            pat, owned, ghosts = ring(hc)
            a, b = Halo(pat, method=kind), Halo(pat, method="flat" if kind == "pscw" else kind)
            xa, _ = filled(pat, owned, ghosts, 8)
            xb, _ = filled(pat, owned, ghosts, 9)
            even = hc.rank % 2 == 0
            if kind == "pscw":
                order = ([(a.update_begin, xa), (a.update_end, xa), (b.update_begin, xb), (b.update_end, xb)]
                         if even else
                         [(a.update_begin, xa), (b.update_begin, xb), (b.update_end, xb), (a.update_end, xa)])
            else:
                pairs = [(a, xa), (b, xb)] if even else [(b, xb), (a, xa)]
                order = [(h.update_begin, x) for h, x in pairs] + [(h.update_end, x) for h, x in pairs]

            def run(order=order):
                for f, x in order:
                    f(x)

            got, secs = with_deadline(comm, 20, lambda run=run: outcome(run))
            views = comm.allgather((got, secs))
            # (across nodes only messages move: the calls may then complete on every rank)
            assert (all(v[0] is None for v in views)
                    or all(v[0] in ("SyncTimeout", "PeerError") and v[1] < 1.0 + PROMPT_S
                           for v in views)), (kind, views)


def case_sync_images_invalid_on_every_rank_stays_usable(comm, rng, node_size):
    """Every rank passes an out-of-range rank to sync_images: each raises ValueError and,
    nothing having been signalled, the next sync_images and sync_all work (as a Halo call
    whose arguments were invalid on every rank).  Found after the fix of 16:39 (451dd87):
    every later sync_images/sync_all raises RuntimeError ('global memory synchronization is
    unusable after an earlier invalid sync_images arguments') on every rank.  Fuzzer: misuse
    kind sync-images-bad, mode all (test_fuzz seeds 202, 302)."""
    from hybridmpi import GlobalMemory

    with HybridComm(comm, node_size=node_size) as hc:
        mem = GlobalMemory(hc, 4)
        got, _ = outcome(lambda: mem.sync_images([hc.size]))
        agree(comm, got)
        assert got == "ValueError", got
        peers = [r for r in range(hc.size) if r != hc.rank]
        got, _ = outcome(lambda: mem.sync_images(peers))
        agree(comm, got)
        assert got is None, got
        got, _ = outcome(mem.sync_all)
        agree(comm, got)
        assert got is None, got


def case_halo_after_a_break_on_another_rank(comm, rng, node_size):
    """One node: rank 0 owns nothing and ghosts two of rank 1's points; rank 0 passes a wrong
    shape to a Halo's reverse, rank 1 a right array: rank 1 (which reads from rank 0) raises
    PeerArgumentError and its comm breaks, rank 0's stays intact (nobody sends to it).  Then
    both call update on another Halo of the same method: each raises within 2 s (or both
    complete) -- never waits.  Found: rank 1 raises at once (unusable) without taking part;
    rank 0 then waits: flat: SyncTimeout after 10 s (rank 1 broke on a PeerError and sent no
    failure notice); pscw and fence: for ever inside MPI_Win_wait / MPI_Win_fence (no timeout
    there).  atomic, neighbor and lock: both raise at once.  Fuzzer: HYBRIDMPI_CHAOS=23132:200
    fuzz.py --seed 23137 --steps 100 --same-order fence,pscw (3 ranks), steps 12-13.  (A hang
    aborts the job after 20 s; the methods that hang come last.)"""
    if comm.size < 2:
        return skip("needs 2 or more ranks")
    for method in ("atomic", "neighbor", "lock", "flat", "pscw", "fence"):
        with HybridComm(comm, node_size=node_size) as hc:
            owned = np.zeros(0, np.int64) if hc.rank == 0 else np.arange(2 * hc.rank, 2 * hc.rank + 2)
            ghosts = np.array([2, 3], np.int64) if hc.rank == 0 else np.zeros(0, np.int64)
            pat = GhostPattern.from_global(hc, owned, ghosts)
            a, b = Halo(pat, method=method), Halo(pat, method=method)
            x = np.ones(pat.size)
            outcome(lambda a=a, x=x, pat=pat, hc=hc: a.reverse(np.ones(pat.size + 1) if hc.rank == 0 else x))
            got, secs = with_deadline(comm, 20, lambda b=b, x=x: outcome(lambda: b.update(x)))
            views = comm.allgather((got, secs))[:2]   # (ranks 0 and 1: the others take no part)
            assert len({v[0] is None for v in views}) == 1, (method, views)
            assert all(v[1] < PROMPT_S for v in views), (method, views)


def case_invalid_mark_survives_the_senders_next_call(comm, rng, node_size):
    """fence, pscw, lock: every rank passes a read-only array (call e: every rank raises its
    own ValueError, the Halo stays usable), then rank 0 alone passes one again (call e + 1).
    Rank 1 reads the marks of call e late (a 50 ms delay put before its mark check).  Found
    (soak, lock, 4 ranks --node-size 2, about 1 run in 2): rank 0, which sends only, ended call
    e at once and stored call e + 1's mark over call e's; rank 1 then took rank 0 for valid in
    call e, broke its comm and raised RuntimeError in call e + 1 instead of PeerError or
    ValueError.  The mark is now kept per epoch parity."""
    from hybridmpi.tools.baselines._window import OwnWindow

    if comm.size < 2:
        return skip("needs 2 or more ranks")
    slow_among = OwnWindow.bad_among

    def late(self, d, e, peers):
        time.sleep(0.05)
        return slow_among(self, d, e, peers)

    for method in ("lock", "fence", "pscw"):
        with HybridComm(comm, node_size=node_size) as hc:
            pat, owned, ghosts = ring(hc)
            h = Halo(pat, method=method)
            x, _ = filled(pat, owned, ghosts, 1)
            ro = x.copy()
            ro.flags.writeable = False
            if hc.rank == 1:
                OwnWindow.bad_among = late
            try:
                first = outcome(lambda h=h, ro=ro: h.update(ro))
                second = outcome(lambda h=h, ro=ro, x=x, hc=hc: h.update(ro if hc.rank == 0 else x))
            finally:
                OwnWindow.bad_among = slow_among
            views = comm.allgather((first[0], second[0]))
            assert all(v[0] == "ValueError" for v in views), (method, views)
            assert views[0][1] == "ValueError", (method, views)
            assert all(v[1] in (None, "PeerArgumentError", "PeerError") for v in views[1:]), (method, views)


def case_reverse_combines_every_sender_or_none(comm, rng, node_size):
    """Three ranks or more: rank 0 owns point 0, every other rank ghosts it; the last rank
    passes a read-only array to reverse(op='add'), the others valid ones.  Rank 0 must raise
    with x[0] untouched (it must not add the valid senders' values and then stop at the invalid
    one's mark: a partial sum, neither the old value nor the new).  Found (soak, atomic and
    lock, 3 ranks): x[0] held the old value plus rank 1's."""
    if comm.size < 3:
        return skip("needs 3 or more ranks")
    for method in ("atomic", "lock", "fence", "pscw", "flat", "neighbor"):
        with HybridComm(comm, node_size=node_size) as hc:
            r = hc.rank
            owned = np.array([0], np.int64) if r == 0 else np.array([r], np.int64)
            ghosts = np.zeros(0, np.int64) if r == 0 else np.array([0], np.int64)
            pat = GhostPattern.from_global(hc, owned, ghosts)
            h = Halo(pat, method=method)
            x = np.full(pat.size, 1.0 + r)
            if r == hc.size - 1:
                x.flags.writeable = False
            got = outcome(lambda h=h, x=x: h.reverse(x, "add"))
            views = comm.allgather((got[0], float(x[0])))
            assert views[0][0] is not None and views[0][1] == 1.0, (method, views)


def case_valid_collective_completed_before_a_peer_broke_elsewhere(comm, rng, node_size):
    """Finding 15, its other half: rank 1 is stopped (SIGSTOP) while it waits in a valid
    collective; rank 0 completes the call, then its comm breaks outside any collective (its own
    exception leaves the ``with`` block, as a one-rank invalid Halo call does).  Resumed, rank 1
    reads rank 0's word with the error bits beside this call's value: the call completed on
    rank 0, so it returns here too, and rank 1's next call raises PeerError.  Before: rank 1
    raised PeerArgumentError in the valid call (every barrier method, both allreduce paths; seen
    in the fuzzer with a Halo call after a barrier, ``--seed 205``, 3 ranks)."""
    sub = comm.Split(0 if comm.rank < 2 else MPI.UNDEFINED, comm.rank)
    if sub == MPI.COMM_NULL:
        return   # not in the pair this case runs on
    calls = {
        "barrier(tree)": lambda hc: hc.barrier(method="tree"),
        "barrier(linear)": lambda hc: hc.barrier(method="linear"),
        "barrier(dissemination)": lambda hc: hc.barrier(method="dissemination"),
        "allreduce(float)": lambda hc: hc.allreduce(1.0),
        "Allreduce(64 doubles)": lambda hc: hc.Allreduce(np.ones(64), np.empty(64)),
        "sync_images": lambda hc: hc.gm.sync_images(1 - hc.rank),
    }
    try:
        for name, call in calls.items():
            got = []
            try:
                with HybridComm(sub, node_size=node_size) as hc:
                    hc.gm = GlobalMemory(hc, 8)
                    hc.barrier()
                    if hc.rank == 1:
                        pid = os.getpid()
                        os.system(f"(sleep 0.1; kill -STOP {pid}; sleep 0.6; kill -CONT {pid}) &")
                        got.append(outcome(lambda hc=hc, call=call: call(hc))[0])
                        got.append(outcome(lambda hc=hc: hc.barrier())[0])
                    else:
                        time.sleep(0.3)
                        got.append(outcome(lambda hc=hc, call=call: call(hc))[0])
                        raise KeyError("rank 0's own error")
            except KeyError:
                pass
            views = sub.allgather(got)
            assert views[0] == [None] and views[1] == [None, "PeerError"], (name, views)
    finally:
        sub.Free()


def _pair(comm):
    """A communicator of ranks 0 and 1 (COMM_NULL elsewhere)."""
    return comm.Split(0 if comm.rank < 2 else MPI.UNDEFINED, comm.rank)


def case_sync_images_timeout_breaks_the_comm(comm, rng, node_size):
    """An outside review (2026-11-27): rank 0 times out in sync_images (timeout 0.5 s) because
    rank 1 comes 0.3 s late; rank 1's call returned normally and both ranks' next barrier too
    (the timeout broke only the memory's synchronization, and rank 0 had stored its count).  A
    timeout breaks the HybridComm, as in any call, and a peer that came but failed in the call
    has not completed it: rank 1 raises PeerError, then both raise in the next call.  (One
    node: across nodes a rank that enters a call after a peer's timeout may complete it, see
    docs/guide/reliability.md.)"""
    sub = _pair(comm)
    if sub == MPI.COMM_NULL:
        return   # not in the pair this case runs on
    try:
        with HybridComm(sub, node_size=2, timeout=0.5) as hc:
            gm = GlobalMemory(hc, 8)
            hc.barrier()
            if hc.rank == 1:
                time.sleep(0.8)
            got = [outcome(lambda: gm.sync_images(1 - hc.rank))[0], outcome(hc.barrier)[0]]
            views = sub.allgather(got)
            assert views[0][0] == "SyncTimeout" and views[1][0] == "PeerError", views
            assert all(v[1] in ("RuntimeError", "PeerError") for v in views), views
    finally:
        sub.Free()


def case_barrier_methods_differ_across_nodes(comm, rng, node_size):
    """An outside review (2026-11-27): barrier(method="dissemination") on one node against
    barrier(method="tree") on another returned on every rank (across nodes both run the node's
    tree, and the leaders compared that): the leaders now compare the methods called, and
    every rank raises ValueError, as on one node."""
    sub = _pair(comm)
    if sub != MPI.COMM_NULL:
        try:
            with HybridComm(sub, node_size=1) as hc:
                got = outcome(lambda: hc.barrier(method="dissemination" if hc.rank == 0 else "tree"))[0]
                views = sub.allgather(got)
                assert views == ["ValueError", "ValueError"], views
        finally:
            sub.Free()


def case_pscw_free_with_a_begin_pending(comm, rng, node_size):
    """An outside review (2026-11-27): a pscw Halo freed with update_begin pending on every rank
    left its exposure epoch open: MPI_Win_free raised "Wrong synchronization of RMA calls" (and
    ids and mappings leaked), and once freed windows were kept, the next pscw Halo failed in
    MPI_Win_post.  A Halo with a window of its own ends a pending call in its free (every rank
    is in that free): the next Halos of each method are right, nothing leaks."""
    from hybridmpi.comm.room import held_ids
    ids0 = held_ids()
    with HybridComm(comm, node_size=node_size) as hc:
        pat, owned, ghosts = ring(hc)
        for method in ("pscw", "fence", "lock"):
            for d in ("update", "reverse"):
                h = Halo(pat, method=method)
                x, _ = filled(pat, owned, ghosts, 1)
                getattr(h, d + "_begin")(np.nan_to_num(x))
                h.free()
                h2 = Halo(pat, method=method)
                x, want = filled(pat, owned, ghosts, 2)
                h2.update(x)
                assert np.array_equal(x, want), (method, d, x, want)
                h2.free()
    assert held_ids() == ids0, (held_ids(), ids0)


def case_valid_collective_next_to_a_one_rank_invalid_one(comm, rng, node_size):
    """A valid allreduce, then rank 0 alone calls allreduce with op 'avg' (invalid), 40 times
    with the C core's random delays on: the valid call must return on every rank.  Found
    (soak, 4 ranks, about 1 run in 2 of one program; finding 15): a slow rank still reading
    the valid call's last word saw the error bits rank 0 left there from its invalid next
    call and raised PeerArgumentError in a call that had completed on its peers.  A peer that
    already entered a later call finished this one: its error bits belong to that call.
    (Runs last: the delays stay on in this process.)"""
    if comm.size < 3:
        return skip("needs 3 or more ranks")
    os.environ["HYBRIDMPI_CHAOS"] = "7:300"
    try:
        for _ in range(40):
            with HybridComm(comm, node_size=node_size) as hc:
                first = outcome(lambda hc=hc: hc.allreduce(1.0))
                outcome(lambda hc=hc: hc.allreduce(1.0, op="avg" if hc.rank == 0 else "sum"))
            views = comm.allgather(first[0])
            assert all(v is None for v in views), views
    finally:
        del os.environ["HYBRIDMPI_CHAOS"]


def case_invalid_rank_keeps_its_own_error_on_every_method(comm, rng, node_size):
    """One rank passes a float32 vector, the others a valid one, on every method and direction:
    every other rank raises PeerArgumentError or PeerError (in this call or the next), and the
    invalid rank's Halo stays broken by its own TypeError (pscw closes its epochs as usual, and
    its bad call ends without a peer's error bits: an outside review of the error map found
    pscw, lock and fence still catching the fault kind the map had renamed)."""
    if comm.size < 2:
        return skip("needs 2 or more ranks")
    bad_rank = comm.size - 1
    for method in METHODS:
        for d in ("update", "reverse"):
            with HybridComm(comm, node_size=node_size) as hc:
                pat, owned, ghosts = ring(hc)
                h = Halo(pat, method=method)
                x, _ = filled(pat, owned, ghosts, 1)
                x = np.nan_to_num(x)
                arg = x.astype(np.float32) if hc.rank == bad_rank else x
                got = []
                for a in (arg, x):
                    try:
                        getattr(h, d)(a)
                        got.append("ok")
                    except Exception as e:  # noqa: BLE001 - what each rank raised is the verdict
                        got.append(f"{type(e).__name__}: {e}")
                if hc.rank == bad_rank:
                    ok = (got[0].startswith("TypeError") and "float32" in got[0]
                          and "unusable after an earlier TypeError" in got[1])
                else:
                    ok = any(g.startswith(("PeerArgumentError", "PeerError")) for g in got)
                verdicts = comm.allgather((ok, f"{method} {d} rank {hc.rank}: {got}"))
                bad = [w for good, w in verdicts if not good]
                assert not bad, bad   # every rank raises the same verdict


CASES = [
    case_vector_while_begin_pending,
    case_reverse_op_none_is_invalid,
    case_one_rank_bad_argument_peers_raise_its_class_or_peererror,
    case_sync_images_bad_argument_on_one_rank,
    case_free_after_break_with_pscw_begin_pending,
    case_lock_peers_raise_promptly_after_a_break,
    case_valid_barrier_next_to_an_invalid_one,
    case_sync_images_invalid_on_every_rank_stays_usable,
    case_one_rank_bad_collective_argument_leaves_every_rank_alike,
    case_peers_across_nodes_raise_promptly_after_a_break,
    case_pscw_first_update_after_creation,
    case_halo_after_a_break_on_another_rank,
    case_invalid_mark_survives_the_senders_next_call,
    case_reverse_combines_every_sender_or_none,
    case_fence_and_pscw_halos_interleaved_in_different_orders,
    case_valid_collective_completed_before_a_peer_broke_elsewhere,
    case_sync_images_timeout_breaks_the_comm,
    case_barrier_methods_differ_across_nodes,
    case_pscw_free_with_a_begin_pending,
    case_valid_collective_next_to_a_one_rank_invalid_one,
    case_invalid_rank_keeps_its_own_error_on_every_method,
]

if __name__ == "__main__":
    assert PeerError is not None and MPI is not None
    main(CASES)
