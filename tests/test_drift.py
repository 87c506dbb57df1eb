"""The drift suite (tests/mpi/drift.py): random operation sequences with per-rank delays and
the C core's chaos hook, no resynchronizing collective between operations, values checked
after every operation; and injected faults, which every rank must see within 2 s."""

import pytest
from conftest import mpi_flavor, run_mpi

CHAOS = {"HYBRIDMPI_CHAOS": "7:200"}


@pytest.mark.parametrize("ranks,args,env", [
    (2, [], {}),
    (3, [], {}),
    (4, [], {}),
    (2, ["--max-delay-us", "1000"], {}),
    (3, ["--node-size", "1"], {}),
    (4, ["--node-size", "2"], {}),
    (3, [], {"MPIR_CVAR_NUM_CLIQUES": "2"}),
], ids=["2", "3", "4", "2-slow", "3-node_size1", "4-node_size2", "3-cliques2"])
def test_drift(ranks, args, env):
    if "MPIR_CVAR_NUM_CLIQUES" in env and mpi_flavor() != "mpich":
        pytest.skip("cliques are an MPICH feature")
    run_mpi("drift.py", ranks, "--seed", str(ranks), "--sequences", "6", "--ops", "120", *args,
            env={**CHAOS, **env}, timeout=200)


@pytest.mark.parametrize("ranks,args", [(2, []), (3, []), (4, ["--node-size", "2"]),
                                        (3, ["--node-size", "1"])],
                         ids=["2", "3", "4-node_size2", "3-node_size1"])
def test_faults_reach_every_rank(ranks, args):
    """An error inside a call, a mismatched argument or method on one rank makes every rank
    raise (PeerError, ValueError) within 2 s, never a hang: on one node and across (virtual)
    nodes, also ranks that were not in the failed call."""
    out = run_mpi("drift.py", ranks, "--seed", "5", "--sequences", "8", "--ops", "80", "--fault",
                  *args, env={"HYBRIDMPI_TIMEOUT": "20"}, timeout=200)
    assert "every rank raised within" in out
