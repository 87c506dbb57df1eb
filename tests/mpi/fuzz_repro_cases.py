"""Minimal reproducers of the failures the API fuzzer (tests/mpi/fuzz.py) found, each written
as the guarantee it breaks, so that each passes once its bug is fixed.

    mpiexec -n N python -m mpi4py fuzz_repro_cases.py [--node-size K] [--only CASE,...]

Run with HYBRIDMPI_TIMEOUT=10: a case that would wait for a peer forever ends with SyncTimeout
(a failure) instead.  Each case's docstring gives the fuzzer command that found it.
"""

import threading
import time

import numpy as np
from _harness import agree, main
from mpi4py import MPI

from hybridmpi import GhostPattern, Halo, HybridComm, PeerError

PROMPT_S = 2.0
METHODS = ("atomic", "flat", "neighbor", "fence", "pscw", "lock")


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
        return
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
        return
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
        return
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
        return
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


CASES = [
    case_vector_while_begin_pending,
    case_reverse_op_none_is_invalid,
    case_one_rank_bad_argument_peers_raise_its_class_or_peererror,
    case_sync_images_bad_argument_on_one_rank,
    case_free_after_break_with_pscw_begin_pending,
    case_lock_peers_raise_promptly_after_a_break,
    case_valid_barrier_next_to_an_invalid_one,
]

if __name__ == "__main__":
    assert PeerError is not None and MPI is not None
    main(CASES)
