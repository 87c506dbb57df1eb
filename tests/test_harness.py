"""The test harness itself (tests/mpi/_harness.py and conftest.check_summary): a misspelt
``--only`` name fails instead of passing with nothing run, a run must pass a case, and a case
that cannot run here is reported as skipped with its reason, not counted as passed."""

import subprocess
import sys

import conftest
import pytest
from conftest import check_summary, run_mpi


def test_misspelt_only_fails():
    with pytest.raises(AssertionError, match="names cases this file does not have: case_misspelt"):
        run_mpi("fem_cases.py", 2, "--only", "case_misspelt", timeout=60)


def test_empty_only_fails():
    with pytest.raises(AssertionError, match="--only names no case"):
        run_mpi("fem_cases.py", 1, "--only", ",", timeout=60)


def test_skipped_cases_are_reported():
    """At one rank the agreement cases that need peers are skipped, with the reason."""
    out = run_mpi("agreement_cases.py", 1, timeout=120)
    assert "skipped (needs 2 or more ranks)" in out and " 0 failed, " in out, out


def test_summary_rules():
    kept = list(conftest.SKIPPED_CASES)
    with pytest.raises(AssertionError, match="no case ran"):
        check_summary("SUMMARY: 0 passed, 0 failed, 0 skipped\n", "nothing")
    with pytest.raises(AssertionError):
        check_summary("a: FAILED (0.1 s)\nSUMMARY: 1 passed, 1 failed, 0 skipped\n", "one failed")
    with pytest.raises(AssertionError, match="no harness summary"):
        check_summary("the job printed nothing\n", "no summary")
    with pytest.raises(pytest.skip.Exception, match="a: needs 3 or more ranks"):
        check_summary("a: skipped (needs 3 or more ranks) (0.0 s)\nSUMMARY: 0 passed, 0 failed, 1 skipped\n",
                      "all skipped")
    check_summary("a: ok (0.1 s)\nSUMMARY: 1 passed, 0 failed, 0 skipped\n", "one passed")
    conftest.SKIPPED_CASES[:] = kept   # the made-up runs above are not the session's


def test_register_refuses_taken_names():
    """``hybridmpi.ghost.exchange.register`` (how the baselines join the Halo) refuses "auto"
    and a name another transport holds; the baselines' import registers the four methods."""
    code = ("import hybridmpi.tools.baselines\n"
            "from hybridmpi.ghost.exchange import METHODS, register\n"
            "assert list(METHODS) == ['atomic', 'flat', 'neighbor', 'fence', 'pscw', 'lock'], METHODS\n"
            "M = METHODS\n"
            "for name, t in (('auto', M['flat']), ('flat', M['atomic']), ('fence', M['lock'])):\n"
            "    try:\n"
            "        register(name, t)\n"
            "    except ValueError as e:\n"
            "        assert 'is taken' in str(e) and str(e).startswith('hybridmpi'), e\n"
            "    else:\n"
            "        raise AssertionError(name)\n"
            "register('fence', METHODS['fence'])   # the same transport again: no change\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr


def test_selections_name_files_and_tests_that_exist():
    """The selections of conftest.py (the files of HYBRIDMPI_TEST_SELECT=mpi and of the sanitizer
    leg, the tests the quick run leaves to the deep one) name only files and tests that exist: a
    renamed file must not drop out of a CI leg unnoticed."""
    import os
    import re

    here = os.path.dirname(os.path.abspath(__file__))
    files = {f for f in os.listdir(here) if f.startswith("test_") and f.endswith(".py")}
    for name in (*conftest.PER_MPI, *conftest.SANITIZED):
        assert name in files, f"conftest.py names {name}, which tests/ does not have"
    for nodeid in conftest.DEEP_ONLY:
        path, test = nodeid.split("::")
        assert path in files, nodeid
        with open(os.path.join(here, path)) as f:
            assert re.search(rf"^def {re.escape(test.split('[')[0])}\(", f.read(), re.M), nodeid
