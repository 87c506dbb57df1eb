"""A bad argument on one rank while the others pass good ones: every rank raises the same class
(or PeerError) within 2 s, and the program goes on (tests/mpi/onerank_cases.py), on one node and
with every rank a node of its own.

HYBRIDMPI_TIMEOUT is 30 s, so a rank that raised only because a wait timed out fails the 2 s
limit; a rank left waiting in an MPI call with no timeout hangs the run until run_mpi's limit."""

import pytest
from conftest import run_mpi

ENV = {"HYBRIDMPI_TIMEOUT": "30"}


@pytest.mark.parametrize("args", [[], ["--node-size", "1"]], ids=["node", "node_size1"])
@pytest.mark.parametrize("ranks", [2, 3])
def test_one_rank_bad(ranks, args):
    run_mpi("onerank_cases.py", ranks, *args, env=ENV, timeout=180)


def test_one_rank_bad_global_memory_conversions():
    run_mpi("onerank_cases.py", 2, "--only", "global_memory_unconvertible,coarray_unconvertible",
            env=ENV, timeout=60)
