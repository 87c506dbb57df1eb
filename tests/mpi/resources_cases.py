"""Resources: many Halos, shared memory that does not fit, method "auto", HYBRIDMPI_METHOD.

Usage: python -m mpi4py resources_cases.py [--node-size K] [--only case1,case2]
"""

import os
import resource
import sys
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _harness import main, skip

import hybridmpi
from hybridmpi import GhostPattern, Halo
from hybridmpi.tools.baselines import METHODS
from hybridmpi.tools.baselines.neighbor import Graphs


def ring(hc, n=100):
    r, p = hc.rank, hc.size
    if p == 1:
        return GhostPattern(hc, send={}, recv={}, size=2 * n)
    return GhostPattern(hc, send={(r + 1) % p: np.arange(n)}, recv={(r - 1) % p: np.arange(n, 2 * n)},
                        size=2 * n)


def shm_mappings():
    """Shared-memory files this process has mapped (a window not freed stays mapped)."""
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if "/dev/shm/" in line)


def window_mappings(hc):
    """The mappings one shared window of the node adds here: one per node rank's segment, and
    Intel MPI maps one more (its own part) even on a node of one rank."""
    from mpi4py import MPI
    before = shm_mappings()
    win = MPI.Win.Allocate_shared(1 << 16, 1, comm=hc.node_comm)
    added = shm_mappings() - before
    win.Free()
    return max(added, hc.node_size)


def case_thousand_halos(comm, rng, **cfg):
    """1000 Halos created and freed, every method in turn: no window, mapping or memory left
    behind but the one window per method (fence, pscw, lock) kept for the next Halo, which the
    HybridComm's free gives back."""
    comm.Barrier()
    outside = shm_mappings()
    with hybridmpi.HybridComm(comm, node_size=cfg["node_size"]) as hc:
        pat = ring(hc)
        comm.Barrier()
        before = shm_mappings()
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        methods = list(METHODS)
        for i in range(1000):
            with Halo(pat, method=methods[i % len(methods)]) as h:
                x = rng.standard_normal(pat.size)
                h.update(x)
        comm.Barrier()
        grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
        kept = len(hc.context.arena.kept)
        assert kept == 3, kept   # fence, pscw, lock
        # and the one empty chunk kept for the next block (a mapping per node rank's segment)
        assert before <= shm_mappings() <= before + 2 * kept + window_mappings(hc), \
            (shm_mappings(), before, kept)
        if not os.environ.get("HYBRIDMPI_SANITIZE"):  # ASan's quarantine keeps freed memory
            assert grown_mb < 64, grown_mb
        assert not hc.context.children
    comm.Barrier()
    assert shm_mappings() == outside, (shm_mappings(), outside)


def case_many_live_halos(comm, rng, **cfg):
    """--halos live Halos at once (atomic, flat, neighbor in turn) on one HybridComm: a handful of
    windows and communicators, every one of them correct; then all freed."""
    with hybridmpi.HybridComm(comm, node_size=cfg["node_size"]) as hc:
        pat = ring(hc, 20)
        before = shm_mappings()
        methods = ["atomic", "flat", "neighbor"]
        halos = [Halo(pat, method=methods[i % 3]) for i in range(cfg["halos"])]
        assert hc.arena.windows <= 8, hc.arena.windows
        graphs = hc.context.service("neighbor_graphs", Graphs)
        assert len(graphs.live) == 1, graphs.live   # the neighbor Halos of one pattern share it
        for h in halos[::97] + halos[-3:]:
            x = rng.standard_normal(pat.size)
            h.update(x)
            expect = comm.sendrecv(x[:20], dest=(hc.rank + 1) % hc.size, source=(hc.rank - 1) % hc.size)
            if hc.size > 1:
                assert np.array_equal(x[20:], expect), h.method
        for h in halos:
            h.free()
        # one empty chunk is kept for the next block: its shared window (and, across nodes, its
        # RMA window); its segments stay mapped
        spare = 1 + (hc.num_nodes > 1)
        assert hc.arena.windows <= spare and shm_mappings() <= before + window_mappings(hc), \
            (hc.arena.windows, shm_mappings(), before)
        assert not graphs.live


