"""The hybridmpi command: every subcommand briefly, JSON against the schema, plots, bad arguments;
an error on one rank (an import, an argument) ends the job, in the command, the benchmark runners
and the examples."""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from conftest import launch, mpi_flavor, mpirun

from hybridmpi.tools.bench import KINDS, validate

TINY = {
    "barrier": ["--iters", "20", "--reps", "2"],
    "allreduce": ["--iters", "20", "--reps", "2", "--sizes", "1,8"],
    "dot": ["--reps", "2", "--lengths", "10,1000", "--iters", "5"],
    "ghost": ["--reps", "2", "--iters", "5", "--h", "0.1"],
    "sync": ["--reps", "3", "--warmup", "5"],
    "cg": ["--reps", "2", "--iterations", "5", "--h", "0.1"],
    "rma": ["--reps", "2", "--iters", "5", "--sizes", "8,4096", "--window", "2"],
    "heat3d": ["--reps", "2", "--steps", "3", "--grid", "8,6,6"],
    "himeno": ["--reps", "2", "--iterations", "3", "--size", "XS"],
    "dolfinx": ["--reps", "2", "--steps", "2", "--n", "6"],
    "profile": ["--reps", "2", "--iters", "20", "--kb", "4", "--calls", "5", "--sleep-ms", "0.5"],
    "mesh": ["--reps", "2", "--h", "0.3"],
    "share": ["--reps", "2", "--mb", "0.01,2"],
}


def test_every_kind_has_a_runner():
    """bench/ holds one thin runner per kind (docs/development.md: layout)."""
    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
    texts = {f: open(os.path.join(folder, f)).read() for f in os.listdir(folder) if f.endswith(".py")}
    for kind in KINDS:
        assert any(f'main(["bench", "{kind}", *sys.argv[1:]])' in t for t in texts.values()), kind
    assert not {"dolfinx.py", "profile.py"} & set(texts)   # would shadow dolfinx / profile


def has_dolfinx():
    code = "import importlib.util as u; print(u.find_spec('dolfinx') is not None)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    return out.strip() == "True"


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "hybridmpi", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def test_version_and_help():
    out = cli("--version")
    assert out.returncode == 0 and out.stdout.startswith("hybridmpi ")
    for sub in (["mesh"], ["partition"], ["bench"], ["plot"], ["demo"], ["solve"],
                *(["bench", k] for k in KINDS)):
        out = cli(*sub, "--help")
        assert out.returncode == 0 and "usage:" in out.stdout, (sub, out.stderr)


