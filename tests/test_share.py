"""hybridmpi.share and Shared at 1-8 ranks: one node, virtual nodes (one rank each, pairs, uneven
threes) and MPICH's cliques; every case of tests/mpi/share_cases.py in each layout."""

import pytest
from conftest import DEEP, mpi_flavor, run_mpi

CONFIGS = {
    "node": ([], {}),
    "node_size1": (["--node-size", "1"], {}),
    "node_size2": (["--node-size", "2"], {}),
    "node_size3": (["--node-size", "3"], {}),
    "cliques2": ([], {"MPIR_CVAR_NUM_CLIQUES": "2"}),
}
#: each layout once, at the size where it differs most from one node
QUICK = [("node", 1), ("node", 2), ("node_size1", 3), ("node_size2", 4), ("cliques2", 4)]
#: the deep run's (HYBRIDMPI_TEST_DEEP=1, run by hand): second sizes, uneven nodes, 8 ranks
SECOND = [("node", 3), ("node", 4), ("node_size1", 2), ("node_size1", 4), ("node_size3", 4), ("cliques2", 3),
          ("node", 8), ("node_size3", 8)]


@pytest.mark.parametrize(("config", "ranks"), [pytest.param(c, n, id=f"{c}-{n}") for c, n in QUICK + SECOND])
def test_share(config, ranks):
    args, env = CONFIGS[config]
    if env and mpi_flavor() != "mpich":
        pytest.skip("cliques are an MPICH feature")
    if (config, ranks) in SECOND and not DEEP:
        pytest.skip("deep run only (HYBRIDMPI_TEST_DEEP=1, run by hand): a second size of a layout")
    run_mpi("share_cases.py", ranks, *args, env=env)
