"""Figures a person can read: one colour per series in every figure, ratios on a log axis with a
line at 1, titles that say what is drawn, the MPI's name without its padding (no MPI run)."""

import pytest

from hybridmpi.tools import plot as plotting

pytest.importorskip("matplotlib")


def doc(series, xs=("barrier", "allreduce"), mpi="MPICH Version:      5.0.2"):
    rows = []
    for x in xs:
        for i, (s, base) in enumerate(series):
            m = 10.0 if base else 0.01 * (i + 1)
            rows.append({"series": s, "x": x, "baseline": base, "samples": [m, m], "min": m,
                         "mean": m, "max": m, "sd": 0.0, "ratio": None if base else m / 10.0})
    return {"schema": "hybridmpi-bench/1", "benchmark": "t", "title": "a test, time per call (us)",
            "unit": "us", "x_label": "call", "machine": "x86_64", "host": "h", "cpus": 2,
            "mpi_library": mpi, "mpi_version": "4.1", "ranks": 2, "nodes": 1, "node_size": None,
            "hybridmpi": "0",
            "thread_level": "funneled", "results": rows}


def test_one_colour_per_series_everywhere():
    names = ["atomic", "flat", "neighbor", "fence", "pscw", "lock", "floor", "PETSc", "DOLFINx",
             "default (hc.barrier())", "drop-in barrier(comm)", "dissemination acq_rel",
             "dissemination seq_cst", "tree acq_rel", "tree seq_cst", "linear acq_rel",
             "linear seq_cst"]
    colours = [plotting.color(n) for n in names]
    assert len(set(colours)) == len(colours), dict(zip(names, colours))
    # MPI's own calls: one dark grey, never a method's colour (MPI and lock were both blue)
    mpi = {plotting.color(n) for n in ("MPI", "MPI_Barrier", "MPI (mpi4py + numpy)", "flat-numpy")}
    assert len(mpi) == 1 and not mpi & set(colours)
    # the same name, the same colour, whatever else is in the figure
    assert plotting.color("some new series") == plotting.color("some new series")
    assert plotting.color("atomic (zero copy)") == plotting.color("atomic")


def test_ratio_figure_log_axis_titles_and_names(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seen = []
    real = plotting._save

    def spy(plt_, fig, ax, title, path):
        handles, labels = ax.get_legend_handles_labels()
        seen.append((path, ax.get_yscale(), title, labels,
                     {t.get_label(): t for t in ax.patches + ax.lines}))
        return real(plt_, fig, ax, title, path)

    monkeypatch.setattr(plotting, "_save", spy)
    paths = plotting.plot(doc([("MPI", True), ("atomic", False), ("lock", False)]), str(tmp_path))
    assert len(paths) == 2
    (tpath, tscale, ttitle, tlabels, _), (rpath, rscale, rtitle, rlabels, _) = seen
    assert tpath.endswith("-time.png") and rpath.endswith("-ratio.png")
    assert rscale == "log", "ratios of 0.001-0.003 need a log axis"
    assert any(lbl.startswith("1: as fast as MPI") for lbl in rlabels), rlabels   # the line at 1
    assert "time per call" not in rtitle and "relative to MPI" in rtitle, rtitle
    for title in (ttitle, rtitle):
        assert "MPICH Version: 5.0.2" in title and "  " not in title, title
    plt.close("all")


def test_mpi_label():
    assert plotting.mpi_label("MPICH Version:      5.0.2") == "MPICH Version: 5.0.2"
    label = plotting.mpi_label("Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4\x00")
    assert label == "Open MPI v4.1.4"

