"""Open MPI 4.1's MPI_Dist_graph_create hang (docs/guide/pmpi.md, Limits), without the PMPI
library: tests/pmpi/ngh_matrix.py's ``adjacent general`` cases, each graph communicator followed
by what the library's set-up does on it (MPI_Comm_split_type, an allreduce on the node, a
duplicate, an allreduce and an alltoall on the graph), MPI_COMM_WORLD set up the same way first
(HYBRIDMPI_PMPI_AFTER=0).  Run it as

    NGH_MATRIX_SEED=5 mpiexec --oversubscribe -n 4 python scripts/ompi_dist_graph_hang.py

with a timeout, several times; a hang here is Open MPI's alone (no library is loaded)."""
import os
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "pmpi"))
import ngh_matrix  # noqa: E402

kept = []


def set_up(comm):
    """The communicators and collectives of the library's set-up, on comm."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    node.Allreduce(np.zeros(3, np.int64), np.zeros(3, np.int64), MPI.MAX)
    node.Free()
    kept.append(comm.Dup())
    comm.Alltoall(np.zeros(comm.size, np.int32), np.zeros(comm.size, np.int32))
    comm.Allreduce(np.zeros(3, np.int32), np.zeros(3, np.int32), MPI.MAX)


def wrapped(make):
    def made(*a, **k):
        topo = make(*a, **k)
        if topo is not None:
            set_up(topo.comm)
        return topo
    return made


for name in ("adjacent_graph", "general_graph", "graph_topo"):
    setattr(ngh_matrix, name, wrapped(getattr(ngh_matrix, name)))
set_up(MPI.COMM_WORLD)
code = ngh_matrix.main(["adjacent", "general"])
for c in kept:
    c.Free()
sys.exit(code)
