"""heat3d and Himeno at 1-8 ranks, on one node, virtual nodes and cliques: every exchange gives
the bits of a one-rank run."""

import pytest
from conftest import mpi_flavor, run_mpi

CONFIGS = {
    "node": ([], {}),
    "node_size1": (["--node-size", "1"], {}),
    "node_size2": (["--node-size", "2"], {}),
    "cliques2": ([], {"MPIR_CVAR_NUM_CLIQUES": "2"}),
}


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_apps(config, ranks):
    args, env = CONFIGS[config]
    if env and mpi_flavor() != "mpich":
        pytest.skip("cliques are an MPICH feature")
    if ranks == 1 and config != "node" or config == "node_size2" and ranks == 2:
        pytest.skip("the same layout as one node")
    if config == "node_size1" and ranks == 8:
        pytest.skip("eight one-rank nodes: covered by node_size2 at 8 ranks")
    run_mpi("apps_cases.py", ranks, *args, env=env)
