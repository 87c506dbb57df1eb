"""A signal during a wait: SIGINT (KeyboardInterrupt) and SIGTERM (SystemExit(143)) raise on
the signalled rank within a fraction of a second, in every kind of wait (the C core's waits on
shared memory, the waits on MPI requests, a constructor's agreement); the comm breaks, so every
peer raises PeerError instead of waiting for that rank, also one that comes late.

Rank 0 is signalled (by a timer thread of its own, as a terminal or a launcher would) while it
waits for the last rank, which comes 1.5 s later; the ranks between wait with rank 0.

Usage: python -m mpi4py signal_cases.py [--node-size K] [--only ...]
"""

import os
import signal
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _harness import main

from hybridmpi import GhostPattern, GlobalMemory, Halo, HybridComm, PeerError

#: seconds from the signal to the exception on the signalled rank, and on its peers
SIGNALLED_S, PEERS_S = 0.5, 2.0
LATE_S = 1.5


def ring(hc, n=8):
    right, left = (hc.rank + 1) % hc.size, (hc.rank - 1) % hc.size
    owned = np.arange(hc.rank * n, hc.rank * n + n)
    ghosts = np.unique([right * n, left * n + n - 1]) if hc.size > 1 else np.array([], dtype=np.int64)
    return GhostPattern.from_global(hc, owned, ghosts)


