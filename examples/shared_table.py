"""A lookup table read once per node and used by every rank: one copy per node, not per rank.

    mpiexec -n 4 python examples/shared_table.py [--node-size K]

The table (temperature -> density, 2 x 8 MB) is made on rank 0 only, written straight into the
shared memory (the ``fill=`` form); a second array comes from rank 0's own numpy array (the
plain form).  Every rank interpolates its own points in its node's one read-only copy.
"""
import argparse

import hybridmpi

with hybridmpi.abort_on_error():   # an error on any rank: print it, end the whole job
    import numpy as np
    from mpi4py import MPI

    ap = argparse.ArgumentParser()
    ap.add_argument("--node-size", type=int, default=None, help="virtual nodes of K ranks")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    n = 1_000_000

    def tabulate(out):   # runs on rank 0 only (fill_on="root"): think np.load(..., mmap_mode="r")
        t = np.linspace(200.0, 2000.0, n)
        out["temperature"][:] = t
        out["density"][:] = 1000.0 * np.exp(-(t - 200.0) / 5000.0)

    with hybridmpi.HybridComm(comm, node_size=args.node_size) as hc:
        table = hybridmpi.share(shape={"temperature": (n,), "density": (n,)}, dtype=np.float64,
                                fill=tabulate, comm=hc)
        weights = hybridmpi.share(np.array([0.25, 0.5, 0.25]) if hc.rank == 0 else None, comm=hc)
        mine = np.random.default_rng(hc.rank).uniform(200.0, 2000.0, 10_000)   # this rank's points
        rho = np.interp(mine, table["temperature"], table["density"])
        smooth = np.convolve(rho, weights, mode="same")
        total = hc.allreduce(float(smooth[1:-1].sum()))
        assert not table["density"].flags.writeable   # every rank reads; nobody writes
        if hc.rank == 0:
            mib = (table["temperature"].nbytes + table["density"].nbytes) / 2**20
            print(f"{hc.size} ranks on {hc.num_nodes} node(s): one {mib:.1f} MiB table per node "
                  f"({hc.num_nodes * mib:.1f} MiB in all, not {hc.size * mib:.1f}); "
                  f"mean density {total / (hc.size * 9_998):.3f}")
