"""Arrays over shared memory own it: a view kept past free() (of its object, of its HybridComm)
holds the values it had, never another object's, and never crashes; the freed objects refuse to
hand out new views; the memory comes back once the views are gone.

Usage: python -m mpi4py views_cases.py [--node-size K] [--only ...]
"""

import gc
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _harness import agree, main

from hybridmpi import Coarray, FreedError, GhostPattern, GlobalMemory, Halo, HybridComm

METHODS = ("atomic", "flat", "neighbor", "fence", "pscw", "lock")


def make_hc(comm, cfg):
    return HybridComm(comm, node_size=cfg["node_size"])


def ring(hc, n=2000):
    """Each rank owns ``n`` points and ghosts its right neighbour's first 3."""
    right = (hc.rank + 1) % hc.size
    owned = np.arange(hc.rank * n, hc.rank * n + n)
    ghosts = np.arange(right * n, right * n + 3) if hc.size > 1 else np.array([], dtype=np.int64)
    return GhostPattern.from_global(hc, owned, ghosts)


def limbo(arena):
    """At most the last GlobalMemory freed waits for the next allocation (node peers may have
    viewed it), unviewed; nothing else is held back."""
    assert len(arena.limbo) <= 1 and all(b.shared and not b.pins for b in arena.limbo), \
        [(b.serial, b.shared, b.pins) for b in arena.limbo]


def raises(exc, fn, *args):
    try:
        fn(*args)
    except exc:
        return
    raise AssertionError(f"{fn} did not raise {exc.__name__}")


def case_stale_halo_vector_does_not_alias(comm, rng, **cfg):
    """Finding 1: a Halo vector kept past the Halo's free, then another Halo's vector: writes
    through the old one never reach the new one (a GlobalMemory keeps the chunk mapped)."""
    with make_hc(comm, cfg) as hc, GlobalMemory(hc, 16) as keep:
        for method in METHODS:
            pattern = ring(hc)
            h = Halo(pattern, dtype=np.float64, method=method)
            u = h.vector()
            u[:] = hc.rank + 0.5
            h.free()
            h2 = Halo(pattern, dtype=np.float64, method=method)
            v = h2.vector()
            assert not v.any(), f"{method}: a new vector is not zero"
            v[: pattern.n_owned] = 7.0
            u[:] = -1.0          # the stale view: its own bytes
            h2.update(v)
            assert (v[: pattern.n_owned] == 7.0).all(), f"{method}: the stale view wrote the new vector"
            assert (v == 7.0).all(), f"{method}: ghosts {v[pattern.n_owned:]}"
            assert (u == -1.0).all()
            h2.free()
            del u, v
        keep.local[:] = 1


def case_views_after_with_and_comm_free(comm, rng, **cfg):
    """Finding 2: Halo.vector() after the Halo's with block and after hc.free(); GlobalMemory's
    local and local_view(r) after free() and hc.free(); Coarray.local: reading and writing them
    neither crashes nor reaches the objects made afterwards."""
    hc = make_hc(comm, cfg)
    pattern = ring(hc, 50)
    with Halo(pattern, dtype=np.int64) as h:
        u = h.vector()
        u[: pattern.n_owned] = hc.rank
        h.update(u)
    expect_u = u.copy()
    assert (u == expect_u).all()   # after the with block: the values it had
    mem = GlobalMemory(hc, 20, np.int64)
    mem.local[:] = 100 + hc.rank
    mem.sync_all()
    loc = mem.local
    peers = {r: mem.local_view(r) for r in range(hc.size) if mem.local_view(r) is not None}
    ca = Coarray(hc, (4, 5), np.int32)
    ca.local[...] = 7
    cloc = ca.local
    row = cloc[1]
    mem.free()
    raises(FreedError, lambda: mem.local)
    raises(FreedError, mem.local_view, 0)
    assert (loc == 100 + hc.rank).all()
    hc.free()
    raises(FreedError, lambda: ca.local)
    assert (u == expect_u).all() and (loc == 100 + hc.rank).all()
    for r, v in peers.items():
        assert (v == 100 + r).all(), (r, v)
    assert (cloc == 7).all() and (row == 7).all()
    # new objects on a new comm; then every old view is written
    with make_hc(comm, cfg) as hc2:
        with GlobalMemory(hc2, 20, np.int64) as m2, Coarray(hc2, (4, 5), np.int32) as c2:
            m2.local[:] = -5
            c2.local[...] = -6
            h2 = Halo(ring(hc2, 50), dtype=np.int64)
            v2 = h2.vector()
            v2[:] = -7
            hc2.barrier()
            u[:] = 1
            loc[:] = 2
            for v in peers.values():
                v[:] = 3
            cloc[...] = 4
            hc2.barrier()
            assert (m2.local == -5).all() and (c2.local == -6).all() and (v2 == -7).all()
            h2.free()


