# ruff: noqa: B023 - every closure here is called inside the iteration that makes it
"""The ways around the calls: leaving a ``with`` block on one rank's own exception, the
agreements of constructors, patterns and the profile, arguments that cannot be sent or shown.

Every outcome is the right value, or an exception on every rank within 2 s of the first (the
timeout only where a rank never calls): each case takes the time each rank raised
(CLOCK_MONOTONIC, one machine) and compares them.
"""

import time

import numpy as np
from _harness import main, skip

import hybridmpi
from hybridmpi import Coarray, GhostPattern, GlobalMemory, Halo, HybridComm

#: seconds a peer may raise after the first rank that raised
LAG = 2.0
#: the timeout of the comms of the cases where one rank waits on a call nobody joins
SHORT = 1.0


class _BadRepr:
    def __repr__(self):
        raise AttributeError("this object's repr raises")

    def __index__(self):
        raise AttributeError("this object's __index__ raises")


def _ring(hc):
    n = 4
    owned = np.arange(hc.rank * n, hc.rank * n + n)
    ghosts = np.array([((hc.rank + 1) % hc.size) * n]) if hc.size > 1 else np.zeros(0, np.int64)
    return GhostPattern.from_global(hc, owned, ghosts)


def _outcome(comm, fn):
    """Run ``fn`` and return (exception class name or None, monotonic time it returned)."""
    try:
        fn()
        got = None
    except BaseException as e:  # noqa: BLE001 - the case judges every kind
        got = e
    return got, time.monotonic()


def _judge(comm, got, t, expect, *, first_at=None):
    """Every rank's exception class is in ``expect[rank]`` (a tuple of classes, or (None,) for
    no exception); every rank raised within LAG s of the first (or of ``first_at``)."""
    views = comm.allgather((type(got).__name__ if got is not None else None, t, str(got)[:300]))
    start = min(v[1] for v in views) if first_at is None else first_at
    for r, (name, tr, text) in enumerate(views):
        allowed = [c.__name__ if c is not None else None for c in expect(r)]
        assert name in allowed, f"rank {r} got {name} ({text}), expected one of {allowed}"
        assert tr - start <= LAG, f"rank {r} raised {tr - start:.2f} s after the first: {views}"
    return views


# ------------------------------------------------------------ leaving a with block

def _others_in_a_call(hc, call, h=None, x=None, mem=None):
    """What the ranks that do not raise are in while rank 0 raises its own error."""
    if call == "barrier":
        hc.barrier()
    elif call == "allreduce":
        hc.allreduce(1.0)
    elif call == "update":
        h.update(x)
    elif call == "sync_all":
        mem.sync_all()


def case_own_exception_leaves_every_block(comm, rng, node_size=None):
    """Rank 0 raises its own KeyError inside a with block of each collective object while the
    others are in a call: rank 0 gets its KeyError, the others PeerError within 2 s (before:
    the block's exit made a collective call that the others never joined: a hang)."""
    if comm.size == 1:
        return skip("needs 2 or more ranks")
    for kind in ("profile", "Halo", "GlobalMemory", "Coarray", "HybridComm"):
        for call in ("barrier", "allreduce", "update"):
            hc = HybridComm(comm, node_size=node_size)
            pat = _ring(hc)
            h = Halo(pat)
            x = np.zeros(pat.size)
            objects = {"profile": lambda: hybridmpi.profile(hc), "Halo": lambda: h,
                       "GlobalMemory": lambda: GlobalMemory(hc, 8),
                       "Coarray": lambda: Coarray(hc, (2, 3)), "HybridComm": lambda: hc}
            obj = objects[kind]()
            comm.Barrier()

            def body():
                with obj:
                    if hc.rank == 0:
                        time.sleep(0.05)
                        raise KeyError("rank 0's own error")
                    _others_in_a_call(hc, call, h, x)
                    _others_in_a_call(hc, call, h, x)   # the second cannot complete
            got, t = _outcome(comm, body)
            # a rank whose updates need nothing of rank 0's completes them (the right value)
            # and leaves normally; its free then finds the comm broken and waits for nobody
            _judge(comm, got, t, lambda r: (KeyError,) if r == 0 else (hybridmpi.PeerError,)
                   if call != "update" else (None, hybridmpi.PeerError))
            hc.free()   # broken: frees what needs no peer, never waits
            assert hc.closed


