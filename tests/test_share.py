"""hybridmpi.share and Shared at 1-8 ranks: one node, virtual nodes (one rank each, pairs, uneven
threes) and MPICH's cliques; every case of tests/mpi/share_cases.py in each layout."""

import os

import pytest
from conftest import DEEP, launch, mpi_flavor, run_mpi

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "shared_table.py")

CONFIGS = {
    "node": ([], {}),
    "node_size1": (["--node-size", "1"], {}),
    "node_size2": (["--node-size", "2"], {}),
    "node_size3": (["--node-size", "3"], {}),
    "cliques2": ([], {"MPIR_CVAR_NUM_CLIQUES": "2"}),
}
#: each layout once, at the size where it differs most from one node
#: (nodes of one rank: the hosts leg's 2-1-1 layout, test_hosts.py, and the deep run)
QUICK = [("node", 1), ("node", 2), ("node_size2", 4), ("cliques2", 4)]
#: the deep run's (HYBRIDMPI_TEST_DEEP=1, run by hand): second sizes, uneven nodes, 8 ranks
SECOND = [("node", 3), ("node", 4), ("node_size1", 2), ("node_size1", 3), ("node_size1", 4),
          ("node_size3", 4), ("cliques2", 3), ("node", 8), ("node_size3", 8)]


@pytest.mark.parametrize(("config", "ranks"), [pytest.param(c, n, id=f"{c}-{n}") for c, n in QUICK + SECOND])
def test_share(config, ranks):
    args, env = CONFIGS[config]
    if env and mpi_flavor() != "mpich":
        pytest.skip("cliques are an MPICH feature")
    if (config, ranks) in SECOND and not DEEP:
        pytest.skip("deep run only (HYBRIDMPI_TEST_DEEP=1, run by hand): a second size of a layout")
    run_mpi("share_cases.py", ranks, *args, env=env)


def test_example_shared_table():
    """examples/shared_table.py on two virtual nodes: the table made on rank 0 only, and the
    mean its ranks print is the one computed here from a private table."""
    import numpy as np

    out = launch(2, [EXAMPLE, "--node-size", "1"], timeout=120)
    t = np.linspace(200.0, 2000.0, 1_000_000)
    table = 1000.0 * np.exp(-(t - 200.0) / 5000.0)
    total = sum(np.convolve(np.interp(np.random.default_rng(r).uniform(200.0, 2000.0, 10_000), t, table),
                            [0.25, 0.5, 0.25], mode="same")[1:-1].sum() for r in range(2))
    assert "2 ranks on 2 node(s): one 15.3 MiB table per node" in out, out
    assert f"mean density {total / (2 * 9_998):.3f}" in out, out
