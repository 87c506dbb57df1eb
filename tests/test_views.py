"""Arrays over shared memory own it: views kept past free() and past the comm's free (2 and 3
ranks, one node, virtual nodes, cliques)."""

import pytest
from conftest import mpi_flavor, run_mpi

#: the layouts: one node, every rank its own node, a node of 2 beside one of 1, cliques
LAYOUTS = [(2, "node"), (3, "node"), (3, "node_size1"), (3, "node_size2"), (3, "cliques2")]


@pytest.mark.parametrize("ranks,config", LAYOUTS)
def test_views(config, ranks):
    args = ["--node-size", config[-1]] if config.startswith("node_size") else []
    env = {"MPIR_CVAR_NUM_CLIQUES": "2"} if config == "cliques2" else {}
    if env and mpi_flavor() != "mpich":
        pytest.skip("cliques are an MPICH feature")
    if mpi_flavor() == "impi" and config == "node_size1":
        # Intel MPI with its network layer on (as across hosts): its memory hooks interpose
        # mremap, which dropped the address the detached pages move to (EINVAL)
        env = {"I_MPI_FABRICS": "shm:ofi"}
    run_mpi("views_cases.py", ranks, *args, env=env)