def case_agreed_exception_keeps_the_comm(comm, rng, node_size=None):
    """An invalid call on every rank inside a Halo's block (agreed: every rank raises it
    together) frees the Halo collectively, as a normal exit does: the comm stays usable."""
    with HybridComm(comm, node_size=node_size) as hc:
        pat = _ring(hc)
        try:
            with Halo(pat) as h:
                h.update(np.zeros(pat.size + 1))
            raise AssertionError("an update of a wrong size did not raise")
        except ValueError:
            pass
        assert h.closed
        assert hc.allreduce(1) == hc.size   # the comm is usable on every rank


def case_peer_left_before_this_rank_frees(comm, rng, node_size=None):
    """Rank 0's own exception leaves its Halo block while the others leave theirs normally and
    free the Halo (MPI_Win_free is collective): they raise PeerError or return from free, never
    wait for rank 0, which will not free."""
    if comm.size == 1:
        return skip("needs 2 or more ranks")
    hc = HybridComm(comm, node_size=node_size)
    pat = _ring(hc)

    def body():
        with Halo(pat, method="fence"):
            if hc.rank == 0:
                raise KeyError("rank 0's own error")
            time.sleep(0.1)
    got, t = _outcome(comm, body)
    _judge(comm, got, t, lambda r: (KeyError,) if r == 0 else (None, hybridmpi.PeerError))
    hc.free()


# ------------------------------------------------------------ agreements under the deadline

def case_constructor_against_a_collective(comm, rng, node_size=None):
    """Rank 0 in a constructor or pattern builder, the others in barrier, allreduce or update:
    each side waits for the other under the same deadline, so each raises SyncTimeout, or
    PeerError when the other's notice comes first, within 2 s of the first (before: rank 0
    waited forever in a blocking MPI collective)."""
    if comm.size == 1:
        return skip("needs 2 or more ranks")
    calls = ("barrier", "allreduce", "update")
    for i, make in enumerate(("Halo", "GlobalMemory", "from_global", "Coarray", "profile", "vector")):
        for call in (calls[i % 3],):
            hc = HybridComm(comm, node_size=node_size, timeout=SHORT)
            pat = _ring(hc)
            h = Halo(pat)
            x = np.zeros(pat.size)
            comm.Barrier()
            makers = {"Halo": lambda: Halo(pat), "GlobalMemory": lambda: GlobalMemory(hc, 4),
                      "from_global": lambda: _ring(hc), "Coarray": lambda: Coarray(hc, 3),
                      "profile": lambda: hybridmpi.profile(hc).__enter__(), "vector": h.vector}
            if hc.rank == 0:
                got, t = _outcome(comm, makers[make])
            else:
                got, t = _outcome(comm, lambda: _others_in_a_call(hc, call, h, x))
            _judge(comm, got, t, lambda r: (hybridmpi.SyncTimeout, hybridmpi.PeerError)
                   if r == 0 or call != "update" else (None, hybridmpi.SyncTimeout, hybridmpi.PeerError))
            hc.free()


def case_hybridcomm_against_a_collective(comm, rng, node_size=None):
    """Rank 0 in HybridComm() on a communicator whose other ranks never call it: SyncTimeout
    at the deadline (env HYBRIDMPI_TIMEOUT, or its own timeout argument), not a hang."""
    if comm.size == 1:
        return skip("needs 2 or more ranks")
    sub = comm.Dup()   # rank 0's agreement stays pending on it: never used again
    got, t0 = None, time.monotonic()
    if comm.rank == 0:
        got, t = _outcome(comm, lambda: HybridComm(sub, node_size=node_size, timeout=SHORT))
        assert isinstance(got, hybridmpi.SyncTimeout), got
        assert SHORT - 0.1 <= t - t0 <= SHORT + LAG, t - t0
        assert "HybridComm()" in str(got), got
    comm.Barrier()


def case_profile_against_allreduce(comm, rng, node_size=None):
    """A profile turned on by rank 0 while the others call allreduce: the profile's agreement
    never matches their allreduce (before: it did, silently, and then a rank hung)."""
    if comm.size == 1:
        return skip("needs 2 or more ranks")
    hc = HybridComm(comm, node_size=node_size, timeout=SHORT)
    if hc.rank == 0:
        got, t = _outcome(comm, lambda: hybridmpi.profile(hc).__enter__())
    else:
        got, t = _outcome(comm, lambda: hc.allreduce(1.0))
    _judge(comm, got, t, lambda r: (hybridmpi.SyncTimeout, hybridmpi.PeerError))
    hc.free()


