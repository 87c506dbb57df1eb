"""hybridmpi.profile (tests/mpi/profile_cases.py) and HYBRIDMPI_PROFILE."""

import json
import os
import textwrap

import pytest
from conftest import launch, run_mpi


@pytest.mark.parametrize("ranks,args", [(1, []), (2, []), (3, ["--node-size", "1"]),
                                        (4, ["--node-size", "2"])],
                         ids=["1", "2", "3-node_size1", "4-node_size2"])
def test_profile(ranks, args):
    run_mpi("profile_cases.py", ranks, *args, timeout=180)


def test_env_profiles_the_whole_run(tmp_path):
    """HYBRIDMPI_PROFILE=path.json: each HybridComm is profiled from its creation; rank 0 prints
    the table and writes the JSON when the comm is freed, also at the end of the run for a comm
    the program never freed; HYBRIDMPI_PROFILE unset: no table."""
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent("""
        import numpy as np
        import hybridmpi
        hc = hybridmpi.HybridComm()
        nxt = (hc.rank + 1) % hc.size
        pat = hybridmpi.GhostPattern.from_global(hc, owned=np.arange(hc.rank * 10, hc.rank * 10 + 10),
                                                 ghosts=np.arange(nxt * 10, nxt * 10 + 10))
        h = hybridmpi.Halo(pat)
        x = np.zeros(pat.size)
        for _ in range(25):
            h.update(x)
        hc.allreduce(1.0)
        # never freed: the profile ends at MPI_Finalize
    """))
    path = tmp_path / "p.json"
    out = launch(2, [str(prog)], env={"HYBRIDMPI_PROFILE": str(path)}, timeout=120)
    assert "hybridmpi profile: 2 ranks" in out and "update" in out and "allreduce" in out, out
    data = json.loads(path.read_text())
    rows = {(r["object"].split(" ")[0], r["op"]): r for r in data["ranks"][1]}
    assert rows[("Halo", "update")]["calls"] == 25 and rows[("Halo", "update")]["bytes"] == 25 * 160
    assert rows[("HybridComm", "allreduce")]["calls"] == 1
    os.remove(path)
    out = launch(2, [str(prog)], env={"HYBRIDMPI_PROFILE": "0"}, timeout=120)
    assert "hybridmpi profile" not in out and not path.exists(), out