def interrupted(comm, cfg, call, sig=signal.SIGINT, prepare=None):
    """Run ``call(hc, state)`` once in step, then again with rank 0 signalled inside it."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal's Python has it
    hc = HybridComm(comm, node_size=cfg["node_size"], timeout=30)
    state = prepare(hc) if prepare else None
    call(hc, state)
    comm.Barrier()
    expect = KeyboardInterrupt if sig == signal.SIGINT else SystemExit
    sent = [0.0]

    def fire():
        sent[0] = time.time()
        os.kill(os.getpid(), sig)

    got, when = None, 0.0
    if hc.rank == comm.size - 1:
        time.sleep(LATE_S)
    timer = threading.Timer(0.3, fire) if hc.rank == 0 else None
    if timer:
        timer.start()
    entered = time.time()
    try:
        call(hc, state)
        got = "returned"
    except (PeerError, KeyboardInterrupt, SystemExit) as e:
        got, when = e, time.time()
    if got == "returned" and hc.rank != 0:
        # a peer whose part of the call needed nothing more of rank 0 (rank 0 had published
        # what it owed, or is no neighbour) completes it; a barrier, which needs rank 0,
        # must then raise at once, not wait
        t0 = time.time()
        try:
            hc.barrier()
        except PeerError as e:
            got, when = e, time.time()
        assert when - t0 < PEERS_S, f"rank {hc.rank}: the barrier after took {when - t0:.3f} s"
    if timer:
        timer.join()
    sent = comm.bcast(sent[0])
    try:
        check(hc, comm, got, when, max(sent, entered), expect, sig)
    finally:   # every rank reaches the barrier below, whatever it found
        hc.free()   # a broken comm: nothing collective
        comm.Barrier()


def check(hc, comm, got, when, sent, expect, sig):
    """``sent``: when the signal was sent, or when this rank entered the call after it."""
    if hc.rank == 0:
        assert isinstance(got, expect), f"rank 0 got {got!r}, not {expect.__name__}"
        if sig == signal.SIGTERM:
            assert got.code == 128 + signal.SIGTERM, got.code
        assert when - sent < SIGNALLED_S, f"raised {when - sent:.3f} s after the signal"
        print(f"  rank 0 raised {type(got).__name__} {1e3 * (when - sent):.1f} ms after the signal",
              flush=True)
    else:
        assert isinstance(got, PeerError), f"rank {hc.rank} got {got!r}, not PeerError"
        assert when - sent < PEERS_S, f"rank {hc.rank} raised {when - sent:.3f} s after the signal"
    assert hc.context.broken() is not None


def barrier(method):
    return lambda hc, _: hc.barrier(method=method)


def case_sigint_barrier_dissemination(comm, rng, **cfg):
    interrupted(comm, cfg, barrier("dissemination"))


def case_sigint_barrier_tree(comm, rng, **cfg):
    interrupted(comm, cfg, barrier("tree"))


def case_sigint_barrier_linear(comm, rng, **cfg):
    interrupted(comm, cfg, barrier("linear"))


def case_sigint_allreduce_float(comm, rng, **cfg):
    interrupted(comm, cfg, lambda hc, _: hc.allreduce(1.0))


def case_sigint_allreduce_array(comm, rng, **cfg):
    interrupted(comm, cfg, lambda hc, _: hc.allreduce(np.ones(300)))


def case_sigint_halo_update(comm, rng, **cfg):
    def prepare(hc):
        h = Halo(ring(hc), dtype=np.float64)
        return h, np.zeros(h.pattern.size)
    interrupted(comm, cfg, lambda hc, s: s[0].update(s[1]), prepare=prepare)


def case_sigint_halo_vector_update(comm, rng, **cfg):
    def prepare(hc):
        h = Halo(ring(hc), dtype=np.float64)
        return h, h.vector()
    interrupted(comm, cfg, lambda hc, s: s[0].update(s[1]), prepare=prepare)


def case_sigint_sync_all(comm, rng, **cfg):
    interrupted(comm, cfg, lambda hc, m: m.sync_all(), prepare=lambda hc: GlobalMemory(hc, 4))


def case_sigint_sync_images(comm, rng, **cfg):
    interrupted(comm, cfg, lambda hc, m: m.sync_images(list(range(hc.size))),
                prepare=lambda hc: GlobalMemory(hc, 4))


def case_sigint_constructor(comm, rng, **cfg):
    interrupted(comm, cfg, lambda hc, _: GlobalMemory(hc, 4))


def case_sigterm_barrier(comm, rng, **cfg):
    interrupted(comm, cfg, barrier("dissemination"), sig=signal.SIGTERM)


def case_sigterm_halo_update(comm, rng, **cfg):
    def prepare(hc):
        h = Halo(ring(hc), dtype=np.float64)
        return h, np.zeros(h.pattern.size)
    interrupted(comm, cfg, lambda hc, s: s[0].update(s[1]), sig=signal.SIGTERM, prepare=prepare)


def looping(comm, cfg, body):
    """Every rank runs ``body(hc)`` in a loop inside ``with hc``; rank 0 is signalled at 0.3 s,
    wherever it is (its own work, a constructor's collective, a free): it raises
    KeyboardInterrupt, leaving the block breaks the comm, and every peer raises PeerError within
    2 s instead of waiting in a constructor's collective (finding: blocking MPI collectives in
    GhostPattern.from_global and Halo() left the peer waiting forever)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sent, got, when = [0.0], None, 0.0

    def fire():
        sent[0] = time.time()
        os.kill(os.getpid(), signal.SIGINT)

    comm.Barrier()
    timer = threading.Timer(0.3, fire) if comm.rank == 0 else None
    if timer:
        timer.start()
    try:
        with HybridComm(comm, node_size=cfg["node_size"], timeout=30) as hc:
            for _ in range(100000):
                body(hc)
        got = "returned"
    except (PeerError, KeyboardInterrupt) as e:
        got, when = e, time.time()
    if timer:
        timer.join()
    sent = comm.bcast(sent[0])
    comm.Barrier()
    expect = KeyboardInterrupt if comm.rank == 0 else PeerError
    assert isinstance(got, expect), f"rank {comm.rank} got {got!r}"
    assert when - sent < (SIGNALLED_S if comm.rank == 0 else PEERS_S), when - sent


def case_sigint_pattern_loop(comm, rng, **cfg):
    def body(hc):
        n = 2000000 if hc.rank == 0 else 1000   # rank 0 busy in its own numpy work too
        owned = np.arange(hc.rank * 10**7, hc.rank * 10**7 + n)
        right = (hc.rank + 1) % hc.size
        GhostPattern.from_global(hc, owned, np.array([right * 10**7]) if hc.size > 1 else owned[:0])
    looping(comm, cfg, body)


def case_sigint_halo_constructor_loop(comm, rng, **cfg):
    pat = {}

    def body(hc):
        if id(hc) not in pat:
            pat[id(hc)] = ring(hc)
        with Halo(pat[id(hc)], method="atomic"):
            pass
    looping(comm, cfg, body)


if __name__ == "__main__":
    main([case_sigint_barrier_dissemination, case_sigint_barrier_tree, case_sigint_barrier_linear,
          case_sigint_allreduce_float, case_sigint_allreduce_array, case_sigint_halo_update,
          case_sigint_halo_vector_update, case_sigint_sync_all, case_sigint_sync_images,
          case_sigint_constructor, case_sigterm_barrier, case_sigterm_halo_update,
          case_sigint_pattern_loop, case_sigint_halo_constructor_loop])