def case_remote_view_pins_the_peer_part(comm, rng, **cfg):
    """local_view(r) kept past free(): rank r's new memory is not under it."""
    with make_hc(comm, cfg) as hc:
        mem = GlobalMemory(hc, 64, np.float64)
        mem.local[:] = hc.rank
        mem.sync_all()
        peers = {r: mem.local_view(r) for r in hc.node_ranks if r != hc.rank}
        mem.free()
        for _ in range(3):   # several allocations: the pinned parts never come back
            with GlobalMemory(hc, 64, np.float64) as m2:
                m2.local[:] = 1000 + hc.rank
                hc.barrier()
                for v in peers.values():
                    v[:] = -1
                hc.barrier()
                assert (m2.local == 1000 + hc.rank).all(), m2.local[:4]
        del peers
        gc.collect()


def case_memory_comes_back(comm, rng, **cfg):
    """Views dropped: their blocks and chunks are given back at the next allocation; views
    kept: the chunks stay, and nothing grows per cycle once they go."""
    with make_hc(comm, cfg) as hc:
        arena = hc.arena
        with GlobalMemory(hc, 8):
            pass
        base = arena.windows
        for _ in range(50):
            with GlobalMemory(hc, 2**20 // 8) as mem:   # a chunk of its own size (1 MiB)
                kept = mem.local
                kept[:] = 1
            assert arena.windows >= base
            del kept
        with GlobalMemory(hc, 8):   # the allocation that hears every rank's views are gone
            pass
        agree(comm, arena.windows)
        assert arena.windows <= base + 2 * (1 + (hc.num_nodes > 1)), (arena.windows, base)
        assert sum(c.live == 0 for c in arena.chunks) <= 1, [c.live for c in arena.chunks]
        limbo(arena)


def case_one_rank_keeps_a_view(comm, rng, **cfg):
    """Only rank 0 keeps a view: every rank still agrees on the chunks (no hang, no leak
    after it goes), and the others' new objects are untouched."""
    with make_hc(comm, cfg) as hc:
        pattern = ring(hc, 300)
        for i in range(20):
            h = Halo(pattern, dtype=np.float64)
            u = h.vector()
            h.free()
            if hc.rank != 0 or i % 5 == 4:
                del u
            with GlobalMemory(hc, 5000, np.float64) as m:
                m.local[:] = i
                if hc.rank == 0 and "u" in locals():
                    u[:] = -i
                hc.barrier()
                assert (m.local == i).all()
        del pattern
        u = None
        with GlobalMemory(hc, 8):
            pass
        agree(comm, hc.arena.windows)
        limbo(hc.arena)


def case_coarray_section_kept(comm, rng, **cfg):
    """A Coarray's section and local view kept past free(), then a new Coarray."""
    with make_hc(comm, cfg) as hc:
        a = Coarray(hc, (6, 6), np.float64)
        a.local[...] = hc.rank
        hc.barrier()
        got = a[hc.rank][1:3, 2:4]
        sub = a.local[2:, ::2]
        a.free()
        with Coarray(hc, (6, 6), np.float64) as b:
            b.local[...] = 99
            sub[...] = -3
            hc.barrier()
            assert (b.local == 99).all()
            assert (got == hc.rank).all()


def case_views_past_the_comm_cost_nothing_once_gone(comm, rng, **cfg):
    """Arrays kept past the HybridComm's free, then dropped, many times: their pages were
    detached at the free (private memory at the same addresses, the values kept), so the MPI
    windows and context ids all come back (review finding F4: one chunk kept per cycle).  On a
    node of one rank MPICH gives a window private memory, which cannot be detached: those chunks
    stay (documented)."""
    from hybridmpi.comm.arena import _KEPT
    from hybridmpi.comm.room import held_ids

    ids0, kept0 = held_ids(), len(_KEPT)
    one_rank_nodes = False
    for i in range(30):
        hc = make_hc(comm, cfg)
        one_rank_nodes = one_rank_nodes or hc.node_size == 1
        m = GlobalMemory(hc, 1000, np.float64)
        v = m.local
        v[:] = i
        peer = m.local_view(hc.node_ranks[-1])
        hc.free()
        assert (v == i).all() and (peer == i).all()   # kept, readable, writable
        comm.Barrier()   # (a view that stays shared, below, sees its owner's write)
        v[:] = -1
        del v, peer, m
    one_rank_nodes = any(comm.allgather(one_rank_nodes))   # a one-rank node anywhere
    if not one_rank_nodes:
        assert held_ids() == ids0 and len(_KEPT) == kept0, (held_ids(), ids0, len(_KEPT), kept0)


if __name__ == "__main__":
    main([case_stale_halo_vector_does_not_alias, case_views_after_with_and_comm_free,
          case_remote_view_pins_the_peer_part, case_memory_comes_back, case_one_rank_keeps_a_view,
          case_coarray_section_kept, case_views_past_the_comm_cost_nothing_once_gone])
