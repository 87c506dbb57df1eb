"""Nothing silently wrong (tests/mpi/silent_cases.py): the outside review's findings as
regression cases, at several rank counts, on one node, virtual nodes and MPICH cliques."""

import pytest
from conftest import mpi_flavor, run_mpi


@pytest.mark.parametrize("ranks,args,env", [
    (2, [], {}),
    (3, [], {}),
    (4, ["--node-size", "2"], {}),
    (3, ["--node-size", "1"], {}),
    (3, [], {"MPIR_CVAR_NUM_CLIQUES": "2"}),
], ids=["2", "3", "4-node_size2", "3-node_size1", "3-cliques2"])
def test_nothing_silently_wrong(ranks, args, env):
    if "MPIR_CVAR_NUM_CLIQUES" in env and mpi_flavor() != "mpich":
        pytest.skip("cliques are an MPICH feature")
    # the 16,000 Halos of the tag case once (at 2 ranks): the other layouts skip it
    halos = "16000" if ranks == 2 else "0"
    run_mpi("silent_cases.py", ranks, "--halos", halos, *args, env={"HYBRIDMPI_TIMEOUT": "30", **env},
            timeout=300)