def case_too_large_for_shared_memory(comm, rng, **cfg):
    """Shared buffers over the limit: MemoryError on every rank; "auto" falls back to flat."""
    with hybridmpi.HybridComm(comm, node_size=cfg["node_size"]) as hc:
        pat = ring(hc, 1000)
        if not pat.intranode:
            return skip("no neighbour on this node")
        os.environ["HYBRIDMPI_SHM_LIMIT"] = str(64 * 1024)
        try:
            try:
                Halo(pat, block=3)
            except MemoryError as e:
                assert "HYBRIDMPI_SHM_LIMIT allows" in str(e) and "method 'flat'" in str(e), e
            else:
                raise AssertionError("no MemoryError")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                h = Halo(pat, block=3, method="auto")
            assert h.method == "flat" and any("using method 'flat'" in str(w.message) for w in caught)
            x = rng.standard_normal((pat.size, 3))
            h.update(x)
            h.free()
        finally:
            del os.environ["HYBRIDMPI_SHM_LIMIT"]
        h = Halo(pat, method="auto")
        assert h.method == "atomic"
        h.free()


def case_env_method(comm, rng, **cfg):
    """HYBRIDMPI_METHOD sets the default method; an explicit method still wins."""
    with hybridmpi.HybridComm(comm, node_size=cfg["node_size"]) as hc:
        pat = ring(hc)
        os.environ["HYBRIDMPI_METHOD"] = "pscw"
        try:
            with Halo(pat) as h:
                assert h.method == "pscw"
            with Halo(pat, method="flat") as h:
                assert h.method == "flat"
            os.environ["HYBRIDMPI_METHOD"] = "smoke-signals"
            try:
                Halo(pat)
            except ValueError as e:
                assert "HYBRIDMPI_METHOD" in str(e), e
            else:
                raise AssertionError("no ValueError")
        finally:
            del os.environ["HYBRIDMPI_METHOD"]


def case_neighbor_graphs_per_pattern(comm, rng, **cfg):
    """Neighbor Halos share a graph communicator per pattern: live Halos alternating between two
    patterns (whose neighbors agree on some ranks only) hold two graphs, not one per Halo; Halos
    of different patterns begun in different orders on different ranks, free-running, exchange
    their own data; every graph is freed with its last Halo."""
    import time

    with hybridmpi.HybridComm(comm, node_size=cfg["node_size"]) as hc:
        r, p = hc.rank, hc.size
        full = ring(hc, 5)
        # every rank sends to r+1 and r+2 in the second pattern: some ranks' neighbors differ
        far = {(r + k) % p: np.arange(5 * (k - 1), 5 * k) for k in (1, 2) if (r + k) % p != r}
        back = {(r - k) % p: np.arange(10 + 5 * (k - 1), 10 + 5 * k) for k in (1, 2) if (r - k) % p != r}
        other = GhostPattern(hc, send=far, recv=back, size=20)
        graphs = hc.context.service("neighbor_graphs", Graphs)
        halos = [Halo(full if i % 2 == 0 else other, method="neighbor") for i in range(cfg["halos"] // 20)]
        assert len(graphs.live) == 2, graphs.live
        h1, h2 = halos[0], halos[1]
        for step in range(20):
            x1, x2 = rng.standard_normal(full.size), rng.standard_normal(other.size)
            x1[:5], x2[:5] = 100 * r + step, -100 * r - step
            pairs = [(h1, x1), (h2, x2)]
            if (r + step) % 2:
                pairs.reverse()
            for h, x in pairs:
                if rng.random() < 0.3:
                    time.sleep(rng.random() * 1e-3)
                h.update_begin(x)
            for h, x in pairs[::-1] if step % 3 else pairs:
                h.update_end(x)
            if p > 1:
                assert np.all(x1[5:10] == 100 * ((r - 1) % p) + step), x1
                assert np.all(x2[10:15] == -100 * ((r - 1) % p) - step), x2
        for h in halos[::-1] if r % 2 else halos:
            h.free()
        assert not graphs.live, graphs.live


CASES = [case_thousand_halos, case_many_live_halos, case_too_large_for_shared_memory, case_env_method,
         case_neighbor_graphs_per_pattern]

if __name__ == "__main__":
    main(CASES, halos=10000)
