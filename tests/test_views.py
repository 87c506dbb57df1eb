"""Arrays over shared memory own it: views kept past free() and past the comm's free (1-4 ranks,
one node, virtual nodes, cliques)."""

import pytest
from conftest import mpi_flavor, run_mpi


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
@pytest.mark.parametrize("config", ["node", "node_size1", "node_size2", "cliques2"])
def test_views(config, ranks):
    args = ["--node-size", config[-1]] if config.startswith("node_size") else []
    env = {"MPIR_CVAR_NUM_CLIQUES": "2"} if config == "cliques2" else {}
    if env and mpi_flavor() != "mpich":
        pytest.skip("cliques are an MPICH feature")
    if ranks == 1 and config != "node" or config == "node_size2" and ranks == 2 \
            or config == "cliques2" and ranks != 3:
        pytest.skip("a layout another run has")
    run_mpi("views_cases.py", ranks, *args, env=env)
