"""Resources: 1000 Halos, shared memory that does not fit, method "auto", HYBRIDMPI_METHOD."""

import pytest
from conftest import run_mpi


@pytest.mark.parametrize("ranks,args", [(1, []), (2, []), (4, ["--node-size", "2"]), (8, [])])
def test_resources(ranks, args):
    run_mpi("resources_cases.py", ranks, *args)