# ------------------------------------------------------------ arguments that cannot travel

def _gen():
    yield 3


def case_unpicklable_or_unprintable_argument_on_one_rank(comm, rng, node_size=None):
    """A generator, a lambda, an object whose repr and __index__ raise, on one rank only, as
    an argument of each constructor: TypeError or ValueError on every rank at once (before:
    a raw error on that rank, the others blocked in MPI_Allgather)."""
    hc = HybridComm(comm, node_size=node_size)
    pat = _ring(hc)
    bad = comm.size - 1
    trials = [
        ("Coarray shape", lambda odd: Coarray(hc, (x for x in ("a", 3)) if odd else (2, 3))),
        ("Coarray dtype", lambda odd: Coarray(hc, 3, dtype=(lambda: 0) if odd else np.float64)),
        ("GlobalMemory dtype", lambda odd: GlobalMemory(hc, 3, _BadRepr() if odd else np.float64)),
        ("GlobalMemory count", lambda odd: GlobalMemory(hc, _BadRepr() if odd else 3)),
        ("Halo block", lambda odd: Halo(pat, block=_BadRepr() if odd else 1)),
        ("Halo dtype", lambda odd: Halo(pat, dtype=_BadRepr() if odd else np.float64)),
        ("HybridComm node_size", lambda odd: HybridComm(comm, node_size=_gen() if odd else node_size)),
        ("HybridComm radix", lambda odd: HybridComm(comm, radix=_BadRepr() if odd else 4)),
    ]
    for what, make in trials:
        got, t = _outcome(comm, lambda: make(comm.rank == bad))
        _judge(comm, got, t, lambda r: (TypeError, ValueError))
        assert "hybridmpi" in str(got), (what, got)
    # the same generator on every rank: the documented message, not pickle's
    got, t = _outcome(comm, lambda: HybridComm(comm, node_size=_gen()))
    _judge(comm, got, t, lambda r: (ValueError,))
    assert "node_size must be a positive int" in str(got), got
    assert hc.allreduce(1) == hc.size   # nothing above broke the comm
    hc.free()


def case_invalid_collective_on_one_rank_across_nodes(comm, rng, node_size=None):
    """One rank passes an invalid allreduce, the others a valid one: every rank raises, and
    every rank's comm is unusable afterwards (before: across nodes, the ranks of the other
    nodes raised PeerArgumentError but kept a usable comm while the failing node's broke)."""
    if comm.size == 1:
        return skip("needs 2 or more ranks")
    hc = HybridComm(comm, node_size=node_size)
    bad = hc.size - 1
    got, t = _outcome(comm, lambda: hc.allreduce("x" if hc.rank == bad else 1.0))
    _judge(comm, got, t, lambda r: (TypeError,) if r == bad
           else (hybridmpi.PeerArgumentError, hybridmpi.PeerError))
    # every node's leader saw the invalid call and broke its comm (before: only the failing
    # node's did, and the other nodes' comms stayed usable among themselves)
    leaders = comm.allgather(hc.context.broken() is not None or not hc.is_leader)
    assert all(leaders), f"a node leader's comm stayed usable: {leaders}"
    for _ in range(2):   # the next calls raise on every rank: no comm stays usable
        got, t = _outcome(comm, hc.barrier)
        _judge(comm, got, t, lambda r: (RuntimeError, hybridmpi.PeerError))
    assert hc.context.broken() is not None
    hc.free()


def case_ranks_in_different_constructors(comm, rng, node_size=None):
    """Rank 0 in one constructor or free, the others in another (profile against from_global,
    GlobalMemory against profile or Coarray, a free against a constructor): ValueError on every
    rank at once, naming the calls (before: the agreements matched each other, and the ranks
    went on into MPI calls the others never joined: a hang, or a shape read as a dtype)."""
    if comm.size == 1:
        return skip("needs 2 or more ranks")
    with HybridComm(comm, node_size=node_size) as hc:
        spare = GlobalMemory(hc, 2)
        calls = {"profile": lambda: hybridmpi.profile(hc).__enter__(), "from_global": lambda: _ring(hc),
                 "GlobalMemory": lambda: GlobalMemory(hc, 10), "Coarray": lambda: Coarray(hc, 10),
                 "free": spare.free}
        for first, other in (("profile", "from_global"), ("GlobalMemory", "profile"),
                             ("GlobalMemory", "Coarray"), ("free", "profile"), ("free", "GlobalMemory")):
            got, t = _outcome(comm, calls[first] if hc.rank == 0 else calls[other])
            _judge(comm, got, t, lambda r: (ValueError,))
            assert "ranks are in different calls" in str(got), got
        assert hc.allreduce(1) == hc.size   # every rank raised alone: the comm stays usable
        spare.free()


