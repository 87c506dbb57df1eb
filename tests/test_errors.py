"""Every invalid call in docs/errors.md raises as documented, on every rank, at 2 and 4 ranks."""

import os

from conftest import run_mpi

DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "errors.md")


def test_errors_at_2_ranks_and_doc_up_to_date(tmp_path):
    out = tmp_path / "errors.md"
    run_mpi("errors_cases.py", 2, "--markdown", out)
    with open(DOC) as f:
        committed = f.read()
    assert out.read_text() == committed, (
        "docs/errors.md is out of date: regenerate it with "
        "`mpiexec -n 2 python -m mpi4py tests/mpi/errors_cases.py --markdown docs/errors.md`")
    assert committed.count("\n| ") >= 21


def test_errors_at_4_ranks():
    run_mpi("errors_cases.py", 4)
