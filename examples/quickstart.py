"""A ring of ranks: each owns 5 points and ghosts its right neighbour's first point."""
import hybridmpi  # imports nothing else: the guard below is in place before any import can fail

with hybridmpi.abort_on_error():  # an error on any rank: print it, end the whole job
    import numpy as np
    from mpi4py import MPI

    with hybridmpi.HybridComm(MPI.COMM_WORLD) as hc:
        n, right = 5, (hc.rank + 1) % hc.size
        owned = np.arange(hc.rank * n, hc.rank * n + n)     # global ids this rank owns
        ghosts = np.array([right * n]) if hc.size > 1 else np.array([], dtype=np.int64)
        pattern = hybridmpi.GhostPattern.from_global(hc, owned, ghosts)
        with hybridmpi.Halo(pattern) as halo:
            u = np.zeros(pattern.size)                      # owned values, then ghosts
            u[:n] = owned                                   # each point holds its global id
            halo.update(u)                                  # ghosts get their owners' values
            assert np.array_equal(u[n:], ghosts)
            u[n:] = 1.0
            halo.reverse(u, op="add")                       # ghosts' values added into owners
        total = hc.allreduce(u[:n].sum())                   # shared-memory allreduce
        assert total == n * hc.size * (n * hc.size - 1) / 2 + (hc.size if hc.size > 1 else 0)
        hc.barrier()
        if hc.rank == 0:
            print(f"{hc.size} ranks on {hc.num_nodes} node(s): sum {total:g}")