def case_one_sided_call_to_a_failed_rank(comm, rng, node_size=None):
    """Across nodes, a blocking Put or fetch_add aimed at a rank whose own exception broke the
    comm a moment before: PeerError (before: a wait inside MPI_Win_flush past the timeout)."""
    if comm.size == 1 or node_size is None:
        return skip("needs 2 or more ranks and virtual nodes")
    for call in ("put", "fetch_add"):
        hc = HybridComm(comm, node_size=1)
        gm = GlobalMemory(hc, 4, np.int64)
        hc.barrier()

        def body():
            with gm:
                if hc.rank == 0:
                    raise KeyError("rank 0's own error")
                time.sleep(0.3)
                if call == "put":
                    gm.Put(np.ones(1, np.int64), 0, 0)
                else:
                    gm.fetch_add(0, 0, 1)
        got, t = _outcome(comm, body)
        _judge(comm, got, t, lambda r: (KeyError,) if r == 0 else (hybridmpi.PeerError,))
        hc.free()


# ------------------------------------------------------------ sync_images

def case_sync_images_invalid_on_one_rank(comm, rng, node_size=None):
    """One rank passes invalid ranks to sync_images ([p, p], [size], "x") while the others
    name it: it raises its own error, the others PeerArgumentError at once (before: they
    waited for the whole timeout); the counts stay matched, so the next valid sync_images of
    every rank pairs as before; on one node and across nodes."""
    if comm.size == 1:
        return skip("needs 2 or more ranks")
    with HybridComm(comm, node_size=node_size) as hc:
        mem = GlobalMemory(hc, 4)
        bad = hc.size - 1
        for arg in ([0, 0], [hc.size], "x"):
            peers = [r for r in range(hc.size) if r != hc.rank]
            got, t = _outcome(comm, lambda: mem.sync_images(arg if hc.rank == bad else [bad]))
            _judge(comm, got, t, lambda r: (ValueError, TypeError) if r == bad
                   else (hybridmpi.PeerArgumentError,))
            got, t = _outcome(comm, lambda: mem.sync_images(peers))
            _judge(comm, got, t, lambda r: (None,))
        # every rank invalid: each raises its own error, nothing else changes
        got, t = _outcome(comm, lambda: mem.sync_images([hc.size]))
        _judge(comm, got, t, lambda r: (ValueError,))
        peers = [r for r in range(hc.size) if r != hc.rank]
        got, t = _outcome(comm, lambda: mem.sync_images(peers))
        _judge(comm, got, t, lambda r: (None,))
        mem.sync_all()
        # an iterator is used once (before: the plan cache consumed it, cached an empty plan
        # under its ranks, and every later call naming them returned without waiting); a bool
        # or a float is refused also after the int's plan was cached (True == 1 as keys)
        if hc.rank == 0:
            mem.sync_images(iter([bad]))
        elif hc.rank == bad:
            time.sleep(0.3)
            mem.sync_images([0])
        got, t = _outcome(comm, lambda: mem.sync_images([True] if hc.rank == 0 and bad == 1 else
                                                          [1.0] if hc.rank == 0 else []))
        _judge(comm, got, t, lambda r: (TypeError,) if r == 0 else (None,)
               if r != bad else (None,))
        mem.free()


if __name__ == "__main__":
    main([case_own_exception_leaves_every_block, case_agreed_exception_keeps_the_comm,
          case_peer_left_before_this_rank_frees, case_constructor_against_a_collective,
          case_hybridcomm_against_a_collective, case_profile_against_allreduce,
          case_unpicklable_or_unprintable_argument_on_one_rank,
          case_sync_images_invalid_on_one_rank, case_invalid_collective_on_one_rank_across_nodes,
          case_ranks_in_different_constructors, case_one_sided_call_to_a_failed_rank])
