"""Resources: 1000 Halos in turn, 10,000 live Halos, shared memory that does not fit,
method "auto", HYBRIDMPI_METHOD."""

import pytest
from conftest import run_mpi


@pytest.mark.parametrize("ranks,args", [(1, []), (2, []), (4, ["--node-size", "2"]), (8, [])])
def test_resources(ranks, args):
    run_mpi("resources_cases.py", ranks, *args, "--halos", "300")


@pytest.mark.parametrize("ranks", [2, 3])
def test_ten_thousand_live_halos(ranks):
    run_mpi("resources_cases.py", ranks, "--only", "case_many_live_halos")
