"""Resources: many Halos, shared memory that does not fit, method "auto", HYBRIDMPI_METHOD.

Usage: python -m mpi4py resources_cases.py [--node-size K] [--only case1,case2]
"""

import os
import resource
import sys
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _harness import main

import hybridmpi
from hybridmpi import GhostPattern, Halo
from hybridmpi.transport import METHODS
from hybridmpi.transport.neighbor import Graphs


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


def case_thousand_halos(comm, rng, **cfg):
    """1000 Halos created and freed, every method in turn: no window, mapping or memory left behind."""
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
        assert shm_mappings() == before, (shm_mappings(), before)
        if not os.environ.get("HYBRIDMPI_SANITIZE"):  # ASan's quarantine keeps freed memory
            assert grown_mb < 64, grown_mb
        assert not hc.context.children


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
        assert hc.arena.windows == 0 and shm_mappings() <= before
        assert not graphs.live and not graphs.latest


def case_too_large_for_shared_memory(comm, rng, **cfg):
    """Shared buffers over the limit: MemoryError on every rank; "auto" falls back to flat."""
    with hybridmpi.HybridComm(comm, node_size=cfg["node_size"]) as hc:
        pat = ring(hc, 1000)
        if not pat.intranode:
            return
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


CASES = [case_thousand_halos, case_many_live_halos, case_too_large_for_shared_memory, case_env_method]

if __name__ == "__main__":
    main(CASES, halos=10000)
