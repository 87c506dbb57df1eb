"""Short runs of scripts/stress.py: mixed operations at 8 ranks on 2 cores, every value checked."""

import os
import re

import pytest
from conftest import launch, mpi_flavor

STRESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "stress.py")


@pytest.mark.parametrize("args,env", [([], {}), (["--node-size", "3"], {}),
                                      (["--method", "flat"], {}),
                                      ([], {"MPIR_CVAR_NUM_CLIQUES": "2"})])
def test_stress(args, env):
    if env and mpi_flavor() != "mpich":
        pytest.skip("cliques are an MPICH feature")
    out = launch(8, [STRESS, "--ops", "1500", "--sleep-prob", "0.01", *args], env=env)
    m = re.search(r"= (\d+) checked calls, (\d+) mismatched values", out)
    assert m, out
    assert int(m.group(1)) == 8 * 1500 and int(m.group(2)) == 0, out