@pytest.mark.parametrize("args", [
    [], ["nope"], ["bench"], ["bench", "nope"], ["bench", "ghost", "--h", "0.1", "--sizes", "4"],
    ["bench", "barrier", "--iters", "x"], ["demo", "--iters", "0"], ["plot"], ["plot", "missing.json"],
    ["plot", "not-json.json"], ["plot", "not-ours.json"], ["mesh", "--h", "0"],
    ["mesh", "--mesh", "missing.vtu"],
    # a benchmark's numbers: negative times were printed for -3, a ZeroDivisionError for 0
    ["bench", "barrier", "--iters", "-3"], ["bench", "barrier", "--iters", "0"],
    ["bench", "allreduce", "--reps", "0"], ["bench", "sync", "--warmup", "-1"],
    ["bench", "ghost", "--iters", "-1"], ["bench", "profile", "--sleep-ms", "-1"],
])
def test_bad_arguments_one_line_exit_2(args, tmp_path):
    (tmp_path / "not-json.json").write_text("{")
    (tmp_path / "not-ours.json").write_text('{"a": 1}')
    out = cli(*args, cwd=tmp_path)
    assert out.returncode == 2, (args, out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr


@pytest.mark.parametrize("kind", list(KINDS))
def test_bench_kind_json_and_plot(kind, tmp_path):
    if kind == "dolfinx" and not has_dolfinx():
        pytest.skip("dolfinx does not import here (the system stack has it)")
    path = tmp_path / f"{kind}.json"
    out = mpirun(2, "bench", kind, *TINY[kind], "--json", str(path))
    assert "ratio" in out and f"# wrote {path}" in out
    doc = validate(json.loads(path.read_text()))
    assert doc["benchmark"] == kind and doc["ranks"] == 2 and doc["thread_level"] == "funneled"
    assert "thread level funneled" in out
    base = [r for r in doc["results"] if r["baseline"]]
    assert base and all(r["ratio"] is not None for r in doc["results"] if not r["baseline"])
    assert all(len(r["samples"]) == int(TINY[kind][TINY[kind].index("--reps") + 1])
               for r in doc["results"])
    plots = cli("plot", str(path), "-o", str(tmp_path / "png"))
    assert plots.returncode == 0, plots.stderr
    pngs = plots.stdout.split()
    assert len(pngs) >= 2
    for png in pngs:
        with open(png, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        assert os.path.getsize(png) > 5000


@pytest.mark.parametrize("level", ["single", "multiple"])
def test_bench_thread_level(level, tmp_path):
    """--thread-level starts MPI at that level (mpi4py.rc, before MPI starts); the table and the
    document say which level MPI provided."""
    path = tmp_path / "barrier.json"
    out = mpirun(2, "bench", "barrier", *TINY["barrier"], f"--thread-level={level}", "--json", str(path))
    assert f"thread level {level};" in out, out
    assert json.loads(path.read_text())["thread_level"] == level
    bad = cli("bench", "barrier", "--thread-level", "many")
    assert bad.returncode == 2 and "invalid choice: 'many'" in bad.stderr, bad.stderr
    for words in (["--thread", level], [f"--thread-l={level}"], ["--thread-level", "single",
                                                                  "--thread-level", "multiple"]):
        bad = cli("bench", "barrier", *TINY["barrier"], *words, "--json", "")
        assert bad.returncode == 2 and "give --thread-level once and in full" in bad.stderr, (words, bad)


@pytest.mark.parametrize("layout", [["--node-size", "1"], ["--node-size", "2"]])
def test_bench_rma_layouts(layout, tmp_path):
    path = tmp_path / "rma.json"
    mpirun(3, "bench", "rma", *TINY["rma"], *layout, "--json", str(path))
    doc = validate(json.loads(path.read_text()))
    assert doc["locality"] == ("internode" if layout[1] == "1" else "intranode")
    series = {r["series"] for r in doc["results"]}
    assert {"Put", "Get", "Rput+wait", "Rget+wait", "mpi4py Put+Flush", "coarray put 8 vars nb",
            "overlap Rget", "bw Rget"} <= series
    assert ("copy into peer" in series) == (doc["locality"] == "intranode")


def test_bench_apps_sweep_and_checksums(tmp_path):
    path = tmp_path / "heat3d.json"
    mpirun(3, "bench", "heat3d", *TINY["heat3d"], "--ranks", "1,3", "--node-size", "2", "--json", str(path))
    doc = validate(json.loads(path.read_text()))
    assert sorted({r["x"] for r in doc["results"]}) == [1, 3]
    assert len({r["checksum"] for r in doc["results"]}) == 1  # every exchange, every rank count
    for r in doc["results"]:   # the exchange split into imbalance and transfer
        assert 0 <= r["imbalance_us"] <= r["halo_us"] + 1e-9, r
        assert r["transfer_us"] == pytest.approx(r["halo_us"] - r["imbalance_us"]), r
        assert r["baseline"] or r["x"] == 1 or r["transfer_ratio"] is not None, r
    path = tmp_path / "himeno.json"
    out = mpirun(2, "bench", "himeno", *TINY["himeno"], "--exchange", "mpi,coarray", "--json", str(path))
    doc = validate(json.loads(path.read_text()))
    gosa = [r["gosa"] for r in doc["results"]]
    assert gosa[0] > 0 and gosa[0] == gosa[1] and all(r["mflops"] > 0 for r in doc["results"])
    # cumulative over the warm-up (2) and every repetition, as the reference's p
    assert all(r["gosa_iterations"] == 2 + 2 * 3 for r in doc["results"])
    assert f"{gosa[0]:.6e}" in out, out   # printed as the reference prints it


def test_bench_ghost_ring_and_virtual_nodes(tmp_path):
    path = tmp_path / "ring.json"
    mpirun(4, "bench", "ghost", "--sizes", "4", "--methods", "atomic,flat", "--reps", "2", "--iters", "5",
           "--node-size", "2", "--json", str(path))
    doc = validate(json.loads(path.read_text()))
    assert doc["nodes"] == 2 and doc["node_size"] == 2
    assert {r["series"] for r in doc["results"]} == {"flat-numpy", "atomic", "atomic shared", "flat", "floor"}


def _importable(*names):
    import importlib.util

    return all(importlib.util.find_spec(n) is not None for n in names)


@pytest.mark.parametrize("layout,block", [("runs", "1"), ("scattered", "3")])
def test_bench_ghost_layouts_and_peers_note(layout, block, tmp_path):
    """--peers always runs: each peer is a row (checked against flat-numpy's bits by the
    benchmark itself) or a note says why it was skipped."""
    path = tmp_path / "ring.json"
    out = mpirun(3, "bench", "ghost", "--sizes", "8", "--layout", layout, "--block", block, "--peers",
                 "--methods", "atomic", "--reps", "2", "--iters", "5", "--json", str(path))
    doc = validate(json.loads(path.read_text()))
    assert doc["layout"] == layout and all(r["block"] == int(block) for r in doc["results"])
    series = {r["series"] for r in doc["results"]}
    assert {"flat-numpy", "atomic", "atomic shared", "floor"} <= series
    for peer in ("petsc", "dolfinx"):
        assert (peer in series) == (peer in doc["peers"])
        if peer not in series:
            assert any(f"peer {peer} skipped" in n for n in doc["notes"]) and f"peer {peer} skipped" in out


@pytest.mark.skipif(not _importable("petsc4py", "dolfinx"),
                    reason="petsc4py and dolfinx are not importable (see the system stack in docs)")
def test_bench_ghost_peers_run(tmp_path):
    path = tmp_path / "peers.json"
    mpirun(2, "bench", "ghost", "--sizes", "4,78", "--layout", "scattered", "--peers", "--methods",
           "atomic", "--reps", "2", "--iters", "5", "--json", str(path))
    doc = validate(json.loads(path.read_text()))
    assert doc["peers"] == ["petsc", "dolfinx"]
    for x in (4.0, 78.0):
        rows = {r["series"]: r for r in doc["results"] if r["x"] == x}
        assert {"petsc", "dolfinx"} <= set(rows)
        shared = rows["atomic shared"]
        assert shared["vs_petsc"] == pytest.approx(shared["mean"] / rows["petsc"]["mean"])
        assert shared["vs_dolfinx"] == pytest.approx(shared["mean"] / rows["dolfinx"]["mean"])


def test_bench_ghost_and_demo_on_a_mesh_file(tmp_path):
    from test_fem import ball_mesh

    path = ball_mesh(str(tmp_path / "ball.msh"))
    out_json = tmp_path / "g.json"
    mpirun(3, "bench", "ghost", "--mesh", path, "--methods", "atomic,flat", "--reps", "2", "--iters", "5",
           "--json", str(out_json))
    doc = validate(json.loads(out_json.read_text()))
    assert doc["pattern"] == "mesh" and {r["x"] for r in doc["results"]} == {path}
    assert all(r["block"] == 3 and r["data_kb"] > 0 for r in doc["results"])
    out = mpirun(2, "demo", "--mesh", path, "--iters", "10", "--reps", "2", cwd=tmp_path)
    assert f"mesh {path}" in out and "fastest ghost update method" in out


def test_demo(tmp_path):
    out = mpirun(2, "demo", "--iters", "20", "--reps", "2", cwd=tmp_path)
    assert "fastest ghost update method" in out
    folder = tmp_path / "hybridmpi-results"
    doc = validate(json.loads((folder / "demo.json").read_text()))
    assert {r["x"] for r in doc["results"]} == {"barrier", "allreduce", "ghost update"}
    for png in ("demo-time.png", "demo-ratio.png"):
        assert (folder / png).stat().st_size > 5000


# ------------------------------------------------------------------ a failing rank ends the job

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: the launcher's limit in these tests; a job that ends must end well before it
LIMIT = 60
QUICK = 20
BROKEN = """\
import importlib, os, sys
rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
if rank == os.environ["BROKEN_RANK"]:
    raise ImportError(f"{__name__} is broken on rank {rank} (test)")
here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
del sys.modules[__name__]
sys.modules[__name__] = importlib.import_module(__name__)
"""


def broken(tmp_path, module, rank=1):
    """Environment in which importing ``module`` fails on ``rank`` only (a package of that name
    on PYTHONPATH that raises there and loads the real one elsewhere): the library is untouched."""
    (tmp_path / "broken" / module).mkdir(parents=True)
    (tmp_path / "broken" / module / "__init__.py").write_text(BROKEN)
    path = os.pathsep.join(filter(None, [str(tmp_path / "broken"), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, "BROKEN_RANK": str(rank)}


def ends_quickly(n, argv, **kw):
    """Launch; assert the job failed well before the launcher's limit; return its output."""
    t0 = time.monotonic()
    rc, out = launch(n, argv, timeout=LIMIT, check=False, **kw)
    took = time.monotonic() - t0
    assert rc != 0 and took < QUICK, f"rc={rc} after {took:.1f} s (the job hung until the limit?):\n{out}"
    return out


COMMANDS = {"module": ["-m", "hybridmpi"], "script": [shutil.which("hybridmpi", path=os.path.dirname(
    sys.executable)) or "hybridmpi"], "runner": [os.path.join(ROOT, "bench", "barrier.py")]}


@pytest.mark.parametrize("abort", [True, False], ids=["mpi4py", "plain"])
@pytest.mark.parametrize("how", list(COMMANDS))
def test_import_failing_on_one_rank_ends_the_job(how, abort, tmp_path):
    """numpy (imported while the arguments are parsed) fails to import on rank 1 only.  Before
    the guard came first, rank 1 exited before starting MPI and rank 0 waited in MPI_Init until
    the launcher's limit (also under ``python -m mpi4py``, which aborts only once MPI is
    imported).  Now: rank 1's traceback once, MPI_Abort, the job ends within seconds."""
    argv = COMMANDS[how] + (["demo", "--iters", "5", "--reps", "1"] if how != "runner"
                            else ["--iters", "5", "--reps", "1", "--json", ""])
    out = ends_quickly(2, argv, env=broken(tmp_path, "numpy"), abort=abort, cwd=tmp_path)
    assert out.count("ImportError: numpy is broken on rank 1 (test)") == 1, out
    assert "hybridmpi: rank 1 failed; aborting the job" in out, out


@pytest.mark.parametrize("abort", [True, False], ids=["mpi4py", "plain"])
def test_bad_argument_on_one_rank_ends_the_job(abort, tmp_path):
    """Rank 1 alone gets a bad argument (MPMD launch): its one line, exit code 2, no traceback,
    and the job ends at once (before, rank 0 waited for it in MPI_Init until the limit)."""
    head = ["-m", "mpi4py"] if abort else []
    argv = ["-m", "hybridmpi", "demo", "--iters", "5", "--reps", "1",
            ":", "-n", "1", sys.executable, *head, "-m", "hybridmpi", "demo", "--iters", "0"]
    out = ends_quickly(1, argv, abort=abort, cwd=tmp_path)
    assert out.count("hybridmpi demo: error: argument --iters: must be >= 1, got 0") == 1, out
    assert "Traceback" not in out, out


def test_bad_argument_on_every_rank_ends_the_job(tmp_path):
    """Every rank finds the same bad argument: exit code 2 at once, no traceback (ranks other
    than 0 wait a second before printing, so rank 0's abort usually leaves one line)."""
    out = ends_quickly(3, ["-m", "hybridmpi", "bench", "barrier", "--iters", "x"], abort=False,
                       cwd=tmp_path)
    assert "hybridmpi bench barrier: error: argument --iters: invalid int value: 'x'" in out, out
    assert "Traceback" not in out, out


@pytest.mark.parametrize("other", [["--help"], ["--version"], ["bench", "barrier", "--help"],
                                   ["bench", "barrier", "--iters", "-3", "--reps", "2", "--json", ""],
                                   ["bench", "barrier", "--iters", "20", "--reps", "3", "--json", ""]],
                         ids=["help", "version", "bench-help", "iters-3", "reps"])
def test_different_command_lines_exit_2_on_every_rank(other, tmp_path):
    """An MPMD launch gives rank 1 another command line: every rank prints one line and exits 2
    at once (before, a --help or --version on rank 1 exited 0 there while rank 0 waited forever in
    HybridComm(), and --iters -3 on rank 1 alone hung)."""
    argv = ["-m", "hybridmpi", "bench", "barrier", "--iters", "20", "--reps", "2", "--json", "",
            ":", "-n", "1", sys.executable, "-m", "hybridmpi", *other]
    t0 = time.monotonic()
    rc, out = launch(1, argv, timeout=LIMIT, check=False, abort=False, cwd=tmp_path)
    assert rc == 2 and time.monotonic() - t0 < QUICK, (rc, out)
    # the ranks' own lines (Open MPI's launcher adds a banner of its own when a rank exits 2,
    # and may end the other rank before it printed: its line is then checked only elsewhere)
    lines = [line for line in out.splitlines() if line.startswith("hybridmpi")]
    both = mpi_flavor() != "openmpi"
    assert len(lines) == 2 or (not both and len(lines) == 1), out
    assert "Traceback" not in out and "usage:" not in out, out
    assert all("error" in line for line in lines), out
    assert "the ranks were launched with different command lines" in out, out
    if both:
        assert "hybridmpi: error on rank 0: the ranks were launched with different command lines" in out
    if both and "-3" in other:
        assert "hybridmpi bench barrier: error: argument --iters: must be >= 1, got -3" in out, out
    elif both:
        assert "hybridmpi: error on rank 1: the ranks were launched with different command lines" in out


def test_help_and_version_on_every_rank(tmp_path):
    for argv, words in ((["--version"], "hybridmpi "), (["bench", "barrier", "--help"], "usage:")):
        out = launch(2, ["-m", "hybridmpi", *argv], timeout=LIMIT, abort=False, cwd=tmp_path)
        assert out.count(words) == 2, out


def test_a_rank_running_another_program_ends_the_job(tmp_path):
    """Rank 1 runs another program: rank 0 compares command lines with nobody, and ends the job
    at the deadline (HYBRIDMPI_TIMEOUT) instead of waiting in HybridComm()."""
    argv = ["-m", "hybridmpi", "bench", "barrier", "--iters", "20", "--reps", "2", "--json", "",
            ":", "-n", "1", sys.executable, "-c", "from mpi4py import MPI; import time; time.sleep(60)"]
    out = ends_quickly(1, argv, abort=False, cwd=tmp_path, env={"HYBRIDMPI_TIMEOUT": "3"})
    assert "hybridmpi: error on rank 0: not every rank came to compare command lines within 3 s" in out


def test_import_failing_on_one_rank_ends_an_example(tmp_path):
    """examples/quickstart.py enters abort_on_error before importing numpy: numpy failing on
    rank 1 only ends the job (before, the other ranks waited in MPI_Init)."""
    out = ends_quickly(3, [os.path.join(ROOT, "examples", "quickstart.py")],
                       env=broken(tmp_path, "numpy"), abort=False)
    assert out.count("ImportError: numpy is broken on rank 1 (test)") == 1, out


GUARD_AROUND_WITH = """\
import hybridmpi

with hybridmpi.abort_on_error():
    from mpi4py import MPI

    with hybridmpi.HybridComm(MPI.COMM_WORLD) as hc:
        if hc.rank == 1:
            raise RuntimeError("injected fault on rank 1")
        MPI.COMM_WORLD.allgather(0)  # rank 0 waits in MPI, where no error bits reach it
"""


def test_guard_around_a_with_block_ends_the_job(tmp_path):
    """abort_on_error entered first, a HybridComm block inside it: the block that the exception
    leaves is not freed (before, rank 1 waited in the collective free for rank 0, which waited in
    its allgather: the job hung until the limit)."""
    (tmp_path / "prog.py").write_text(GUARD_AROUND_WITH)
    out = ends_quickly(2, [str(tmp_path / "prog.py")], abort=False)
    assert out.count("RuntimeError: injected fault on rank 1") == 1, out


def test_import_hybridmpi_imports_nothing_else():
    """The guard can only come first if importing the package cannot fail on one rank: it loads
    the standard library only, and no MPI."""
    code = ("import sys, hybridmpi, hybridmpi.tools.cli\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'mpi4py', 'cffi'))\n"
            "assert not bad, bad\n"
            "assert hybridmpi.profile.__name__ == 'profile' and hybridmpi.HybridComm.__name__ == "
            "'HybridComm'\n"
            "import hybridmpi.profiling.profile\n"
            "assert isinstance(hybridmpi.profile, type) and set(hybridmpi.__all__) <= set(dir(hybridmpi))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


# ------------------------------------------------------------------ a lean install

#: the optional modules, and the extra that installs each (pyproject.toml)
OPTIONAL = {"meshio": "mesh", "pymetis": "mesh", "gmsh": "mesh", "scipy": "fem", "matplotlib": "plot"}
ABSENT = 'raise ModuleNotFoundError(f"No module named {__name__!r}", name=__name__)\n'


def without(tmp_path, *modules):
    """Environment in which ``modules`` cannot be imported on any rank, as after
    ``pip install hybridmpi`` without extras (packages of those names on PYTHONPATH that raise
    ModuleNotFoundError)."""
    for module in modules:
        (tmp_path / "absent" / module).mkdir(parents=True)
        (tmp_path / "absent" / module / "__init__.py").write_text(ABSENT)
    path = os.pathsep.join(filter(None, [str(tmp_path / "absent"), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path}


def test_the_library_needs_no_extra(tmp_path):
    """The quickstart (HybridComm, GhostPattern, Halo, allreduce) at 2 ranks, every optional
    module absent."""
    out = launch(2, [os.path.join(ROOT, "examples", "quickstart.py")], env=without(tmp_path, *OPTIONAL))
    assert "2 ranks on 1 node(s): sum" in out, out


LEAN = [  # (command, the module it finds missing first, its extra)
    (["demo", "--iters", "5", "--reps", "1"], "meshio", "mesh"),
    (["mesh", "--h", "0.3"], "meshio", "mesh"),
    (["partition", "--parts", "2", "--h", "0.3"], "meshio", "mesh"),
    (["solve", "--h", "0.3"], "meshio", "mesh"),
    (["bench", "mesh", "--reps", "1", "--h", "0.3"], "meshio", "mesh"),
    (["bench", "ghost", "--reps", "1", "--iters", "2", "--h", "0.3", "--json", ""], "meshio", "mesh"),
]


@pytest.mark.parametrize("argv, module, extra", LEAN, ids=[" ".join(c[0][:2]) for c in LEAN])
def test_a_command_names_the_missing_extra(argv, module, extra, tmp_path):
    """Every optional module absent on every rank: one line naming the extra, no traceback,
    the job ends at once (exit code 3 where the launcher passes it on)."""
    out = ends_quickly(2, ["-m", "hybridmpi", *argv], env=without(tmp_path, *OPTIONAL), abort=False,
                       cwd=tmp_path)
    line = f"needs {module}, which cannot be imported (No module named '{module}'); " \
           f"install it with: pip install 'hybridmpi[{extra}]'"
    assert line in out, out
    assert "Traceback" not in out, out


@pytest.mark.parametrize("module, argv, extra", [
    ("matplotlib", ["plot", "x.json"], "plot"),
    ("scipy", ["solve", "--h", "0.3"], "fem"),
    ("gmsh", ["mesh", "--h", "0.3"], "mesh"),
    ("pymetis", ["partition", "--parts", "2", "--h", "0.3"], "mesh"),
])
def test_each_optional_module_names_its_extra(module, argv, extra, tmp_path):
    """One module absent at a time, the command alone: exit code 3, the extra named."""
    out = subprocess.run([sys.executable, "-m", "hybridmpi", *argv], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path, env=dict(os.environ, **without(tmp_path, module)))
    assert out.returncode == 3, (out.returncode, out.stdout, out.stderr)
    assert f"pip install 'hybridmpi[{extra}]'" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_an_extra_missing_on_one_rank_ends_the_job(tmp_path):
    """gmsh cannot be imported on rank 1 only: rank 1's line, no traceback, the job ends."""
    out = ends_quickly(2, ["-m", "hybridmpi", "demo", "--iters", "5", "--reps", "1"],
                       env=broken(tmp_path, "gmsh"), abort=False, cwd=tmp_path)
    assert out.count("needs gmsh, which cannot be imported (gmsh is broken on rank 1 (test))") == 1, out
    assert "Traceback" not in out, out


LIBRARY_CALL = """\
import sys
import hybridmpi
from mpi4py import MPI
from hybridmpi.tools.mesh import distribute_cube, distribute_file

with hybridmpi.HybridComm(MPI.COMM_WORLD) as hc:
    try:
        if sys.argv[1] == "cube":
            distribute_cube(hc, 0.3)
        elif sys.argv[1] == "file":
            distribute_file(hc, sys.argv[2])
        else:
            from hybridmpi.tools.fem import Poisson
            _, lm = distribute_cube(hc, 0.3)
            Poisson(hc, lm, lambda p: p[:, 0], lambda p: p[:, 0])
        verdict = "no error"
    except hybridmpi.MissingExtra as e:
        verdict = "MissingExtra: " + str(e)
    except Exception as e:
        verdict = type(e).__name__ + ": " + str(e)
    verdicts = hc.comm.allgather(verdict.split(" (rank")[0])
    assert len(set(verdicts)) == 1, verdicts
    if hc.rank == 0:
        print(f"{len(verdicts)} ranks agreed:", verdict)
"""


@pytest.mark.parametrize("call, absent, on_rank, words", [
    ("cube", "gmsh", None, "generating the cube mesh needs gmsh"),
    ("file", "meshio", None, "reading a mesh file needs meshio"),
    ("fem", "scipy", 1, "the FEM assembly needs scipy"),
])
def test_a_library_call_raises_missing_extra_on_every_rank(call, absent, on_rank, words, tmp_path):
    """distribute_cube and distribute_file read and mesh on rank 0 only, Poisson assembles on
    every rank: every rank raises the same MissingExtra (before, a failure on one rank left the
    others waiting in the next collective), also when one rank alone lacks the module."""
    (tmp_path / "prog.py").write_text(LIBRARY_CALL)
    env = without(tmp_path, absent) if on_rank is None else broken(tmp_path, absent, on_rank)
    env = dict(env, HYBRIDMPI_CACHE=str(tmp_path / "cache"))  # no cached mesh
    mesh = os.path.join(ROOT, "meshes", "cube-h0.1.vtu")
    out = launch(3, [str(tmp_path / "prog.py"), call, mesh], env=env, cwd=tmp_path)
    assert f"3 ranks agreed: MissingExtra: hybridmpi: {words}" in out, out
