"""The ways around the calls: leaving a with block on one rank's own exception, constructors'
agreements under the deadline, arguments that cannot be sent or shown (tests/mpi/agreement_cases.py)."""

import pytest
from conftest import run_mpi


@pytest.mark.parametrize("ranks, node_size", [(2, None), (3, 1), (4, 2)])
def test_agreement(ranks, node_size):
    args = [] if node_size is None else ["--node-size", node_size]
    run_mpi("agreement_cases.py", ranks, *args, timeout=180)
