"""The bounds adversary (tests/mpi/bounds_cases.py) at 1, 2 and 3 ranks, on one node and on
virtual nodes of one rank (where every peer is reached with MPI RMA)."""

import pytest
from conftest import run_mpi

CONFIGS = {"node": [], "node_size1": ["--node-size", "1"]}


@pytest.mark.parametrize("ranks", [1, 2, 3])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_bounds(config, ranks):
    if ranks == 1 and config != "node":
        pytest.skip("one rank has one layout")
    run_mpi("bounds_cases.py", ranks, *CONFIGS[config])
