"""HybridComm barrier and allreduce at 1-8 ranks, on one node, virtual nodes and cliques."""

import pytest
from conftest import mpi_flavor, run_mpi

CONFIGS = {
    "node": ([], {}),
    "node_size1": (["--node-size", "1"], {}),
    "node_size2": (["--node-size", "2"], {}),
    "node_size3": (["--node-size", "3"], {}),
    "seq_cst": (["--memory-order", "seq_cst"], {}),
    "tree_allreduce": (["--allreduce", "tree"], {}),
    "cliques2": ([], {"MPIR_CVAR_NUM_CLIQUES": "2"}),
}


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_collectives(config, ranks):
    args, env = CONFIGS[config]
    if env and mpi_flavor() != "mpich":
        pytest.skip("cliques are an MPICH feature")
    if ranks == 1 and config != "node":
        pytest.skip("one rank has one layout")
    if config == "node_size2" and ranks == 2 or config == "node_size3" and ranks in (2, 3) \
            or config == "cliques2" and ranks == 2:
        pytest.skip("the same layout as one node, or as node_size1")
    if config == "seq_cst" and ranks not in (3, 4) or config == "tree_allreduce" and ranks not in (3, 8):
        pytest.skip("the memory order at an odd count and at four; the tree at an odd count and "
                    "the deepest tree")
    if ranks == 8 and config not in ("node", "node_size3", "tree_allreduce"):
        # oversubscribed four to a core, 8 ranks cost 10-20 s a layout: one node, uneven
        # virtual nodes (3, 3, 2), and the tree allreduce two levels deep
        pytest.skip("8 ranks: one node, uneven virtual nodes and the tree only")
    run_mpi("collectives_cases.py", ranks, *args, env=env)


@pytest.mark.parametrize("ranks,config", [(2, "node"), (3, "node"), (4, "node"), (2, "node_size1"),
                                          (3, "node_size1"), (4, "node_size1"), (3, "node_size2"),
                                          (4, "node_size2")])
def test_one_rule_whatever_the_algorithm(config, ranks):
    """Float min and max and the complex product give one result, bit for bit, whatever
    combines the values (each allreduce option forced, sizes either side of the thresholds, one
    node, virtual nodes of one and two ranks: the leaders' step between the nodes): the cases
    case_min_max_one_rule and case_complex_product_c99 at 2, 3 and 4 ranks (the matrix above
    runs them too, in its layouts)."""
    args, _ = CONFIGS[config]
    run_mpi("collectives_cases.py", ranks, *args, "--only",
            "case_min_max_one_rule,case_complex_product_c99", timeout=120)
